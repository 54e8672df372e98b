/**
 * The seed's coercions, as its reducer makes them: `Number(...)`, a JavaScript comparison,
 * `Date.parse(ts)`. Each gives what the seed's expression gives, except on a value JavaScript cannot
 * turn into a primitive, which reads as NaN where the seed throws (see {@link isUnconvertible}).
 * The rules that use them are reducer.ts.
 */

/**
 * `Date.parse(ts)`, with a fast path for the one format journals hold (`toISOString()`:
 * `YYYY-MM-DDTHH:MM:SS.sssZ`, years from 1970): `Date.parse` costs more than the rest of a
 * replayed entry. Anything else, including an impossible date, goes to `Date.parse` itself.
 */
export function parseEntryTime(ts: unknown): number {
  // The entries of one append share their timestamp (the same string, as the replay reads it).
  if (ts === lastParsedTs) return lastParsedMs;
  if (typeof ts === "string" && ts.length === 24) {
    const ms = isoMillis(ts);
    if (ms >= 0) {
      lastParsedTs = ts;
      lastParsedMs = ms;
      return ms;
    }
  }
  return isUnconvertible(ts) ? NaN : Date.parse(ts as string);
}

/**
 * Whether JavaScript cannot turn `value` into a primitive. JSON can spell such a value: an object
 * whose own `toString` shadows the method with a non-function (`{"toString": 0}`), or an array
 * holding one (joining it converts each element). The seed's `Number(...)`, `>=`, `Date.parse` and
 * computed keys throw a TypeError on it, and its store then fails on that event forever; berth's
 * rules read it as NaN (not a number, not a time, no key) instead.
 */
export function isUnconvertible(value: unknown): boolean {
  if (typeof value !== "object" || value === null) return false;
  if (Array.isArray(value)) return value.some(isUnconvertible);
  return Object.hasOwn(value, "toString");
}

/** `Number(value)`, NaN for a value with no primitive form. */
export function toNumber(value: unknown): number {
  return isUnconvertible(value) ? NaN : Number(value);
}

/** `value` for a JavaScript comparison: NaN (never greater or equal) when it has no primitive form. */
// `any`: a snapshot field may hold any JSON value, and the seed compares whatever it holds.
export function comparable(value: any): any {
  return isUnconvertible(value) ? NaN : value;
}

let lastParsedTs = "";
let lastParsedMs = 0;

/** Epoch ms of a valid `toISOString()` timestamp from 1970 on, else -1. */
function isoMillis(ts: string): number {
  if (
    ts.charCodeAt(4) !== 45 || // -
    ts.charCodeAt(7) !== 45 ||
    ts.charCodeAt(10) !== 84 || // T
    ts.charCodeAt(13) !== 58 || // :
    ts.charCodeAt(16) !== 58 ||
    ts.charCodeAt(19) !== 46 || // .
    ts.charCodeAt(23) !== 90 // Z
  ) {
    return -1;
  }
  // A non-digit makes its number NaN, and every range check below false.
  const year = digit(ts, 0) * 1000 + digit(ts, 1) * 100 + digit(ts, 2) * 10 + digit(ts, 3);
  const month = digit(ts, 5) * 10 + digit(ts, 6);
  const day = digit(ts, 8) * 10 + digit(ts, 9);
  const hour = digit(ts, 11) * 10 + digit(ts, 12);
  const minute = digit(ts, 14) * 10 + digit(ts, 15);
  const second = digit(ts, 17) * 10 + digit(ts, 18);
  const millis = digit(ts, 20) * 100 + digit(ts, 21) * 10 + digit(ts, 22);
  if (!(year >= 1970 && month >= 1 && month <= 12 && day >= 1 && hour <= 23 && minute <= 59 && second <= 59 && millis >= 0)) {
    return -1;
  }
  if (day > daysInMonth(year, month)) return -1;
  // Days since 1970-01-01 of a proleptic Gregorian date, counting years from March.
  const y = month <= 2 ? year - 1 : year;
  const era = Math.floor(y / 400);
  const yearOfEra = y - era * 400;
  const dayOfYear = Math.floor((153 * ((month + 9) % 12) + 2) / 5) + day - 1;
  const dayOfEra = yearOfEra * 365 + Math.floor(yearOfEra / 4) - Math.floor(yearOfEra / 100) + dayOfYear;
  const days = era * 146097 + dayOfEra - 719468;
  return ((days * 24 + hour) * 60 + minute) * 60000 + second * 1000 + millis;
}

function digit(text: string, index: number): number {
  const value = text.charCodeAt(index) - 48;
  return value >= 0 && value <= 9 ? value : NaN;
}

function daysInMonth(year: number, month: number): number {
  if (month === 2) return (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0 ? 29 : 28;
  return month === 4 || month === 6 || month === 9 || month === 11 ? 30 : 31;
}
