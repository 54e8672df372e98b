/**
 * Session journals in etcd: several berth instances on one cluster append to, read and watch the
 * same sessions, and etcd serialises them (no election, no in-memory authority).
 *
 * - An append is one transaction. It compares the session's head (the `h/` key's mod revision as
 *   this instance last saw it), the idempotency key's absence and, with a fence, that the lock's
 *   holder key still has the token as its create revision; it puts the append's entries (one key,
 *   the journal's lines), the new head and the idempotency key. When a compare fails, the failure
 *   branch reads back the head, the key's record and the lock's holder in the same round trip, so
 *   a retry on a moved head, a duplicate and a lost fence cost nothing more. A stale fence is
 *   refused by etcd itself, atomically with the write: a paused ex-holder can never write.
 * - A read takes the append holding the seq asked for and those after it at one revision R (one
 *   transaction, then pages at R); a watch follows the entry keys from R + 1, so nothing falls
 *   between the read and the watch. A revision etcd has compacted ends the watch as
 *   WATCHER_LAGGED, resumable by seq, as the file store's watchers end when they fall behind.
 * - Snapshots are a cache under `s/`, written only while the head is the incarnation they were
 *   built from, and rebuilt from the journal's tail.
 */
import { randomUUID } from "node:crypto";
import { systemClock, type Clock } from "@berth/shared/clock";
import { BerthError, invalidArgument, isBerthError } from "@berth/shared/errors";
import {
  compare,
  EtcdReason,
  isEtcdCompacted,
  op,
  type EtcdClient,
  type KeyValue,
  type RangeResult,
  type TxnCompare,
  type TxnOp,
  type TxnRequestInit,
  type TxnResult,
} from "@berth/etcd";
import { AppendTracker, storedEntry } from "../journal/journal-file.js";
import type { StoredEntry } from "../journal/journal-store.js";
import { decodeJournalLine, encodeJournalLine, forEachLine, isBlankLine } from "../journal/journal-format.js";
import { applyEvent, baseSnapshot, type JournalEntry, type SessionSnapshot } from "../reducer.js";
import type { PreparedEvent } from "../append-input.js";
import { checkExpectation, expectationHolds } from "../append-rules.js";
import {
  keyReused,
  refuseDeletedSeqs,
  seqConflict,
  sessionNotFound,
  sessionWatcherLagged,
  watchedSessionDeleted,
  type ExpectedState,
} from "../session-refusals.js";
import {
  DEFAULT_IDEMPOTENCY_WINDOW_MS,
  findDeletedKey,
  refuseAppendOfDeletedKey,
  remembered,
  repeatedDeletion,
  type Deletion,
  type DeletedKey,
} from "../session-tombstones.js";
import type { KeyRecord, Tombstone } from "../journal/journal-store.js";
import type { SessionChange, WatchEvent } from "../session-store-api.js";
import {
  entriesPrefix,
  entryKey,
  headKey,
  HEADS,
  idempotencyKey,
  idempotencyPrefix,
  lockWaitersPrefix,
  sessionOfHead,
  sessionOfTombstone,
  snapshotKey,
  tombstoneKey,
  TOMBSTONES,
} from "./store-keys.js";
import { ETCD_DEFAULT_MAX_REQUEST_BYTES } from "./etcd-defaults.js";

export type { PreparedEvent } from "../append-input.js";

/** Room left in a request for everything but the entries' lines (keys, head, idempotency record, compares). */
const REQUEST_OVERHEAD_BYTES = 4 * 1024;
/** Appends (entry keys) per page of a read. */
const DEFAULT_PAGE_APPENDS = 256;
/** Heads remembered, so that an append usually costs one round trip. */
const HEAD_CACHE_SIZE = 10_000;

/**
 * A fence resolved against etcd: `key` is the lock's holder key whose create revision is `token`
 * (see etcd-locks.ts, {@link EtcdLocks.fence}). The append compares it; nothing else is trusted.
 */
export interface EtcdFence {
  /** The canonical path of the locked file. */
  readonly file: string;
  readonly key: string;
  readonly token: bigint;
}

export interface EtcdAppendOptions {
  /** The last seq the caller saw (0: no entry yet); anything else is aborted SEQ_CONFLICT. */
  readonly expectedSeq?: number;
  readonly expectedState?: ExpectedState;
  /** A retry with the same key answers the first append (nothing is written). */
  readonly idempotencyKey?: string;
  /** The digest of the events (event-digest.ts), kept with the key to tell a retry from a reuse. */
  readonly digest?: string;
  readonly fence?: EtcdFence;
}

export interface EtcdAppendResult {
  readonly firstSeq: number;
  readonly lastSeq: number;
  /** The entries written; empty for a duplicate. */
  readonly entries: JournalEntry[];
  /** The revision of the transaction that wrote them (for a duplicate: the one that found the key). */
  readonly revision: bigint;
  readonly duplicate: boolean;
  /** The head's create revision the append was written after (the session's incarnation); 0n for a duplicate. */
  readonly incarnation: bigint;
  /** True when the append created its session (no head before it): nothing of this incarnation came before. */
  readonly created: boolean;
}

