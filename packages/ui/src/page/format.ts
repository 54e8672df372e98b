/** How the page writes times, sizes and durations. */
import type { Duration, Timestamp } from "@bufbuild/protobuf/wkt";
import { msOfDuration, msOfTimestamp } from "@berth/client/wire-time";

/** Milliseconds since the epoch, or undefined for an unset timestamp. */
export function msOf(timestamp: Timestamp | undefined): number | undefined {
  return msOfTimestamp(timestamp);
}

/** A duration in milliseconds (0 when unset). */
export function durationMs(duration: Duration | undefined): number {
  return msOfDuration(duration) ?? 0;
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

/** `1.5 GiB`. */
export function bytes(value: bigint | number | undefined): string {
  if (value === undefined) return "–";
  let n = Number(value);
  let unit = 0;
  while (Math.abs(n) >= 1024 && unit < UNITS.length - 1) {
    n /= 1024;
    unit++;
  }
  return `${unit === 0 ? n : n.toFixed(n >= 100 ? 0 : 1)} ${UNITS[unit]}`;
}

/** `850 ms`, `12 s`, `3 min 5 s`, `2 h 4 min`. */
export function span(ms: number): string {
  if (!Number.isFinite(ms)) return "–";
  const abs = Math.abs(ms);
  if (abs < 1000) return `${Math.round(ms)} ms`;
  const s = Math.round(ms / 1000);
  if (Math.abs(s) < 60) return `${s} s`;
  const m = Math.trunc(s / 60);
  if (Math.abs(m) < 60) return `${m} min ${Math.abs(s % 60)} s`;
  return `${Math.trunc(m / 60)} h ${Math.abs(m % 60)} min`;
}

/** `12 s ago` from a time in ms. */
export function ago(ms: number | undefined, now: number): string {
  return ms === undefined ? "–" : `${span(Math.max(0, now - ms))} ago`;
}

/** `14:03:27` (local time). */
export function clock(ms: number | undefined): string {
  return ms === undefined ? "–" : new Date(ms).toLocaleTimeString(undefined, { hour12: false });
}

/** `1.5` cores. */
export function cores(value: number): string {
  return Number.isInteger(value) ? String(value) : value.toFixed(2);
}
