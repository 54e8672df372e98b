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

/** The seed's fields of `entry`, in the seed's order. */
function seedFields(entry: JournalLineEntry): Record<string, unknown> {
  return { seq: entry.seq, id: entry.id, type: entry.type, ts: entry.ts, event: entry.event };
}

/**
 * The line the seed's store writes for `entry`, newline included: its five fields and nothing
 * else. berth never writes one; tests play another process sharing a journal with it.
 */
export function encodeSeedLine(entry: JournalLineEntry): string {
  return `${JSON.stringify(seedFields(entry))}\n`;
}

/**
 * One journal line, newline included. `entry`'s fields are written in the seed's order; the
 * marks follow, then the checksum of everything before it.
 */
export function encodeJournalLine(entry: JournalLineEntry, marks?: AppendMarks): string {
  const line = seedFields(entry);
  if (marks?.ikey !== undefined) line[IDEMPOTENCY_KEY_FIELD] = marks.ikey;
  if (marks?.n !== undefined) line[BATCH_SIZE_FIELD] = marks.n;
  const canonical = JSON.stringify(line);
  return `${canonical.slice(0, -1)},"${CHECKSUM_FIELD}":"${crc32Hex(canonical)}"}\n`;
}

/** A line that decoded to an entry (an object; whether it is a well-formed entry is the reducer's business, as in the seed). */
export interface DecodedEntry {
  kind: "entry";
  /**
   * The line's fields, without berth's checksum once it is verified (`checksum` is the verdict;
   * a per-line string nobody reads would be one more allocation per line of a replay).
   */
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

/** The 8 lowercase hex digits at `buf[at, at + 8)` as a number, or -1. */
function hexChecksumAt(buf: Uint8Array, at: number): number {
  let value = 0;
  for (let i = at; i < at + 8; i++) {
    const c = buf[i]!;
    const digit = c >= 0x30 && c <= 0x39 ? c - 0x30 : c >= 0x61 && c <= 0x66 ? c - 0x57 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

/** True when `buf[at, …)` holds the bytes of `expected`. */
function bytesAt(buf: Uint8Array, at: number, expected: Uint8Array): boolean {
  for (let i = 0; i < expected.length; i++) if (buf[at + i] !== expected[i]) return false;
  return true;
}

/**
 * The end (exclusive) of the decimal integer at `buf[at, limit)` as JSON.stringify writes one —
 * digits, no sign, no leading zero, at most 15 of them (exact as a double) — or -1.
 */
function integerEnd(buf: Uint8Array, at: number, limit: number): number {
  let i = at;
  while (i < limit && buf[i]! >= 0x30 && buf[i]! <= 0x39) i++;
  const digits = i - at;
  if (digits === 0 || digits > 15 || (digits > 1 && buf[at] === 0x30)) return -1;
  return i;
}

/** The integer whose digits are `buf[at, stop)` (checked by {@link integerEnd}). */
function integerValue(buf: Uint8Array, at: number, stop: number): number {
  let value = 0;
  for (let i = at; i < stop; i++) value = value * 10 + (buf[i]! - 0x30);
  return value;
}

/**
 * The index of the quote closing the JSON string whose first character is at `buf[at]`, when the
 * string holds no escape and no control character (so its bytes are its text); else -1.
 */
function plainStringEnd(buf: Uint8Array, at: number, limit: number): number {
  for (let i = at; i < limit; i++) {
    const c = buf[i]!;
    if (c === 0x22) return i;
    if (c === 0x5c || c < 0x20) return -1;
  }
  return -1;
}

const SEQ_OPEN = Buffer.from('{"seq":', "latin1");
const ID_KEY = Buffer.from(',"id":"', "latin1");
const TYPE_KEY = Buffer.from(',"type":"', "latin1");
const TS_KEY = Buffer.from(',"ts":"', "latin1");
const EVENT_KEY = Buffer.from(',"event":', "latin1");
const BATCH_KEY = Buffer.from(`,"${BATCH_SIZE_FIELD}":`, "latin1");

/**
 * Where the fields of a line berth wrote sit, as {@link scanLine} finds them: slots of a
 * Float64Array, {@link LAYOUT_SLOTS} per line. A layout holds numbers only, so one thread can scan
 * lines while another turns them into entries (see journal-scan.ts).
 */
export const LAYOUT_SLOTS = 12;
const L_SEQ = 0;
const L_ID_AT = 1;
const L_ID_END = 2;
const L_TYPE_AT = 3;
const L_TYPE_END = 4;
const L_TS_AT = 5;
const L_TS_END = 6;
const L_EVENT_AT = 7;
const L_EVENT_END = 8;
/** The `n` mark, or -1 when the line has none. */
const L_BATCH = 9;
/** Where the line's checksum field begins (everything before it is what the checksum covers). */
const L_CHECKSUM_AT = 10;
/**
 * The CRC of the bytes the line's checksum suffix covers, or -1 when the line has no such suffix.
 * Set whatever {@link scanLine} answers, so that a suffixed line it turns down (one with an `ikey`,
 * or damaged) is not checksummed a second time by the whole-line path.
 */
const L_CRC = 11;

/**
 * The bytes-only half of decoding the line `buf[start, end)`: true when it is exactly what
 * {@link encodeJournalLine} writes — the seed's fields in order, plain strings, an object event,
 * at most an `n` mark — and its checksum matches; then `layout[at, at + LAYOUT_SLOTS)` holds where
 * its fields are. False for any other line (the seed's, a damaged one, one with an `ikey`…): those
 * are parsed whole; `layout[at + L_CRC]` is set either way. Allocates nothing.
 */
export function scanLine(buf: Uint8Array, start: number, end: number, layout: Float64Array, at: number): boolean {
  let stop = end;
  if (stop > start && buf[stop - 1] === CARRIAGE_RETURN) stop--;
  // The CRC of the bytes before `,"crc":…` plus the closing brace: what berth wrote, if it did.
  if (!hasChecksumSuffix(buf, start, stop)) {
    layout[at + L_CRC] = -1;
    return false;
  }
  const checksumAt = stop - CHECKSUM_SUFFIX_LENGTH;
  const crc = crc32Range(CLOSING_BRACE, 0, 1, crc32Range(buf, start, checksumAt));
  layout[at + L_CRC] = crc;
  if (hexChecksumAt(buf, checksumAt + CHECKSUM_PREFIX.length) !== crc) return false;
  if (!bytesAt(buf, start, SEQ_OPEN)) return false;
  const seqAt = start + SEQ_OPEN.length;
  const seqEnd = integerEnd(buf, seqAt, checksumAt);
  if (seqEnd < 0 || !bytesAt(buf, seqEnd, ID_KEY)) return false;
  const idAt = seqEnd + ID_KEY.length;
  const idEnd = plainStringEnd(buf, idAt, checksumAt);
  if (idEnd < 0 || !bytesAt(buf, idEnd + 1, TYPE_KEY)) return false;
  const typeAt = idEnd + 1 + TYPE_KEY.length;
  const typeEnd = plainStringEnd(buf, typeAt, checksumAt);
  if (typeEnd < 0 || !bytesAt(buf, typeEnd + 1, TS_KEY)) return false;
  const tsAt = typeEnd + 1 + TS_KEY.length;
  const tsEnd = plainStringEnd(buf, tsAt, checksumAt);
  if (tsEnd < 0 || !bytesAt(buf, tsEnd + 1, EVENT_KEY)) return false;
  const eventAt = tsEnd + 1 + EVENT_KEY.length;
  // After the event: nothing, or `,"n":<k>` (a line with an `ikey` is parsed whole).
  let eventEnd = checksumAt;
  let batchSize = -1;
  if (buf[eventEnd - 1] !== 0x7d) {
    let digitsAt = eventEnd;
    while (digitsAt > eventAt && buf[digitsAt - 1]! >= 0x30 && buf[digitsAt - 1]! <= 0x39) digitsAt--;
    const keyAt = digitsAt - BATCH_KEY.length;
    if (keyAt <= eventAt || !bytesAt(buf, keyAt, BATCH_KEY) || integerEnd(buf, digitsAt, checksumAt) !== checksumAt) return false;
    batchSize = integerValue(buf, digitsAt, checksumAt);
    eventEnd = keyAt;
    if (buf[eventEnd - 1] !== 0x7d) return false;
  }
  if (buf[eventAt] !== 0x7b) return false;
  layout[at + L_SEQ] = integerValue(buf, seqAt, seqEnd);
  layout[at + L_ID_AT] = idAt;
  layout[at + L_ID_END] = idEnd;
  layout[at + L_TYPE_AT] = typeAt;
  layout[at + L_TYPE_END] = typeEnd;
  layout[at + L_TS_AT] = tsAt;
  layout[at + L_TS_END] = tsEnd;
  layout[at + L_EVENT_AT] = eventAt;
  layout[at + L_EVENT_END] = eventEnd;
  layout[at + L_BATCH] = batchSize;
  layout[at + L_CHECKSUM_AT] = checksumAt;
  return true;
}

/**
 * The entry of a line {@link scanLine} accepted, from its layout: the seed's fields and `n` come
 * from the layout and only the event goes through JSON.parse — the event is about half of a
 * typical line, and parsing the other half (keys, the id, the type, the timestamp) was a third of
 * a replay. The result is the object JSON.parse would give for the line, field for field and in
 * the same order, less the checksum field; undefined when the event is not valid JSON after all.
 */
function entryFromLayout(buf: Uint8Array, start: number, layout: Float64Array, at: number, asciiText: string | undefined): Record<string, unknown> | undefined {
  const eventAt = layout[at + L_EVENT_AT]!;
  const eventEnd = layout[at + L_EVENT_END]!;
  let eventJson: string;
  let id: string;
  let type: string;
  let ts: string;
  if (asciiText !== undefined) {
    // Slicing one decoded text is much cheaper than a Buffer decode per field.
    eventJson = asciiText.slice(eventAt, eventEnd);
    id = recentText(asciiText, layout[at + L_ID_AT]!, layout[at + L_ID_END]!, RECENT_IDS);
    type = recentText(asciiText, layout[at + L_TYPE_AT]!, layout[at + L_TYPE_END]!, RECENT_TYPES);
    ts = recentText(asciiText, layout[at + L_TS_AT]!, layout[at + L_TS_END]!, RECENT_TIMES);
  } else {
    const bytes = Buffer.from(buf.buffer, buf.byteOffset, buf.byteLength);
    const text = bytes.toString("utf8", start, layout[at + L_CHECKSUM_AT]!);
    if (text.length === layout[at + L_CHECKSUM_AT]! - start) {
      // ASCII after all: string and byte offsets agree.
      eventJson = text.slice(eventAt - start, eventEnd - start);
      id = recentText(text, layout[at + L_ID_AT]! - start, layout[at + L_ID_END]! - start, RECENT_IDS);
      type = recentText(text, layout[at + L_TYPE_AT]! - start, layout[at + L_TYPE_END]! - start, RECENT_TYPES);
      ts = recentText(text, layout[at + L_TS_AT]! - start, layout[at + L_TS_END]! - start, RECENT_TIMES);
    } else {
      // Multi-byte characters: string and byte offsets differ; decode each field on its own.
      eventJson = bytes.toString("utf8", eventAt, eventEnd);
      id = bytes.toString("utf8", layout[at + L_ID_AT]!, layout[at + L_ID_END]!);
      type = bytes.toString("utf8", layout[at + L_TYPE_AT]!, layout[at + L_TYPE_END]!);
      ts = bytes.toString("utf8", layout[at + L_TS_AT]!, layout[at + L_TS_END]!);
    }
  }
  let event: unknown;
  try {
    event = JSON.parse(eventJson);
  } catch {
    return undefined;
  }
  const entry: Record<string, unknown> = { seq: layout[at + L_SEQ]!, id, type, ts, event };
  const batchSize = layout[at + L_BATCH]!;
  if (batchSize >= 0) entry[BATCH_SIZE_FIELD] = batchSize;
  return entry;
}

// The strings last read for ids, event types and timestamps. Lines mostly repeat them (one
// session per journal, a few event types, one timestamp per append), and handing out the same
// string again saves an allocation per field per line — the garbage of a 100,000-line replay.
// Event types are kept by the dozen: a journal cycles through most of the seed's ~15 types, and
// with fewer kept than it uses, every line missed.
const RECENT_IDS: RecentStrings = { kept: 4, strings: [] };
const RECENT_TYPES: RecentStrings = { kept: 24, strings: [] };
const RECENT_TIMES: RecentStrings = { kept: 4, strings: [] };

interface RecentStrings {
  readonly kept: number;
  readonly strings: string[];
}

/** `text.slice(from, to)`, or an equal string from `recent` (most recent first). */
function recentText(text: string, from: number, to: number, recent: RecentStrings): string {
  const length = to - from;
  const strings = recent.strings;
  for (let i = 0; i < strings.length; i++) {
    const candidate = strings[i]!;
    if (candidate.length === length && text.startsWith(candidate, from)) return candidate;
  }
  const fresh = text.slice(from, to);
  if (strings.length >= recent.kept) strings.pop();
  strings.unshift(fresh);
  return fresh;
}

// The layout of the line being decoded, when the caller brought none.
const OWN_LAYOUT = new Float64Array(LAYOUT_SLOTS);

/** A line's layout found beforehand (by another thread): `valid` is what {@link scanLine} answered. */
export interface ScannedLine {
  valid: boolean;
  layout: Float64Array;
  at: number;
}

/**
 * Decodes the line `buf[start, end)` (without its newline; a trailing CR is tolerated as JSON
 * whitespace, as the seed's JSON.parse does). Never throws. `asciiText`, when given, is the
 * whole of `buf` decoded once by a caller that checked it is pure ASCII (so string and byte
 * offsets agree): slicing it is much cheaper than decoding each line on its own. `scanned`, when
 * given, is {@link scanLine}'s answer for this very line, so it is not scanned again.
 *
 * A line berth wrote is checked first: its checksum over the raw bytes, then — when it matches —
 * its fields read from the bytes with only the event parsed ({@link scanLine}). Any other line
 * (the seed's, a damaged one, one re-serialised by someone) is parsed whole.
 */
export function decodeJournalLine(buf: Buffer, start: number, end: number, asciiText?: string, scanned?: ScannedLine): DecodedLine {
  const layout = scanned !== undefined ? scanned.layout : OWN_LAYOUT;
  const at = scanned !== undefined ? scanned.at : 0;
  const valid = scanned !== undefined ? scanned.valid : scanLine(buf, start, end, layout, at);
  if (valid) {
    const entry = entryFromLayout(buf, start, layout, at, asciiText);
    if (entry !== undefined) return { kind: "entry", entry, checksum: "valid" };
  }
  let stop = end;
  if (stop > start && buf[stop - 1] === CARRIAGE_RETURN) stop--;
  const crc = layout[at + L_CRC]!;
  const suffixed = crc >= 0;
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
  if (suffixed) {
    // Checked on the raw bytes, no re-serialising. Compared as numbers: formatting a hex string
    // per line is measurable over 100,000 lines.
    if (typeof written === "string" && written.length === 8 && Number.parseInt(written, 16) === crc) {
      delete entry[CHECKSUM_FIELD];
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
  delete entry[CHECKSUM_FIELD];
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