/** A session's head as etcd has it, with its tombstone: what an append compares. */
interface Head {
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
interface TombstoneValue {
  /** The mod revision of `t/<session>` (0n: never deleted). */
  readonly mod: bigint;
  /** The last seq the session reached before its last deletion (0: never deleted). */
  readonly lastSeq: number;
  /** Its deletions within the idempotency window (as of the last deletion), oldest first. */
  readonly deletions: readonly Deletion[];
}

const NO_TOMBSTONE: TombstoneValue = { mod: 0n, lastSeq: 0, deletions: [] };
const NO_HEAD: Head = { seq: 0, mod: 0n, create: 0n, first: 0, tomb: NO_TOMBSTONE };

/** A session's entries from a seq, read at one revision. */
export interface JournalRead {
  /** The store's revision the read saw: follow from `revision + 1n`. */
  readonly revision: bigint;
  /** The session's last seq at `revision` (0: no session). */
  readonly lastSeq: number;
  /** The head's create revision at `revision` (0n: no session). */
  readonly incarnation: bigint;
  /** The head's mod revision at `revision` (0n: no session): what a deletion decided on this read compares. */
  readonly headRevision: bigint;
  /** The last seq of the session's deleted incarnations (0: never deleted): seqs up to it are gone for good. */
  readonly deletedThrough: number;
  /** The entries with seq ≥ the one asked for, in order (pages read at `revision`). */
  entries(): AsyncGenerator<StoredEntry, void, undefined>;
}

/** A session as a list finds it. */
export interface ListedSession {
  readonly sessionId: string;
  readonly lastSeq: number;
  /** The head's create revision. */
  readonly incarnation: bigint;
  /** The head's mod revision (the last append's). */
  readonly headRevision: bigint;
}

/** A session's state rebuilt from etcd: the cached snapshot plus the journal after it. */
export interface SessionState {
  readonly sessionId: string;
  readonly snapshot: SessionSnapshot;
  readonly lastSeq: number;
  readonly exists: boolean;
  readonly revision: bigint;
  readonly incarnation: bigint;
  /** The head's mod revision the state was read at (0n: no session). */
  readonly headRevision: bigint;
  /** As in {@link JournalRead}. */
  readonly deletedThrough: number;
}

/** A change of a session's head: an append (its transaction's revision) or the session's deletion. */
export interface HeadChange {
  readonly sessionId: string;
  readonly revision: bigint;
  readonly deleted: boolean;
}

export interface EtcdJournalOptions {
  readonly client: EtcdClient;
  readonly clock?: Clock;
  /** etcd's `--max-request-bytes` as its operator set it: a larger append is refused before it is sent. */
  readonly maxRequestBytes?: number;
  /** Appends per page of a read (default 256). */
  readonly pageAppends?: number;
  /** How long a deleted session's idempotency keys keep answering (default 1 h; see session-tombstones.ts). */
  readonly idempotencyWindowMs?: number;
}

const decoder = new TextDecoder();
const json = (kv: KeyValue | undefined): Record<string, unknown> | undefined =>
  kv === undefined ? undefined : (JSON.parse(decoder.decode(kv.value)) as Record<string, unknown>);

/** Session journals in etcd; see the module comment. One per berth instance; any number per cluster. */
export class EtcdJournal {
  private readonly client: EtcdClient;
  private readonly clock: Clock;
  private readonly maxRequestBytes: number;
  private readonly pageAppends: number;
  private readonly idempotencyWindowMs: number;
  /** The last head this instance saw per session: what the next append compares (a miss costs one retry). */
  private readonly heads = new Map<string, Head>();

  constructor(options: EtcdJournalOptions) {
    this.client = options.client;
    this.clock = options.clock ?? systemClock;
    this.maxRequestBytes = options.maxRequestBytes ?? ETCD_DEFAULT_MAX_REQUEST_BYTES;
    this.pageAppends = options.pageAppends ?? DEFAULT_PAGE_APPENDS;
    this.idempotencyWindowMs = options.idempotencyWindowMs ?? DEFAULT_IDEMPOTENCY_WINDOW_MS;
  }

  // ---------------------------------------------------------------- appends

