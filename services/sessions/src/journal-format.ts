/**
 * The journal's line format. A line is the seed's entry `{"seq","id","type","ts","event"}` as one
 * JSON object, followed by fields only berth reads and the seed's reader ignores (it applies
 * `entry.event` and looks at `seq`/`ts`, nothing else):
 *
 * - `ikey`: the idempotency key of the append this line starts (only on the first line of a keyed
 *   append), so a retry is recognised after a restart with no time window;
 * - `n`: how many lines the append wrote (only on the first line of an append of several events),
 *   so an append torn by a crash is recognised — and cut back — as a whole;
 * - `crc`: always last, CRC-32 (8 lowercase hex digits) of the line's bytes without it — the exact
 *   text `JSON.stringify` gave for the other fields. A line that still parses but was damaged
 *   (a flipped bit in a digit, a disk that returned stale bytes) no longer matches.
 */
import * as zlib from "node:zlib";

/** The checksum field's name. */
export const CHECKSUM_FIELD = "crc";
/** The idempotency key field's name (first line of a keyed append). */
export const IDEMPOTENCY_KEY_FIELD = "ikey";
/** The field holding the number of lines an append wrote (first line of a multi-event append). */
export const BATCH_SIZE_FIELD = "n";

/** One journal entry as the seed writes it. */
export interface JournalLineEntry {
  seq: number;
  id: string;
  type: string;
  ts: string;
  event: Record<string, unknown>;
}

/** What berth adds to the first line of an append. */
export interface AppendMarks {
  /** The append's idempotency key. */
  ikey?: string;
  /** The number of lines of the append, when more than one. */
  n?: number;
}

// `,"crc":"` + 8 hex digits + `"}`: the checksum is always the last field, so its bytes sit at a
// fixed distance from the end of the line and can be checked without re-serialising the entry.
const CHECKSUM_PREFIX = Buffer.from(`,"${CHECKSUM_FIELD}":"`, "latin1");
const CHECKSUM_SUFFIX_LENGTH = CHECKSUM_PREFIX.length + 8 + 2;
const CLOSING_BRACE = Buffer.from("}", "latin1");
const NEWLINE = 0x0a;
const CARRIAGE_RETURN = 0x0d;

type Crc32 = (data: string | Uint8Array, value?: number) => number;

// Eight 256-entry tables for slicing-by-8 (IEEE polynomial, reflected, as zlib).
const CRC_TABLES = (() => {
  const tables = new Int32Array(8 * 256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    tables[n] = c;
  }
  for (let n = 0; n < 256; n++) {
    let c = tables[n]!;
    for (let t = 1; t < 8; t++) {
      c = tables[c & 0xff]! ^ (c >>> 8);
      tables[t * 256 + n] = c;
    }
  }
  return tables;
})();

/**
 * CRC-32 of `buf[start, end)`, continuing from `value`. Plain JavaScript, slicing-by-8: at open
 * every line of a journal is checked, and a call into zlib per line (a Buffer view plus the
 * binding's argument checks) cost more than the arithmetic — measured, it made checking 100,000
 * lines two to three times slower than this loop.
 */
export function crc32Range(buf: Uint8Array, start: number, end: number, value = 0): number {
  const t = CRC_TABLES;
  let crc = ~value;
  let i = start;
  for (; i + 8 <= end; i += 8) {
    const one = crc ^ (buf[i]! | (buf[i + 1]! << 8) | (buf[i + 2]! << 16) | (buf[i + 3]! << 24));
    const two = buf[i + 4]! | (buf[i + 5]! << 8) | (buf[i + 6]! << 16) | (buf[i + 7]! << 24);
    crc =
      t[1792 + (one & 0xff)]! ^
      t[1536 + ((one >>> 8) & 0xff)]! ^
      t[1280 + ((one >>> 16) & 0xff)]! ^
      t[1024 + (one >>> 24)]! ^
      t[768 + (two & 0xff)]! ^
      t[512 + ((two >>> 8) & 0xff)]! ^
      t[256 + ((two >>> 16) & 0xff)]! ^
      t[two >>> 24]!;
  }
  for (; i < end; i++) crc = t[(crc ^ buf[i]!) & 0xff]! ^ (crc >>> 8);
  return ~crc >>> 0;
}

/** CRC-32 computed in JavaScript (the same function as zlib's; exported so tests can compare them). */
export function portableCrc32(data: string | Uint8Array, value = 0): number {
  const bytes = typeof data === "string" ? Buffer.from(data, "utf8") : data;
  return crc32Range(bytes, 0, bytes.length, value);
}

// zlib.crc32 appeared in Node 20.15 / 22.2; berth's engines range starts at 20.11.
const nativeCrc32 = (zlib as unknown as { crc32?: Crc32 }).crc32;

/** CRC-32 (IEEE) of `data` (a string is taken as UTF-8), continuing from `value` when given. */
export const crc32: Crc32 = nativeCrc32 ?? portableCrc32;

/** The 8-hex-digit form used in the `crc` field. */
export function crc32Hex(data: string | Uint8Array): string {
  return (crc32(data) >>> 0).toString(16).padStart(8, "0");
}

/**
 * One journal line, newline included. `entry`'s fields are written in the seed's order; the
 * marks follow, then the checksum of everything before it.
 */
