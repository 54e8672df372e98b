import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { isBerthError } from "@berth/shared/errors";
import { loadConfig } from "@berth/shared/config";
import { POLICY_SETTINGS, defaultPolicy, loadPolicy, policyFromConfig, validatePolicy } from "./policy.js";

const G = 1024 ** 3;
const M = 1024 ** 2;
const machine = { totalBytes: 16 * G, cpus: 8 };
const dir = mkdtempSync(path.join(tmpdir(), "berth-policy-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function thrown(fn: () => unknown): { code: string; message: string; field: string } {
  try {
    fn();
  } catch (error) {
    if (!isBerthError(error)) throw error;
    return { code: error.code, message: error.message, field: String(error.details?.field) };
  }
  throw new Error("expected a refusal");
}

describe("defaultPolicy", () => {
  it("derives the budget from the machine", () => {
    expect(defaultPolicy(machine)).toEqual({
      enabled: true,
      memoryBytes: 12 * G,
      cpu: 8,
      reserveBytes: G,
      cpuPressure: 80,
      loadPerCore: 1.5,
      maxWaitMs: 600_000,
      maxQueue: 1000,
      defaultRun: { memoryBytes: 512 * M, cpu: 0.5 },
      defaultBuild: { memoryBytes: 2 * G, cpu: 1 },
      queueMode: "fifo",
      heartbeatMs: 5000,
    });
  });

  it("keeps 10 % in reserve on a small machine", () => {
    expect(defaultPolicy({ totalBytes: 4 * G, cpus: 2 }).reserveBytes).toBe(Math.floor(0.4 * G));
  });
});

describe("loadPolicy", () => {
  it("reads BERTH_BUDGET_* variables", () => {
    const policy = loadPolicy({
      machine,
      env: {
        BERTH_BUDGET_MEMORY: "8G",
        BERTH_BUDGET_CPU: "4",
        BERTH_BUDGET_RESERVE: "512M",
        BERTH_BUDGET_CPU_PRESSURE: "60",
        BERTH_BUDGET_LOAD_PER_CORE: "2",
        BERTH_BUDGET_WAIT: "30s",
        BERTH_BUDGET_MAX_QUEUE: "5",
        BERTH_BUDGET_DEFAULT_RUN_MEMORY: "256M",
        BERTH_BUDGET_DEFAULT_RUN_CPU: "0.25",
        BERTH_BUDGET_DEFAULT_BUILD_MEMORY: "1G",
        BERTH_BUDGET_DEFAULT_BUILD_CPU: "2",
        BERTH_BUDGET_QUEUE: "backfill",
        BERTH_BUDGET_HEARTBEAT: "2s",
        BERTH_BUDGET_ENABLED: "off",
      },
    });
    expect(policy).toEqual({
      enabled: false,
      memoryBytes: 8 * G,
      cpu: 4,
      reserveBytes: 512 * M,
      cpuPressure: 60,
      loadPerCore: 2,
      maxWaitMs: 30_000,
      maxQueue: 5,
      defaultRun: { memoryBytes: 256 * M, cpu: 0.25 },
      defaultBuild: { memoryBytes: G, cpu: 2 },
      queueMode: "backfill",
      heartbeatMs: 2000,
    });
  });

  it("with nothing set, is the machine's default policy", () => {
    expect(loadPolicy({ machine, env: {} })).toEqual(defaultPolicy(machine));
  });

  it("accepts the seed's BACKLOT_BUDGET_* names; berth's own win", () => {
    expect(loadPolicy({ machine, env: { BACKLOT_BUDGET_MEMORY: "4G", BACKLOT_BUDGET_CPU: "3" } })).toMatchObject({ memoryBytes: 4 * G, cpu: 3 });
    expect(loadPolicy({ machine, env: { BACKLOT_BUDGET_MEMORY: "4G", BERTH_BUDGET_MEMORY: "6G" } }).memoryBytes).toBe(6 * G);
  });

  it("takes a share of the machine's memory", () => {
    expect(loadPolicy({ machine, env: { BERTH_BUDGET_MEMORY: "50%", BERTH_BUDGET_RESERVE: "5%" } })).toMatchObject({
      memoryBytes: 8 * G,
      reserveBytes: Math.floor(0.8 * G),
    });
  });

  it("layers flags over env over the config file over defaults", () => {
    const file = path.join(dir, "budget.json");
    writeFileSync(file, JSON.stringify({ memory: "2G", cpu: 2, wait: "1m", "default-run-memory": "128M", defaultRunCpu: 0.1 }));
    const policy = loadPolicy({ machine, file, env: { BERTH_BUDGET_CPU: "3" }, argv: ["--wait=5s", "--queue", "backfill"] });
    expect(policy).toMatchObject({ memoryBytes: 2 * G, cpu: 3, maxWaitMs: 5000, queueMode: "backfill", defaultRun: { memoryBytes: 128 * M, cpu: 0.1 } });
  });

  it("can be spread into a server's own settings and read back from its values", () => {
    const loaded = loadConfig(
      { ...POLICY_SETTINGS, port: { flag: "port", default: 7302, parse: Number, doc: "port" } },
      { argv: ["--memory=3G", "--port=1"], env: {} },
    );
    expect(policyFromConfig(loaded.values, machine).memoryBytes).toBe(3 * G);
  });

  it.each([
    [{ env: { BERTH_BUDGET_MEMORY: "12Q" } }, "BERTH_BUDGET_MEMORY"],
    [{ env: { BERTH_BUDGET_CPU: "-2" } }, "BERTH_BUDGET_CPU"],
    [{ env: { BERTH_BUDGET_CPU: "NaN" } }, "BERTH_BUDGET_CPU"],
    [{ env: { BERTH_BUDGET_LOAD_PER_CORE: "0" } }, "BERTH_BUDGET_LOAD_PER_CORE"],
    [{ env: { BERTH_BUDGET_CPU_PRESSURE: "120" } }, "BERTH_BUDGET_CPU_PRESSURE"],
    [{ env: { BERTH_BUDGET_MAX_QUEUE: "2.5" } }, "BERTH_BUDGET_MAX_QUEUE"],
    [{ env: { BERTH_BUDGET_WAIT: "-1s" } }, "BERTH_BUDGET_WAIT"],
    [{ env: { BACKLOT_BUDGET_RESERVE: "-1G" } }, "BACKLOT_BUDGET_RESERVE"],
    [{ env: { BERTH_BUDGET_QUEUE: "lifo" } }, "BERTH_BUDGET_QUEUE"],
    [{ env: { BERTH_BUDGET_ENABLED: "maybe" } }, "BERTH_BUDGET_ENABLED"],
    [{ env: { BERTH_BUDGET_HEARTBEAT: "0s" } }, "BERTH_BUDGET_HEARTBEAT"],
    [{ argv: ["--cpu=lots"] }, "--cpu"],
    [{ argv: ["--memory=200%"] }, "--memory"],
  ])("refuses %j naming the setting", (sources, field) => {
    const refusal = thrown(() => loadPolicy({ machine, env: {}, ...sources }));
    expect(refusal.code).toBe("invalid_argument");
    expect(refusal.field).toBe(field);
    expect(refusal.message.startsWith(`${field}: `)).toBe(true);
  });

  it("refuses a config file's unknown key and bad value naming the file", () => {
    const unknown = path.join(dir, "unknown.json");
    writeFileSync(unknown, JSON.stringify({ memroy: "2G" }));
    expect(thrown(() => loadPolicy({ machine, env: {}, file: unknown })).message).toContain(`unknown setting in ${unknown}`);
    const bad = path.join(dir, "bad.json");
    writeFileSync(bad, JSON.stringify({ cpu: -1 }));
    expect(thrown(() => loadPolicy({ machine, env: {}, file: bad })).field).toBe(`cpu (in ${bad})`);
  });
});

describe("validatePolicy", () => {
  it.each([
    ["memoryBytes", Number.NaN],
    ["memoryBytes", -1],
    ["cpu", 0],
    ["reserveBytes", -1],
    ["cpuPressure", Number.NaN],
    ["loadPerCore", Number.POSITIVE_INFINITY],
    ["maxQueue", 1.5],
    ["maxWaitMs", -5],
    ["heartbeatMs", 0],
  ])("refuses %s = %d", (key, value) => {
    const refusal = thrown(() => validatePolicy({ ...defaultPolicy(machine), [key]: value }));
    expect(refusal.code).toBe("invalid_argument");
    expect(refusal.field).toBe(`policy.${key}`);
  });

  it("refuses a NaN default cost", () => {
    expect(thrown(() => validatePolicy({ ...defaultPolicy(machine), defaultRun: { memoryBytes: Number.NaN, cpu: 1 } })).field).toBe(
      "policy.defaultRun.memoryBytes",
    );
  });
});