  /** Appends `events` to the session in one transaction; see the module comment. */
  async append(sessionId: string, events: readonly PreparedEvent[], options: EtcdAppendOptions = {}): Promise<EtcdAppendResult> {
    if (events.length === 0) throw invalidArgument("events", "must hold at least one event");
    const ikey = options.idempotencyKey === "" ? undefined : options.idempotencyKey;
    let head = this.heads.get(sessionId) ?? NO_HEAD;
    let fresh = false;
    /** The mod revision of a record of `ikey` left by a deletion whose window passed: overwritten, not answered. */
    let expiredKey: bigint | undefined;
    for (;;) {
      if (!expectationHolds(head.seq, options)) {
        // A cached head may be behind: only a head read now refutes the caller.
        if (!fresh) {
          head = await this.readHead(sessionId);
          fresh = true;
          continue;
        }
        // A retry of an append that landed answers its first result before anything else.
        if (ikey !== undefined) {
          const known = await this.client.get(idempotencyKey(sessionId, ikey));
          if (known && this.answerKnownKey(sessionId, ikey, known, head.tomb, options.digest) !== "expired") {
            return duplicate(sessionId, ikey, known, options.digest);
          }
        }
        throw seqConflict(sessionId, head.seq, options.expectedSeq, options.expectedState);
      }
      const creating = head.mod === 0n;
      // An id's seqs never go back: a session created again continues after its tombstone.
      const firstSeq = (creating ? head.tomb.lastSeq : head.seq) + 1;
      const ts = new Date(this.clock.now()).toISOString();
      const entries: JournalEntry[] = events.map((e, i) => ({ seq: firstSeq + i, id: sessionId, type: e.type, ts, event: e.event }));
      const lastSeq = firstSeq + entries.length - 1;
      const marks = { ...(ikey !== undefined ? { ikey } : {}), ...(entries.length > 1 ? { n: entries.length } : {}) };
      const lines = entries.map((entry, i) => encodeJournalLine(entry, i === 0 ? marks : undefined)).join("");
      const bytes = Buffer.byteLength(lines);
      if (bytes + REQUEST_OVERHEAD_BYTES > this.maxRequestBytes) throw appendTooLarge(sessionId, bytes, this.maxRequestBytes);

      const compares: TxnCompare[] = [compare.mod(headKey(sessionId), "==", head.mod)];
      // Creating compares the tombstone too: a deletion meanwhile moves where the seqs start.
      if (creating) compares.push(compare.mod(tombstoneKey(sessionId), "==", head.tomb.mod));
      const success: TxnOp[] = [
        op.put(entryKey(sessionId, firstSeq), lines),
        op.put(headKey(sessionId), headValue(lastSeq, entries.length, creating ? firstSeq : head.first)),
      ];
      const failure: TxnOp[] = [op.get({ key: headKey(sessionId) }), op.get({ key: tombstoneKey(sessionId) })];
      if (ikey !== undefined) {
        compares.push(
          expiredKey === undefined ? compare.absent(idempotencyKey(sessionId, ikey)) : compare.mod(idempotencyKey(sessionId, ikey), "==", expiredKey),
        );
        success.push(
          op.put(idempotencyKey(sessionId, ikey), JSON.stringify({ firstSeq, lastSeq, ...(options.digest !== undefined ? { digest: options.digest } : {}) })),
        );
        failure.push(op.get({ key: idempotencyKey(sessionId, ikey) }));
      }
      if (options.fence !== undefined) {
        compares.push(compare.create(options.fence.key, "==", options.fence.token));
        // The oldest waiter is the holder: its create revision is the current token.
        failure.push(op.get({ key: lockWaitersPrefix(options.fence.file), prefix: true, sort: { by: "create", order: "ascend" }, limit: 1, keysOnly: true }));
      }
      const result = await this.appendTxn(sessionId, bytes, { compare: compares, success, failure });
      if (result.succeeded) {
        // The head key was written by this transaction: its mod revision is the transaction's.
        const create = creating ? result.revision : head.create;
        this.remember(sessionId, { seq: lastSeq, mod: result.revision, create, first: creating ? firstSeq : head.first, tomb: head.tomb });
        return { firstSeq, lastSeq, entries, revision: result.revision, duplicate: false, incarnation: create, created: creating };
      }
      const got = (i: number): RangeResult => {
        const r = result.results[i];
        if (r === undefined || !("get" in r)) throw new Error("etcd answered a failed append without its reads");
        return r.get;
      };
      head = headOf(got(0).kvs[0], tombstoneOf(got(1).kvs[0]));
      fresh = true;
      this.remember(sessionId, head);
      let next = 2;
      if (ikey !== undefined) {
        const known = got(next++).kvs[0];
        expiredKey = undefined;
        if (known) {
          if (this.answerKnownKey(sessionId, ikey, known, head.tomb, options.digest) === "expired") expiredKey = known.modRevision;
          else return duplicate(sessionId, ikey, known, options.digest, result.revision);
        }
      }
      if (options.fence !== undefined) {
        const holder = got(next++).kvs[0];
        const current = holder?.createRevision ?? 0n;
        if (current !== options.fence.token) throw fenceRejected(options.fence, current);
      }
      // The head moved (another instance appended, or the session was deleted): sequence again after it.
    }
  }

  /**
   * What to make of the record of `ikey` an append found: nothing to object to when it is the live
   * session's (the caller answers it as a duplicate); `expired` when it is a deleted session's
   * whose idempotency window passed (the key is free again); else the deleted session's answer,
   * thrown (see session-tombstones.ts).
   */
  private answerKnownKey(sessionId: string, ikey: string, kv: KeyValue, tomb: TombstoneValue, digest: string | undefined): "live" | "expired" {
    const record = json(kv)!;
    const deletion = record.deletion === true;
    const lastSeq = Number(record.lastSeq);
    if (!deletion && lastSeq > tomb.lastSeq) return "live";
    const known = this.deletedKey(ikey, record, tomb);
    if (known === undefined) return "expired";
    refuseAppendOfDeletedKey(sessionId, ikey, digest, known);
  }

  /** The key `ikey` of a deleted session (its record under `i/`), while its deletion is remembered. */
  private deletedKey(ikey: string, record: Record<string, unknown>, tomb: TombstoneValue): DeletedKey | undefined {
    const keyRecord: KeyRecord = {
      firstSeq: Number(record.firstSeq ?? record.lastSeq),
      lastSeq: Number(record.lastSeq),
      ...(typeof record.digest === "string" ? { digest: record.digest } : {}),
    };
    const tombstone: Tombstone = {
      lastSeq: tomb.lastSeq,
      deletions: tomb.deletions.map((d) => ({
        ...d,
        keys:
          record.deletion !== true && d.firstSeq <= keyRecord.firstSeq && keyRecord.lastSeq <= d.lastSeq
            ? new Map([[ikey, keyRecord]])
            : new Map<string, KeyRecord>(),
      })),
    };
    return findDeletedKey(tombstone, ikey, this.clock.now(), this.idempotencyWindowMs);
  }

