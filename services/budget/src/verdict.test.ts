import { describe, expect, it } from "vitest";
import { defaultPolicy } from "./policy.js";
import type { Policy } from "./policy.js";
import type { MachineSample } from "./sampler.js";
import type { Committed, VerdictContext } from "./verdict.js";
import { check, refusingGates } from "./verdict.js";

const G = 1024 ** 3;
const M = 1024 ** 2;

const policy: Policy = {
  ...defaultPolicy({ totalBytes: 16 * G, cpus: 4 }),
  memoryBytes: 8 * G,
  cpu: 4,
  reserveBytes: G,
  cpuPressure: 80,
  loadPerCore: 1.5,
};

const sample = (changes: Partial<MachineSample> = {}): MachineSample => ({
  at: 1000,
  monotonicAt: 1000,
  source: "host",
  availableBytes: 12 * G,
  cores: 4,
  load1: 0.5,
  pressure: {},
  ...changes,
});

const committed = (memoryBytes = 0, cpu = 0): Committed => ({
  memoryBytes,
  cpu,
  items: memoryBytes || cpu ? [{ kind: "reservation", id: "r1", label: "web up", memoryBytes, cpu }] : [],
});

const ctx = (changes: Partial<VerdictContext> = {}): VerdictContext => ({ policy, committed: committed(), sample: sample(), ...changes });
const need = (memoryBytes: number, cpu: number) => ({ memoryBytes, cpu });
const psi = (avg10: number, avg60: number) => ({ avg10, avg60, avg300: 0, total: 0, scope: "host" as const });

