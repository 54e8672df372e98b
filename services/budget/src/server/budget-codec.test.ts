import { create, fromBinary, toBinary, toJson } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { Gate, NeedItemKind, NeedSchema, SampleSource } from "@berth/api/berth/budget/v1/budget_pb";
import { AdmitResponseSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { Committed, MachineSample, QueuedUpdate, Reason } from "../index.js";
import { QueuedEncoder, coresOf, durationMs, machineToProto, needItemsFromProto, queueToProto, resourceSpecFromProto, waitReasonToProto } from "./budget-codec.js";

const G = 1024 ** 3;

const committed: Committed = {
  memoryBytes: 7 * G,
  cpu: 3,
  items: [
    { kind: "running", id: "r1", label: "db", memoryBytes: 1 * G, cpu: 2 },
    { kind: "reservation", id: "a1", label: "up web", memoryBytes: 6 * G, cpu: 1 },
  ],
};
const memoryReason: Reason = { gate: "memory_budget", message: "memory: needs 2G, the budget has 1G of 8G free (berth has committed 7G)", needed: 2 * G, available: G, limit: 8 * G, setting: "BERTH_BUDGET_MEMORY" };
const queueReason = (ahead: number): Reason => ({ gate: "queue", message: `${ahead} request(s) ahead in the queue` });

describe("inbound checks", () => {
  it.each([
    [{ seconds: 1n, nanos: 500_000_000 }, 1500],
    [{ seconds: 0n, nanos: 0 }, 0],
    [undefined, undefined],
  ])("reads duration %o as %s ms", (duration, ms) => {
    expect(durationMs(duration === undefined ? undefined : { $typeName: "google.protobuf.Duration", ...duration }, "d")).toBe(ms);
  });

  it("refuses durations that are negative, malformed or too long for a timer", () => {
    const d = (seconds: bigint, nanos: number) => ({ $typeName: "google.protobuf.Duration" as const, seconds, nanos });
    expect(() => durationMs(d(-1n, 0), "ttl")).toThrow(/^ttl: must not be negative/);
    expect(() => durationMs(d(0n, -5), "ttl")).toThrow(/^ttl: nanos/);
    expect(() => durationMs(d(30n * 86_400n, 0), "ttl")).toThrow(/^ttl: must be at most 24 days/);
    expect(() => durationMs(d(0n, 0), "ttl", { positive: true })).toThrow(/^ttl: must be a positive duration/);
  });

  it("parses sizes in specs and names the part that is wrong", () => {
    expect(resourceSpecFromProto({ $typeName: "berth.budget.v1.ResourceSpec", memory: "1.5GiB", cpu: 2, build: { $typeName: "berth.budget.v1.BuildSpec", memory: "2G" } })).toEqual({
      memory: 1.5 * G,
      cpu: 2,
      build: { memory: 2 * G, cpu: undefined },
    });
    expect(() => resourceSpecFromProto({ $typeName: "berth.budget.v1.ResourceSpec", build: { $typeName: "berth.budget.v1.BuildSpec", cpu: -1 } })).toThrow(/^spec\.build\.cpu:/);
  });

  it("reads a need's items, an empty skip reason still skipping", () => {
    const items = needItemsFromProto(create(NeedSchema, { items: [{ kind: NeedItemKind.BUILD, name: "web", skipped: "", wave: 2 }] }));
    expect(items).toEqual([{ kind: "build", name: "web", skipped: "skipped", wave: 2 }]);
  });
});

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

  it("lists holders on the head's queue entry only", () => {
    const entries = [1, 2].map((position) => ({ id: `q${position}`, seq: position, owner: `w${position}`, position, needs: { memoryBytes: G, cpu: 1 }, skipLoadGate: false, queuedAt: 0, waitedMs: 0, etaMs: 1000, deadline: 60_000 }));
    const [head, second] = queueToProto(entries, [memoryReason], { committed });
    expect(head!.waitFor[0]!.holders).toHaveLength(2);
    expect(second!.waitFor.map((r) => [r.gate, r.holders.length])).toEqual([
      [Gate.QUEUE, 0],
      [Gate.MEMORY_BUDGET, 0],
    ]);
  });

  it("leaves unsampled figures unset and caps cores by the cgroup's quota", () => {
    const sample: MachineSample = { at: 1_000, monotonicAt: 1_000, source: "cgroup", cores: 8, cpuLimit: 1.5, pressure: {}, availableBytes: G, cgroup: { path: "/box", memoryLimitBytes: 2 * G } };
    const machine = machineToProto(sample)!;
    expect(machine.source).toBe(SampleSource.CGROUP);
    expect(machine.load1).toBeUndefined();
    expect(machine.totalBytes).toBeUndefined();
    expect(machine.cpuPressure).toBeUndefined();
    expect(machine.cgroup?.memoryMax).toBe(BigInt(2 * G));
    expect(machine.cgroup?.memoryAvailable).toBe(BigInt(G));
    expect(coresOf(sample)).toBe(2);
    expect(coresOf({ ...sample, cpuLimit: 0.2 })).toBe(1);
  });
});