  /**
   * Appends several plain appends (no expectation, idempotency key or fence) to the session in one
   * transaction, in order: each its own entry key (so each is still one change to watchers), one
   * head after the last. What an instance's appends queued behind each other on one session cost
   * together: one round trip, not one each.
   */
  async appendGroup(sessionId: string, groups: ReadonlyArray<readonly PreparedEvent[]>): Promise<EtcdAppendResult[]> {
    if (groups.length === 0 || groups.some((events) => events.length === 0)) throw invalidArgument("events", "must hold at least one event");
    let head = this.heads.get(sessionId) ?? NO_HEAD;
    for (;;) {
      const ts = new Date(this.clock.now()).toISOString();
      const written: Array<{ firstSeq: number; lastSeq: number; entries: JournalEntry[] }> = [];
      const success: TxnOp[] = [];
      const creating = head.mod === 0n;
      // An id's seqs never go back: a session created again continues after its tombstone.
      let seq = creating ? head.tomb.lastSeq : head.seq;
      let bytes = 0;
      for (const events of groups) {
        const firstSeq = seq + 1;
        const entries: JournalEntry[] = events.map((e, i) => ({ seq: firstSeq + i, id: sessionId, type: e.type, ts, event: e.event }));
        seq = firstSeq + entries.length - 1;
        const marks = entries.length > 1 ? { n: entries.length } : {};
        const lines = entries.map((entry, i) => encodeJournalLine(entry, i === 0 ? marks : undefined)).join("");
        bytes += Buffer.byteLength(lines);
        success.push(op.put(entryKey(sessionId, firstSeq), lines));
        written.push({ firstSeq, lastSeq: seq, entries });
      }
      if (bytes + REQUEST_OVERHEAD_BYTES > this.maxRequestBytes) throw appendTooLarge(sessionId, bytes, this.maxRequestBytes);
      const first = creating ? head.tomb.lastSeq + 1 : head.first;
      success.push(op.put(headKey(sessionId), headValue(seq, written.at(-1)!.entries.length, first)));
      const compares: TxnCompare[] = [compare.mod(headKey(sessionId), "==", head.mod)];
      if (creating) compares.push(compare.mod(tombstoneKey(sessionId), "==", head.tomb.mod));
      const result = await this.appendTxn(sessionId, bytes, {
        compare: compares,
        success,
        failure: [op.get({ key: headKey(sessionId) }), op.get({ key: tombstoneKey(sessionId) })],
      });
      if (result.succeeded) {
        const incarnation = creating ? result.revision : head.create;
        this.remember(sessionId, { seq, mod: result.revision, create: incarnation, first, tomb: head.tomb });
        return written.map((w, i) => ({ ...w, revision: result.revision, duplicate: false, incarnation, created: creating && i === 0 }));
      }
      const [headRead, tombRead] = result.results.map((r) => ("get" in r ? r.get : undefined));
      if (headRead === undefined || tombRead === undefined) throw new Error("etcd answered a failed append without its reads");
      head = headOf(headRead.kvs[0], tombstoneOf(tombRead.kvs[0]));
      this.remember(sessionId, head);
    }
  }

  /** The most an append's journal lines may take (what `--etcd-max-request-bytes` leaves). */
  get maxAppendBytes(): number {
    return this.maxRequestBytes - REQUEST_OVERHEAD_BYTES;
  }

  /**
   * An append's transaction. etcd's own refusal of its size (its `--max-request-bytes` is lower
   * than this journal was told) is the caller's, as the check before sending would have said.
   */
  private async appendTxn(sessionId: string, bytes: number, request: TxnRequestInit): Promise<TxnResult> {
    try {
      return await this.client.txn(request);
    } catch (error) {
      if (isBerthError(error) && error.reason === EtcdReason.REQUEST_TOO_LARGE) throw appendRefusedByEtcd(sessionId, bytes, this.maxRequestBytes, error);
      throw error;
    }
  }

  /** The session's last seq and incarnation (the head's create revision; 0n: no session), read now. */
  async head(sessionId: string): Promise<{ seq: number; incarnation: bigint }> {
    const head = await this.readHead(sessionId);
    return { seq: head.seq, incarnation: head.create };
  }

  /** The session's head and tombstone, read now (one round trip). */
  private async readHead(sessionId: string): Promise<Head> {
    const read = await this.client.txn({ compare: [], success: [op.get({ key: headKey(sessionId) }), op.get({ key: tombstoneKey(sessionId) })] });
    const [headRead, tombRead] = read.results.map((r) => ("get" in r ? r.get : undefined));
    const head = headOf(headRead?.kvs[0], tombstoneOf(tombRead?.kvs[0]));
    this.remember(sessionId, head);
    return head;
  }

  private remember(sessionId: string, head: Head): void {
    this.heads.delete(sessionId);
    this.heads.set(sessionId, head);
    if (this.heads.size > HEAD_CACHE_SIZE) this.heads.delete(this.heads.keys().next().value!);
  }

  // ---------------------------------------------------------------- reads

  /**
   * The entries with seq ≥ `fromSeq`, read at one revision: the append holding `fromSeq` and every
   * later one, in pages. The first page is read before this resolves (so `revision` is known).
   */
  async read(sessionId: string, fromSeq = 1, limit = 0): Promise<JournalRead> {
    const prefix = entriesPrefix(sessionId);
    const prefixEnd = `${prefix.slice(0, -1)}0`; // `/` + 1: the end of the session's entry keys
    const from = Math.max(1, fromSeq);
    const first = await this.client.txn({
      compare: [],
      success: [
        op.get({ key: headKey(sessionId) }),
        op.get({ key: tombstoneKey(sessionId) }),
        // The append that starts before `from` and may hold it…
        op.get({ key: prefix, end: entryKey(sessionId, from), sort: { by: "key", order: "descend" }, limit: 1 }),
        // …and the appends that start at or after it.
        op.get({ key: entryKey(sessionId, from), end: prefixEnd, sort: { by: "key", order: "ascend" }, limit: this.pageAppends }),
      ],
    });
    const [headResult, tombResult, before, after] = first.results.map((r) => ("get" in r ? r.get : undefined));
    const revision = first.revision;
    const head = headOf(headResult?.kvs[0], tombstoneOf(tombResult?.kvs[0]));
    const client = this.client;
    const pageAppends = this.pageAppends;
    async function* entries(): AsyncGenerator<StoredEntry, void, undefined> {
      let given = 0;
      const take = function* (kvs: KeyValue[]): Generator<StoredEntry, boolean> {
        for (const kv of kvs) {
          for (const stored of decodeAppend(kv.value)) {
            if (stored.entry.seq < from) continue;
            if (stored.entry.seq > head.seq) return false;
            yield stored;
            if (limit > 0 && ++given >= limit) return false;
          }
        }
        return true;
      };
      if (!(yield* take(before?.kvs ?? []))) return;
      let page = after;
      while (page !== undefined) {
        if (!(yield* take(page.kvs))) return;
        const last = page.kvs.at(-1);
        if (!page.more || last === undefined) return;
        page = await client.range({ key: `${last.key}\0`, end: prefixEnd, sort: { by: "key", order: "ascend" }, limit: pageAppends, revision });
      }
    }
    return { revision, lastSeq: head.seq, incarnation: head.create, headRevision: head.mod, deletedThrough: head.tomb.lastSeq, entries };
  }

