import { create } from "@bufbuild/protobuf";
import { DurationSchema, TimestampSchema } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { durationFromMs, msOfDuration, msOfTimestamp, optionalDurationFromMs, timestampFromMs } from "./time.js";

describe("time", () => {
  it("round-trips whole milliseconds", () => {
    for (const ms of [0, 1, 999, 1000, 61_500, 86_400_000]) {
      expect(msOfDuration(durationFromMs(ms))).toBe(ms);
      expect(msOfTimestamp(timestampFromMs(ms))).toBe(ms);
    }
    expect(msOfTimestamp(timestampFromMs(-1500))).toBe(-1500);
    expect(timestampFromMs(-1500)).toMatchObject({ seconds: -2n, nanos: 500_000_000 });
  });

  it("rounds to the nearest millisecond, a half up", () => {
    expect(durationFromMs(1.4)).toMatchObject({ seconds: 0n, nanos: 1_000_000 });
    expect(durationFromMs(1.5)).toMatchObject({ seconds: 0n, nanos: 2_000_000 });
    expect(msOfDuration(create(DurationSchema, { seconds: 2n, nanos: 499_999 }))).toBe(2000);
    expect(msOfDuration(create(DurationSchema, { seconds: 2n, nanos: 500_000 }))).toBe(2001);
    expect(msOfTimestamp(create(TimestampSchema, { seconds: 1n, nanos: 1_600_000 }))).toBe(1002);
  });

  it("keeps unset unset, and a zero Duration set", () => {
    expect(msOfDuration(undefined)).toBeUndefined();
    expect(msOfTimestamp(undefined)).toBeUndefined();
    expect(optionalDurationFromMs(undefined)).toBeUndefined();
    expect(msOfDuration(optionalDurationFromMs(0))).toBe(0);
  });

  it("refuses a negative or non-finite duration", () => {
    expect(() => durationFromMs(-1)).toThrow(RangeError);
    expect(() => durationFromMs(Number.NaN)).toThrow(RangeError);
    expect(() => durationFromMs(Number.POSITIVE_INFINITY)).toThrow(RangeError);
  });
});
