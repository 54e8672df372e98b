import { describe, expect, it } from "vitest";
import { descriptorRefusal, stateWriteError } from "./state-errors.js";

const failure = (code: string) => Object.assign(new Error(`${code}: something, open '/state/sessions/s1.jsonl'`), { code });

describe("a refusal for want of a descriptor", () => {
  it("is RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES, retryable in a second, for EMFILE and ENFILE alike, on reads as on writes", () => {
    for (const code of ["EMFILE", "ENFILE"]) {
      const refusal = descriptorRefusal(failure(code), "session s1: its journal could not be read", { sessionId: "s1" });
      expect(refusal).toMatchObject({
        code: "resource_exhausted",
        reason: "TOO_MANY_OPEN_FILES",
        options: { retryAfterMs: 1000 },
        details: { sessionId: "s1", errno: code },
      });
      expect(refusal?.message).toMatch(new RegExp(`^session s1: its journal could not be read: the service has no file descriptor left \\(${code}`));
      expect(stateWriteError(failure(code), "session s1: the append was not written", "/state")).toMatchObject({
        reason: "TOO_MANY_OPEN_FILES",
        details: { stateDir: "/state", errno: code },
      });
    }
  });

  it("is not made of other errors", () => {
    expect(descriptorRefusal(failure("ENOSPC"), "x")).toBeUndefined();
    expect(descriptorRefusal(new Error("EMFILE"), "x")).toBeUndefined();
    expect(stateWriteError(failure("ENOSPC"), "x", "/state")).toMatchObject({ reason: "DISK_FULL" });
  });
});
