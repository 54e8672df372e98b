import { create } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { BuildSpecSchema, NeedItemKind, NeedSchema, ResourceSpecSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { durationMs, needItemsFromProto, resourceSpecFromProto } from "./budget-decode.js";

const G = 1024 ** 3;

describe("inbound checks", () => {
  it.each([
    [{ seconds: 1n, nanos: 500_000_000 }, 1500],
    [{ seconds: 0n, nanos: 0 }, 0],
    [undefined, undefined],
  ])("reads duration %o as %s ms", (duration, ms) => {
    expect(durationMs(duration === undefined ? undefined : { $typeName: DurationSchema.typeName, ...duration }, "d")).toBe(ms);
  });

  it("refuses durations that are negative, malformed or too long for a timer", () => {
    const d = (seconds: bigint, nanos: number) => create(DurationSchema, { seconds, nanos });
    expect(() => durationMs(d(-1n, 0), "ttl")).toThrow(/^ttl: must not be negative/);
    expect(() => durationMs(d(0n, -5), "ttl")).toThrow(/^ttl: nanos/);
    expect(() => durationMs(d(30n * 86_400n, 0), "ttl")).toThrow(/^ttl: must be at most 24d; got 30d$/);
    // The limit quoted is the limit checked: a day more than it is refused, the limit itself is not.
    expect(() => durationMs(d(24n * 86_400n + 1n, 0), "max_wait")).toThrow(/^max_wait: must be at most 24d; got 24d 1s$/);
    expect(durationMs(d(24n * 86_400n, 0), "max_wait")).toBe(24 * 86_400_000);
    expect(() => durationMs(d(0n, 0), "ttl", { positive: true })).toThrow(/^ttl: must be a positive duration/);
  });

  it("parses sizes in specs and names the part that is wrong", () => {
    expect(resourceSpecFromProto(create(ResourceSpecSchema, { memory: "1.5GiB", cpu: 2, build: create(BuildSpecSchema, { memory: "2G" }) }))).toEqual({
      memory: 1.5 * G,
      cpu: 2,
      build: { memory: 2 * G, cpu: undefined },
    });
    expect(() => resourceSpecFromProto(create(ResourceSpecSchema, { build: create(BuildSpecSchema, { cpu: -1 }) }))).toThrow(/^spec\.build\.cpu:/);
  });

  it("reads a need's items, an empty skip reason still skipping", () => {
    const items = needItemsFromProto(create(NeedSchema, { items: [{ kind: NeedItemKind.BUILD, name: "web", skipped: "", wave: 2 }] }));
    expect(items).toEqual([{ kind: "build", name: "web", skipped: "skipped", wave: 2 }]);
  });
});