export function encodeJournalLine(entry: JournalLineEntry, marks?: AppendMarks): string {
  const line: Record<string, unknown> = { seq: entry.seq, id: entry.id, type: entry.type, ts: entry.ts, event: entry.event };
  if (marks?.ikey !== undefined) line[IDEMPOTENCY_KEY_FIELD] = marks.ikey;
  if (marks?.n !== undefined) line[BATCH_SIZE_FIELD] = marks.n;
  const canonical = JSON.stringify(line);
  return `${canonical.slice(0, -1)},"${CHECKSUM_FIELD}":"${crc32Hex(canonical)}"}\n`;
}

/** A line that decoded to an entry (an object; whether it is a well-formed entry is the reducer's business, as in the seed). */
export interface DecodedEntry {
  kind: "entry";
  entry: Record<string, unknown>;
  /** "absent" for lines written by the seed, which carry no checksum. */
  checksum: "valid" | "absent";
}
/** A line that is not JSON or not an object: the seed's `journal_parse_failed`. */
export interface UnparsableLine {
  kind: "parse_failed";
  message: string;
}
/** A line that parses but whose checksum does not match its bytes. */
export interface DamagedLine {
  kind: "checksum_mismatch";
  message: string;
}
/** The three things a journal line can turn out to be. */
export type DecodedLine = DecodedEntry | UnparsableLine | DamagedLine;

function hasChecksumSuffix(buf: Uint8Array, start: number, end: number): boolean {
  const at = end - CHECKSUM_SUFFIX_LENGTH;
  if (at <= start || buf[end - 1] !== 0x7d || buf[end - 2] !== 0x22) return false;
  for (let i = 0; i < CHECKSUM_PREFIX.length; i++) if (buf[at + i] !== CHECKSUM_PREFIX[i]) return false;
  return true;
}

/**
 * Decodes the line `buf[start, end)` (without its newline; a trailing CR is tolerated as JSON
 * whitespace, as the seed's JSON.parse does). Never throws. `asciiText`, when given, is the
 * whole of `buf` decoded once by a caller that checked it is pure ASCII (so string and byte
 * offsets agree): slicing it is much cheaper than decoding each line on its own.
 */
export function decodeJournalLine(buf: Buffer, start: number, end: number, asciiText?: string): DecodedLine {
  let stop = end;
  if (stop > start && buf[stop - 1] === CARRIAGE_RETURN) stop--;
  let parsed: unknown;
  try {
    parsed = JSON.parse(asciiText !== undefined ? asciiText.slice(start, stop) : buf.toString("utf8", start, stop));
  } catch (error) {
    return { kind: "parse_failed", message: (error as Error).message };
  }
  // The seed's test, to the letter: an array is an object to it (and replays as an unknown event).
  if (parsed === null || typeof parsed !== "object") return { kind: "parse_failed", message: "entry is not object" };
  const entry = parsed as Record<string, unknown>;
  const written = entry[CHECKSUM_FIELD];
  if (written === undefined) return { kind: "entry", entry, checksum: "absent" };
  let actual: string;
  if (hasChecksumSuffix(buf, start, stop)) {
    // The fast path: the CRC of the bytes before `,"crc":…` plus the closing brace, no re-serialising.
    const at = stop - CHECKSUM_SUFFIX_LENGTH;
    const crc = crc32Range(CLOSING_BRACE, 0, 1, crc32Range(buf, start, at));
    // Compared as numbers: formatting a hex string per line is measurable over 100,000 lines.
    if (typeof written === "string" && written.length === 8 && Number.parseInt(written, 16) === crc) {
      return { kind: "entry", entry, checksum: "valid" };
    }
    actual = crc.toString(16).padStart(8, "0");
  } else {
    // The line was re-serialised by someone (spacing, key order): check against the canonical form.
    const { [CHECKSUM_FIELD]: _ignored, ...rest } = entry;
    actual = crc32Hex(JSON.stringify(rest));
  }
  if (written !== actual) {
    return { kind: "checksum_mismatch", message: `checksum ${JSON.stringify(written)} does not match the line (crc ${actual})` };
  }
  return { kind: "entry", entry, checksum: "valid" };
}

/** True when the line holds nothing but whitespace (the seed skips such lines silently). */
export function isBlankLine(buf: Uint8Array, start: number, end: number): boolean {
  for (let i = start; i < end; i++) {
    const c = buf[i];
    if (c !== 0x20 && c !== 0x09 && c !== CARRIAGE_RETURN && c !== 0x0b && c !== 0x0c) return false;
  }
  return true;
}

/**
 * Calls `onLine(start, end)` for every newline-terminated line of `buf` from `from`, and returns
 * the offset just past the last newline: bytes after it are an unterminated tail.
 */
export function forEachLine(buf: Buffer, from: number, onLine: (start: number, end: number) => void): number {
  let start = from;
  for (;;) {
    const nl = buf.indexOf(NEWLINE, start);
    if (nl < 0) return start;
    onLine(start, nl);
    start = nl + 1;
  }
}

/** The fields berth adds to a line, stripped from entries handed to readers. */
export const BERTH_LINE_FIELDS: readonly string[] = [CHECKSUM_FIELD, IDEMPOTENCY_KEY_FIELD, BATCH_SIZE_FIELD];
