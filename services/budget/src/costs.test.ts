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
    [
      "nothing declared: both defaults",
      undefined,
      undefined,
      { memoryBytes: 512 * M, cpu: 0.5, declared: false },
      { memoryBytes: 2 * G, cpu: 1, declared: false },
    ],
    ["run fully declared", { memoryBytes: G, cpu: 2 }, undefined, { memoryBytes: G, cpu: 2, declared: true }, { memoryBytes: 2 * G, cpu: 1, declared: false }],
    [
      "memory only: cpu defaults, not declared",
      { memoryBytes: 256 * M },
      undefined,
      { memoryBytes: 256 * M, cpu: 0.5, declared: false },
      { memoryBytes: 2 * G, cpu: 1, declared: false },
    ],
    [
      "build declared",
      undefined,
      { memoryBytes: 1.5 * G, cpu: 3 },
      { memoryBytes: 512 * M, cpu: 0.5, declared: false },
      { memoryBytes: 1.5 * G, cpu: 3, declared: true },
    ],
    ["zero bytes, zero cpu", { memoryBytes: 0, cpu: 0 }, {}, { memoryBytes: 0, cpu: 0, declared: true }, { memoryBytes: 2 * G, cpu: 1, declared: false }],
  ])("%s", (_name, run, build, runCost, buildCost) => {
    expect(costsOf(run, build, defaults)).toEqual({ run: runCost, build: buildCost });
  });

  it.each([
    [{ cpu: -1 }, undefined, "spec.cpu", "spec.cpu: must be a non-negative number of cpus; got -1"],
    [{ cpu: Number.NaN }, undefined, "spec.cpu", "spec.cpu: must be a non-negative number of cpus; got NaN"],
    [{ memoryBytes: -5 }, undefined, "spec.memoryBytes", "spec.memoryBytes: must be a whole, non-negative number of bytes; got -5"],
    [undefined, { memoryBytes: 1.5 }, "spec.build.memoryBytes", "spec.build.memoryBytes: must be a whole, non-negative number of bytes; got 1.5"],
  ])("refuses %j, %j naming the field", (run, build, field, message) => {
    let thrown: unknown;
    try {
      costsOf(run, build, defaults);
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
        { kind: "start", name: "web", spec: { memoryBytes: G, cpu: 1 } },
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

  it("names the item and the value of a wrong amount", () => {
    expect(() =>
      resolveItems(
        [
          { kind: "start", name: "a" },
          { kind: "start", name: "b" },
          { kind: "start", name: "c", spec: { cpu: -2 } },
        ],
        defaults,
      ),
    ).toThrow("items[2].spec.cpu: must be a non-negative number of cpus; got -2");
  });

  it("refuses an unknown kind and a fractional wave", () => {
    expect(() => resolveItems([{ kind: "deploy" as never, name: "x" }], defaults)).toThrow("items[0].kind: must be build, start or appliance");
    expect(() => resolveItems([{ kind: "build", name: "x", wave: 1.5 }], defaults)).toThrow("items[0].wave: must be a whole number");
  });
});
