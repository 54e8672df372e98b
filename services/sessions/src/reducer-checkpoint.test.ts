import { describe, expect, it } from "vitest";
import { applyEvent, baseSnapshot } from "./reducer.js";
import { entries, reduce, generate } from "./reducer-fixtures.js";

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
