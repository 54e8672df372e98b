/**
 * Streaming reads of one session's journal file from a sequence number: in chunks, each opening the
 * file for a moment, with the key each entry was appended with and its checksum verdict.
 */
import * as fs from "node:fs";
import { retryAfterRelief } from "@berth/shared/descriptors";
import { AppendTracker, storedEntry } from "./journal-file.js";
import { decodeJournalLine, forEachLine, isBlankLine } from "./journal-format.js";
import type { StoredEntry } from "./journal-store.js";

/** Options of {@link readJournalEntries}. */
export interface ReadRange {
  /** Entries with seq ≥ this (integer seqs only; lines without one are not entries a reader can resume from). */
  fromSeq: number;
  /** At most this many entries (0 or undefined: no limit). */
  limit?: number;
  /** The byte offset to start at (an append boundary, from {@link SeqIndex.startFor}). */
  start: number;
  /** Read no further than this offset: the durable end of the journal when the read began. */
  end: number;
}

const READ_CHUNK_BYTES = 64 * 1024;

/** The journal a read started on was removed, or replaced by another file under its name, before the read ended. */
export class JournalReplacedError extends Error {
  override name = "JournalReplacedError";
}

/**
 * Streams the entries of `path` in file order, with the key each was appended with and its
 * checksum verdict, skipping damaged and unparsable lines (they are diagnostics of the snapshot,
 * not entries). Reads in chunks, so a long journal is never held in memory.
 *
 * Each chunk opens the file, reads and closes it at once: a reader waiting on its consumer (a
 * watcher's backlog to a slow client, thousands of them) holds no descriptor, so readers never
 * take the descriptors appends and connections need, however many there are. A chunk that finds
 * another file under the name (the session deleted and begun again) ends the read with
 * {@link JournalReplacedError}: the bytes it still had to read are gone.
 */
export async function* readJournalEntries(path: string, range: ReadRange): AsyncGenerator<StoredEntry, void, undefined> {
  const limit = range.limit && range.limit > 0 ? range.limit : Infinity;
  if (limit === 0 || range.end <= range.start) return;
  /** The file the read started on: its inode, and its birth time (an inode number is reused at once for a new file). */
  let identity: string | undefined;
  /** Up to `chunk.length` bytes at `position`; undefined when the journal never existed. */
  const readChunk = (chunk: Buffer, position: number): number | undefined => {
    let fd: number;
    try {
      fd = fs.openSync(path, "r");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      if (identity === undefined) return undefined;
      throw new JournalReplacedError(`${path} was removed while it was read`);
    }
    try {
      const { dev, ino, birthtimeNs } = fs.fstatSync(fd, { bigint: true });
      const file = `${dev}:${ino}:${birthtimeNs}`;
      identity ??= file;
      if (file !== identity) throw new JournalReplacedError(`${path} was replaced while it was read`);
      let read = 0;
      while (read < chunk.length) {
        const n = fs.readSync(fd, chunk, read, chunk.length - read, position + read);
        if (n === 0) break;
        read += n;
      }
      return read;
    } finally {
      fs.closeSync(fd);
    }
  };
  const appends = new AppendTracker();
  const take = (buf: Buffer, start: number, end: number, out: StoredEntry[]): void => {
    if (isBlankLine(buf, start, end)) return;
    const decoded = decodeJournalLine(buf, start, end);
    appends.line(decoded.kind === "entry" ? decoded.entry : undefined);
    if (decoded.kind !== "entry") return;
    const seq = decoded.entry.seq;
    if (typeof seq !== "number" || !Number.isInteger(seq) || seq < range.fromSeq) return;
    out.push(storedEntry(decoded, appends.key));
  };
  let position = range.start;
  let carry: Buffer = Buffer.alloc(0);
  let yielded = 0;
  while (position < range.end) {
    const chunk = Buffer.allocUnsafe(Math.min(READ_CHUNK_BYTES, range.end - position));
    const bytesRead = retryAfterRelief(() => readChunk(chunk, position));
    if (bytesRead === undefined || bytesRead === 0) break;
    position += bytesRead;
    const buf = carry.length > 0 ? Buffer.concat([carry, chunk.subarray(0, bytesRead)]) : chunk.subarray(0, bytesRead);
    const entries: StoredEntry[] = [];
    const rest = forEachLine(buf, 0, (start, end) => take(buf, start, end, entries));
    carry = Buffer.from(buf.subarray(rest));
    for (const entry of entries) {
      yield entry;
      if (++yielded >= limit) return;
    }
  }
  // A last entry without its newline (a journal another writer left so) is still an entry.
  if (carry.length > 0) {
    const last: StoredEntry[] = [];
    take(carry, 0, carry.length, last);
    if (last[0] !== undefined) yield last[0];
  }
}
