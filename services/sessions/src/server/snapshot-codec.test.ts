import { performance } from "node:perf_hooks";
import { create, fromBinary, toBinary, toJson, toJsonString, type JsonObject } from "@bufbuild/protobuf";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { applyEvent, baseSnapshot, MAX_DIAGNOSTICS, type SessionSnapshot } from "../reducer.js";
import { journalEvent, typedKeys } from "./codec-fixtures/journal-events.js";
import { journalToEvent } from "@berth/wire/journal-events";
import { toNumber } from "../seed-coercions.js";
import { snapshotToProto } from "./snapshot-codec.js";

const T0 = Date.parse("2026-03-01T10:00:00.000Z");

/** Folds events through the reducer as journal entries `{seq, id, type, ts, event}`, a second apart. */
function fold(id: string, events: Record<string, unknown>[], start: SessionSnapshot = baseSnapshot(id)): SessionSnapshot {
  let snapshot = start;
  events.forEach((event, i) => {
    const entry = { seq: i + 1, id, type: event.type, ts: new Date(T0 + i * 1000).toISOString(), event: { ...event, id } };
    snapshot = applyEvent(snapshot, entry, { now: () => T0 });
  });
  return snapshot;
}

/** A session that went through most of the seed's rules: every snapshot field ends up set. */
const RICH_EVENTS: Record<string, unknown>[] = [
  { type: "generate", pageUrl: "http://localhost:3000/pricing", count: 3, screenshotPath: "/tmp/shot.png", token: "tok-1", prompt: "bolder hero" },
  { type: "agent_phase", phase: "planning", at: T0 + 500, durationMs: 120.5 },
  { type: "variant_plan", plan: { variants: [{ name: "airy" }, { name: "dense" }, { name: "bold" }] } },
  { type: "detector_waivers", waivers: ["contrast", { rule: "motion", why: null }] },
  { type: "agent_phase", phase: "writing", durationMs: 900 },
  { type: "checkpoint", reason: "variants_progress", revision: 3, arrivedVariants: 2 },
  { type: "variants_ready", sourceFile: "src/pages/pricing.tsx", previewFile: ".impeccable/preview.html", previewMode: "iframe", arrivedVariants: 3 },
  { type: "variant_mounted", variant: 1 },
  { type: "variant_mounted", variant: "2" },
  { type: "variant_mount_failed", variant: 3, url: "/v3.js", error: "SyntaxError", token: "tok-2" },
  { type: "checkpoint", owner: "tab-a", revision: 4, visibleVariant: 2, paramValues: { hue: 4, mode: "dark" } },
  { type: "checkpoint", owner: "tab-a", revision: 2 },
  { type: "resume" },
  { type: "variant_mounted", variant: "x" },
  { type: "steer_done", message: "tweaked the spacing" },
  { type: "accept", variantId: 2, paramValues: { hue: 5 }, token: "tok-3", note: "ship it" },
];

const INT64_KEYS = ["checkpointRevision", "browserCheckpointRevision", "publicationCheckpointRevision", "pendingEventSeq", "diagnosticsTotal"];

/**
 * The proto's JSON form read back into the seed's shape: int64 strings as numbers, the Timestamp
 * as the seed's ISO string, each diagnostic's `fields` flattened beside its `error`.
 */
function seedView(protoJson: JsonObject): Record<string, unknown> {
  const view: Record<string, unknown> = { ...protoJson };
  for (const key of INT64_KEYS) if (typeof view[key] === "string") view[key] = Number(view[key]);
  if (typeof view.updatedAt === "string") view.updatedAt = new Date(view.updatedAt).toISOString();
  if (Array.isArray(view.diagnostics)) {
    view.diagnostics = (view.diagnostics as JsonObject[]).map((d) => ({ error: d.error ?? "", ...((d.fields as JsonObject) ?? {}) }));
  }
  return view;
}

/** The seed's snapshot as its JSON file holds it, minus the nulls (unset fields in the proto). */
function seedJson(snapshot: SessionSnapshot): Record<string, unknown> {
  const json = JSON.parse(JSON.stringify(snapshot)) as Record<string, unknown>;
  for (const key of Object.keys(json)) if (json[key] === null) delete json[key];
  for (const timing of Object.values((json.generationTimings ?? {}) as Record<string, Record<string, unknown>>)) {
    for (const key of Object.keys(timing)) if (timing[key] === null) delete timing[key];
  }
  for (const failure of (json.mountFailures ?? []) as Record<string, unknown>[]) {
    for (const key of Object.keys(failure)) if (failure[key] === null) delete failure[key];
  }
  return json;
}

