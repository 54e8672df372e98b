import { create } from "@bufbuild/protobuf";
import { DurationSchema } from "@bufbuild/protobuf/wkt";
import { describe, expect, it } from "vitest";
import { BuildSpecSchema, NeedItemKind, NeedSchema, ResourceSpecSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { durationMs, needItemsFromProto, resourceSpecFromProto } from "./budget-decode.js";

const G = 1024 ** 3;

describe("inbound checks", () => {
  it("caps durations at the longest timer, naming the field", () => {
    const d = (seconds: bigint) => create(DurationSchema, { seconds, nanos: 0 });
    expect(() => durationMs(d(24n * 86_400n + 1n), "max_wait")).toThrow(/^max_wait: must be at most 24d; got 24d 1s$/);
    expect(durationMs(d(24n * 86_400n), "max_wait")).toBe(24 * 86_400_000);
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