describe("QueuedEncoder", () => {
  const ahead = Array.from({ length: 10 }, (_, i) => ({ owner: i === 3 ? "café ☕" : `waiter ${i}`, needs: { memoryBytes: (i + 1) * G, cpu: i / 2 } }));
  const updates: QueuedUpdate[] = [
    { position: 1, etaMs: 60_000, waitFor: [memoryReason], waitForText: memoryReason.message, ahead: [], aheadCount: 0 },
    { position: 2, etaMs: 1_234, waitFor: [queueReason(1), memoryReason], waitForText: `1 request(s) ahead in the queue; ${memoryReason.message}`, ahead: ahead.slice(0, 1), aheadCount: 1 },
    { position: 5000, etaMs: 300_059_957, waitFor: [queueReason(4999), memoryReason], waitForText: "4999 request(s) ahead in the queue; é", ahead, aheadCount: 4999 },
    { position: 1, etaMs: 0, waitFor: [], waitForText: "", ahead: [], aheadCount: 0 },
    { position: 3, etaMs: 999, waitFor: [queueReason(2)], waitForText: "2 request(s) ahead in the queue", ahead: ahead.slice(0, 2), aheadCount: 2 },
  ];

  it.each(updates.map((u, i) => [i, u] as const))("encodes update %i to the same bytes as the reflective writer", (_i, update) => {
    const encoder = new QueuedEncoder(() => ({ committed }));
    const deadline = Date.UTC(2026, 0, 1, 12, 0, 0, 250);
    const fast = toBinary(AdmitResponseSchema, encoder.response(update, QueuedEncoder.deadline(deadline), true));
    const reference = toBinary(AdmitResponseSchema, create(AdmitResponseSchema, { kind: { case: "queued", value: encoder.encode(update, deadline) } }));
    expect(Buffer.from(fast).toString("hex")).toBe(Buffer.from(reference).toString("hex"));
    const decoded = fromBinary(AdmitResponseSchema, fast);
    expect(decoded.kind.case).toBe("queued");
    if (decoded.kind.case === "queued") expect(decoded.kind.value.position).toBe(update.position);
  });

  it("gives a call that is not binary the real message (JSON serialization skips a pre-encoded field)", () => {
    const encoder = new QueuedEncoder(() => ({ committed }));
    const deadline = QueuedEncoder.deadline(Date.UTC(2026, 0, 1, 12));
    const response = encoder.response(updates[2]!, deadline, false);
    expect(response.$unknown).toBeUndefined();
    expect(response.kind).toEqual({ case: "queued", value: encoder.encode(updates[2]!, deadline.ms) });
    expect(toJson(AdmitResponseSchema, response)).toMatchObject({ queued: { position: 5000, eta: "300059.957s", waitForText: "4999 request(s) ahead in the queue; é" } });
  });
});
