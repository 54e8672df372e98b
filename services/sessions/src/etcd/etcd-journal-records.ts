/**
 * What the journal's keys hold in etcd, decoded: a session's head (`h/`), its tombstone (`t/`), an
 * append's entries (`e/`, its journal lines) and the JSON records beside them.
 */
import { randomUUID } from "node:crypto";
import { BerthError } from "@berth/shared/errors";
import type { KeyValue } from "@berth/etcd";
import { AppendTracker, storedEntry } from "../journal/journal-file.js";
import { decodeJournalLine, forEachLine, isBlankLine } from "../journal/journal-format.js";
import type { StoredEntry } from "../journal/journal-store.js";
import type { Deletion } from "../session-tombstones.js";

/** A session's head as etcd has it, with its tombstone: what an append compares. */
export interface Head {
  readonly seq: number;
  /** The mod revision of `h/<session>` (0n: no head, no session). */
  readonly mod: bigint;
  /** The create revision of `h/<session>`: the session's incarnation (a deleted and re-created session has a new one). */
  readonly create: bigint;
  /** The seq of the incarnation's first entry (0: no session). */
  readonly first: number;
  /** The session's tombstone (what its deletions left); its mod revision is 0n when it was never deleted. */
  readonly tomb: TombstoneValue;
}

/** A tombstone as `t/<session>` holds it (see session-tombstones.ts); the keys of its deletions stay under `i/`. */
export interface TombstoneValue {
  /** The mod revision of `t/<session>` (0n: never deleted). */
  readonly mod: bigint;
  /** The last seq the session reached before its last deletion (0: never deleted). */
  readonly lastSeq: number;
  /** Its deletions within the idempotency window (as of the last deletion), oldest first. */
  readonly deletions: readonly Deletion[];
}

export const NO_TOMBSTONE: TombstoneValue = { mod: 0n, lastSeq: 0, deletions: [] };
export const NO_HEAD: Head = { seq: 0, mod: 0n, create: 0n, first: 0, tomb: NO_TOMBSTONE };

const decoder = new TextDecoder();
/** The JSON object a key holds; undefined for no key. */
export const jsonOf = (kv: KeyValue | undefined): Record<string, unknown> | undefined =>
  kv === undefined ? undefined : (JSON.parse(decoder.decode(kv.value)) as Record<string, unknown>);

/** The entries of one append's value (its journal lines), with the append's idempotency key on each. */
export function decodeAppend(value: Uint8Array): StoredEntry[] {
  const buf = Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  const tracker = new AppendTracker();
  const out: StoredEntry[] = [];
  forEachLine(buf, 0, (start, end) => {
    if (isBlankLine(buf, start, end)) return;
    const line = decodeJournalLine(buf, start, end);
    // etcd checks every write's bytes (its own CRCs): a line that does not decode was never berth's.
    if (line.kind !== "entry") throw new BerthError("internal", `an entry in etcd does not decode (${line.message})`, {}, { reason: "JOURNAL_DAMAGED" });
    tracker.line(line.entry);
    out.push(storedEntry(line, tracker.key));
  });
  return out;
}

export function headOf(kv: KeyValue | undefined, tomb: TombstoneValue): Head {
  if (kv === undefined) return { ...NO_HEAD, tomb };
  const value = jsonOf(kv);
  const seq = value?.seq;
  if (typeof seq !== "number" || !Number.isInteger(seq) || seq < 0)
    throw new BerthError("internal", `the head of ${kv.key} in etcd does not decode`, {}, { reason: "JOURNAL_DAMAGED" });
  // Heads written before incarnations kept their first seq started at 1 (or after the tombstone).
  const first = typeof value?.b === "number" ? value.b : tomb.lastSeq + 1;
  return { seq, mod: kv.modRevision, create: kv.createRevision, first, tomb };
}

/** A head's value: the last seq, the entries of the last append, its write id, and the incarnation's first seq. */
export function headValue(seq: number, entries: number, first: number): string {
  return JSON.stringify({ seq, n: entries, w: randomUUID(), b: first });
}

export function tombstoneOf(kv: KeyValue | undefined): TombstoneValue {
  if (kv === undefined) return NO_TOMBSTONE;
  const value = jsonOf(kv);
  const lastSeq = value?.lastSeq;
  if (typeof lastSeq !== "number" || !Number.isInteger(lastSeq) || lastSeq < 0 || !Array.isArray(value?.deletions))
    throw new BerthError("internal", `the tombstone ${kv.key} in etcd does not decode`, {}, { reason: "JOURNAL_DAMAGED" });
  return { mod: kv.modRevision, lastSeq, deletions: value.deletions as Deletion[] };
}
