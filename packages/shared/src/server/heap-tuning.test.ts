import { execFileSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { DAEMON_HEAP_FLAGS } from "./heap-tuning.js";

describe("tuneHeapForDaemon", () => {
  it("sets only flags this Node's V8 knows (an unknown one would be ignored with a warning)", () => {
    const known = execFileSync(process.execPath, ["--v8-options"], { encoding: "utf8" });
    for (const flag of DAEMON_HEAP_FLAGS) {
      const name = flag.replace(/^--/, "").replace(/=.*$/, "");
      expect(known).toContain(`--${name} `);
    }
  });
});
