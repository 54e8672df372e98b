import { describe, expect, it } from "vitest";
import { applyEvent, baseSnapshot, MOUNT_FAILURE_HISTORY } from "./reducer.js";
import { T0, NOW, iso, reduce, reduceEntries, generate } from "./reducer-fixtures.js";

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
