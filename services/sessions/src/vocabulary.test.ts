import { describe, expect, it } from "vitest";
import { COMPLETED_SESSION_PHASES, GENERATION_FENCED_SESSION_PHASES, isCompletedPhase, isPastGenerationCutoff } from "./vocabulary.js";

describe("vocabulary", () => {
  it("lists the completed and generation-fenced phases", () => {
    expect(COMPLETED_SESSION_PHASES).toEqual(["completed", "discarded"]);
    expect(GENERATION_FENCED_SESSION_PHASES).toEqual(["accept_requested", "discard_requested", "carbonize_required", "completed", "discarded"]);
    expect(isCompletedPhase("discarded")).toBe(true);
    expect(isCompletedPhase("accept_requested")).toBe(false);
    expect(isPastGenerationCutoff("carbonize_required")).toBe(true);
    expect(isPastGenerationCutoff("variants_ready")).toBe(false);
  });
});