  /**
   * Watches a session from `fromSeq`: the entries already there, a caught-up marker, then every new
   * entry as it commits, in order, whichever instance appended it. Ends (returns) when
   * `signal` aborts; a deleted session ends it with not_found SESSION_DELETED, and a revision etcd
   * compacted away with resource_exhausted WATCHER_LAGGED naming the seq to resume from.
   */
  async *watch(sessionId: string, fromSeq = 1, options: { readonly signal?: AbortSignal } = {}): AsyncGenerator<WatchEvent, void, undefined> {
    let lastDelivered = Math.max(0, fromSeq - 1);
    try {
      const backlog = await this.read(sessionId, fromSeq);
      refuseDeletedSeqs(sessionId, fromSeq, backlog.deletedThrough);
      for await (const stored of backlog.entries()) {
        lastDelivered = stored.entry.seq;
        yield { kind: "entry", ...stored };
      }
      lastDelivered = Math.max(lastDelivered, backlog.lastSeq);
      yield { kind: "caught_up", lastSeq: backlog.lastSeq };
      for await (const batch of this.client.watch({
        key: entriesPrefix(sessionId),
        prefix: true,
        startRevision: backlog.revision + 1n,
        ...(options.signal ? { signal: options.signal } : {}),
      })) {
        for (const event of batch.events) {
          if (event.type === "delete") {
            throw watchedSessionDeleted(sessionId, lastDelivered);
          }
          for (const stored of decodeAppend(event.kv.value)) {
            if (stored.entry.seq <= lastDelivered) continue;
            lastDelivered = stored.entry.seq;
            yield { kind: "entry", ...stored };
          }
        }
      }
    } catch (error) {
      if (isEtcdCompacted(error)) throw sessionWatcherLagged(`watcher of session ${sessionId} fell behind etcd's compaction`, sessionId, lastDelivered);
      throw error;
    }
  }

  /**
   * Watches every session: one change per append (first..last seq, its last entry), or a session's
   * deletion (at its last seq), from `startRevision` (default: from now), in revision order. The
   * changes one transaction made share its revision; `endsRevision` marks the last of them, so a
   * watcher that stops after it knows its revision is complete.
   */
  async *watchAll(
    options: { readonly signal?: AbortSignal; readonly startRevision?: bigint } = {},
  ): AsyncGenerator<SessionChange & { endsRevision: boolean }, void, undefined> {
    try {
      for await (const batch of this.client.watch({
        key: "e/",
        prefix: true,
        // A deletion's events carry what was deleted: the session's last seq. Entry keys are
        // written once, so their puts have no previous value to carry.
        prevKv: true,
        ...(options.startRevision !== undefined ? { startRevision: options.startRevision } : {}),
        ...(options.signal ? { signal: options.signal } : {}),
      })) {
        // A deletion removes many keys at one revision: one change per session and revision.
        const changes: SessionChange[] = [];
        const deletions = new Map<string, SessionChange>();
        for (const event of batch.events) {
          const sessionId = event.kv.key.slice(2, event.kv.key.lastIndexOf("/"));
          const revision = Number(event.kv.modRevision);
          if (event.type === "put") {
            const entries = decodeAppend(event.kv.value).map((s) => s.entry);
            const last = entries.at(-1);
            if (last === undefined) continue;
            changes.push({ sessionId, firstSeq: entries[0]!.seq, lastSeq: last.seq, entry: last, deleted: false, revision });
          } else {
            const lastSeq = (event.prevKv ? decodeAppend(event.prevKv.value).at(-1)?.entry.seq : undefined) ?? 0;
            const key = `${revision}/${sessionId}`;
            const known = deletions.get(key);
            if (known) {
              known.lastSeq = Math.max(known.lastSeq, lastSeq);
              known.firstSeq = known.lastSeq;
            } else {
              const change: SessionChange = { sessionId, firstSeq: lastSeq, lastSeq, entry: undefined, deleted: true, revision };
              deletions.set(key, change);
              changes.push(change);
            }
          }
        }
        for (const [i, change] of changes.entries()) yield { ...change, endsRevision: changes[i + 1]?.revision !== change.revision };
      }
    } catch (error) {
      if (isEtcdCompacted(error))
        throw new BerthError("resource_exhausted", "watcher of all sessions fell behind etcd's compaction", {}, { reason: "WATCHER_LAGGED" });
      throw error;
    }
  }

  /**
   * Watches the heads of every session from `startRevision`: one change per append transaction
   * (however many appends it wrote), and one per deletion. Carries no entries: what a follower
   * that reads a session only when it needs to (the retention of completed sessions) watches.
   */
  async *watchHeads(options: { readonly signal?: AbortSignal; readonly startRevision: bigint }): AsyncGenerator<HeadChange, void, undefined> {
    for await (const batch of this.client.watch({
      key: HEADS,
      prefix: true,
      startRevision: options.startRevision,
      ...(options.signal ? { signal: options.signal } : {}),
    })) {
      for (const event of batch.events) yield { sessionId: sessionOfHead(event.kv.key), revision: event.kv.modRevision, deleted: event.type === "delete" };
    }
  }

