/**
 * Protobuf Duration and Timestamp to and from milliseconds: the one conversion berth's servers,
 * client, command and MCP server use at the wire.
 *
 * Rounding: to the nearest whole millisecond, a half rounding up (Math.round), both ways. berth
 * keeps times in whole milliseconds, so what it sends reads back exactly.
 *
 * Unset: a message that is absent is `undefined`, and converts to `undefined` (never 0): what an
 * unset field means (the default, no limit, none) is the caller's to say. A Duration of 0 is set.
 *
 * A Duration is never negative: a negative or non-finite number of milliseconds is a RangeError.
 * Range checks with field names (a request's nanos out of range, a cap) stay with the server that
 * refuses them.
 */
import { create } from "@bufbuild/protobuf";
import { DurationSchema, TimestampSchema, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";

/** `ms` milliseconds as a Duration (rounded to the millisecond). */
export function durationFromMs(ms: number): Duration {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`a duration must be a finite number of milliseconds ≥ 0, got ${ms}`);
  const whole = Math.round(ms);
  return create(DurationSchema, { seconds: BigInt(Math.floor(whole / 1000)), nanos: (whole % 1000) * 1_000_000 });
}

/** {@link durationFromMs}, with unset staying unset. */
export function optionalDurationFromMs(ms: number | undefined): Duration | undefined {
  return ms === undefined ? undefined : durationFromMs(ms);
}

/** A Duration as whole milliseconds; unset is undefined. */
export function msOfDuration(duration: Duration): number;
export function msOfDuration(duration: Duration | undefined): number | undefined;
export function msOfDuration(duration: Duration | undefined): number | undefined {
  return duration === undefined ? undefined : Number(duration.seconds) * 1000 + Math.round(duration.nanos / 1_000_000);
}

/** Clock milliseconds (since the epoch) as a Timestamp (rounded to the millisecond). */
export function timestampFromMs(ms: number): Timestamp {
  const whole = Math.round(ms);
  const seconds = Math.floor(whole / 1000);
  return create(TimestampSchema, { seconds: BigInt(seconds), nanos: (whole - seconds * 1000) * 1_000_000 });
}

/** A Timestamp as whole clock milliseconds; unset is undefined. */
export function msOfTimestamp(timestamp: Timestamp): number;
export function msOfTimestamp(timestamp: Timestamp | undefined): number | undefined;
export function msOfTimestamp(timestamp: Timestamp | undefined): number | undefined {
  return timestamp === undefined ? undefined : Number(timestamp.seconds) * 1000 + Math.round(timestamp.nanos / 1_000_000);
}
