import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { reloadSettings } from "./reload-settings.js";
import { RELOADABLE_SETTINGS } from "./settings.js";

const dir = mkdtempSync(path.join(tmpdir(), "berth-reload-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function configFile(name: string, content: unknown): string {
  const file = path.join(dir, name);
  writeFileSync(file, typeof content === "string" ? content : JSON.stringify(content));
  return file;
}

describe("reloadSettings", () => {
  it("keeps the policy's flags and skips the others, positionals included (berth up)", () => {
    const values = reloadSettings(RELOADABLE_SETTINGS, {
      argv: ["up", "--sessions-port", "0", "--memory=6G", "--state-dir", "/tmp/x", "--max-queue", "7", "--host=127.0.0.1"],
      env: {},
    });
    expect(values.memory).toEqual({ bytes: 6 * 1024 ** 3 });
    expect(values.maxQueue).toBe(7);
  });

  it("reads the config file, ignoring the keys of other settings by flag or key name", () => {
    const file = configFile("a.json", { "state-dir": "/x", budgetPort: 7, memory: "2G", "lease-ttl": "1m", heartbeat: "2s" });
    const values = reloadSettings(RELOADABLE_SETTINGS, { argv: [`--config=${file}`], env: {} });
    expect(values.memory).toEqual({ bytes: 2 * 1024 ** 3 });
    expect(values.leaseTtl).toBe(60_000);
    expect(values.heartbeat).toBe(2000);
  });

  it("keeps the precedence: flags over environment over the file (BERTH_CONFIG names it too)", () => {
    const file = configFile("b.json", { memory: "2G", cpu: 3, "max-queue": 9 });
    const values = reloadSettings(RELOADABLE_SETTINGS, {
      argv: ["--cpu=1"],
      env: { BERTH_CONFIG: file, BERTH_BUDGET_MEMORY: "5G", BACKLOT_BUDGET_MAX_QUEUE: "4" },
    });
    expect(values.cpu).toBe(1);
    expect(values.memory).toEqual({ bytes: 5 * 1024 ** 3 });
    expect(values.maxQueue).toBe(4);
  });

  it("throws for a value that does not parse, or a file that is not JSON", () => {
    expect(() => reloadSettings(RELOADABLE_SETTINGS, { argv: [`--config=${configFile("c.json", { memory: "lots" })}`], env: {} })).toThrow(/memory/);
    expect(() => reloadSettings(RELOADABLE_SETTINGS, { argv: [`--config=${configFile("d.json", "{not json")}`], env: {} })).toThrow(/not valid JSON/);
    expect(() => reloadSettings(RELOADABLE_SETTINGS, { argv: [`--config=${path.join(dir, "missing.json")}`], env: {} })).toThrow(/cannot read/);
  });
});
