/**
 * Reading one session's journal file: the replay at open (with the repair of a torn tail), the
 * light scan that recovers idempotency keys and seek points when the state came from a snapshot
 * file instead; streaming reads from a sequence number are journal-read.ts. Writing is the write path's (file-appends.ts) and
 * group commit's business; this module only ever cuts a torn tail back.
 */
import { isAscii } from "node:buffer";
import * as fs from "node:fs";
import { confirmStillWritable } from "@berth/shared/files";
import type { Logger } from "@berth/shared/logger";
import {
  BATCH_SIZE_FIELD,
  CHECKSUM_FIELD,
  IDEMPOTENCY_KEY_FIELD,
  crc32Range,
  decodeJournalLine,
  forEachLine,
  isBlankLine,
  type DecodedEntry,
  type DecodedLine,
} from "./journal-format.js";
import { PARALLEL_SCAN_MIN_BYTES, scanWorker, type ScanResults, type ScanWorker } from "./journal-scan.js";
import type { Diagnostic, JournalEntry, SessionReducer, SessionSnapshot } from "../reducer.js";
import type { KeyRecord, StoredEntry } from "./journal-store.js";

/**
 * Seek points of a journal: about every `stride`-th line, the line's seq and byte offset, kept
 * only where the seq is above every seq before it. So every line before a point has a smaller
 * seq, and a read from seq S can start at the last point with seq ≤ S and skip nothing it should
 * return — even in a journal the seed wrote with duplicate or out-of-order seqs. Points are put
 * only where an append starts (never inside an append of several events), so a read from a point
 * sees the first line of every append it returns entries of, and with it the append's key.
 */
export class SeqIndex {
  private seqs: number[] = [];
  private offsets: number[] = [];
  private maxSeq = -Infinity;
  private sinceLast: number;

  constructor(private readonly stride = 256) {
    this.sinceLast = stride;
  }

  /**
   * Records the line at `offset` holding `seq` (lines are noted in file order). `appendStart`
   * false marks a line inside an append of several events: it counts, but is no seek point.
   */
  note(seq: number, offset: number, appendStart = true): void {
    if (seq > this.maxSeq) {
      if (appendStart && this.sinceLast >= this.stride) {
        this.seqs.push(seq);
        this.offsets.push(offset);
        this.sinceLast = 0;
      }
      this.maxSeq = seq;
    }
    this.sinceLast++;
  }

