/**
 * Reading a session's journal file straight from the disk, independently of the service's reader,
 * so a suite can hold the file itself to DESIGN.md's promises: every line is JSON, every berth line
 * carries a matching CRC-32 (`"crc"`, last field, of the line's bytes without it), an append of
 * several events (`"n": k` on its first line) is whole, and what a crash left unfinished at the
 * end is recognised as a torn tail rather than taken for an entry.
 */
import { readFileSync } from "node:fs";
import { crc32Hex } from "@berth/sessions/journal/journal-format";

/** One whole line of a journal that parsed as a JSON object. */
export interface JournalFileLine {
  /** 1-based, counting every line of the file (blank ones too), as the service's diagnostics do. */
  readonly line: number;
  /** Byte offset of the line's first byte. */
  readonly offset: number;
  /** The parsed line: the seed's `{seq,id,type,ts,event}` plus berth's `ikey`, `n` and `crc`. */
  readonly fields: Record<string, unknown>;
  readonly seq: unknown;
  /** The idempotency key of the append this line belongs to (batch members inherit the first line's). */
  readonly key: string | undefined;
  /** `valid`, `absent` (a line the seed wrote) or `mismatch` (the bytes are not the ones written). */
  readonly checksum: "valid" | "absent" | "mismatch";
}

/** A line that is not a JSON object. */
export interface JournalFileProblem {
  readonly line: number;
  readonly problem: string;
}

/** What is at the end of the file after the last whole append, if anything. */
export interface TornTail {
  /** Where the whole appends end: the size the service must cut the file back to at open. */
  readonly keepBytes: number;
  readonly droppedBytes: number;
  /** Whole lines of an incomplete append of several events (0 for a half-written line alone). */
  readonly droppedLines: number;
}

/** A journal file as read from the disk. */
export interface JournalFile {
  readonly size: number;
  /** Whole lines of whole appends, in file order. */
  readonly lines: readonly JournalFileLine[];
  /** Lines in the middle that do not parse. */
  readonly unparsable: readonly JournalFileProblem[];
  /** An unfinished write at the end (a crash mid-append), or undefined when the file ends cleanly. */
  readonly torn: TornTail | undefined;
  /** The file ends with a whole entry but no newline (kept by the service; the next append adds one). */
  readonly unterminated: boolean;
}

// `,"crc":"` + 8 hex digits + `"}`.
const CRC_SUFFIX = /,"crc":"([0-9a-f]{8})"\}$/;
const CRC_SUFFIX_LENGTH = 18;

/** The checksum verdict of one line's text (without its newline). */
export function lineChecksum(text: string): JournalFileLine["checksum"] {
  const match = CRC_SUFFIX.exec(text);
  if (!match) return "absent";
  const canonical = `${text.slice(0, -CRC_SUFFIX_LENGTH)}}`;
  return crc32Hex(canonical) === match[1] ? "valid" : "mismatch";
}

function parseObject(text: string): Record<string, unknown> | string {
  try {
    const value: unknown = JSON.parse(text);
    if (typeof value === "object" && value !== null && !Array.isArray(value)) return value as Record<string, unknown>;
    return `not an object: ${text.slice(0, 60)}`;
  } catch (error) {
    return (error as Error).message;
  }
}

function batchSize(fields: Record<string, unknown>): number {
  const n = fields.n;
  return typeof n === "number" && Number.isInteger(n) && n > 1 ? n : 1;
}

/** Reads and checks the journal at `path` (which must exist). */
export function readJournalFile(path: string): JournalFile {
  const bytes = readFileSync(path);
  const lines: JournalFileLine[] = [];
  const unparsable: JournalFileProblem[] = [];
  // The append being collected: its first line's offset, how many lines it still needs, its lines.
  let open: { offset: number; remaining: number; members: JournalFileLine[] } | undefined;
  let position = 0;
  let lineNumber = 0;
  let torn: TornTail | undefined;
  let unterminated = false;

  while (position < bytes.length) {
    const newline = bytes.indexOf(0x0a, position);
    const end = newline < 0 ? bytes.length : newline;
    const offset = position;
    position = newline < 0 ? bytes.length : newline + 1;
    lineNumber++;
    const text = bytes.subarray(offset, end).toString("utf8");
    if (text.trim() === "") continue;
    const parsed = parseObject(text);
    if (typeof parsed === "string") {
      if (newline < 0) {
        // A half-written last line: everything from the append it belongs to on is torn.
        const keepBytes = open?.offset ?? offset;
        torn = { keepBytes, droppedBytes: bytes.length - keepBytes, droppedLines: open?.members.length ?? 0 };
        open = undefined;
        break;
      }
      unparsable.push({ line: lineNumber, problem: parsed });
      if (open && --open.remaining === 0) {
        lines.push(...open.members);
        open = undefined;
      }
      continue;
    }
    if (newline < 0) unterminated = true;
    const first = open === undefined;
    const key = first ? (typeof parsed.ikey === "string" ? parsed.ikey : undefined) : open!.members[0]?.key;
    const entry: JournalFileLine = { line: lineNumber, offset, fields: parsed, seq: parsed.seq, key, checksum: lineChecksum(text) };
    if (open) {
      open.members.push(entry);
      if (--open.remaining === 0) {
        lines.push(...open.members);
        open = undefined;
      }
    } else if (batchSize(parsed) > 1) {
      open = { offset, remaining: batchSize(parsed) - 1, members: [entry] };
    } else lines.push(entry);
  }
  if (open) {
    torn = { keepBytes: open.offset, droppedBytes: bytes.length - open.offset, droppedLines: open.members.length };
    unterminated = false;
  }
  return { size: bytes.length, lines, unparsable, torn, unterminated };
}

/** The line's fields without berth's own bookkeeping (`crc`, `ikey`, `n`): the entry the reducer sees. */
export function entryOf(line: JournalFileLine): Record<string, unknown> {
  const { crc: _crc, ikey: _ikey, n: _n, ...entry } = line.fields;
  return entry;
}
