/**
 * The snapshot file `<id>.snapshot.json`: a cache of a session's derived state, in the seed's
 * format. Besides the snapshot it holds `__journalBytes` (the journal's size when it was written)
 * and `__nextSeq`. The journal is append-only, so a file whose `__journalBytes` equals the
 * journal's current size provably describes it; anything else is ignored and the journal replayed.
 * Both berth and the seed's store follow that rule, so either can hydrate from the other's file.
 */
import * as fs from "node:fs";
import { writeFileAtomic } from "@berth/shared/files";
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
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return null;
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) return null;
  const record = parsed as Record<string, unknown>;
  if (record[META_JOURNAL_BYTES] !== journalBytes) return null;
  const nextSeq = record[META_NEXT_SEQ];
  if (typeof nextSeq !== "number" || !Number.isInteger(nextSeq)) return null;
  delete record[META_JOURNAL_BYTES];
  delete record[META_NEXT_SEQ];
  if (record.id !== id) return null;
  return { snapshot: { ...baseSnapshot(id), ...record } as SessionSnapshot, nextSeq };
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
 * Writes the snapshot file atomically (temp file, fsync, rename, fsync of the directory): a
 * reader — berth after a crash, or the seed's store — sees the old file or the new one, never a
 * half-written one that would force it to replay.
 */
export async function writeSnapshotFile(
  path: string,
  snapshot: SessionSnapshot,
  meta: { journalBytes: number; nextSeq: number },
): Promise<void> {
  await writeFileAtomic(path, encodeSnapshotFile(snapshot, meta));
}
