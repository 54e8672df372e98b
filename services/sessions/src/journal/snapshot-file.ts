/**
 * The snapshot file `<id>.snapshot.json`: a cache of a session's derived state, in the seed's
 * format. Besides the snapshot it holds `__journalBytes` (the journal's size when it was written)
 * and `__nextSeq`. The journal is append-only, so a file whose `__journalBytes` equals the
 * journal's current size provably describes it; anything else is ignored and the journal replayed.
 * Both berth and the seed's store follow that rule, so either can hydrate from the other's file.
 *
 * berth goes one step further with a file of its own beside it, `<id>.snapshot.meta.json` (the
 * sidecar): the CRC-32 of the snapshot file's bytes and of the journal's line ending at
 * `__journalBytes`, and where the snapshot holds numbers JSON cannot (the seed's `Number()` of a
 * non-numeric value is NaN; the file holds null there). The sidecar tells berth's own file from
 * one the seed's store wrote since, and what berth wrote is read back exactly as it was in memory,
 * so a session evicted and re-opened, or a restart, changes nothing of its snapshot. A snapshot
 * file that is stale — the journal grew since — but whose sidecar still matches it and whose last
 * line is still at that place describes a prefix of the journal (append-only), so berth hydrates
 * from it and replays only the tail. The extra facts live in a separate file because the seed
 * hands every key of the snapshot file but its two to its callers.
 *
 * A current file the seed's store wrote is read with berth's bound on diagnostics: it keeps every
 * diagnostic, so berth keeps the newest {@link MAX_DIAGNOSTICS} and counts them all. If it carries
 * a `diagnosticsTotal`, that count is one berth wrote before the seed's store added entries it
 * knows nothing of: the file is not used, and the journal is replayed.
 */
import * as fs from "node:fs";
import { writeFileAtomic } from "@berth/shared/files";
import { crc32 } from "./journal-format.js";
import type { SessionReducer, SessionSnapshot } from "../reducer.js";

/** The journal size the snapshot describes. */
export const META_JOURNAL_BYTES = "__journalBytes";
/** The next sequence number after the snapshot. */
export const META_NEXT_SEQ = "__nextSeq";

/** A snapshot read back from its file. */
export interface HydratedSnapshot {
  snapshot: SessionSnapshot;
  nextSeq: number;
}

/** A snapshot file describing the first `journalBytes` bytes of a journal that has grown since. */
export interface PrefixSnapshot extends HydratedSnapshot {
  journalBytes: number;
  /** CRC-32 of the journal's line that ends at `journalBytes` (its newline included), when written. */
  lastLineCrc: number;
}

/** A number JSON has no text for, as the sidecar names it. */
type NonJsonNumber = "NaN" | "Infinity" | "-Infinity" | "-0";

/** Where in the snapshot a number JSON wrote as something else (null, or 0 for -0) is, and what it was. */
type NonJsonValue = [path: Array<string | number>, value: NonJsonNumber];

/** What the sidecar file records (see the module comment). */
interface SnapshotSidecar {
  journalBytes: number;
  snapshotCrc: number;
  /** Null when the journal did not end with a whole line at `journalBytes`: no prefix to vouch for. */
  lastLineCrc: number | null;
  /** Absent when there are none. */
  nonJson?: NonJsonValue[];
}

/** The sidecar of the snapshot file at `snapshotFile`: `<id>.snapshot.meta.json`. */
export function sidecarPath(snapshotFile: string): string {
  return `${snapshotFile.replace(/\.json$/, "")}.meta.json`;
}

/** The file's text for `snapshot` at a journal of `journalBytes` bytes. */
export function encodeSnapshotFile(snapshot: SessionSnapshot, meta: { journalBytes: number; nextSeq: number }): string {
  // Compact rather than the seed's pretty-printed JSON: the seed's reader parses either, and this
  // file is written for every session on every flush.
  return `${JSON.stringify({ ...snapshot, [META_JOURNAL_BYTES]: meta.journalBytes, [META_NEXT_SEQ]: meta.nextSeq })}\n`;
}

