/**
 * berth's writes to a journal another process may append to at the same time. The election lock
 * makes berth the only berth on a state directory, but a live directory is shared with seed
 * processes, and the seed takes no lock: it reads the journal, takes max(seq) + 1 and appends with
 * O_APPEND. A line of berth's written after such a line would repeat its seq, so every write of
 * berth's is bracketed, in one synchronous step (see group-commit.ts):
 *
 * 1. before: the journal must still end where berth's last durable byte is ({@link checkJournalEnd});
 *    if it does not, nothing is written;
 * 2. the write (O_APPEND, so it never overwrites anyone's bytes);
 * 3. after: the journal must have grown by exactly berth's bytes, or hold them right at the old
 *    end ({@link checkOwnWrite}). If another writer's line landed between 1 and 2 — two adjacent
 *    system calls — berth's bytes sit after it, with seqs it already took: they are overwritten
 *    in place with spaces (newlines kept), which both the seed's reader and berth's skip as blank
 *    lines, and the append is refused. The file is never cut: the other writer may already have
 *    appended again behind berth's bytes.
 *
 * What no check of berth's can see: a seed process that read the journal before berth's write and
 * appends after it gives its line a seq berth's line already holds — the seed's own read-then-write
 * is not atomic (two seed processes race the same way).
 */
import * as fs from "node:fs";
import { confirmStillWritable } from "@berth/shared/files";

/**
 * What became of berth's bytes when another writer got in: `unwritten` (the check before the
 * write saw it), `blanked` (written after the other line, then blanked), `left` (written, but
 * not found whole again, so left as they are; see {@link checkOwnWrite}).
 */
export type ForeignAppendOutcome = "unwritten" | "blanked" | "left";

/** Another writer appended to the journal around a write of berth's. */
export class ForeignAppendError extends Error {
  constructor(
    readonly expected: number,
    readonly found: number,
    readonly outcome: ForeignAppendOutcome,
  ) {
    super(`the journal is ${found} bytes where ${expected} were expected`);
  }
}

/** Throws {@link ForeignAppendError} (nothing written) unless the file open at `fd` is `expected` bytes long. */
export function checkJournalEnd(fd: number, expected: number): void {
  const size = fs.fstatSync(fd).size;
  if (size !== expected) throw new ForeignAppendError(expected, size, "unwritten");
}

/**
 * Checks that `data`, just appended to the journal at `path` (open at `fd`), landed at offset
 * `expected`. Returns when it did (other lines may follow it: written later, they are another
 * writer's ordinary appends). When another writer's bytes came first, blanks `data` where it
 * landed, syncs that, and throws {@link ForeignAppendError}.
 */
export function checkOwnWrite(fd: number, path: string, expected: number, data: Uint8Array): void {
  const size = fs.fstatSync(fd).size;
  if (size === expected + data.length) return;
  // The journal fd is write-only and O_APPEND (a positioned write on it would append on Linux):
  // read and blank through a second, plain one.
  const rw = fs.openSync(path, "r+");
  try {
    const region = Buffer.alloc(Math.max(0, size - expected));
    let read = 0;
    while (read < region.length) {
      const n = fs.readSync(rw, region, read, region.length - read, expected + read);
      if (n === 0) break;
      read += n;
    }
    const landed = region.subarray(0, read);
    if (landed.subarray(0, data.length).equals(data)) return;
    // Our lines are unique (their seq, time and checksum), so the first match is where they went.
    const at = landed.indexOf(data);
    // Only a write split in pieces (write(2) returning short) with another line between them can
    // leave our bytes nowhere whole; no piece of them is told apart from the other writer's safely.
    if (at < 0) throw new ForeignAppendError(expected, size, "left");
    const blank = Buffer.from(data);
    for (let i = 0; i < blank.length; i++) if (blank[i] !== 0x0a) blank[i] = 0x20;
    try {
      let written = 0;
      while (written < blank.length) written += fs.writeSync(rw, blank, written, blank.length - written, expected + at + written);
      fs.fdatasyncSync(rw);
      confirmStillWritable(rw);
    } catch {
      // Cutting the file back instead (what a failed write gets) would cut the other writer's lines.
      throw new ForeignAppendError(expected, size, "left");
    }
    throw new ForeignAppendError(expected, expected + at, "blanked");
  } finally {
    fs.closeSync(rw);
  }
}