describe("check", () => {
  it.each<[string, { memoryBytes: number; cpu: number }, Partial<VerdictContext>, { skipLoadGate?: boolean }]>([
    ["a need that fits", need(2 * G, 1), {}, {}],
    ["a need of nothing, whatever the machine", need(0, 0), { committed: committed(100 * G, 100), sample: sample({ availableBytes: 0, load1: 99 }) }, {}],
    ["anything when the budget is off", need(100 * G, 100), { policy: { ...policy, enabled: false } }, {}],
    ["without a sample, only the budget gates", need(2 * G, 1), { sample: undefined }, {}],
    ["without MemAvailable, no free-memory gate", need(2 * G, 1), { sample: sample({ availableBytes: undefined }) }, {}],
    ["without PSI or load, no cpu gate", need(2 * G, 1), { sample: sample({ load1: undefined }) }, {}],
    ["pressure under the limit in one window", need(G, 1), { sample: sample({ pressure: { cpu: psi(95, 50) }, load1: 99 }) }, {}],
    [
      "pressure limit 100 turns the PSI gate off",
      need(G, 1),
      { policy: { ...policy, cpuPressure: 100 }, sample: sample({ pressure: { cpu: psi(100, 100) } }) },
      {},
    ],
    ["skipLoadGate skips a saturated cpu", need(G, 1), { sample: sample({ load1: 99 }) }, { skipLoadGate: true }],
    ["exactly at the budget", need(6 * G, 3), { committed: committed(2 * G, 1) }, {}],
  ])("fits: %s", (_name, want, context, options) => {
    const verdict = check(want, ctx(context), options);
    expect(verdict).toMatchObject({ fits: true, reasons: [], waitFor: undefined, impossible: undefined });
  });

  it.each<[string, { memoryBytes: number; cpu: number }, Partial<VerdictContext>, { skipLoadGate?: boolean }, Array<Record<string, unknown>>, string]>([
    [
      "memory budget",
      need(2 * G, 1),
      { committed: committed(7 * G, 1) },
      {},
      [
        {
          gate: "memory_budget",
          needed: 2 * G,
          available: G,
          limit: 8 * G,
          setting: "BERTH_BUDGET_MEMORY",
          consumers: [{ name: "web up", memoryBytes: 7 * G, berth: true }],
        },
      ],
      "memory: needs 2G, the budget has 1G of 8G free (berth has committed 7G); held by: 'web up' 7G",
    ],
    [
      "cpu budget",
      need(G, 2),
      { committed: committed(G, 3) },
      {},
      [{ gate: "cpu_budget", needed: 2, available: 1, limit: 4, setting: "BERTH_BUDGET_CPU" }],
      "cpu: needs 2, the budget has 1 of 4 free; held by: 'web up' 3 cpu",
    ],
    [
      "free memory below the reserve",
      need(2 * G, 1),
      { sample: sample({ availableBytes: 2.5 * G }) },
      {},
      [{ gate: "free_memory", needed: 2 * G, available: 2.5 * G, limit: G, setting: "BERTH_BUDGET_RESERVE" }],
      "free memory: the box has 2.5G available and keeps 1G in reserve (BERTH_BUDGET_RESERVE)",
    ],
    [
      "free memory less what was admitted since the sample",
      need(2 * G, 1),
      { sample: sample({ availableBytes: 5 * G }), unseenMemoryBytes: 2.5 * G },
      {},
      [{ gate: "free_memory", available: 2.5 * G }],
      "free memory: the box has 2.5G available (after 2.5G admitted since the last sample) and keeps 1G in reserve (BERTH_BUDGET_RESERVE)",
    ],
    [
      "cpu pressure over both windows",
      need(G, 1),
      { sample: sample({ pressure: { cpu: psi(85.4, 81.2) } }) },
      {},
      [{ gate: "cpu_pressure", observed: 85.4, limit: 80, setting: "BERTH_BUDGET_CPU_PRESSURE" }],
      "cpu pressure: runnable work waited 85% of the last 10s and 81% of the last minute (limit 80%, BERTH_BUDGET_CPU_PRESSURE)",
    ],
    [
      "load without PSI",
      need(G, 1),
      { sample: sample({ load1: 6.25 }) },
      {},
      [{ gate: "load", observed: 6.25, limit: 6, setting: "BERTH_BUDGET_LOAD_PER_CORE" }],
      "load: 6.3 on 4 cores is above 1.5 per core (BERTH_BUDGET_LOAD_PER_CORE)",
    ],
    [
      "skipLoadGate keeps the memory gates",
      need(2 * G, 1),
      { committed: committed(7 * G, 0), sample: sample({ load1: 99 }) },
      { skipLoadGate: true },
      [{ gate: "memory_budget" }],
      "memory: needs 2G, the budget has 1G of 8G free (berth has committed 7G); held by: 'web up' 7G",
    ],
    [
      "several reasons, in gate order",
      need(2 * G, 2),
      { committed: committed(7 * G, 3), sample: sample({ availableBytes: 2 * G, pressure: { cpu: psi(90, 90) } }) },
      {},
      [{ gate: "memory_budget" }, { gate: "cpu_budget" }, { gate: "free_memory" }, { gate: "cpu_pressure" }],
      "memory: needs 2G, the budget has 1G of 8G free (berth has committed 7G); held by: 'web up' 7G; cpu: needs 2, the budget has 1 of 4 free; held by: 'web up' 3 cpu; free memory: the box has 2G available and keeps 1G in reserve (BERTH_BUDGET_RESERVE); cpu pressure: runnable work waited 90% of the last 10s and 90% of the last minute (limit 80%, BERTH_BUDGET_CPU_PRESSURE)",
    ],
    [
      "PSI present: the load average is not consulted",
      need(G, 1),
      { sample: sample({ load1: 99, pressure: { cpu: psi(85, 85) } }) },
      {},
      [{ gate: "cpu_pressure" }],
      "cpu pressure: runnable work waited 85% of the last 10s and 85% of the last minute (limit 80%, BERTH_BUDGET_CPU_PRESSURE)",
    ],
  ])("waits: %s", (_name, want, context, options, reasons, text) => {
    const verdict = check(want, ctx(context), options);
    expect(verdict.fits).toBe(false);
    expect(verdict.impossible).toBeUndefined();
    expect(verdict.reasons).toMatchObject(reasons);
    expect(verdict.reasons.map((r) => r.message).join("; ")).toBe(text);
    expect(verdict.waitFor).toBe(text);
  });

  it.each([
    ["memory first", need(9 * G, 8), "it needs 9G of memory and the whole budget is 8G (BERTH_BUDGET_MEMORY)", "memory_budget"],
    ["then cpu", need(G, 6), "it needs 6 cpu and the whole budget is 4 (BERTH_BUDGET_CPU)", "cpu_budget"],
  ])("impossible: %s", (_name, want, text, gate) => {
    const verdict = check(want, ctx({ committed: committed(0, 0) }));
    expect(verdict).toMatchObject({ fits: false, impossible: text, waitFor: undefined });
    expect(verdict.reasons).toEqual([expect.objectContaining({ gate, message: text })]);
  });

  it("lists what holds the resources", () => {
    const verdict = check(need(2 * G, 1), ctx({ committed: committed(7 * G, 1) }));
    expect(verdict.committed.items).toEqual([{ kind: "reservation", id: "r1", label: "web up", memoryBytes: 7 * G, cpu: 1 }]);
  });

  it("refusingGates agrees with check on every case above (it is the same rule without strings)", () => {
    const cases: Array<[ReturnType<typeof need>, Partial<VerdictContext>]> = [
      [need(2 * G, 1), { committed: committed(7 * G, 1) }],
      [need(G, 2), { committed: committed(G, 3) }],
      [need(512 * M, 0.5), { sample: sample({ availableBytes: G }) }],
      [need(G, 1), { sample: sample({ load1: 7 }) }],
      [need(G, 1), {}],
    ];
    for (const [want, context] of cases) {
      expect(refusingGates(want, ctx(context)) === 0).toBe(check(want, ctx(context)).fits);
    }
  });
});

