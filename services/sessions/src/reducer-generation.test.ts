import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { applyEvent, baseSnapshot, createReplay, MAX_DIAGNOSTICS, MOUNT_FAILURE_HISTORY, type JournalEntry, type SessionSnapshot } from "./reducer.js";
import { COMPLETED_SESSION_PHASES, GENERATION_FENCED_SESSION_PHASES, isCompletedPhase, isGenerationFencedPhase } from "./vocabulary.js";
import { foldJournalText, replayJournalText } from "./fixtures/journal-text.js";

const T0 = Date.parse("2025-03-01T10:00:00.000Z");
/** The wall clock of these tests: far from every entry time, so a clock reading shows. */
const NOW = Date.parse("2030-01-01T00:00:00.000Z");
const now = (): number => NOW;
const iso = (ms: number): string => new Date(ms).toISOString();

type Event = Record<string, unknown>;

/** Entry n (from 1) is stamped T0 + (n - 1) seconds. */
function entries(events: Event[]): JournalEntry[] {
  return events.map((event, i) => ({
    seq: i + 1,
    id: "s",
    type: String(event.type),
    ts: iso(T0 + i * 1000),
    event: { id: "s", ...event },
  }));
}

/** Folds the events with applyEvent, and checks that the replay fast path agrees. */
function reduce(events: Event[]): SessionSnapshot {
  return reduceEntries(entries(events));
}

function reduceEntries(list: Record<string, unknown>[]): SessionSnapshot {
  let snapshot = baseSnapshot("s");
  for (const entry of list) snapshot = applyEvent(snapshot, entry, { now });
  const replay = createReplay("s", { now });
  for (const entry of list) replay.apply(entry);
  expect(replay.snapshot()).toStrictEqual(snapshot);
  return snapshot;
}

const generate: Event = { type: "generate", pageUrl: "http://localhost:5173/", count: 3, token: "lease-1" };

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