  /** The byte offset a read of entries with seq ≥ `fromSeq` may start at. */
  startFor(fromSeq: number): number {
    let lo = 0;
    let hi = this.seqs.length - 1;
    let found = 0;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (this.seqs[mid]! <= fromSeq) {
        found = this.offsets[mid]!;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return found;
  }

  /** Puts the points of `earlier` (an index of the bytes before this one's) in front of this one's. */
  prepend(earlier: SeqIndex): void {
    const keep = this.seqs.map((seq, i) => [seq, this.offsets[i]!] as const).filter(([seq]) => seq > earlier.maxSeq);
    this.seqs = [...earlier.seqs, ...keep.map(([seq]) => seq)];
    this.offsets = [...earlier.offsets, ...keep.map(([, offset]) => offset)];
    this.maxSeq = Math.max(this.maxSeq, earlier.maxSeq);
  }

  /** How many points are kept (tests). */
  get size(): number {
    return this.seqs.length;
  }
}

/** Options of {@link replayJournalFile}. */
export interface ReplayOptions {
  /**
   * Cut a torn tail back to the last whole entry (ftruncate). Only for the primary file at open:
   * the legacy root is read-only, and a journal that moved under a running store may be in the
   * middle of another process's write.
   */
  repair: boolean;
  /** The rules that fold the entries into the snapshot. */
  reducer: SessionReducer;
  /** Stop after the entry with this seq was applied (used to rebuild an old append's result). */
  stopAfterSeq?: number;
  logger?: Logger;
  /** The reducer's clock, for entries without a usable `ts`. */
  now?: () => number;
  sessionId?: string;
  /**
   * The thread that scans a large journal's lines ahead of the replay (default: the process's
   * one); null to replay on this thread alone.
   */
  scanner?: ScanWorker | null;
}

/** A journal as the replay found it. */
export interface ReplayedJournal {
  snapshot: SessionSnapshot;
  /** max(seq) + 1 over the applied entries, as the seed computes it (1 for an empty journal). */
  nextSeq: number;
  /** Bytes holding whole entries: where the next append goes (equals `fileSize` unless a tail was left). */
  size: number;
  /** The file's size after the replay (and repair): the journal length a snapshot file must record to describe it. */
  fileSize: number;
  mtimeMs: number;
  /** The file does not end with a newline, so the next append must begin with one. */
  needsNewline: boolean;
  keys: Map<string, KeyRecord>;
  index: SeqIndex;
  /** What the repair dropped, when it cut anything. */
  repaired?: { bytesDropped: number; entriesDropped: number; line: number };
}

interface OpenBatch {
  offset: number;
  line: number;
  remaining: number;
  entries: Array<{ entry: Record<string, unknown>; offset: number }>;
  lines: number;
}

/** Appends berth's own diagnostics (after the reducer's) under the reducer's bound of `maxDiagnostics`. */
export function appendDiagnostics(snapshot: SessionSnapshot, added: Diagnostic[], maxDiagnostics: number): SessionSnapshot {
  if (added.length === 0) return snapshot;
  const before = snapshot.diagnostics.length;
  const recorded = typeof snapshot.diagnosticsTotal === "number" && snapshot.diagnosticsTotal >= before ? snapshot.diagnosticsTotal : before;
  const diagnostics = [...snapshot.diagnostics, ...added].slice(-maxDiagnostics);
  const next: SessionSnapshot = { ...snapshot, diagnostics };
  const total = recorded + added.length;
  if (total > maxDiagnostics || Object.hasOwn(snapshot, "diagnosticsTotal")) next.diagnosticsTotal = total;
  return next;
}

function batchSizeOf(entry: Record<string, unknown>): number {
  const n = entry[BATCH_SIZE_FIELD];
  return typeof n === "number" && Number.isInteger(n) && n > 1 ? n : 1;
}

/**
 * Replays the journal at `path` (which must exist) for session `id`, reading it once.
 *
 * - A line that is not JSON is a `journal_parse_failed` diagnostic and the replay goes on, as in the seed.
 * - A line whose checksum does not match is a `journal_checksum_mismatch` diagnostic and its entry
 *   is skipped: it parsed, but its bytes are not the ones written, so any field — the seq, the
 *   phase, a revision — may be wrong, and applying it could move the session to a state nobody
 *   asked for. Skipping it is what the seed does with a line it cannot parse.
 * - The entries of an append of several events (first line `"n": k`) are applied only once all k
 *   lines are there: an append torn by a crash contributes nothing (AppendEvents is all or none).
 * - A torn tail — an unterminated last line that does not parse, or an incomplete append at the
 *   end — is cut back with `repair` (logged, and a `journal_torn_tail_repaired` diagnostic).
 */
export function replayJournalFile(path: string, id: string, options: ReplayOptions): ReplayedJournal {
  let repair = options.repair;
  let fd: number;
  try {
    fd = fs.openSync(path, repair ? "r+" : "r");
  } catch (error) {
    // A read-only state directory (remounted after a disk error, say) is still read: a torn tail
    // is then left in place, unapplied, as for a file berth may not repair.
    if (!repair || !cannotWrite(error)) throw error;
    repair = false;
    fd = fs.openSync(path, "r");
  }
  let scan: ScanResults | undefined;
  try {
    const scanner = options.scanner === null ? undefined : (options.scanner ?? scanWorker());
    const { buf, shared } = readForReplay(fd, scanner);
    const text = isAscii(buf) ? buf.toString("latin1") : undefined;
    if (shared !== undefined) scan = scanner?.start(shared, buf.length, 0);
    const replay = options.reducer.createReplay(id, options.now ? { now: options.now } : {});
    const extraDiagnostics: Diagnostic[] = [];
    const keys = new Map<string, KeyRecord>();
    const index = new SeqIndex();
    let nextSeq = 1;
    let lineNumber = 0;
    let batch: OpenBatch | undefined;
    let stopped = false;

    const apply = (entry: Record<string, unknown>, offset: number, appendStart: boolean): void => {
      replay.apply(entry);
      const seq = entry.seq;
      if (typeof seq === "number" && Number.isInteger(seq)) {
        if (seq + 1 > nextSeq) nextSeq = seq + 1;
        index.note(seq, offset, appendStart);
        const ikey = entry[IDEMPOTENCY_KEY_FIELD];
        if (typeof ikey === "string" && !keys.has(ikey)) keys.set(ikey, { firstSeq: seq, lastSeq: seq + batchSizeOf(entry) - 1 });
        if (seq === options.stopAfterSeq) stopped = true;
      }
    };
    const closeBatch = (): void => {
      if (!batch) return;
      const members = batch.entries;
      for (let i = 0; i < members.length && !stopped; i++) apply(members[i]!.entry, members[i]!.offset, i === 0);
      batch = undefined;
    };
    const onLine = (start: number, _end: number, decoded: DecodedLine): void => {
      if (decoded.kind === "parse_failed") replay.parseFailure(lineNumber, decoded.message);
      else if (decoded.kind === "checksum_mismatch") {
        extraDiagnostics.push({ error: "journal_checksum_mismatch", line: lineNumber, message: decoded.message });
      }
      if (batch) {
        batch.lines++;
        batch.remaining--;
        if (decoded.kind === "entry") batch.entries.push({ entry: decoded.entry, offset: start });
        if (batch.remaining === 0) closeBatch();
        return;
      }
      if (decoded.kind !== "entry") return;
      const n = batchSizeOf(decoded.entry);
      if (n > 1) {
        batch = { offset: start, line: lineNumber, remaining: n - 1, entries: [{ entry: decoded.entry, offset: start }], lines: 1 };
      } else apply(decoded.entry, start, true);
    };

    const tailStart = forEachLine(buf, 0, (start, end) => {
      const scanned = scan?.take(lineNumber, start);
      lineNumber++;
      if (stopped || isBlankLine(buf, start, end)) return;
      onLine(start, end, decodeJournalLine(buf, start, end, text, scanned));
    });
    scan?.finish();
    scan = undefined;

    // The unterminated rest of the file: a whole entry written without its newline (kept; the next
    // append starts with a newline) or a line torn by a crash (cut back).
    let cut = buf.length;
    let tornLine: number | undefined;
    let needsNewline = false;
    if (tailStart < buf.length && !stopped) {
      lineNumber++;
      const decoded = isBlankLine(buf, tailStart, buf.length) ? undefined : decodeJournalLine(buf, tailStart, buf.length, text);
      if (decoded === undefined || decoded.kind === "entry") {
        if (decoded) onLine(tailStart, buf.length, decoded);
        needsNewline = true;
      } else {
        cut = tailStart;
        tornLine = lineNumber;
      }
    }
    let entriesDropped = 0;
    if (batch && !stopped) {
      // An append of several events that did not reach the disk whole: none of it counts.
      cut = batch.offset;
      tornLine = batch.line;
      entriesDropped = batch.entries.length;
      needsNewline = false;
      batch = undefined;
    }

    let fileSize = buf.length;
    let repaired: ReplayedJournal["repaired"];
    if (cut < buf.length && !stopped) {
      const bytesDropped = buf.length - cut;
      if (repair && !cutBack(fd, cut)) {
        repair = false;
        options.logger?.warn(
          { sessionId: options.sessionId ?? id, path },
          "journal ends in a torn write, but the state directory is not writable: left as it is, unapplied",
        );
      }
      if (repair) {
        fileSize = cut;
        needsNewline = false;
        repaired = { bytesDropped, entriesDropped, line: tornLine ?? lineNumber };
        extraDiagnostics.push({ error: "journal_torn_tail_repaired", line: repaired.line, bytesDropped, entriesDropped });
        options.logger?.warn(
          { sessionId: options.sessionId ?? id, path, bytesDropped, entriesDropped, line: repaired.line },
          "journal ended in a torn write (a crash mid-append); cut it back to the last whole entry",
        );
      } else {
        // Left in place (read-only file, or possibly another process's write in progress); the
        // next append of ours must not glue its first line to these bytes.
        needsNewline = buf[buf.length - 1] !== 0x0a;
      }
    }
    const mtimeMs = fs.fstatSync(fd).mtimeMs;
    const snapshot = appendDiagnostics(replay.snapshot(), extraDiagnostics, options.reducer.maxDiagnostics);
    return { snapshot, nextSeq, size: cut, fileSize, mtimeMs, needsNewline, keys, index, ...(repaired ? { repaired } : {}) };
  } finally {
    scan?.finish();
    fs.closeSync(fd);
  }
}

/**
 * The whole file; in a SharedArrayBuffer when it is large enough for `scanner` to scan it
 * alongside the replay and `scanner` can take it now (files of 2 GiB and more are read as before).
 */
function readForReplay(fd: number, scanner: ScanWorker | undefined): { buf: Buffer; shared?: SharedArrayBuffer } {
  const size = fs.fstatSync(fd).size;
  if (scanner === undefined || size < PARALLEL_SCAN_MIN_BYTES || size >= 2 ** 31 || !scanner.available()) return { buf: fs.readFileSync(fd) };
  const shared = new SharedArrayBuffer(size);
  const view = new Uint8Array(shared);
  let read = 0;
  while (read < size) {
    const n = fs.readSync(fd, view, read, size - read, read);
    if (n === 0) break; // cut short under us: replay what is there
    read += n;
  }
  return { buf: Buffer.from(shared, 0, read), shared };
}

const SEQ_PREFIX = Buffer.from('{"seq":', "latin1");
const IKEY_NEEDLE = Buffer.from(`"${IDEMPOTENCY_KEY_FIELD}":`, "latin1");
const BATCH_NEEDLE = Buffer.from(`,"${BATCH_SIZE_FIELD}":`, "latin1");

function startsWithSeqPrefix(buf: Buffer, start: number): boolean {
  for (let i = 0; i < SEQ_PREFIX.length; i++) if (buf[start + i] !== SEQ_PREFIX[i]) return false;
  return true;
}

/** The integer right after `{"seq":`, or undefined. */
function leadingSeq(buf: Buffer, start: number, end: number): number | undefined {
  let i = start + SEQ_PREFIX.length;
  let value = 0;
  let digits = 0;
  for (; i < end; i++) {
    const c = buf[i]!;
    if (c < 0x30 || c > 0x39) break;
    value = value * 10 + (c - 0x30);
    digits++;
  }
  return digits > 0 && digits < 16 && buf[i] === 0x2c ? value : undefined;
}

/**
 * The idempotency keys and seek points of the first `end` bytes of a journal, without parsing
 * every entry: the seq is read from the `{"seq":N,` prefix every seed or berth line starts with,
 * and only lines holding `"ikey":` or `,"n":` somewhere are parsed (to tell berth's top-level
 * fields from event fields of those names). This is what makes hydrating from a snapshot file
 * cheap: the keys and seek points are recovered by this scan on the first keyed append or read,
 * not at open.
 */
export function scanJournalPrefix(path: string, end: number): { keys: Map<string, KeyRecord>; index: SeqIndex } {
  const keys = new Map<string, KeyRecord>();
  const index = new SeqIndex();
  if (end <= 0) return { keys, index };
  const buf = Buffer.alloc(end);
  const fd = fs.openSync(path, "r");
  try {
    let read = 0;
    while (read < end) {
      const n = fs.readSync(fd, buf, read, end - read, read);
      if (n === 0) break;
      read += n;
    }
  } finally {
    fs.closeSync(fd);
  }
  let nextKeyAt = buf.indexOf(IKEY_NEEDLE);
  let nextBatchAt = buf.indexOf(BATCH_NEEDLE);
  // Lines still to come of an append of several events (the replay's rule: the next n-1 lines).
  let batchLeft = 0;
  forEachLine(buf, 0, (start, stop) => {
    const hasKey = nextKeyAt >= 0 && nextKeyAt < stop;
    if (hasKey) nextKeyAt = buf.indexOf(IKEY_NEEDLE, stop);
    const mayStartBatch = nextBatchAt >= 0 && nextBatchAt < stop;
    if (mayStartBatch) nextBatchAt = buf.indexOf(BATCH_NEEDLE, stop);
    if (isBlankLine(buf, start, stop)) return;
    const inBatch = batchLeft > 0;
    if (inBatch) batchLeft--;
    let seq = startsWithSeqPrefix(buf, start) ? leadingSeq(buf, start, stop) : undefined;
    if (hasKey || mayStartBatch || seq === undefined) {
      const decoded = decodeJournalLine(buf, start, stop);
      if (decoded.kind !== "entry") return;
      const entrySeq = decoded.entry.seq;
      if (typeof entrySeq !== "number" || !Number.isInteger(entrySeq)) return;
      seq = entrySeq;
      const size = batchSizeOf(decoded.entry);
      if (!inBatch && size > 1) batchLeft = size - 1;
      const ikey = decoded.entry[IDEMPOTENCY_KEY_FIELD];
      if (typeof ikey === "string" && !keys.has(ikey)) keys.set(ikey, { firstSeq: seq, lastSeq: seq + size - 1 });
    }
    index.note(seq, start, !inBatch);
  });
  return { keys, index };
}

/** The entry as readers see it: the seed's fields (and any foreign extras), without berth's bookkeeping. */
export function toReaderEntry(raw: Record<string, unknown>): JournalEntry {
  const { [CHECKSUM_FIELD]: _crc, [IDEMPOTENCY_KEY_FIELD]: _ikey, [BATCH_SIZE_FIELD]: _n, ...rest } = raw;
  return rest as JournalEntry;
}

/**
 * Follows appends through the lines of a journal read in file order: whether a line starts an
 * append (or sits inside an append of several events, whose first line says `"n": k`: the next
 * k-1 lines, as the replay counts them), and the idempotency key its entry was appended with
 * (written on the append's first line only). Start it at an append boundary — the start of the
 * file or a seek point.
 */
export class AppendTracker {
  private left = 0;
  private carried: string | undefined;
  /** The key of the line last passed to {@link line}. */
  key: string | undefined;
  /** The number of lines of the append the last line passed to {@link line} starts (1 inside an append). */
  size = 1;

