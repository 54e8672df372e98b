import { describe, expect, it } from "vitest";
import { applyEvent, baseSnapshot } from "./reducer.js";
import { T0, NOW, now, iso, reduce, reduceEntries, generate } from "./reducer-fixtures.js";

describe("baseSnapshot", () => {
  it("is the seed's empty session", () => {
    const s = baseSnapshot("abc");
    expect(s).toStrictEqual({
      id: "abc",
      phase: "new",
      pageUrl: null,
      sourceFile: null,
      previewFile: null,
      previewMode: null,
      expectedVariants: 0,
      arrivedVariants: 0,
      visibleVariant: null,
      paramValues: {},
      pendingEventSeq: null,
      pendingEvent: null,
      deliveryLease: null,
      checkpointRevision: 0,
      browserCheckpointRevision: 0,
      publicationCheckpointRevision: 0,
      activeOwner: null,
      sourceMarkers: {},
      fallbackMode: null,
      generationPhase: null,
      generationCompletedAt: null,
      generationTimings: {},
      variantPlan: null,
      generationCanceled: false,
      generationCanceledAt: null,
      cancelReason: null,
      annotationArtifacts: [],
      mountedVariants: [],
      mountFailures: [],
      renderState: null,
      diagnostics: [],
      updatedAt: null,
    });
    expect(baseSnapshot("abc").paramValues).not.toBe(s.paramValues);
  });
});

describe("entries", () => {
  it("sets updatedAt from the entry's ts, else from the clock", () => {
    expect(reduce([{ type: "steer" }]).updatedAt).toBe(iso(T0));
    expect(reduceEntries([{ seq: 1, event: { type: "steer" } }]).updatedAt).toBe(iso(NOW));
    expect(reduceEntries([{ seq: 1, ts: "", event: { type: "steer" } }]).updatedAt).toBe(iso(NOW));
  });

  it("reads a bare event as its own entry (the seed's `entry.event || entry`)", () => {
    const s = reduceEntries([{ type: "steer", pageUrl: "/x", ts: iso(T0), token: "t" }]);
    expect(s.phase).toBe("steer_requested");
    expect(s.pageUrl).toBe("/x");
    expect(s.pendingEventSeq).toBeNull(); // no seq on a bare event
    expect(s.pendingEvent).toStrictEqual({ type: "steer", pageUrl: "/x", ts: iso(T0) });
    expect(reduceEntries([{ seq: 4, ts: iso(T0), type: "discarded", event: null }]).phase).toBe("discarded");
  });

  it("uses the entry's type only through its event", () => {
    const s = reduceEntries([{ seq: 1, ts: iso(T0), type: "steer", event: { type: "complete" } }]);
    expect(s.phase).toBe("completed");
  });

  it("never mutates the snapshot it is given", () => {
    const before = reduce([generate, { type: "variants_ready" }, { type: "variant_mounted", variant: 1 }]);
    const copy = structuredClone(before);
    for (const event of [generate, { type: "variant_mount_failed", variant: 2 }, { type: "bogus" }, { type: "detector_waivers", waivers: ["a"] }]) {
      applyEvent(before, { seq: 9, id: "s", type: String(event.type), ts: iso(T0), event }, { now });
    }
    expect(before).toStrictEqual(copy);
  });
});

// JSON can spell a value JavaScript cannot turn into a primitive: the seed's reducer throws on it
// (its store then fails on that event forever); berth reads it as NaN, no time, or no key.
describe("values with no primitive form", () => {
  const hostile = { toString: 0 };

  it("agent_phase: the phase is kept, but it names no timing", () => {
    const s = reduce([{ type: "agent_phase", phase: hostile, durationMs: 5 }]);
    expect(s.generationPhase).toStrictEqual(hostile);
    expect(s.generationTimings).toStrictEqual({});
  });

  it("variant_mounted and variant_mount_failed: a malformed ack", () => {
    const s = reduce([generate, { type: "variant_mounted", variant: hostile }, { type: "variant_mount_failed", variant: [hostile] }]);
    expect(s.mountedVariants).toStrictEqual([]);
    expect(s.mountFailures).toStrictEqual([]);
    expect(s.diagnostics).toStrictEqual([
      { error: "malformed_mount_ack", type: "variant_mounted", variant: hostile },
      { error: "malformed_mount_ack", type: "variant_mount_failed", variant: [hostile] },
    ]);
  });

  it("accept: a variant id that is no number, as for any other non-numeric id", () => {
    expect(reduce([generate, { type: "accept", variantId: [[hostile]] }]).visibleVariant).toBeNaN();
  });

  it("checkpoint: a revision that cannot be compared is stale, and never becomes the counter", () => {
    const s = reduce([
      generate,
      { type: "checkpoint", revision: 2, phase: "generating" },
      { type: "checkpoint", revision: hostile, phase: "reviewing" },
      { type: "checkpoint", revision: 3, phase: "generating" },
    ]);
    expect(s.phase).toBe("generating");
    expect(s.browserCheckpointRevision).toBe(3);
    expect(s.diagnostics).toStrictEqual([{ error: "stale_checkpoint_ignored", revision: hostile, revisionDomain: "browser" }]);
  });

  it("an entry time with no primitive form reads as no time", () => {
    const s = reduceEntries([{ seq: 1, id: "s", type: "agent_done", ts: hostile, event: { type: "agent_done" } }]);
    expect(s.generationCompletedAt).toBe(NOW);
  });
});