describe("vocabulary", () => {
  it("lists the completed and generation-fenced phases", () => {
    expect(COMPLETED_SESSION_PHASES).toEqual(["completed", "discarded"]);
    expect(GENERATION_FENCED_SESSION_PHASES).toEqual(["accept_requested", "discard_requested", "carbonize_required", "completed", "discarded"]);
    expect(isCompletedPhase("discarded")).toBe(true);
    expect(isCompletedPhase("accept_requested")).toBe(false);
    expect(isGenerationFencedPhase("carbonize_required")).toBe(true);
    expect(isGenerationFencedPhase("variants_ready")).toBe(false);
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

describe("generate", () => {
  it("requests a generation and becomes the pending event, without its token", () => {
    const s = reduce([generate]);
    expect(s.phase).toBe("generate_requested");
    expect(s.pageUrl).toBe("http://localhost:5173/");
    expect(s.expectedVariants).toBe(3);
    expect(s.pendingEventSeq).toBe(1);
    expect(s.pendingEvent).toStrictEqual({ id: "s", type: "generate", pageUrl: "http://localhost:5173/", count: 3 });
    expect(s.renderState).toBeNull();
  });

  it("keeps pageUrl and count when the event has none, and takes 0 as a count", () => {
    expect(reduce([generate, { type: "generate" }])).toMatchObject({ pageUrl: "http://localhost:5173/", expectedVariants: 3 });
    expect(reduce([generate, { type: "generate", count: 0 }]).expectedVariants).toBe(0);
  });

  it("forgets the previous batch's plan and mount reports", () => {
    const s = reduce([
      generate,
      { type: "variant_plan", plan: { variants: ["a"] } },
      { type: "variants_ready" },
      { type: "variant_mounted", variant: 1 },
      { type: "variant_mount_failed", variant: 2 },
      { type: "generate" },
    ]);
    expect(s).toMatchObject({ variantPlan: null, mountedVariants: [], mountFailures: [], renderState: null });
    expect(s.generationCompletedAt).toBe(T0 + 2000); // completion stays set
  });

  it("attaches each screenshot once", () => {
    const s = reduce([
      { type: "generate", screenshotPath: "/a.png" },
      { type: "generate", screenshotPath: "/a.png" },
      { type: "generate", screenshotPath: "/b.png" },
      { type: "generate", screenshotPath: "" },
      { type: "generate" },
    ]);
    expect(s.annotationArtifacts).toStrictEqual([
      { type: "screenshot", path: "/a.png" },
      { type: "screenshot", path: "/b.png" },
    ]);
  });
});

describe("variant_plan", () => {
  it("records the plan, and keeps it when the event has none", () => {
    expect(reduce([generate, { type: "variant_plan", plan: { n: 3 } }]).variantPlan).toStrictEqual({ n: 3 });
    expect(reduce([generate, { type: "variant_plan", plan: { n: 3 } }, { type: "variant_plan" }]).variantPlan).toStrictEqual({ n: 3 });
  });

  it("turns a falsy plan into null on the next entry, as the seed's copy does", () => {
    expect(reduce([{ type: "variant_plan", plan: false }]).variantPlan).toBe(false);
    expect(reduce([{ type: "variant_plan", plan: false }, { type: "steer" }]).variantPlan).toBeNull();
    expect(reduce([{ type: "variant_plan", plan: 0 }, { type: "bogus" }]).variantPlan).toBeNull();
  });

  it.each([
    ["after an accept", [{ type: "accept", variantId: 1 }]],
    ["after a discard", [{ type: "discard" }]],
    ["in a fenced phase", [{ type: "complete" }]],
    ["when canceled, even in a new cycle", [{ type: "accept" }, generate]],
  ])("is ignored %s, without a diagnostic", (_, before) => {
    const s = reduce([...before, { type: "variant_plan", plan: { late: true } }]);
    expect(s.variantPlan).toBeNull();
    expect(s.diagnostics).toStrictEqual([]);
  });
});

describe("detector_waivers", () => {
  it("accumulates waivers; a non-array adds none but creates the list", () => {
    const s = reduce([
      { type: "detector_waivers", waivers: ["contrast"] },
      { type: "detector_waivers", waivers: ["motion", "focus"] },
      { type: "detector_waivers", waivers: "contrast" },
    ]);
    expect(s.detectorWaivers).toStrictEqual(["contrast", "motion", "focus"]);
    expect(reduce([{ type: "detector_waivers" }]).detectorWaivers).toStrictEqual([]);
    expect(baseSnapshot("s")).not.toHaveProperty("detectorWaivers");
  });

  it("is ignored when canceled or fenced", () => {
    expect(reduce([{ type: "discard" }, { type: "detector_waivers", waivers: ["a"] }])).not.toHaveProperty("detectorWaivers");
    expect(
      reduce([
        { type: "checkpoint", phase: "carbonize_required" },
        { type: "detector_waivers", waivers: ["a"] },
      ]),
    ).not.toHaveProperty("detectorWaivers");
  });

  it("does not change a list an earlier snapshot holds", () => {
    const first = reduce([{ type: "detector_waivers", waivers: ["a"] }]);
    const second = applyEvent(first, { seq: 2, id: "s", type: "detector_waivers", ts: iso(T0), event: { type: "detector_waivers", waivers: ["b"] } });
    expect(first.detectorWaivers).toStrictEqual(["a"]);
    expect(second.detectorWaivers).toStrictEqual(["a", "b"]);
  });
});

describe("agent_phase", () => {
  it("records the phase and its timing", () => {
    const s = reduce([
      { type: "agent_phase", phase: "plan", durationMs: 850 },
      { type: "agent_phase", phase: "generate", at: 1234 },
    ]);
    expect(s.generationPhase).toBe("generate");
    expect(s.generationTimings).toStrictEqual({
      plan: { at: T0, durationMs: 850 },
      generate: { at: 1234, durationMs: null },
    });
  });

  it("has no time when the entry's ts does not parse (null, never the clock)", () => {
    const s = reduceEntries([{ seq: 1, ts: "yesterday", event: { type: "agent_phase", phase: "plan" } }]);
    expect(s.generationTimings).toStrictEqual({ plan: { at: null, durationMs: null } });
    expect(reduceEntries([{ seq: 1, event: { type: "agent_phase", phase: "plan" } }]).generationTimings.plan?.at).toBeNull();
  });

  it("keeps the phase and records no timing when the event has no phase", () => {
    const s = reduce([{ type: "agent_phase", phase: "plan" }, { type: "agent_phase" }, { type: "agent_phase", phase: "" }]);
    expect(s.generationPhase).toBe("");
    expect(Object.keys(s.generationTimings)).toStrictEqual(["plan"]);
  });
});

describe.each(["variants_ready", "agent_done"])("%s", (type) => {
  it("finishes the generation", () => {
    const s = reduce([generate, { type, file: "src/A.tsx", previewFile: "p.html", previewMode: "iframe" }]);
    expect(s).toMatchObject({
      phase: "variants_ready",
      generationCompletedAt: T0 + 1000,
      sourceFile: "src/A.tsx",
      previewFile: "p.html",
      previewMode: "iframe",
      arrivedVariants: 3, // the expected count, when the event gives none
      pendingEventSeq: null,
      pendingEvent: null,
      renderState: "pending",
    });
  });

  it("prefers sourceFile to file, and the event's at and arrivedVariants", () => {
    const s = reduce([generate, { type, sourceFile: "a", file: "b", at: 42, arrivedVariants: 0 }]);
    expect(s).toMatchObject({ sourceFile: "a", generationCompletedAt: 42, arrivedVariants: 0 });
  });

  it("falls back to the arrived count, then 0", () => {
    expect(reduce([{ type: "checkpoint", revision: 1, arrivedVariants: 2 }, { type }]).arrivedVariants).toBe(2);
    expect(reduce([{ type }]).arrivedVariants).toBe(0);
  });

  it("reads the clock only when neither at nor ts gives a time", () => {
    expect(reduceEntries([{ seq: 1, ts: "garbage", event: { type } }]).generationCompletedAt).toBe(NOW);
  });

  it("asks for a carbonize cleanup when the agent says so", () => {
    const s = reduce([generate, { type, carbonize: true, file: "src/A.css" }]);
    expect(s.phase).toBe("carbonize_required");
    expect(s.diagnostics).toStrictEqual([
      {
        error: "carbonize_cleanup_required",
        file: "src/A.css",
        message: "Accepted variant still has carbonize markers that must be folded into source CSS.",
      },
    ]);
    expect(reduce([{ type, carbonize: true, file: "" }]).diagnostics[0]).toMatchObject({ file: null });
    expect(reduce([{ type, carbonize: "true" }]).phase).toBe("variants_ready");
  });

  it.each([
    ["an accept", [{ type: "accept", variantId: 1 }], "accept_requested"],
    ["a discard", [{ type: "discard" }], "discard_requested"],
    ["completion", [{ type: "complete" }], "completed"],
    ["a carbonize request", [{ type: "agent_done", carbonize: true }], "carbonize_required"],
    ["a cancel, even in a new cycle", [{ type: "discard" }, generate], "generate_requested"],
  ])("is ignored after %s (the generation fence)", (_, before, phase) => {
    const fenced = reduce(before);
    const s = reduce([...before, { type, arrivedVariants: 9, file: "late.tsx" }]);
    expect(s.diagnostics.at(-1)).toStrictEqual({ error: "late_generation_event_ignored", type, phase });
    expect({ ...s, diagnostics: [], updatedAt: null }).toStrictEqual({ ...fenced, diagnostics: [], updatedAt: null });
  });
});

describe("agent_done carbonize after accept (the fence's one exception)", () => {
  it("moves an accepted session to carbonize_required", () => {
    const s = reduce([generate, { type: "accept", variantId: 2 }, { type: "agent_done", carbonize: true, file: "a.css" }]);
    expect(s.phase).toBe("carbonize_required");
    expect(s.generationCompletedAt).toBe(T0 + 2000);
    expect(s.pendingEvent).toBeNull();
    expect(s.diagnostics.map((d) => d.error)).toStrictEqual(["carbonize_cleanup_required"]);
  });

  it("does not apply to variants_ready, to agent_done without carbonize, or after a discard", () => {
    for (const late of [{ type: "variants_ready", carbonize: true }, { type: "agent_done" }]) {
      expect(reduce([{ type: "accept" }, late]).phase).toBe("accept_requested");
    }
    expect(reduce([{ type: "discard" }, { type: "agent_done", carbonize: true }]).phase).toBe("discard_requested");
    // Only while the phase is still accept_requested.
    expect(reduce([{ type: "accept" }, { type: "steer" }, { type: "agent_done", carbonize: true }]).phase).toBe("steer_requested");
  });
});

describe("variant_mounted", () => {
  it("records each mounted variant once, sorted, and reads numeric strings", () => {
    const s = reduce([
      generate,
      { type: "variants_ready" },
      { type: "variant_mounted", variant: 3 },
      { type: "variant_mounted", variant: "1" },
      { type: "variant_mounted", variant: 3 },
      { type: "variant_mounted", variant: 2.0 },
    ]);
    expect(s.mountedVariants).toStrictEqual([1, 2, 3]);
    expect(s.renderState).toBe("mounted");
  });

  it.each([0, -1, 1.5, "x", null, undefined, "", false])("reports a malformed ack (variant %s)", (variant) => {
    const s = reduce([{ type: "variant_mounted", variant }]);
    expect(s.mountedVariants).toStrictEqual([]);
    expect(s.diagnostics).toStrictEqual([{ error: "malformed_mount_ack", type: "variant_mounted", variant: variant ?? null }]);
  });

  it("reads JavaScript's Number() of odd values as the seed does", () => {
    expect(reduce([{ type: "variant_mounted", variant: true }]).mountedVariants).toStrictEqual([1]);
    expect(reduce([{ type: "variant_mounted", variant: " 4 " }]).mountedVariants).toStrictEqual([4]);
    expect(reduce([{ type: "variant_mounted", variant: [2] }]).mountedVariants).toStrictEqual([2]);
  });

  it("outranks any number of failures", () => {
    const s = reduce([
      { type: "variant_mount_failed", variant: 1 },
      { type: "variant_mount_failed", variant: 2 },
      { type: "variant_mounted", variant: 2 },
    ]);
    expect(s.renderState).toBe("mounted");
  });
});

describe("variant_mount_failed", () => {
  it("records the failure and becomes the pending event, without its token", () => {
    const s = reduce([{ type: "variant_mount_failed", variant: "2", url: "/v2.js", error: "SyntaxError", token: "t" }]);
    expect(s.mountFailures).toStrictEqual([{ variant: 2, url: "/v2.js", error: "SyntaxError", at: T0 }]);
    expect(s.renderState).toBe("failed");
    expect(s.pendingEvent).toStrictEqual({ id: "s", type: "variant_mount_failed", variant: "2", url: "/v2.js", error: "SyntaxError" });
    expect(s.pendingEventSeq).toBeNull(); // the seed leaves the seq alone
  });

  it("keeps non-string url and error out, and takes at from the event", () => {
    const s = reduce([{ type: "variant_mount_failed", variant: 1, url: 5, error: { code: 404 }, at: 99 }]);
    expect(s.mountFailures).toStrictEqual([{ variant: 1, url: null, error: null, at: 99 }]);
  });

  it(`keeps the newest ${MOUNT_FAILURE_HISTORY} failures`, () => {
    const failures = Array.from({ length: 8 }, (_, i) => ({ type: "variant_mount_failed", variant: i + 1 }));
    const s = reduce(failures);
    expect(s.mountFailures.map((f) => f.variant)).toStrictEqual([4, 5, 6, 7, 8]);
    expect(s.mountFailures[0]?.at).toBe(T0 + 3000);
  });

  it("never clobbers a pending event", () => {
    const s = reduce([generate, { type: "variant_mount_failed", variant: 1 }]);
    expect(s.pendingEvent).toMatchObject({ type: "generate" });
    expect(s.pendingEventSeq).toBe(1);
    const first = reduce([
      { type: "variant_mount_failed", variant: 1 },
      { type: "variant_mount_failed", variant: 2 },
    ]);
    expect(first.pendingEvent).toMatchObject({ variant: 1 });
  });

  it("reads the clock only when neither at nor ts gives a time", () => {
    const s = reduceEntries([{ seq: 1, event: { type: "variant_mount_failed", variant: 1 } }]);
    expect(s.mountFailures[0]?.at).toBe(NOW);
  });

  it("reports a malformed ack and records nothing else", () => {
    const s = reduce([{ type: "variant_mount_failed", variant: "two" }]);
    expect(s.mountFailures).toStrictEqual([]);
    expect(s.pendingEvent).toBeNull();
    expect(s.diagnostics).toStrictEqual([{ error: "malformed_mount_ack", type: "variant_mount_failed", variant: "two" }]);
  });
});

describe("renderState", () => {
  it("is null until a generation finishes, then pending, failed or mounted", () => {
    expect(reduce([generate]).renderState).toBeNull();
    expect(reduce([generate, { type: "variants_ready" }]).renderState).toBe("pending");
    expect(reduce([generate, { type: "variants_ready" }, { type: "variant_mount_failed", variant: 1 }]).renderState).toBe("failed");
    expect(reduce([generate, { type: "variants_ready" }, { type: "variant_mounted", variant: 1 }]).renderState).toBe("mounted");
  });

  it("is derived only by the events that change what it depends on", () => {
    // A checkpoint leaves it alone even though the seed would derive something else now.
    const s = reduce([generate, { type: "variants_ready" }, { type: "generate" }, { type: "checkpoint", revision: 1 }]);
    expect(s.renderState).toBeNull();
    expect(s.generationCompletedAt).not.toBeNull();
  });
});

describe("checkpoint", () => {
  it("takes a browser checkpoint into the browser domain and its mirror", () => {
    const params = { hue: 210 };
    const s = reduce([
      generate,
      {
        type: "checkpoint",
        owner: "tab-1",
        revision: 4,
        phase: "variants_ready",
        arrivedVariants: 2,
        visibleVariant: 2,
        sourceFile: "a.tsx",
        previewFile: "p.html",
        previewMode: "inline",
        paramValues: params,
      },
    ]);
    expect(s).toMatchObject({
      phase: "variants_ready",
      browserCheckpointRevision: 4,
      checkpointRevision: 4,
      publicationCheckpointRevision: 0,
      activeOwner: "tab-1",
      arrivedVariants: 2,
      visibleVariant: 2,
      sourceFile: "a.tsx",
      previewFile: "p.html",
      previewMode: "inline",
      paramValues: { hue: 210 },
    });
  });

  it("copies paramValues rather than keeping the event's object", () => {
    const list = entries([{ type: "checkpoint", revision: 1, paramValues: { hue: 1 } }]);
    const s = applyEvent(baseSnapshot("s"), list[0]!);
    expect(s.paramValues).toStrictEqual({ hue: 1 });
    expect(s.paramValues).not.toBe((list[0]!.event as { paramValues: unknown }).paramValues);
  });

  it.each([
    ["an explicit publication domain", { revisionDomain: "publication", owner: "tab-1" }],
    ["variants_progress without an owner", { reason: "variants_progress" }],
    ["variants_progress with an empty owner", { reason: "variants_progress", owner: "" }],
  ])("takes %s into the publication domain, which leaves browser state alone", (_, fields) => {
    const s = reduce([
      { type: "checkpoint", owner: "tab-9", revision: 2, visibleVariant: 1, paramValues: { a: 1 } },
      { type: "checkpoint", ...fields, revision: 7, phase: "generating", arrivedVariants: 3, visibleVariant: 4, paramValues: { a: 2 }, sourceFile: "x" },
    ]);
    expect(s).toMatchObject({
      publicationCheckpointRevision: 7,
      browserCheckpointRevision: 2,
      checkpointRevision: 2,
      activeOwner: "tab-9",
      visibleVariant: 1,
      paramValues: { a: 1 },
      phase: "generating",
      arrivedVariants: 3,
      sourceFile: "x",
    });
  });

  it("takes variants_progress with an owner into the browser domain", () => {
    const s = reduce([{ type: "checkpoint", reason: "variants_progress", owner: "tab-2", revision: 3 }]);
    expect(s).toMatchObject({ browserCheckpointRevision: 3, checkpointRevision: 3, publicationCheckpointRevision: 0, activeOwner: "tab-2" });
  });

  it("counts each domain separately", () => {
    const s = reduce([
      { type: "checkpoint", revisionDomain: "publication", revision: 10 },
      { type: "checkpoint", revision: 1 },
      { type: "checkpoint", revisionDomain: "publication", revision: 11 },
    ]);
    expect(s).toMatchObject({ publicationCheckpointRevision: 11, browserCheckpointRevision: 1, checkpointRevision: 1 });
    expect(s.diagnostics).toStrictEqual([]);
  });

  it("accepts an equal revision and ignores an older one with a diagnostic", () => {
    const s = reduce([
      { type: "checkpoint", revision: 5, phase: "a" },
      { type: "checkpoint", revision: 5, phase: "b" },
      { type: "checkpoint", revision: 4, phase: "c" },
      { type: "checkpoint", revisionDomain: "publication", revision: 2 },
      { type: "checkpoint", revisionDomain: "publication", revision: 1 },
    ]);
    expect(s.phase).toBe("b");
    expect(s.diagnostics).toStrictEqual([
      { error: "stale_checkpoint_ignored", revision: 4, revisionDomain: "browser" },
      { error: "stale_checkpoint_ignored", revision: 1, revisionDomain: "publication" },
    ]);
  });

  it("reads a missing revision as 0 and keeps the counter", () => {
    const fresh = reduce([{ type: "checkpoint", phase: "generating" }]);
    expect(fresh).toMatchObject({ phase: "generating", browserCheckpointRevision: 0, checkpointRevision: 0 });
    const later = reduce([
      { type: "checkpoint", revision: 3 },
      { type: "checkpoint", phase: "x" },
    ]);
    expect(later.phase).toBe("new");
    expect(later.diagnostics).toStrictEqual([{ error: "stale_checkpoint_ignored", revision: undefined, revisionDomain: "browser" }]);
  });

  it("keeps every field the checkpoint does not carry", () => {
    const s = reduce([generate, { type: "checkpoint", owner: "t", revision: 1, visibleVariant: 2, sourceFile: "a" }, { type: "checkpoint", revision: 2 }]);
    expect(s).toMatchObject({ phase: "generate_requested", activeOwner: "t", visibleVariant: 2, sourceFile: "a", arrivedVariants: 0 });
  });

  it.each([
    ["after an accept", [{ type: "accept", variantId: 1 }], "accept_requested"],
    ["after a discard", [{ type: "discard" }], "discard_requested"],
    ["once completed", [{ type: "complete" }], "completed"],
    ["once discarded", [{ type: "discarded" }], "discarded"],
    ["when canceled, even in a new cycle", [{ type: "discard" }, generate], "generate_requested"],
  ])("is ignored %s, with a diagnostic", (_, before, phase) => {
    const s = reduce([...before, { type: "checkpoint", revision: 8, phase: "variants_ready" }]);
    expect(s.phase).toBe(phase);
    expect(s.browserCheckpointRevision).toBe(0);
    expect(s.diagnostics.at(-1)).toStrictEqual({ error: "checkpoint_after_terminal_ignored", phase: "variants_ready", revision: 8 });
    expect(reduce([...before, { type: "checkpoint" }]).diagnostics.at(-1)).toStrictEqual({
      error: "checkpoint_after_terminal_ignored",
      phase: null,
      revision: null,
    });
  });

  it("can itself move the session into a fenced phase", () => {
    const s = reduce([{ type: "checkpoint", revision: 1, phase: "completed" }, { type: "variants_ready" }]);
    expect(s.phase).toBe("completed");
    expect(s.diagnostics).toStrictEqual([{ error: "late_generation_event_ignored", type: "variants_ready", phase: "completed" }]);
  });
});

describe.each(["accept", "accept_intent"])("%s", (type) => {
  it("requests the accept and cancels the generation", () => {
    const s = reduce([generate, { type, variantId: 2, paramValues: { hue: 3 }, token: "lease-2" }]);
    expect(s).toMatchObject({
      phase: "accept_requested",
      generationCanceled: true,
      generationCanceledAt: T0 + 1000,
      cancelReason: "accept",
      visibleVariant: 2,
      paramValues: { hue: 3 },
      pendingEventSeq: 2,
      pendingEvent: { id: "s", type, variantId: 2, paramValues: { hue: 3 } },
    });
    expect(s.pendingEvent).not.toHaveProperty("token");
  });

  it("takes Number() of the variant id, or of the visible variant", () => {
    expect(reduce([{ type, variantId: "3" }]).visibleVariant).toBe(3);
    expect(reduce([{ type: "checkpoint", revision: 1, visibleVariant: "2" }, { type }]).visibleVariant).toBe(2);
    expect(reduce([{ type }]).visibleVariant).toBe(0); // Number(null)
    expect(reduce([{ type, at: 5 }]).generationCanceledAt).toBe(5);
  });

  it("keeps NaN in memory for a non-numeric id; JSON holds null", () => {
    const s = reduce([{ type, variantId: "second" }]);
    expect(s.visibleVariant).toBeNaN();
    expect(JSON.parse(JSON.stringify(s)).visibleVariant).toBeNull();
  });

  it("keeps paramValues when the event has none", () => {
    expect(reduce([{ type: "checkpoint", revision: 1, paramValues: { a: 1 } }, { type }]).paramValues).toStrictEqual({ a: 1 });
  });

  it("reads the clock only when neither at nor ts gives a time", () => {
    expect(reduceEntries([{ seq: 1, event: { type } }]).generationCanceledAt).toBe(NOW);
  });
});

describe("manual_edit_apply", () => {
  it("requests the edit as the pending event", () => {
    const s = reduce([generate, { type: "manual_edit_apply", pageUrl: "/blog", edits: [1], token: "t" }]);
    expect(s).toMatchObject({
      phase: "manual_edit_apply_requested",
      pageUrl: "/blog",
      pendingEventSeq: 2,
      pendingEvent: { id: "s", type: "manual_edit_apply", pageUrl: "/blog", edits: [1] },
    });
    expect(reduce([generate, { type: "manual_edit_apply" }]).pageUrl).toBe("http://localhost:5173/");
  });
});

describe("steer", () => {
  it("requests the steer as the pending event", () => {
    const s = reduce([{ type: "steer", pageUrl: "/a", prompt: "more air", token: "t" }]);
    expect(s).toMatchObject({
      phase: "steer_requested",
      pageUrl: "/a",
      pendingEventSeq: 1,
      pendingEvent: { id: "s", type: "steer", pageUrl: "/a", prompt: "more air" },
    });
    expect(s.pendingEvent).not.toHaveProperty("token");
  });
});

describe("carbonize_cleanup", () => {
  it("requests the cleanup of a file", () => {
    const s = reduce([{ type: "carbonize_cleanup", file: "a.css", token: "t" }]);
    expect(s).toMatchObject({
      phase: "carbonize_cleanup_requested",
      sourceFile: "a.css",
      pendingEventSeq: 1,
      pendingEvent: { type: "carbonize_cleanup", file: "a.css" },
    });
    expect(reduce([{ type: "variants_ready", file: "b.tsx" }, { type: "carbonize_cleanup" }]).sourceFile).toBe("b.tsx");
  });
});

describe("steer_done", () => {
  it("finishes the steer with its message", () => {
    const s = reduce([{ type: "steer" }, { type: "steer_done", message: "done", file: "a.tsx", previewFile: "p", previewMode: "inline" }]);
    expect(s).toMatchObject({
      phase: "steer_done",
      message: "done",
      sourceFile: "a.tsx",
      previewFile: "p",
      previewMode: "inline",
      pendingEvent: null,
      pendingEventSeq: null,
    });
  });

  it("creates the message key even when there is none, as the seed does", () => {
    const s = reduce([{ type: "steer_done" }]);
    expect(Object.hasOwn(s, "message")).toBe(true);
    expect(s.message).toBeUndefined();
    expect(reduce([{ type: "steer_done", message: "a" }, { type: "steer_done" }]).message).toBe("a");
  });
});

describe("discard", () => {
  it("requests the discard and cancels the generation", () => {
    const s = reduce([generate, { type: "discard", token: "t" }]);
    expect(s).toMatchObject({
      phase: "discard_requested",
      generationCanceled: true,
      generationCanceledAt: T0 + 1000,
      cancelReason: "discard",
      pendingEventSeq: 2,
      pendingEvent: { id: "s", type: "discard" },
    });
  });
});

describe("discarded", () => {
  it("retires the session", () => {
    const s = reduce([generate, { type: "discard" }, { type: "discarded" }]);
    expect(s).toMatchObject({ phase: "discarded", pendingEvent: null, pendingEventSeq: null });
    expect(isCompletedPhase(s.phase)).toBe(true);
  });
});

describe("complete", () => {
  it("retires the session with its final files", () => {
    const s = reduce([generate, { type: "complete", file: "a.tsx", previewFile: "p", previewMode: "iframe" }]);
    expect(s).toMatchObject({ phase: "completed", sourceFile: "a.tsx", previewFile: "p", previewMode: "iframe", pendingEvent: null, pendingEventSeq: null });
    expect(isCompletedPhase(s.phase)).toBe(true);
  });
});

describe("agent_error", () => {
  it("records the error and clears the pending event", () => {
    const s = reduce([generate, { type: "agent_error", message: "boom" }]);
    expect(s).toMatchObject({ phase: "agent_error", pendingEvent: null, pendingEventSeq: null });
    expect(s.diagnostics).toStrictEqual([{ error: "agent_error", message: "boom" }]);
    expect(reduce([{ type: "agent_error", message: "" }]).diagnostics).toStrictEqual([{ error: "agent_error", message: "unknown agent error" }]);
  });

  it("ignores a late generate error after the user accepted or discarded", () => {
    const s = reduce([generate, { type: "accept", variantId: 1 }, { type: "agent_error", sourceEventType: "generate", message: "late" }]);
    expect(s.phase).toBe("accept_requested");
    expect(s.pendingEvent).toMatchObject({ type: "accept" });
    expect(s.diagnostics).toStrictEqual([{ error: "late_generation_event_ignored", type: "agent_error", phase: "accept_requested" }]);
  });

  it("still takes an error of another source after a cancel, and a generate error before one", () => {
    expect(reduce([{ type: "discard" }, { type: "agent_error", sourceEventType: "steer" }]).phase).toBe("agent_error");
    expect(reduce([generate, { type: "agent_error", sourceEventType: "generate" }]).phase).toBe("agent_error");
  });
});

describe("unknown event types", () => {
  it("are recorded as a diagnostic and change nothing else", () => {
    const before = reduce([generate]);
    const s = reduce([generate, { type: "resume", phase: "x" }]);
    expect(s.diagnostics).toStrictEqual([{ error: "unknown_event_type", type: "resume" }]);
    expect({ ...s, diagnostics: [], updatedAt: null }).toStrictEqual({ ...before, updatedAt: null });
    expect(reduce([{ type: "toString" }]).diagnostics).toStrictEqual([{ error: "unknown_event_type", type: "toString" }]);
    expect(reduceEntries([{ seq: 1, ts: iso(T0), event: { note: "no type" } }]).diagnostics).toStrictEqual([{ error: "unknown_event_type", type: undefined }]);
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

describe("diagnostics bound", () => {
  const stale = (n: number): Event[] => [{ type: "checkpoint", revision: 1000 }, ...Array.from({ length: n }, (_, i) => ({ type: "checkpoint", revision: i }))];

  it(`has no total while at most ${MAX_DIAGNOSTICS} were recorded: the seed's snapshot exactly`, () => {
    const s = reduce(stale(MAX_DIAGNOSTICS));
    expect(s.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(s).not.toHaveProperty("diagnosticsTotal");
  });

  it(`keeps the newest ${MAX_DIAGNOSTICS} and counts them all`, () => {
    const s = reduce(stale(450));
    expect(s.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(s.diagnostics[0]).toStrictEqual({ error: "stale_checkpoint_ignored", revision: 350, revisionDomain: "browser" });
    expect(s.diagnostics.at(-1)).toMatchObject({ revision: 449 });
    expect(s.diagnosticsTotal).toBe(450);
  });

  it("bounds a snapshot that came with more (a seed snapshot file) and counts them", () => {
    const seedSnapshot = { ...baseSnapshot("s"), diagnostics: Array.from({ length: 300 }, (_, i) => ({ error: "e", i })) };
    const s = applyEvent(seedSnapshot, { seq: 301, id: "s", type: "bogus", ts: iso(T0), event: { type: "bogus" } });
    expect(s.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(s.diagnostics[0]).toStrictEqual({ error: "e", i: 201 });
    expect(s.diagnostics.at(-1)).toStrictEqual({ error: "unknown_event_type", type: "bogus" });
    expect(s.diagnosticsTotal).toBe(301);
    expect(seedSnapshot.diagnostics).toHaveLength(300);
    // Once present, the total keeps counting.
    const t = applyEvent(s, { seq: 302, id: "s", type: "steer", ts: iso(T0), event: { type: "steer" } });
    expect(t.diagnosticsTotal).toBe(301);
    expect(applyEvent(t, { seq: 303, id: "s", type: "x", ts: iso(T0), event: { type: "x" } }).diagnosticsTotal).toBe(302);
  });

  it("places parse failures after every event's diagnostics, within the bound", () => {
    const replay = createReplay("s", { now });
    replay.apply({ seq: 1, ts: iso(T0), event: { type: "bogus" } });
    replay.parseFailure(2, "Unexpected end of JSON input");
    replay.apply({ seq: 3, ts: iso(T0), event: { type: "other" } });
    expect(replay.snapshot().diagnostics).toStrictEqual([
      { error: "unknown_event_type", type: "bogus" },
      { error: "unknown_event_type", type: "other" },
      { error: "journal_parse_failed", line: 2, message: "Unexpected end of JSON input" },
    ]);

    const many = createReplay("s", { now });
    for (let line = 1; line <= 150; line++) many.parseFailure(line, "bad");
    for (let i = 0; i < 120; i++) many.apply({ ts: iso(T0), event: { type: "bogus" } });
    const s = many.snapshot();
    expect(s.diagnosticsTotal).toBe(270);
    expect(s.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(s.diagnostics.every((d) => d.error === "journal_parse_failed")).toBe(true);
    expect(s.diagnostics[0]).toMatchObject({ line: 51 });
  });
});

describe("createReplay", () => {
  it("hands out snapshots that later entries do not change", () => {
    const replay = createReplay("s", { now });
    const list = entries([generate, { type: "detector_waivers", waivers: ["a"] }, { type: "variants_ready" }, { type: "variant_mounted", variant: 1 }]);
    replay.apply(list[0]!);
    replay.apply(list[1]!);
    const early = replay.snapshot();
    const copy = structuredClone(early);
    replay.apply(list[2]!);
    replay.apply(list[3]!);
    replay.apply({ seq: 5, ts: iso(T0), event: { type: "detector_waivers", waivers: ["b"] } });
    replay.parseFailure(9, "bad");
    const late = replay.snapshot();
    expect(early).toStrictEqual(copy);
    expect(late.mountedVariants).toStrictEqual([1]);
    expect(late.detectorWaivers).toStrictEqual(["a", "b"]);
    expect(late.diagnostics).toStrictEqual([{ error: "journal_parse_failed", line: 9, message: "bad" }]);
    expect(replay.snapshot()).toStrictEqual(late); // a second call adds nothing
  });

  it("starts from the base snapshot", () => {
    expect(createReplay("x").snapshot()).toStrictEqual(baseSnapshot("x"));
  });
});

describe("fixtures in the seed's on-disk format", () => {
  const dir = join(dirname(fileURLToPath(import.meta.url)), "fixtures", "journals");
  const names = readdirSync(dir)
    .filter((name) => name.endsWith(".jsonl"))
    .map((name) => name.slice(0, -".jsonl".length));

  it("are there", () => {
    expect(names.length).toBeGreaterThanOrEqual(6);
  });

  /** A parse failure's message comes from the runtime's JSON parser, which varies by version. */
  function withRuntimeParseMessages(expected: SessionSnapshot, text: string): SessionSnapshot {
    const lines = text.split("\n");
    const diagnostics = expected.diagnostics.map((d) => {
      if (d.error !== "journal_parse_failed" || d.message === "entry is not object") return d;
      try {
        JSON.parse(lines[(d.line as number) - 1] ?? "");
        return d;
      } catch (err) {
        return { ...d, message: (err as Error).message };
      }
    });
    return { ...expected, diagnostics };
  }

  it.each(names)("%s gives its expected snapshot through both paths", (name) => {
    const text = readFileSync(join(dir, `${name}.jsonl`), "utf8");
    const expected = withRuntimeParseMessages(JSON.parse(readFileSync(join(dir, `${name}.expected.json`), "utf8")), text);
    // A clock reading shows as a 2030 time in a field the expected snapshot does not have.
    const replayed = replayJournalText(name, text, { now });
    const folded = foldJournalText(name, text, { now });
    expect(folded).toStrictEqual(replayed);
    // As persisted: the same JSON, byte for byte, key order included.
    expect(JSON.stringify(replayed)).toBe(JSON.stringify(expected));
  });
});
