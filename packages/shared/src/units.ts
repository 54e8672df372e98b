/**
 * Sizes and durations as people write them in flags, environment variables and config files.
 *
 * Sizes use binary multiples throughout: `K`, `KB` and `KiB` all mean 1024 bytes, `G`, `GB` and `GiB`
 * all mean 2^30. Memory is what berth measures, memory is sold in binary units, and the budget code
 * this replaces read `2G` the same way; a decimal `GB` that quietly meant 7% less would surprise.
 * The grammar is the wire's (`@berth/wire/amounts`), so that a size in a flag, a config file and a
 * budget request reads the same; this module adds the refusals that name the field.
 */
import { bytesOfSize, coresOfText } from "@berth/wire/amounts";
import { invalidArgument } from "./errors.js";

const SIZE_RULE = "must be a size such as 1024 (bytes), 100k, 512M, 1.5GiB or 2G";

/**
 * Parses a size into bytes: a number of bytes, or a string like `1024`, `100k`, `512M`, `1.5GiB`,
 * `2GB` (case-insensitive; binary multiples, see the module comment). A fractional result is rounded
 * to whole bytes. Malformed, negative, NaN or infinite input throws `invalidArgument(field, …)`.
 */
export function parseSize(input: string | number, field = "size"): number {
  if (typeof input === "number") {
    if (!Number.isFinite(input) || input < 0 || !Number.isInteger(input)) {
      throw invalidArgument(field, `${SIZE_RULE}; got ${input}`);
    }
    return input;
  }
  const bytes = typeof input === "string" ? bytesOfSize(input) : undefined;
  if (bytes === undefined) throw invalidArgument(field, `${SIZE_RULE}; got ${JSON.stringify(input)}`);
  if (!Number.isSafeInteger(bytes)) throw invalidArgument(field, `is too large: ${JSON.stringify(input)}`);
  return bytes;
}

/** A value as it was sent: strings quoted, numbers (NaN included) as they print. */
const show = (value: unknown) => (typeof value === "string" ? JSON.stringify(value) : String(value));

/**
 * A declared amount of memory in bytes (a size string or a number of bytes), or undefined when none
 * was declared (unset or empty). Anything else is refused naming `field`:
 * `spec.memory: "12Q" is not a size like 512M or 2G`.
 */
export function parseMemory(value: string | number | undefined, field: string): number | undefined {
  if (value === undefined || value === "") return undefined;
  try {
    return parseSize(value, field);
  } catch {
    throw invalidArgument(field, `${show(value)} is not a size like 512M or 2G`);
  }
}

/**
 * A declared number of cpus (a decimal as text, or a number): finite and non-negative; undefined
 * when none was declared (unset or empty). Anything else is refused naming `field`.
 */
export function parseCpu(value: string | number | undefined, field: string): number | undefined {
  if (value === undefined || value === "") return undefined;
  const cpu = typeof value === "number" ? value : (coresOfText(value) ?? Number.NaN);
  if (!Number.isFinite(cpu) || cpu < 0) throw invalidArgument(field, `${show(value)} is not a number of cpus like 0.5 or 2`);
  return cpu;
}

const SIZE_STEPS: ReadonlyArray<readonly [string, number]> = [
  ["T", 1024 ** 4],
  ["G", 1024 ** 3],
  ["M", 1024 ** 2],
  ["K", 1024],
];

/**
 * Formats bytes the way {@link parseSize} reads them back: `512M`, `1.5G`, `2G`, `100K`, `900B`
 * (the largest unit that fits, at most one decimal).
 */
export function formatSize(bytes: number): string {
  if (!Number.isFinite(bytes)) return String(bytes);
  if (bytes < 0) return `-${formatSize(-bytes)}`;
  for (const [index, [unit, size]] of SIZE_STEPS.entries()) {
    if (bytes < size) continue;
    const value = Math.round((bytes / size) * 10) / 10;
    // 1023.96M rounds to 1024M: say 1G instead.
    const bigger = SIZE_STEPS[index - 1];
    if (bigger && value >= 1024) return `${Math.round((bytes / bigger[1]) * 10) / 10}${bigger[0]}`;
    return `${value}${unit}`;
  }
  return `${Math.round(bytes)}B`;
}

const DURATION_UNITS: Record<string, number> = {
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
};

/**
 * The longest duration the budget takes in a request (a wait, a lease) and the longest a duration
 * flag of the command may send it: Node's timers cannot wait past 2^31-1 ms (about 24.8 days), and
 * 24 days is the round figure under that, so a refusal can quote it as the user writes it.
 */
export const LONGEST_TIMER_MS = 24 * 86_400_000;

const DURATION_RULE = "must be a duration such as 250ms, 5s, 2m, 1h or 1m30s";

/**
 * Parses a duration into milliseconds: a number (milliseconds, from code), or a string like `250ms`,
 * `5s`, `2m`, `1h`, `1d`, `1m30s`, `1m 30s` (what {@link formatDuration} prints), or `0`. Rounded to
 * whole milliseconds. Malformed, negative, NaN or infinite input throws `invalidArgument(field, …)`.
 *
 * A string that is a bare number other than zero is refused, naming the units: `--wait 5` once meant
 * 5 ms to berth and 5 s to the person who typed it. Zero needs no unit.
 */
export function parseDuration(input: string | number, field = "duration"): number {
  if (typeof input === "number") {
    if (!Number.isFinite(input) || input < 0) throw invalidArgument(field, `${DURATION_RULE}; got ${input}`);
    return Math.round(input);
  }
  const text = typeof input === "string" ? input.trim() : "";
  if (/^\d+(?:\.\d+)?$/.test(text)) {
    if (Number(text) === 0) return 0;
    throw invalidArgument(field, `${JSON.stringify(text)} has no unit: write ${text}s, ${text}m or ${text}ms (units: ms, s, m, h, d; only 0 needs none)`);
  }
  const part = /(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*/gy;
  let total = 0;
  let consumed = 0;
  for (let match = part.exec(text); match; match = part.exec(text)) {
    total += Number(match[1]) * DURATION_UNITS[match[2]!]!;
    consumed = part.lastIndex;
  }
  if (text.length === 0 || consumed !== text.length) throw invalidArgument(field, `${DURATION_RULE}; got ${JSON.stringify(input)}`);
  const ms = Math.round(total);
  if (!Number.isSafeInteger(ms)) throw invalidArgument(field, `is too large: ${JSON.stringify(input)}`);
  return ms;
}

/**
 * Formats milliseconds for people: `250ms`, `5s`, `1.5s`, `1m 30s`, `2h 5m`, `1d 3h`. Zero parts are
 * left out; {@link parseDuration} reads every output back.
 */
export function formatDuration(ms: number): string {
  if (!Number.isFinite(ms)) return String(ms);
  if (ms < 0) return `-${formatDuration(-ms)}`;
  let rest = Math.round(ms);
  if (rest < 1000) return `${rest}ms`;
  const parts: string[] = [];
  for (const [unit, size] of [
    ["d", 86_400_000],
    ["h", 3_600_000],
    ["m", 60_000],
  ] as const) {
    if (rest >= size) {
      parts.push(`${Math.floor(rest / size)}${unit}`);
      rest %= size;
    }
  }
  if (rest > 0) {
    // Seconds keep their milliseconds as a decimal ("1.5s"); trailing zeros are noise.
    parts.push(`${(rest / 1000).toFixed(3).replace(/\.?0+$/, "")}s`);
  }
  return parts.join(" ");
}
