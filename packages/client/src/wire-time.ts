/** Protobuf Duration and Timestamp to and from milliseconds, as the services convert them (see `@berth/wire/time`). */
export { durationFromMs, msOfDuration, msOfTimestamp, optionalDurationFromMs, timestampFromMs } from "@berth/wire/time";