  /**
   * The sessions with a head (at least one entry), sorted by id, with their last seq: a page after
   * `after`, of at most `limit` (0: all), read at one revision.
   */
  async list(options: { readonly after?: string; readonly limit?: number } = {}): Promise<{ sessions: ListedSession[]; revision: bigint }> {
    const end = `${HEADS.slice(0, -1)}0`;
    const sessions: ListedSession[] = [];
    let key = options.after === undefined ? HEADS : `${headKey(options.after)}\0`;
    let revision: bigint | undefined;
    const limit = options.limit ?? 0;
    for (;;) {
      const want = limit > 0 ? Math.min(this.pageAppends, limit - sessions.length) : this.pageAppends;
      const page = await this.client.range({ key, end, limit: want, ...(revision !== undefined ? { revision } : {}) });
      revision ??= page.revision;
      for (const kv of page.kvs)
        sessions.push({
          sessionId: sessionOfHead(kv.key),
          lastSeq: headOf(kv, NO_TOMBSTONE).seq,
          incarnation: kv.createRevision,
          headRevision: kv.modRevision,
        });
      const last = page.kvs.at(-1);
      if (!page.more || last === undefined || (limit > 0 && sessions.length >= limit)) return { sessions, revision };
      key = `${last.key}\0`;
    }
  }

  /**
   * Deletes a session: its entries, snapshot and head, in one transaction that compares the head
   * and the tombstone read (so an append that lands first is not lost silently: the deletion
   * retries and takes it too, unless `expectedSeq` no longer holds), and leaves its tombstone
   * (session-tombstones.ts): the session's last seq for good, this deletion for the idempotency
   * window, and the deleted session's idempotency keys where they were. not_found
   * SESSION_NOT_FOUND for a session with no head. A repeat of a keyed deletion answers the first
   * (`duplicate`), even once the session was created again.
   */
  async delete(
    sessionId: string,
    options: { readonly expectedSeq?: number; readonly idempotencyKey?: string } = {},
  ): Promise<{ lastSeq: number; revision: bigint; duplicate: boolean }> {
    const ikey = options.idempotencyKey === "" ? undefined : options.idempotencyKey;
    for (;;) {
      const reads: TxnOp[] = [op.get({ key: headKey(sessionId) }), op.get({ key: tombstoneKey(sessionId) })];
      if (ikey !== undefined) reads.push(op.get({ key: idempotencyKey(sessionId, ikey) }));
      const read = await this.client.txn({ compare: [], success: reads });
      const [headRead, tombRead, keyRead] = read.results.map((r) => ("get" in r ? r.get : undefined));
      const head = headOf(headRead?.kvs[0], tombstoneOf(tombRead?.kvs[0]));
      this.remember(sessionId, head);
      let keyCompare: TxnCompare | undefined;
      if (ikey !== undefined) {
        const kv = keyRead?.kvs[0];
        keyCompare = kv === undefined ? compare.absent(idempotencyKey(sessionId, ikey)) : compare.mod(idempotencyKey(sessionId, ikey), "==", kv.modRevision);
        if (kv !== undefined) {
          const record = json(kv)!;
          if (record.deletion !== true && Number(record.lastSeq) > head.tomb.lastSeq) {
            throw keyReused(sessionId, ikey, { firstSeq: Number(record.firstSeq), lastSeq: Number(record.lastSeq) });
          }
          const known = this.deletedKey(ikey, record, head.tomb);
          if (known !== undefined) return { ...repeatedDeletion(sessionId, ikey, options.expectedSeq, known), revision: read.revision, duplicate: true };
        }
      }
      if (head.mod === 0n) throw sessionNotFound(sessionId);
      checkExpectation(sessionId, head.seq, { expectedSeq: options.expectedSeq });
      const revision = await this.bury(sessionId, head, {
        ...(ikey !== undefined ? { idempotencyKey: ikey } : {}),
        ...(options.expectedSeq !== undefined ? { expectedSeq: options.expectedSeq } : {}),
        ...(keyCompare !== undefined ? { keyCompare } : {}),
      });
      if (revision !== undefined) return { lastSeq: head.seq, revision, duplicate: false };
    }
  }

  /**
   * Deletes the session as {@link delete} does, only if its head is still the one whose mod
   * revision is `headRevision` (as a read found it): no retry, so an append that landed after that
   * read keeps the session. Resolves the deletion's revision, or undefined when the head moved or
   * is gone.
   */
  async deleteUnchanged(sessionId: string, headRevision: bigint): Promise<bigint | undefined> {
    const head = await this.readHead(sessionId);
    if (head.mod === 0n || head.mod !== headRevision) return undefined;
    return this.bury(sessionId, head, {});
  }

  /**
   * The deletion's transaction: removes the session's entries, snapshot and head, and writes its
   * tombstone with this deletion added (and the deletion's own key under `i/`), if the head and the
   * tombstone are still as read. Resolves its revision, or undefined when either moved.
   */
  private async bury(
    sessionId: string,
    head: Head,
    request: { readonly idempotencyKey?: string; readonly expectedSeq?: number; readonly keyCompare?: TxnCompare },
  ): Promise<bigint | undefined> {
    const deletedAt = this.clock.now();
    const deletion: Deletion = {
      firstSeq: head.first,
      lastSeq: head.seq,
      deletedAt,
      ...(request.idempotencyKey !== undefined ? { idempotencyKey: request.idempotencyKey } : {}),
      ...(request.expectedSeq !== undefined ? { expectedSeq: request.expectedSeq } : {}),
    };
    const success: TxnOp[] = [
      op.delete({ key: entriesPrefix(sessionId), prefix: true }),
      op.delete({ key: snapshotKey(sessionId) }),
      op.delete({ key: headKey(sessionId) }),
      op.put(tombstoneKey(sessionId), JSON.stringify({ lastSeq: head.seq, deletions: [...head.tomb.deletions, deletion] })),
    ];
    if (request.idempotencyKey !== undefined) {
      const record = { deletion: true, lastSeq: head.seq, deletedAt, ...(request.expectedSeq !== undefined ? { expectedSeq: request.expectedSeq } : {}) };
      success.push(op.put(idempotencyKey(sessionId, request.idempotencyKey), JSON.stringify(record)));
    }
    const result = await this.client.txn({
      compare: [
        compare.mod(headKey(sessionId), "==", head.mod),
        compare.mod(tombstoneKey(sessionId), "==", head.tomb.mod),
        ...(request.keyCompare !== undefined ? [request.keyCompare] : []),
      ],
      success,
    });
    if (!result.succeeded) {
      this.heads.delete(sessionId);
      return undefined;
    }
    // What the next append (creating the session again) compares: no head, this tombstone.
    const deletions = [...head.tomb.deletions, deletion];
    this.remember(sessionId, { ...NO_HEAD, tomb: { mod: result.revision, lastSeq: head.seq, deletions } });
    return result.revision;
  }