describe("who uses what a gate is short of", () => {
  const processes = {
    memory: () => [
      { name: "chromium", processes: 12, memoryBytes: 4.1 * G, cpu: 1.5, berth: false },
      { name: "node", pid: 812, processes: 1, memoryBytes: 2 * G, cpu: 0.2, berth: false },
      { name: "npm run build", pid: 900, processes: 1, memoryBytes: G, cpu: 0.9, berth: true },
    ],
    cpu: () => [
      { name: "chromium", processes: 12, memoryBytes: 4.1 * G, cpu: 1.5, berth: false },
      { name: "npm run build", pid: 900, processes: 1, memoryBytes: G, cpu: 0.9, berth: true },
    ],
  };

  it("names the machine's largest processes after free memory's and the cpu gates' sentences, berth's running work as berth's", () => {
    const memory = check(need(2 * G, 1), ctx({ sample: sample({ availableBytes: 2.5 * G }), machineConsumers: processes }));
    expect(memory.waitFor).toBe(
      "free memory: the box has 2.5G available and keeps 1G in reserve (BERTH_BUDGET_RESERVE); held by: chromium (12 processes) 4.1G, node (pid 812) 2G, berth: 'npm run build' 1G",
    );
    expect(memory.reasons[0]!.consumers).toHaveLength(3);
    const load = check(need(G, 1), ctx({ sample: sample({ load1: 6.25 }), machineConsumers: processes }));
    expect(load.waitFor).toBe(
      "load: 6.3 on 4 cores is above 1.5 per core (BERTH_BUDGET_LOAD_PER_CORE); busy: chromium (12 processes) 1.5 cpu, berth: 'npm run build' 0.9 cpu",
    );
  });

  it("names nothing it does not know: no process table, or an impossible need", () => {
    expect(check(need(2 * G, 1), ctx({ sample: sample({ availableBytes: 2.5 * G }) })).reasons[0]!.consumers).toBeUndefined();
    expect(check(need(9 * G, 1), ctx({ committed: committed(7 * G, 1), machineConsumers: processes })).impossible).toBe(
      "it needs 9G of memory and the whole budget is 8G (BERTH_BUDGET_MEMORY)",
    );
  });
});
