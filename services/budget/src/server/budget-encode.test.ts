import { describe, expect, it } from "vitest";
import { CgroupVersion, Gate, SampleSource } from "@berth/api/berth/budget/v1/budget_pb";
import type { MachineSample } from "../index.js";
import { committed, G, memoryReason, queueReason } from "./codec-fixtures.js";
import { coresOf, machineToProto, queueToProto, waitReasonToProto } from "./budget-encode.js";

describe("outbound", () => {
  it("gives budget gates their holders (largest first) and committed figure, and the queue gate its count", () => {
    const reason = waitReasonToProto(memoryReason, { committed });
    expect(reason.gate).toBe(Gate.MEMORY_BUDGET);
    expect(reason.observed).toBe(7 * G);
    expect(reason.holders.map((h) => h.what)).toEqual(["in flight: up web", "running: db"]);
    const cpu = waitReasonToProto({ gate: "cpu_budget", message: "cpu", needed: 2, available: 1, limit: 4 }, { committed });
    expect(cpu.holders.map((h) => h.what)).toEqual(["running: db", "in flight: up web"]);
    expect(waitReasonToProto(queueReason(3), { committed }, 3)).toMatchObject({ gate: Gate.QUEUE, observed: 3, setting: "" });
  });

  it("lists holders on the first waiter's queue entry only", () => {
    const entries = [1, 2].map((position) => ({
      id: `q${position}`,
      seq: position,
      owner: `w${position}`,
      position,
      needs: { memoryBytes: G, cpu: 1 },
      skipLoadGate: false,
      queuedAt: 0,
      waitedMs: 0,
      etaMs: 1000,
      etaBasis: "the budget has room for it now",
      deadline: 60_000,
    }));
    const [firstWaiter, second] = queueToProto(entries, [memoryReason], { committed });
    expect(firstWaiter!.waitFor[0]!.holders).toHaveLength(2);
    expect(second!.waitFor.map((r) => [r.gate, r.holders.length])).toEqual([
      [Gate.QUEUE, 0],
      [Gate.MEMORY_BUDGET, 0],
    ]);
  });

  it("leaves unsampled figures unset and caps cores by the cgroup's quota", () => {
    const sample: MachineSample = {
      at: 1_000,
      monotonicAt: 1_000,
      source: "cgroup",
      cores: 8,
      cpuLimit: 1.5,
      pressure: {},
      availableBytes: G,
      cgroup: { version: "v2", path: "/box", memoryLimitBytes: 2 * G },
    };
    const machine = machineToProto(sample)!;
    expect(machine.source).toBe(SampleSource.CGROUP);
    expect(machine.load1).toBeUndefined();
    expect(machine.totalBytes).toBeUndefined();
    expect(machine.cpuPressure).toBeUndefined();
    expect(machine.cgroup?.memoryMax).toBe(BigInt(2 * G));
    expect(machine.cgroup?.memoryAvailable).toBe(BigInt(G));
    expect(machine.cgroup?.version).toBe(CgroupVersion.V2);
    expect(machineToProto({ ...sample, cgroup: { version: "v1", path: "/docker/abc" } })?.cgroup?.version).toBe(CgroupVersion.V1);
    expect(coresOf(sample)).toBe(2);
    expect(coresOf({ ...sample, cpuLimit: 0.2 })).toBe(1);
  });
});