  /**
   * Forgets the deletions whose idempotency window passed: the deleted sessions' records under
   * `i/` and the deletions in their tombstones (each tombstone keeps its last seq for good). Every
   * write compares what it read, so a sweep racing an append or a deletion (from any instance)
   * leaves their writes alone. Resolves when the oldest deletion kept was made (Infinity: none).
   */
  async sweepTombstones(): Promise<number> {
    const now = this.clock.now();
    let oldest = Infinity;
    const end = `${TOMBSTONES.slice(0, -1)}0`;
    let from = TOMBSTONES;
    for (;;) {
      const page = await this.client.range({ key: from, end, limit: this.pageAppends });
      for (const kv of page.kvs) {
        const tomb = tombstoneOf(kv);
        const kept = tomb.deletions.filter((d) => remembered(d, now, this.idempotencyWindowMs));
        for (const d of kept) oldest = Math.min(oldest, d.deletedAt);
        if (kept.length === tomb.deletions.length) continue;
        await this.forgetDeletedKeys(sessionOfTombstone(kv.key), tomb, kept);
        await this.client.txn({
          compare: [compare.mod(kv.key, "==", kv.modRevision)],
          success: [op.put(kv.key, JSON.stringify({ lastSeq: tomb.lastSeq, deletions: kept }))],
        });
      }
      const last = page.kvs.at(-1);
      if (!page.more || last === undefined) return oldest;
      from = `${last.key}\0`;
    }
  }

  /** Deletes the records under `i/` of the session's deleted incarnations but those of the `kept` deletions. */
  private async forgetDeletedKeys(sessionId: string, tomb: TombstoneValue, kept: readonly Deletion[]): Promise<void> {
    const prefix = idempotencyPrefix(sessionId);
    const end = `${prefix.slice(0, -1)}0`;
    let from = prefix;
    for (;;) {
      const page = await this.client.range({ key: from, end, limit: this.pageAppends });
      for (const kv of page.kvs) {
        const record = json(kv)!;
        const lastSeq = Number(record.lastSeq);
        const firstSeq = Number(record.firstSeq ?? record.lastSeq);
        if (record.deletion !== true && lastSeq > tomb.lastSeq) continue; // the live session's
        const key = decodeURIComponent(kv.key.slice(prefix.length));
        const remembered = kept.some((d) =>
          record.deletion === true ? d.lastSeq === lastSeq && d.idempotencyKey === key : d.firstSeq <= firstSeq && lastSeq <= d.lastSeq,
        );
        if (remembered) continue;
        await this.client.txn({ compare: [compare.mod(kv.key, "==", kv.modRevision)], success: [op.delete({ key: kv.key })] });
      }
      const last = page.kvs.at(-1);
      if (!page.more || last === undefined) return;
      from = `${last.key}\0`;
    }
  }

  // ---------------------------------------------------------------- snapshots

  /**
   * The session's state: its cached snapshot (when there is one) with the entries after it applied.
   * A session with no head gets the base snapshot and `exists: false`. With `untilSeq`, the state
   * right after that seq (an earlier append's result).
   */
  async state(sessionId: string, options: { readonly now?: () => number; readonly untilSeq?: number } = {}): Promise<SessionState> {
    const until = options.untilSeq;
    if (until !== undefined) {
      if (!Number.isInteger(until) || until < 1) throw new RangeError(`untilSeq must be a positive seq, got ${until}`);
      return this.rebuild(sessionId, options, until);
    }
    const cachedKv = await this.client.get(snapshotKey(sessionId));
    const cached = json(cachedKv);
    let snapshot = baseSnapshot(sessionId);
    let seq = 0;
    if (cached !== undefined && typeof cached.seq === "number" && cached.snapshot !== null && typeof cached.snapshot === "object") {
      snapshot = { ...snapshot, ...(cached.snapshot as SessionSnapshot) };
      seq = cached.seq;
    }
    const read = await this.read(sessionId, seq + 1);
    // The cache is only written while its incarnation's head lives (see saveSnapshot); a session
    // deleted and re-created since (or a cache ahead of the head) is rebuilt from its first entry.
    if (seq > 0 && (read.incarnation !== BigInt(String(cached?.incarnation ?? -1)) || seq > read.lastSeq)) return this.rebuild(sessionId, options);
    const now = options.now ?? (() => this.clock.now());
    for await (const stored of read.entries()) snapshot = applyEvent(snapshot, stored.entry, { now });
    return {
      sessionId,
      snapshot,
      lastSeq: read.lastSeq,
      exists: read.lastSeq > 0,
      revision: read.revision,
      incarnation: read.incarnation,
      headRevision: read.headRevision,
      deletedThrough: read.deletedThrough,
    };
  }

  /** The state from the first entry, up to `untilSeq` when given. */
  private async rebuild(sessionId: string, options: { readonly now?: () => number }, untilSeq?: number): Promise<SessionState> {
    const read = await this.read(sessionId, 1, untilSeq ?? 0);
    const now = options.now ?? (() => this.clock.now());
    let snapshot = baseSnapshot(sessionId);
    for await (const stored of read.entries()) snapshot = applyEvent(snapshot, stored.entry, { now });
    const lastSeq = untilSeq === undefined ? read.lastSeq : Math.min(untilSeq, read.lastSeq);
    return {
      sessionId,
      snapshot,
      lastSeq,
      exists: lastSeq > 0,
      revision: read.revision,
      incarnation: read.incarnation,
      headRevision: read.headRevision,
      deletedThrough: read.deletedThrough,
    };
  }

