/**
 * The snapshot file `<id>.snapshot.json`: a cache of a session's derived state, in the seed's
 * format. Besides the snapshot it holds `__journalBytes` (the journal's size when it was written)
 * and `__nextSeq`. The journal is append-only, so a file whose `__journalBytes` equals the
 * journal's current size provably describes it; anything else is ignored and the journal replayed.
 * Both berth and the seed's store follow that rule, so either can hydrate from the other's file.
 *
 * berth goes one step further with a file of its own beside it, `<id>.snapshot.meta.json` (the
 * sidecar): the CRC-32 of the snapshot file's bytes and of the journal's line ending at
 * `__journalBytes`. A snapshot file that is stale — the journal grew since — but whose sidecar
 * still matches it and whose last line is still at that place describes a prefix of the journal
 * (append-only), so berth hydrates from it and replays only the tail. The extra facts live in a
 * separate file because the seed hands every key of the snapshot file but its two to its callers.
 */
import * as fs from "node:fs";
import { writeFileAtomic } from "@berth/shared/files";
import { crc32 } from "./journal-format.js";
import { baseSnapshot, type SessionSnapshot } from "./reducer.js";

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

/** What the sidecar file records (see the module comment). */
interface SnapshotSidecar {
  journalBytes: number;
  snapshotCrc: number;
  lastLineCrc: number;
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
export function decodeSnapshotFile(text: string, id: string, journalBytes: number): HydratedSnapshot | null {
  const decoded = parseSnapshotFile(text, id, journalBytes);
  return decoded && { snapshot: decoded.snapshot, nextSeq: decoded.nextSeq };
}

/** The file's snapshot, next seq and journal size; null unless well-formed, for session `id` (and at `journalBytes` when given). */
function parseSnapshotFile(text: string, id: string, journalBytes?: number): (HydratedSnapshot & { journalBytes: number }) | null {
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
  return { snapshot: { ...baseSnapshot(id), ...record } as SessionSnapshot, nextSeq, journalBytes: bytes };
}

/** Reads and checks the snapshot file at `path` (see {@link decodeSnapshotFile}); null when absent or not current. */
export function readSnapshotFile(path: string, id: string, journalBytes: number): HydratedSnapshot | null {
  let text: string;
  try {
    text = fs.readFileSync(path, "utf8");
  } catch {
    return null;
  }
  return decodeSnapshotFile(text, id, journalBytes);
}

/**
 * The snapshot file at `path` when it describes a strict prefix of a journal now `journalSize`
 * bytes long, as its sidecar attests: the sidecar's CRC of the snapshot file matches the file
 * (so the file is the one berth wrote with it, not one the seed rewrote since) and names the
 * same journal size. Whether the journal's line ending there is still the one recorded is the
 * caller's check (`lastLineCrc`). Null otherwise.
 */
export function readPrefixSnapshot(path: string, id: string, journalSize: number): PrefixSnapshot | null {
  let sidecar: SnapshotSidecar;
  let bytes: Buffer;
  try {
    sidecar = JSON.parse(fs.readFileSync(sidecarPath(path), "utf8")) as SnapshotSidecar;
    bytes = fs.readFileSync(path);
  } catch {
    return null;
  }
  if (sidecar === null || typeof sidecar !== "object") return null;
  const { journalBytes, snapshotCrc, lastLineCrc } = sidecar;
  if (!Number.isSafeInteger(journalBytes) || journalBytes <= 0 || journalBytes >= journalSize) return null;
  if (!Number.isInteger(lastLineCrc) || crc32(bytes) !== snapshotCrc) return null;
  const decoded = parseSnapshotFile(bytes.toString("utf8"), id, journalBytes);
  return decoded && { ...decoded, lastLineCrc };
}

/**
 * Writes the snapshot file atomically (temp file, fsync, rename, fsync of the directory): a
 * reader — berth after a crash, or the seed's store — sees the old file or the new one, never a
 * half-written one that would force it to replay. With `lastLineCrc` (the journal ends with a
 * whole line at `journalBytes`), the sidecar follows, naming this very file by its CRC: a crash
 * between the two leaves a sidecar that matches no file, which is ignored.
 */
export async function writeSnapshotFile(
  path: string,
  snapshot: SessionSnapshot,
  meta: { journalBytes: number; nextSeq: number; lastLineCrc?: number | undefined },
): Promise<void> {
  const text = encodeSnapshotFile(snapshot, meta);
  await writeFileAtomic(path, text);
  if (meta.lastLineCrc === undefined) return;
  const sidecar: SnapshotSidecar = { journalBytes: meta.journalBytes, snapshotCrc: crc32(text), lastLineCrc: meta.lastLineCrc };
  await writeFileAtomic(sidecarPath(path), `${JSON.stringify(sidecar)}\n`);
}
