import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { errorAdvice, protoComment } from "./proto-docs.js";

const SCRIPT = fileURLToPath(new URL("../scripts/proto-docs.mjs", import.meta.url));
const JSON_FILE = fileURLToPath(new URL("./proto-docs.json", import.meta.url));

describe("proto-docs.json", () => {
  it("is what scripts/proto-docs.mjs makes of proto/ now (npm run generate writes it)", () => {
    const fresh = execFileSync(process.execPath, [SCRIPT, "--check"], { encoding: "utf8", maxBuffer: 16 << 20 });
    expect(fresh === readFileSync(JSON_FILE, "utf8"), "packages/mcp/src/proto-docs.json is stale: run npm run generate").toBe(true);
  }, 30_000);

  it("gives a field's comment as one paragraph, and throws for an element without one", () => {
    expect(protoComment("berth.sessions.v1.AgentPhaseEvent.phase")).toBe(
      'The phase name (`phase`), e.g. "planning", "writing". Unset keeps the current `generationPhase`; unset or empty records no timing.',
    );
    expect(() => protoComment("berth.sessions.v1.NoSuchMessage")).toThrow(/no comment for berth.sessions.v1.NoSuchMessage/);
  });

  it("gives what to do about each reason of each service's error table, the shared rows included", () => {
    expect(errorAdvice("berth.sessions", "SEQ_CONFLICT")).toBe("re-read, redo the change, append again");
    expect(errorAdvice("berth.locks", "WAIT_EXHAUSTED")).toMatch(/retry/);
    expect(errorAdvice("berth.budget", "IMPOSSIBLE")).toMatch(/declare less/);
    expect(errorAdvice("berth.budget", "TOKEN_INVALID")).toBe(errorAdvice("berth.budget", "TOKEN_MISSING"));
    expect(errorAdvice("berth.sessions", "NO_SUCH_REASON")).toBeUndefined();
  });
});