/**
 * The key check: the proto's JSON names exactly the seed snapshot's set keys (`diagnosticsTotal`,
 * berth's addition, aside), both with every implicit field emitted and with protobuf's default
 * of omitting zero values (then a subset).
 */
function expectSameKeys(seed: SessionSnapshot, proto: Snapshot): void {
  const seedKeys = Object.keys(seedJson(seed))
    .filter((k) => k !== "diagnosticsTotal")
    .sort();
  const full = toJson(SnapshotSchema, proto, { alwaysEmitImplicit: true }) as JsonObject;
  expect(
    Object.keys(full)
      .filter((k) => k !== "diagnosticsTotal")
      .sort(),
  ).toEqual(seedKeys);
  const compact = toJson(SnapshotSchema, proto) as JsonObject;
  for (const key of Object.keys(compact)) expect(key === "diagnosticsTotal" || seedKeys.includes(key), key).toBe(true);
}

describe("snapshotToProto", () => {
  it("maps the base snapshot", () => {
    const base = baseSnapshot("x");
    const proto = snapshotToProto(base);
    expect(proto).toEqual(create(SnapshotSchema, { id: "x", phase: "new", paramValues: {}, sourceMarkers: {} }));
    expect(fromBinary(SnapshotSchema, toBinary(SnapshotSchema, proto))).toEqual(proto);
    expect(toJson(SnapshotSchema, proto)).toEqual({ id: "x", phase: "new", paramValues: {}, sourceMarkers: {} });
    expectSameKeys(base, proto);
  });

  it("maps a rich snapshot built by the reducer, field by field", () => {
    const seed = fold("rich-1", RICH_EVENTS);
    const proto = snapshotToProto(seed);
    expect(proto).toMatchObject({
      id: "rich-1",
      phase: "accept_requested",
      pageUrl: "http://localhost:3000/pricing",
      sourceFile: "src/pages/pricing.tsx",
      previewFile: ".impeccable/preview.html",
      previewMode: "iframe",
      expectedVariants: 3,
      arrivedVariants: 3,
      visibleVariant: 2,
      paramValues: { hue: 5 },
      pendingEventSeq: 16n,
      pendingEvent: { type: "accept", id: "rich-1", variantId: 2, paramValues: { hue: 5 }, note: "ship it" },
      checkpointRevision: 4n,
      browserCheckpointRevision: 4n,
      publicationCheckpointRevision: 3n,
      activeOwner: "tab-a",
      generationPhase: "writing",
      generationCanceled: true,
      cancelReason: "accept",
      mountedVariants: [1, 2],
      renderState: "mounted",
      message: "tweaked the spacing",
      diagnosticsTotal: 3n,
    });
    expect(proto.generationCompletedAt).toBe(T0 + 6000);
    expect(proto.generationCanceledAt).toBe(T0 + 15000);
    expect(proto.generationTimings.planning).toMatchObject({ at: T0 + 500, durationMs: 120.5 });
    expect(proto.generationTimings.writing).toMatchObject({ at: T0 + 4000, durationMs: 900 });
    expect(proto.annotationArtifacts).toMatchObject([{ type: "screenshot", path: "/tmp/shot.png" }]);
    expect(proto.mountFailures).toMatchObject([{ variant: 3, url: "/v3.js", error: "SyntaxError", at: T0 + 9000 }]);
    expect(proto.diagnostics.map((d) => [d.error, d.fields])).toEqual([
      ["stale_checkpoint_ignored", { revision: 2, revisionDomain: "browser" }],
      ["unknown_event_type", { type: "resume" }],
      ["malformed_mount_ack", { type: "variant_mounted", variant: "x" }],
    ]);
    expect(toJson(SnapshotSchema, proto)).toMatchObject({
      variantPlan: { variants: [{ name: "airy" }, { name: "dense" }, { name: "bold" }] },
      detectorWaivers: ["contrast", { rule: "motion", why: null }],
      updatedAt: "2026-03-01T10:00:15Z",
    });
    expect(fromBinary(SnapshotSchema, toBinary(SnapshotSchema, proto))).toEqual(proto);
  });

  it("its JSON form has the seed snapshot's keys, and read back in the seed's shape, its values", () => {
    const seed = fold("rich-2", RICH_EVENTS);
    const proto = snapshotToProto(seed);
    expectSameKeys(seed, proto);
    const view = seedView(toJson(SnapshotSchema, proto, { alwaysEmitImplicit: true }) as JsonObject);
    // The seed's snapshot has no diagnosticsTotal until more than MAX_DIAGNOSTICS were recorded.
    expect(view.diagnosticsTotal).toBe(seed.diagnostics.length);
    delete view.diagnosticsTotal;
    expect(view).toEqual(seedJson(seed));
  });

  it("keeps diagnosticsTotal once the reducer counts past the kept diagnostics", () => {
    const noisy = Array.from({ length: MAX_DIAGNOSTICS + 20 }, () => ({ type: "bogus" }));
    const seed = fold("noisy", noisy);
    expect(seed.diagnosticsTotal).toBe(MAX_DIAGNOSTICS + 20);
    const proto = snapshotToProto(seed);
    expect(proto.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(proto.diagnosticsTotal).toBe(BigInt(MAX_DIAGNOSTICS + 20));
    const view = seedView(toJson(SnapshotSchema, proto, { alwaysEmitImplicit: true }) as JsonObject);
    expect(view).toEqual(seedJson(seed));
  });

  it("leaves NaN visibleVariant (the seed's Number(undefined)) and an undefined message unset", () => {
    const seed = fold("nan", [{ type: "accept", variantId: "abc" }, { type: "steer_done" }]);
    expect(Number.isNaN(seed.visibleVariant)).toBe(true);
    expect(Object.hasOwn(seed, "message")).toBe(true);
    const proto = snapshotToProto(seed);
    expect(proto.visibleVariant).toBeUndefined();
    expect(proto.message).toBeUndefined();
    expect(Object.hasOwn(proto, "message")).toBe(false);
    expectSameKeys(seed, proto);
  });

  it("follows snapshot.proto for values of another JSON type: numeric strings parse, the rest is unset or zero", () => {
    const seed = {
      ...baseSnapshot("junk"),
      phase: 7,
      pageUrl: 5,
      expectedVariants: "3",
      arrivedVariants: " 4 ",
      visibleVariant: "x",
      checkpointRevision: "5",
      browserCheckpointRevision: 1.5,
      publicationCheckpointRevision: "-2",
      pendingEventSeq: -1,
      paramValues: [1, 2],
      generationCompletedAt: "1700000000000",
      generationCanceledAt: "soon",
      generationCanceled: "true",
      generationTimings: { plan: { at: null, durationMs: 5 }, odd: 3 },
      annotationArtifacts: [{ type: "screenshot", path: 9 }, "junk"],
      mountedVariants: [2, "3", "x", 0.5],
      mountFailures: [{ variant: "2", url: null, error: 5, at: "7" }, null],
      diagnostics: [{ error: "stale_checkpoint_ignored", revision: undefined, revisionDomain: "browser" }, { error: 5, detail: "kept" }, "junk"],
      updatedAt: "+275760-09-13T00:00:00.000Z",
      detectorWaivers: "contrast",
      message: 12,
    } as unknown as SessionSnapshot;
    const proto = snapshotToProto(seed);
    expect(proto).toMatchObject({
      phase: "",
      expectedVariants: 3,
      arrivedVariants: 4,
      checkpointRevision: 5n,
      browserCheckpointRevision: 0n,
      publicationCheckpointRevision: -2n,
      generationCompletedAt: 1_700_000_000_000,
      generationCanceled: false,
      mountedVariants: [2, 3],
      diagnosticsTotal: 3n,
    });
    for (const key of ["pageUrl", "visibleVariant", "pendingEventSeq", "paramValues", "generationCanceledAt", "updatedAt", "detectorWaivers", "message"]) {
      expect(Object.hasOwn(proto, key), key).toBe(false);
    }
    expect(proto.generationTimings).toEqual({
      plan: create(SnapshotSchema.field.generationTimings!.message!, { durationMs: 5 }),
      odd: create(SnapshotSchema.field.generationTimings!.message!),
    });
    expect(proto.annotationArtifacts).toMatchObject([{ type: "screenshot", path: "" }]);
    expect(proto.mountFailures).toHaveLength(1);
    expect(proto.mountFailures[0]).toEqual(create(SnapshotSchema.field.mountFailures!.message!, { variant: 2, at: 7 }));
    expect(proto.diagnostics.map((d) => [d.error, d.fields])).toEqual([
      ["stale_checkpoint_ignored", { revisionDomain: "browser" }],
      ["", { error: 5, detail: "kept" }],
    ]);
    expect(() => toJsonString(SnapshotSchema, proto)).not.toThrow();
    expect(fromBinary(SnapshotSchema, toBinary(SnapshotSchema, proto))).toEqual(proto);
  });

  it("never throws, and always gives a message protobuf can serialise, for sessions of arbitrary events (junk included)", () => {
    fc.assert(
      fc.property(fc.array(journalEvent, { maxLength: 25 }), (events) => {
        const seed = fold("prop", events);
        const proto = snapshotToProto(seed);
        expect(fromBinary(SnapshotSchema, toBinary(SnapshotSchema, proto))).toEqual(proto);
        const compact = toJson(SnapshotSchema, proto) as JsonObject;
        const seedKeys = new Set(Object.keys(seed));
        for (const key of Object.keys(compact)) expect(key === "diagnosticsTotal" || seedKeys.has(key), key).toBe(true);
        expect(() => toJsonString(SnapshotSchema, proto)).not.toThrow();
      }),
      { numRuns: 300 },
    );
  });

  it("gives the seed's keys and values back for sessions of well-formed events (the JSON view read in the seed's shape)", () => {
    // Only values of the declared types (what berth's API lets through): nothing is left unset then.
    const wellFormed = journalEvent.filter((e) => {
      const extra = (journalToEvent(e).kind.value as { extra?: JsonObject }).extra ?? {};
      const keys = typedKeys(String(e.type));
      // The reducer's Number(variant) of a huge number is a mounted variant a uint32 cannot hold.
      const variant = toNumber(e.variant);
      return !Object.keys(extra).some((k) => keys.includes(k)) && !(Number.isInteger(variant) && variant > 0xffffffff);
    });
    fc.assert(
      fc.property(fc.array(wellFormed, { maxLength: 20 }), (events) => {
        const seed = fold("prop", events);
        const proto = snapshotToProto(seed);
        expectSameKeys(seed, proto);
        const view = seedView(toJson(SnapshotSchema, proto, { alwaysEmitImplicit: true }) as JsonObject);
        if (!Object.hasOwn(seed, "diagnosticsTotal")) delete view.diagnosticsTotal;
        expect(view).toEqual(seedJson(seed));
      }),
      { numRuns: 200 },
    );
  });
});

describe("cost", () => {
  it("a typical snapshot converts in a few µs", () => {
    const typical = fold("cost", RICH_EVENTS);
    const noisy = fold(
      "cost-noisy",
      [...RICH_EVENTS, ...Array.from({ length: 150 }, (_, i) => (i % 2 ? { type: "bogus" } : { type: "detector_waivers", waivers: [`rule-${i}`] }))].slice(
        0,
        160,
      ),
    );
    // The best of several batches: on a shared machine the slowest batches measure the neighbours.
    const bestOf = (rounds: number, run: () => void): number => {
      for (let i = 0; i < rounds / 4; i++) run();
      let best = Infinity;
      for (let batch = 0; batch < 7; batch++) {
        const start = performance.now();
        for (let i = 0; i < rounds; i++) run();
        best = Math.min(best, ((performance.now() - start) * 1000) / rounds);
      }
      return best;
    };
    const typicalUs = bestOf(4_000, () => snapshotToProto(typical));
    const noisyUs = bestOf(1_000, () => snapshotToProto(noisy));
    const withBinary = bestOf(500, () => toBinary(SnapshotSchema, snapshotToProto(typical)));
    console.log(
      `snapshot-codec: typical snapshot ${typicalUs.toFixed(2)} µs (${typical.diagnostics.length} diagnostics); ` +
        `${noisy.diagnostics.length} diagnostics + ${(noisy.detectorWaivers ?? []).length} waivers ${noisyUs.toFixed(2)} µs; ` +
        `typical + toBinary ${withBinary.toFixed(2)} µs`,
    );
    expect(typicalUs).toBeLessThan(100);
  });
});
