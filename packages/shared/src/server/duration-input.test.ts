import { create } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { durationInputMs } from "./duration-input.js";

describe("durationInputMs", () => {
  it.each([
    [{ seconds: 1n, nanos: 500_000_000 }, 1500],
    [{ seconds: 0n, nanos: 0 }, 0],
    [undefined, undefined],
  ])("reads duration %o as %s ms", (duration, ms) => {
    expect(durationInputMs(duration === undefined ? undefined : { $typeName: DurationSchema.typeName, ...duration }, "d")).toBe(ms);
  });

  it("refuses durations that are negative, malformed or too long for a timer", () => {
    const d = (seconds: bigint, nanos: number) => create(DurationSchema, { seconds, nanos });
    expect(() => durationInputMs(d(-1n, 0), "ttl")).toThrow(/^ttl: must not be negative/);
    expect(() => durationInputMs(d(0n, -5), "ttl")).toThrow(/^ttl: nanos/);
    expect(() => durationInputMs(d(30n * 86_400n, 0), "ttl")).toThrow(/^ttl: must be at most 24d; got 30d$/);
    // The limit quoted is the limit checked: a day more than it is refused, the limit itself is not.
    expect(() => durationInputMs(d(24n * 86_400n + 1n, 0), "max_wait")).toThrow(/^max_wait: must be at most 24d; got 24d 1s$/);
    expect(durationInputMs(d(24n * 86_400n, 0), "max_wait")).toBe(24 * 86_400_000);
    expect(() => durationInputMs(d(0n, 0), "ttl", { positive: true })).toThrow(/^ttl: must be a positive duration/);
  });

  it("rounds to the nearest millisecond, as the wire does, and takes the caller's longest", () => {
    const d = (seconds: bigint, nanos: number) => create(DurationSchema, { seconds, nanos });
    expect(durationInputMs(d(1n, 500_400_000), "wait")).toBe(1500);
    expect(durationInputMs(d(1n, 500_500_000), "wait")).toBe(1501);
    expect(() => durationInputMs(d(2n, 0), "wait", { maxMs: 1000 })).toThrow(/^wait: must be at most 1s; got 2s$/);
  });
});