/**
 * Parses a snapshot file's text, returning null unless it describes the journal of session `id`
 * at exactly `journalBytes` bytes (the seed's rule, including its check of the id: a file copied
 * between sessions must not answer for the wrong one). The snapshot is laid over the base
 * snapshot, as the seed does, so a file written by an older version gains the newer fields.
 */
export function decodeSnapshotFile(text: string, id: string, journalBytes: number, reducer: SessionReducer): HydratedSnapshot | null {
  const decoded = parseSnapshotFile(text, id, reducer, journalBytes);
  return decoded && { snapshot: decoded.snapshot, nextSeq: decoded.nextSeq };
}

/** The file's snapshot, next seq and journal size; null unless well-formed, for session `id` (and at `journalBytes` when given). */
function parseSnapshotFile(text: string, id: string, reducer: SessionReducer, journalBytes?: number): (HydratedSnapshot & { journalBytes: number }) | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return null;
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) return null;
  const record = parsed as Record<string, unknown>;
  const bytes = record[META_JOURNAL_BYTES];
  if (typeof bytes !== "number" || !Number.isSafeInteger(bytes) || bytes < 0) return null;
  if (journalBytes !== undefined && bytes !== journalBytes) return null;
  const nextSeq = record[META_NEXT_SEQ];
  if (typeof nextSeq !== "number" || !Number.isInteger(nextSeq)) return null;
  delete record[META_JOURNAL_BYTES];
  delete record[META_NEXT_SEQ];
  if (record.id !== id) return null;
  return { snapshot: { ...reducer.baseSnapshot(id), ...record } as SessionSnapshot, nextSeq, journalBytes: bytes };
}

/**
 * Reads and checks the snapshot file at `path` (see {@link decodeSnapshotFile}); null when absent
 * or not current. When its sidecar names it, berth wrote it, and it comes back as berth had it in
 * memory (numbers JSON cannot hold included); else the seed's store wrote it last, and it is read
 * as the module comment says — null when its diagnostics count cannot be trusted.
 */
export function readSnapshotFile(path: string, id: string, journalBytes: number, reducer: SessionReducer): HydratedSnapshot | null {
  let bytes: Buffer;
  try {
    bytes = fs.readFileSync(path);
  } catch {
    return null;
  }
  const decoded = decodeSnapshotFile(bytes.toString("utf8"), id, journalBytes, reducer);
  if (!decoded) return null;
  const sidecar = readSidecar(path);
  if (sidecar && sidecar.journalBytes === journalBytes && sidecar.snapshotCrc === crc32(bytes)) {
    restoreNonJson(decoded.snapshot, sidecar.nonJson);
    return decoded;
  }
  const snapshot = boundForeignDiagnostics(decoded.snapshot, reducer.maxDiagnostics);
  return snapshot && { snapshot, nextSeq: decoded.nextSeq };
}

/**
 * A snapshot another writer derived, with berth's bound on diagnostics; null when it carries a
 * `diagnosticsTotal` (berth's, carried past entries the other writer added without counting them).
 */
function boundForeignDiagnostics(snapshot: SessionSnapshot, maxDiagnostics: number): SessionSnapshot | null {
  if (Object.hasOwn(snapshot, "diagnosticsTotal")) return null;
  const diagnostics = snapshot.diagnostics;
  if (!Array.isArray(diagnostics) || diagnostics.length <= maxDiagnostics) return snapshot;
  return { ...snapshot, diagnostics: diagnostics.slice(-maxDiagnostics), diagnosticsTotal: diagnostics.length };
}

function readSidecar(snapshotFile: string): SnapshotSidecar | null {
  try {
    const sidecar = JSON.parse(fs.readFileSync(sidecarPath(snapshotFile), "utf8")) as unknown;
    return sidecar !== null && typeof sidecar === "object" ? (sidecar as SnapshotSidecar) : null;
  } catch {
    return null;
  }
}

