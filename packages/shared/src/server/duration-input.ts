/**
 * A request's Duration field as milliseconds, checked the same way in every service: negative or
 * malformed (nanos out of range) durations and ones past the caller's longest are INVALID_ARGUMENT
 * naming the field. The conversion itself is the wire's (`@berth/wire/time`: nearest millisecond),
 * so what a client sends and what a service reads are the same number.
 */
import type { Duration } from "@bufbuild/protobuf/wkt";
import { msOfDuration } from "@berth/wire/time";
import { invalidArgument } from "../errors.js";
import { formatDuration, LONGEST_TIMER_MS } from "../units.js";

export interface DurationInputOptions {
  /** The longest accepted; Node's longest timer (24 days) unless said. */
  readonly maxMs?: number;
  /** Refuse zero too (a duration that must pass at least a millisecond). */
  readonly positive?: boolean;
}

/** `duration` in ms, or undefined when unset (what unset means is the caller's to say). */
export function durationInputMs(duration: Duration | undefined, field: string, options: DurationInputOptions = {}): number | undefined {
  if (duration === undefined) return undefined;
  const maxMs = options.maxMs ?? LONGEST_TIMER_MS;
  const { seconds, nanos } = duration;
  if (!Number.isInteger(nanos) || nanos < 0 || nanos > 999_999_999)
    throw invalidArgument(field, `nanos must be 0 to 999999999 for a non-negative duration; got ${nanos}`);
  if (seconds < 0n) throw invalidArgument(field, `must not be negative; got ${seconds}s`);
  const tooLong = () => invalidArgument(field, `must be at most ${formatDuration(maxMs)}; got ${formatDuration(Number(seconds) * 1000 + nanos / 1e6)}`);
  // Checked on the seconds first so a huge value is refused before it loses precision as a number.
  if (seconds > BigInt(Math.ceil(maxMs / 1000))) throw tooLong();
  const ms = msOfDuration(duration);
  if (ms > maxMs) throw tooLong();
  if (options.positive && ms <= 0) throw invalidArgument(field, "must be a positive duration (at least 1ms)");
  return ms;
}
