/** Timestamps as the journal and the snapshots spell them (ISO 8601), as protobuf Timestamps. */
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import { timestampFromMs } from "@berth/wire/time";

// The earliest and latest instants a Timestamp can hold (0001-01-01T00:00:00Z and
// 9999-12-31T23:59:59.999Z); outside them protobuf's JSON form is undefined.
const MIN_TIMESTAMP_MS = -62_135_596_800_000;
const MAX_TIMESTAMP_MS = 253_402_300_799_999;

/**
 * The Timestamp for an ISO 8601 time (as the journal's `ts` and the snapshot's `updatedAt` hold
 * it), to the millisecond; undefined for anything else, or a time a Timestamp cannot hold.
 */
export function isoToTimestamp(iso: unknown): Timestamp | undefined {
  if (typeof iso !== "string") return undefined;
  const ms = Date.parse(iso);
  if (!(ms >= MIN_TIMESTAMP_MS && ms <= MAX_TIMESTAMP_MS)) return undefined;
  return timestampFromMs(ms);
}
