import { describe, expect, it } from "vitest";
import { isBerthError } from "@berth/shared/errors";
import type { NeedItem } from "./costs.js";
import { costsOf, needFromItems, needOf, resolveItems, total } from "./costs.js";

const M = 1024 ** 2;
const G = 1024 ** 3;
const defaults = { defaultRun: { memoryBytes: 512 * M, cpu: 0.5 }, defaultBuild: { memoryBytes: 2 * G, cpu: 1 } };

const cost = (memoryBytes: number, cpu: number) => ({ memoryBytes, cpu, declared: true });
const build = (name: string, memoryBytes: number, cpu: number, extra: Partial<NeedItem> = {}): NeedItem => ({
  kind: "build",
  name,
  cost: cost(memoryBytes, cpu),
  ...extra,
});
const start = (name: string, memoryBytes: number, cpu: number, extra: Partial<NeedItem> = {}): NeedItem => ({
  kind: "start",
  name,
  cost: cost(memoryBytes, cpu),
  ...extra,
});

describe("costsOf", () => {
  it.each([
    ["nothing declared: both defaults", undefined, { memoryBytes: 512 * M, cpu: 0.5, declared: false }, { memoryBytes: 2 * G, cpu: 1, declared: false }],
    ["run fully declared", { memory: "1G", cpu: 2 }, { memoryBytes: G, cpu: 2, declared: true }, { memoryBytes: 2 * G, cpu: 1, declared: false }],
    [
      "memory only: cpu defaults, not declared",
      { memory: "256M" },
      { memoryBytes: 256 * M, cpu: 0.5, declared: false },
      { memoryBytes: 2 * G, cpu: 1, declared: false },
    ],
    [
      "build declared",
      { build: { memory: "1.5GiB", cpu: "3" } },
      { memoryBytes: 512 * M, cpu: 0.5, declared: false },
      { memoryBytes: 1.5 * G, cpu: 3, declared: true },
    ],
    ["bytes as a number, zero cpu", { memory: 4096, cpu: 0 }, { memoryBytes: 4096, cpu: 0, declared: true }, { memoryBytes: 2 * G, cpu: 1, declared: false }],
  ])("%s", (_name, spec, run, buildCost) => {
    expect(costsOf(spec, defaults)).toEqual({ run, build: buildCost });
  });

  it.each([
    [{ memory: "12Q" }, "spec.memory", 'spec.memory: "12Q" is not a size like 512M or 2G'],
    [{ build: { memory: "lots" } }, "spec.build.memory", 'spec.build.memory: "lots" is not a size like 512M or 2G'],
    [{ cpu: -1 }, "spec.cpu", "spec.cpu: -1 is not a number of cpus like 0.5 or 2"],
    [{ cpu: Number.NaN }, "spec.cpu", "spec.cpu: NaN is not a number of cpus like 0.5 or 2"],
    [{ cpu: "two" }, "spec.cpu", 'spec.cpu: "two" is not a number of cpus like 0.5 or 2'],
    [{ memory: -5 }, "spec.memory", "spec.memory: -5 is not a size like 512M or 2G"],
  ])("refuses %j naming the field", (spec, field, message) => {
    let thrown: unknown;
    try {
      costsOf(spec as never, defaults);
    } catch (error) {
      thrown = error;
    }
    expect(isBerthError(thrown) && thrown.code).toBe("invalid_argument");
    expect((thrown as Error).message).toBe(message);
    expect((thrown as { details: { field: string } }).details.field).toBe(field);
  });
});

describe("needOf", () => {
  it.each<[string, NeedItem[], { start: [number, number]; build: [number, number] }]>([
    ["nothing", [], { start: [0, 0], build: [0, 0] }],
    ["starts add up", [start("a", G, 1), start("b", 2 * G, 0.5), { ...start("c", G, 1), kind: "appliance" }], { start: [4 * G, 2.5], build: [0, 0] }],
    ["builds of one wave add up", [build("a", G, 1, { wave: 0 }), build("b", 2 * G, 2, { wave: 0 })], { start: [0, 0], build: [3 * G, 3] }],
    [
      "the costliest wave is held",
      [build("a", G, 1, { wave: 0 }), build("b", G, 1, { wave: 0 }), build("c", 3 * G, 1, { wave: 1 })],
      { start: [0, 0], build: [3 * G, 2] },
    ],
    ["a build without a wave runs alone", [build("a", G, 1), build("b", 2 * G, 1)], { start: [0, 0], build: [2 * G, 1] }],
    ["solo builds do not join a wave", [build("a", G, 1), build("b", G, 1, { wave: 0 }), build("c", G, 1, { wave: 0 })], { start: [0, 0], build: [2 * G, 2] }],
    [
      "skipped builds cost nothing",
      [build("a", 8 * G, 4, { wave: 0, skipped: "inputs unchanged" }), build("b", G, 1, { wave: 0 })],
      { start: [0, 0], build: [G, 1] },
    ],
    ["everything skipped is nothing", [build("a", 8 * G, 4, { skipped: "unchanged" })], { start: [0, 0], build: [0, 0] }],
    [
      "starts and builds together",
      [start("web", 512 * M, 0.5), build("web", 2 * G, 1, { wave: 0 }), build("api", G, 2, { wave: 0 })],
      { start: [512 * M, 0.5], build: [3 * G, 3] },
    ],
  ])("%s", (_name, items, expected) => {
    const need = needOf(items);
    expect(need.items).toBe(items);
    expect(need.start).toEqual({ memoryBytes: expected.start[0], cpu: expected.start[1] });
    expect(need.build).toEqual({ memoryBytes: expected.build[0], cpu: expected.build[1] });
    expect(total(need)).toEqual({ memoryBytes: expected.start[0] + expected.build[0], cpu: expected.start[1] + expected.build[1] });
  });
});

describe("resolveItems / needFromItems", () => {
  it("takes each item's own spec or the default for its kind", () => {
    const items = resolveItems(
      [
        { kind: "start", name: "web", spec: { memory: "1G", cpu: 1 } },
        { kind: "appliance", name: "db" },
        { kind: "build", name: "web", wave: 0 },
        { kind: "build", name: "docs", skipped: "unchanged" },
      ],
      defaults,
    );
    expect(items.map((i) => [i.name, i.cost.memoryBytes, i.cost.cpu, i.cost.declared])).toEqual([
      ["web", G, 1, true],
      ["db", 512 * M, 0.5, false],
      ["web", 2 * G, 1, false],
      ["docs", 2 * G, 1, false],
    ]);
    expect(needFromItems([{ kind: "build", name: "docs", skipped: "unchanged" }], defaults).build).toEqual({ memoryBytes: 0, cpu: 0 });
  });

  it("names the item and the value of a malformed size", () => {
    expect(() =>
      resolveItems(
        [
          { kind: "start", name: "a" },
          { kind: "start", name: "b" },
          { kind: "start", name: "c", spec: { memory: "12Q" } },
        ],
        defaults,
      ),
    ).toThrow('items[2].spec.memory: "12Q" is not a size like 512M or 2G');
  });

  it("refuses an unknown kind and a fractional wave", () => {
    expect(() => resolveItems([{ kind: "deploy" as never, name: "x" }], defaults)).toThrow("items[0].kind: must be build, start or appliance");
    expect(() => resolveItems([{ kind: "build", name: "x", wave: 1.5 }], defaults)).toThrow("items[0].wave: must be a whole number");
  });
});
