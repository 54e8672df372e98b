import { describe, expect, it } from "vitest";
import { isCompletedPhase } from "./vocabulary.js";
import { T0, NOW, iso, reduce, reduceEntries, generate } from "./reducer-fixtures.js";

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
