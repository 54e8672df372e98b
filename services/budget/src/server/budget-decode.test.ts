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
      run: { memoryBytes: 1.5 * G, cpu: 2 },
      build: { memoryBytes: 2 * G },
    });
    expect(resourceSpecFromProto(undefined)).toEqual({ run: undefined, build: undefined });
    expect(() => resourceSpecFromProto(create(ResourceSpecSchema, { build: create(BuildSpecSchema, { cpu: -1 }) }))).toThrow(/^spec\.build\.cpu:/);
  });

  it("costs a need item by the part of its spec it runs with, in bytes and cores", () => {
    const spec = (memory: string, build: string) => ({
      case: "spec" as const,
      value: create(ResourceSpecSchema, { memory, build: create(BuildSpecSchema, { memory: build }) }),
    });
    const items = needItemsFromProto(
      create(NeedSchema, {
        items: [
          { kind: NeedItemKind.START, name: "web", costSource: spec("512M", "1G") },
          // A build's run part is not its cost, and not read.
          { kind: NeedItemKind.BUILD, name: "web", costSource: spec("not read", "1G") },
          { kind: NeedItemKind.APPLIANCE, name: "db", costSource: { case: "cost", value: { memoryBytes: 4096n, cpu: 1 } } },
        ],
      }),
    );
    expect(items.map((item) => item.spec)).toEqual([{ memoryBytes: 512 * 1024 ** 2 }, { memoryBytes: G }, { memoryBytes: 4096, cpu: 1 }]);
  });

  it("refuses a malformed size naming the item's field, the start's build part included", () => {
    const need = (memory: string, build = "1G") =>
      create(NeedSchema, {
        items: [
          { kind: NeedItemKind.START, name: "a" },
          { kind: NeedItemKind.START, name: "b" },
          {
            kind: NeedItemKind.START,
            name: "c",
            costSource: { case: "spec", value: create(ResourceSpecSchema, { memory, build: create(BuildSpecSchema, { memory: build }) }) },
          },
        ],
      });
    expect(() => needItemsFromProto(need("12Q"))).toThrow('need.items[2].spec.memory: "12Q" is not a size like 512M or 2G');
    expect(() => needItemsFromProto(need("1G", "lots"))).toThrow('need.items[2].spec.build.memory: "lots" is not a size like 512M or 2G');
  });

  it("reads a need's items, an empty skip reason still skipping", () => {
    const items = needItemsFromProto(create(NeedSchema, { items: [{ kind: NeedItemKind.BUILD, name: "web", skipped: "", wave: 2 }] }));
    expect(items).toEqual([{ kind: "build", name: "web", skipped: "skipped", wave: 2 }]);
  });
});