  /** True while lines of an append of several events are still to come. */
  get inAppend(): boolean {
    return this.left > 0;
  }

  /**
   * Takes the next non-blank line (`entry` undefined when it is not an entry: it still counts
   * toward an open append's lines). Returns true when the line starts an append.
   */
  line(entry: Record<string, unknown> | undefined): boolean {
    if (this.left > 0) {
      this.left--;
      this.key = this.carried;
      this.size = 1;
      return false;
    }
    const ikey = entry?.[IDEMPOTENCY_KEY_FIELD];
    this.key = typeof ikey === "string" ? ikey : undefined;
    this.size = entry === undefined ? 1 : batchSizeOf(entry);
    if (this.size > 1) {
      this.left = this.size - 1;
      this.carried = this.key;
    }
    return true;
  }
}

/** The reader's view of a decoded line whose key `tracker` has just worked out. */
export function storedEntry(decoded: DecodedEntry, key: string | undefined): StoredEntry {
  return { entry: toReaderEntry(decoded.entry), idempotencyKey: key, integrity: decoded.checksum === "valid" ? "verified" : "unchecked" };
}

const TAIL_CHUNK_BYTES = 64 * 1024;

/**
 * CRC-32 of the journal's line that ends at byte `end` (its newline included): what a snapshot
 * file's sidecar records to prove, later, that the journal still holds the same bytes there.
 * Undefined when `end` is not just past a newline (the file ends with an unterminated tail) or
 * the file is shorter. Reads backwards from `end` in chunks until the line's start.
 */
export function lastLineCrc(path: string, end: number): number | undefined {
  if (end <= 0) return undefined;
  const fd = fs.openSync(path, "r");
  try {
    const chunks: Buffer[] = [];
    let position = end;
    for (;;) {
      const length = Math.min(TAIL_CHUNK_BYTES, position);
      const chunk = Buffer.allocUnsafe(length);
      let read = 0;
      while (read < length) {
        const n = fs.readSync(fd, chunk, read, length - read, position - length + read);
        if (n === 0) return undefined; // the file is shorter than `end`
        read += n;
      }
      position -= length;
      if (chunks.length === 0 && chunk[length - 1] !== 0x0a) return undefined;
      // The previous line's newline (skipping this line's own, the last byte of the first chunk).
      const searchEnd = chunks.length === 0 ? length - 2 : length - 1;
      const nl = searchEnd >= 0 ? chunk.lastIndexOf(0x0a, searchEnd) : -1;
      if (nl >= 0) {
        chunks.unshift(chunk.subarray(nl + 1));
        break;
      }
      chunks.unshift(chunk);
      if (position === 0) break;
    }
    let crc = 0;
    for (const chunk of chunks) crc = crc32Range(chunk, 0, chunk.length, crc);
    return crc;
  } finally {
    fs.closeSync(fd);
  }
}

/** True for the errors of a file that may be read but not written (a read-only file system, permissions). */
function cannotWrite(error: unknown): boolean {
  const code = (error as NodeJS.ErrnoException).code;
  return code === "EROFS" || code === "EACCES" || code === "EPERM";
}

/** Cuts the file open at `fd` back to `size` and syncs it; false when the file system does not allow it. */
function cutBack(fd: number, size: number): boolean {
  try {
    fs.ftruncateSync(fd, size);
    fs.fsyncSync(fd);
    confirmStillWritable(fd);
    return true;
  } catch (error) {
    if (cannotWrite(error)) return false;
    throw error;
  }
}