  /**
   * Caches `snapshot` (the state at `seq` of incarnation `incarnation`) under `s/`, only while that
   * incarnation's head still exists: a deleted session's snapshot never outlives it. A snapshot
   * holding numbers JSON cannot write (NaN, ±Infinity) is not cached: it is rebuilt when needed.
   * Resolves false when nothing was written.
   */
  async saveSnapshot(sessionId: string, state: { readonly seq: number; readonly incarnation: bigint; readonly snapshot: SessionSnapshot }): Promise<boolean> {
    if (state.seq <= 0 || state.incarnation <= 0n) return false;
    let exact = true;
    const text = JSON.stringify({ seq: state.seq, incarnation: String(state.incarnation), snapshot: state.snapshot }, (_key, value: unknown) => {
      if (typeof value === "number" && (!Number.isFinite(value) || Object.is(value, -0))) exact = false;
      return value;
    });
    if (!exact) return false;
    const result = await this.client.txn({
      compare: [compare.create(headKey(sessionId), "==", state.incarnation)],
      success: [op.put(snapshotKey(sessionId), text)],
    });
    return result.succeeded;
  }
}

// ---------------------------------------------------------------- decoding

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

function headOf(kv: KeyValue | undefined, tomb: TombstoneValue): Head {
  if (kv === undefined) return { ...NO_HEAD, tomb };
  const value = json(kv);
  const seq = value?.seq;
  if (typeof seq !== "number" || !Number.isInteger(seq) || seq < 0)
    throw new BerthError("internal", `the head of ${kv.key} in etcd does not decode`, {}, { reason: "JOURNAL_DAMAGED" });
  // Heads written before incarnations kept their first seq started at 1 (or after the tombstone).
  const first = typeof value?.b === "number" ? value.b : tomb.lastSeq + 1;
  return { seq, mod: kv.modRevision, create: kv.createRevision, first, tomb };
}

/** A head's value: the last seq, the entries of the last append, its write id, and the incarnation's first seq. */
function headValue(seq: number, entries: number, first: number): string {
  return JSON.stringify({ seq, n: entries, w: randomUUID(), b: first });
}

function tombstoneOf(kv: KeyValue | undefined): TombstoneValue {
  if (kv === undefined) return NO_TOMBSTONE;
  const value = json(kv);
  const lastSeq = value?.lastSeq;
  if (typeof lastSeq !== "number" || !Number.isInteger(lastSeq) || lastSeq < 0 || !Array.isArray(value?.deletions))
    throw new BerthError("internal", `the tombstone ${kv.key} in etcd does not decode`, {}, { reason: "JOURNAL_DAMAGED" });
  return { mod: kv.modRevision, lastSeq, deletions: value.deletions as Deletion[] };
}

/** The answer to a retry whose idempotency key is already in etcd. */
function duplicate(sessionId: string, ikey: string, kv: KeyValue, digest: string | undefined, revision = kv.modRevision): EtcdAppendResult {
  const record = json(kv)!;
  const firstSeq = Number(record.firstSeq);
  const lastSeq = Number(record.lastSeq);
  if (digest !== undefined && typeof record.digest === "string" && record.digest !== digest) throw keyReused(sessionId, ikey, { firstSeq, lastSeq });
  return { firstSeq, lastSeq, entries: [], revision, duplicate: true, incarnation: 0n, created: false };
}

// ---------------------------------------------------------------- refusals the file store has no need of

/** A fence whose token no longer holds the lock: etcd refused the write with it. */
export function fenceRejected(fence: Pick<EtcdFence, "file" | "token">, currentToken: bigint): BerthError {
  const now = currentToken === 0n ? "nobody holds it now" : `it is held with fencing token ${currentToken} now`;
  return new BerthError(
    "failed_precondition",
    `fence: fencing token ${fence.token} no longer holds the lock of ${fence.file} (${now}); nothing was written`,
    { file: fence.file, fencingToken: String(fence.token), currentToken: Number(currentToken) },
    { reason: "FENCE_REJECTED" },
  );
}

function appendTooLarge(sessionId: string, bytes: number, limit: number): BerthError {
  return new BerthError(
    "invalid_argument",
    `events: the append to session ${sessionId} is ${bytes} bytes as journal lines, over what one etcd request carries (etcd's --max-request-bytes, ${limit} bytes by --etcd-max-request-bytes, less room for the head): split the append`,
    {
      field: "events",
      rule: `at most ${limit - REQUEST_OVERHEAD_BYTES} bytes per append (etcd's --max-request-bytes, less room for the head)`,
      limit: limit - REQUEST_OVERHEAD_BYTES,
      size: bytes,
    },
    { reason: EtcdReason.REQUEST_TOO_LARGE },
  );
}

/** etcd refused an append's size that berth's check let through: its `--max-request-bytes` is lower than berth was told. */
function appendRefusedByEtcd(sessionId: string, bytes: number, told: number, refusal: BerthError): BerthError {
  return new BerthError(
    "invalid_argument",
    `events: etcd refused the append to session ${sessionId} (${bytes} bytes as journal lines) as larger than one request may be: its --max-request-bytes is below the ${told} bytes berth was told (--etcd-max-request-bytes). Split the append, and give berth etcd's limit`,
    {
      field: "events",
      rule: `at most etcd's --max-request-bytes, less room for the head (below the ${told} bytes of --etcd-max-request-bytes)`,
      size: bytes,
      ...(typeof refusal.details?.etcd === "string" ? { etcd: refusal.details.etcd } : {}),
    },
    { reason: EtcdReason.REQUEST_TOO_LARGE },
  );
}