/** Where `snapshot` holds numbers JSON would write as something else. */
function nonJsonValues(snapshot: SessionSnapshot): NonJsonValue[] {
  const found: NonJsonValue[] = [];
  const visit = (value: unknown, at: Array<string | number>): void => {
    if (typeof value === "number") {
      if (Number.isNaN(value)) found.push([at, "NaN"]);
      else if (value === Infinity) found.push([at, "Infinity"]);
      else if (value === -Infinity) found.push([at, "-Infinity"]);
      else if (Object.is(value, -0)) found.push([at, "-0"]);
    } else if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i++) visit(value[i], [...at, i]);
    } else if (value !== null && typeof value === "object") {
      for (const key of Object.keys(value)) visit((value as Record<string, unknown>)[key], [...at, key]);
    }
  };
  visit(snapshot, []);
  return found;
}

const NON_JSON_NUMBERS: Record<NonJsonNumber, number> = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity, "-0": -0 };

/** Puts back the numbers `values` names where the file holds what JSON made of them. */
function restoreNonJson(snapshot: SessionSnapshot, values: NonJsonValue[] | undefined): void {
  if (!Array.isArray(values)) return;
  for (const [at, name] of values) {
    if (!Array.isArray(at) || at.length === 0 || !Object.hasOwn(NON_JSON_NUMBERS, name)) continue;
    let parent: unknown = snapshot;
    for (const step of at.slice(0, -1)) parent = parent !== null && typeof parent === "object" ? (parent as Record<string | number, unknown>)[step] : undefined;
    if (parent === null || typeof parent !== "object") continue;
    const key = at[at.length - 1]!;
    const held = (parent as Record<string | number, unknown>)[key];
    if (held === null || held === 0) (parent as Record<string | number, unknown>)[key] = NON_JSON_NUMBERS[name];
  }
}

/**
 * The snapshot file at `path` when it describes a strict prefix of a journal now `journalSize`
 * bytes long, as its sidecar attests: the sidecar's CRC of the snapshot file matches the file
 * (so the file is the one berth wrote with it, not one the seed rewrote since) and names the
 * same journal size. Whether the journal's line ending there is still the one recorded is the
 * caller's check (`lastLineCrc`). Null otherwise.
 */
export function readPrefixSnapshot(path: string, id: string, journalSize: number, reducer: SessionReducer): PrefixSnapshot | null {
  const sidecar = readSidecar(path);
  let bytes: Buffer;
  try {
    bytes = fs.readFileSync(path);
  } catch {
    return null;
  }
  if (sidecar === null) return null;
  const { journalBytes, snapshotCrc, lastLineCrc } = sidecar;
  if (!Number.isSafeInteger(journalBytes) || journalBytes <= 0 || journalBytes >= journalSize) return null;
  if (typeof lastLineCrc !== "number" || !Number.isInteger(lastLineCrc) || crc32(bytes) !== snapshotCrc) return null;
  const decoded = parseSnapshotFile(bytes.toString("utf8"), id, reducer, journalBytes);
  if (!decoded) return null;
  restoreNonJson(decoded.snapshot, sidecar.nonJson);
  return { ...decoded, lastLineCrc };
}

/**
 * Writes the snapshot file atomically (temp file, fsync, rename, fsync of the directory): a
 * reader — berth after a crash, or the seed's store — sees the old file or the new one, never a
 * half-written one that would force it to replay. The sidecar follows, naming this very file by
 * its CRC: a crash between the two leaves a sidecar that matches no file, which is ignored (the
 * file is then read as one the seed wrote). `lastLineCrc` is given when the journal ends with a
 * whole line at `journalBytes`; without it the sidecar vouches for no prefix.
 */
export async function writeSnapshotFile(
  path: string,
  snapshot: SessionSnapshot,
  meta: { journalBytes: number; nextSeq: number; lastLineCrc?: number | undefined },
): Promise<void> {
  const text = encodeSnapshotFile(snapshot, meta);
  const nonJson = nonJsonValues(snapshot);
  await writeFileAtomic(path, text);
  const sidecar: SnapshotSidecar = {
    journalBytes: meta.journalBytes,
    snapshotCrc: crc32(text),
    lastLineCrc: meta.lastLineCrc ?? null,
    ...(nonJson.length > 0 ? { nonJson } : {}),
  };
  await writeFileAtomic(sidecarPath(path), `${JSON.stringify(sidecar)}\n`);
}
