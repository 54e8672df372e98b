import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { createBudget } from "./budget.js";
import { defaultPolicy } from "./policy.js";
import { RunningTally, runningFilePath } from "./running-tally.js";
import { ManualSampler } from "./sampler.js";

/** The atomic writer fails as on a full (or read-only) file system while `disk.failing` names an errno. */
const disk = vi.hoisted(() => ({ failing: undefined as string | undefined }));
vi.mock("@berth/shared/files", async (real) => {
  const files = await real<typeof import("@berth/shared/files")>();
  return {
    ...files,
    writeFileAtomic: async (...args: Parameters<typeof files.writeFileAtomic>) => {
      if (disk.failing !== undefined) throw Object.assign(new Error(`${disk.failing}: cannot write '${args[0]}'`), { code: disk.failing });
      return files.writeFileAtomic(...args);
    },
  };
});

const G = 1024 ** 3;
const quiet = { debug() {}, info() {}, warn() {}, error() {} };
let stateDir: string;
beforeEach(() => {
  stateDir = mkdtempSync(path.join(tmpdir(), "berth-tally-"));
});
afterEach(() => {
  disk.failing = undefined;
  rmSync(stateDir, { recursive: true, force: true });
});

const onDisk = () => (JSON.parse(readFileSync(runningFilePath(stateDir), "utf8")) as { entries: Array<{ name: string }> }).entries.map((e) => e.name);

describe("the running tally on a full or read-only disk", () => {
  it("refuses a registration it cannot save with DISK_FULL naming the state directory, counting nothing; saves again once there is room", async () => {
    const tally = await RunningTally.open({ clock: new ManualClock(), stateDir, logger: quiet });
    await tally.registerDurably("before", { memoryBytes: G, cpu: 1 });
    disk.failing = "ENOSPC";
    await expect(tally.registerDurably("refused", { memoryBytes: G, cpu: 1 })).rejects.toMatchObject({
      code: "resource_exhausted",
      reason: "DISK_FULL",
      message: expect.stringContaining(`the file system of the state directory ${stateDir} is full (ENOSPC)`),
    });
    expect(tally.entries().map((e) => e.name)).toEqual(["before"]);
    expect(onDisk()).toEqual(["before"]);
    disk.failing = undefined;
    await tally.registerDurably("after", { memoryBytes: G, cpu: 1 });
    expect(onDisk()).toEqual(["before", "after"]);
    await tally.close();
  });

  it("a refused registration leaves its request id free: the retry counts the work once, and the file keeps the id", async () => {
    const clock = new ManualClock();
    const sampler = new ManualSampler({ availableBytes: 64 * G, cores: 8, load1: 0 }, clock);
    const budget = await createBudget({ policy: defaultPolicy({ totalBytes: 64 * G, cpus: 8 }), sampler, clock, stateDir });
    disk.failing = "ENOSPC";
    await expect(budget.registerRunning("web", { memoryBytes: G, cpu: 1 }, { requestId: "r1" })).rejects.toMatchObject({ reason: "DISK_FULL" });
    disk.failing = undefined;
    const { running: entry } = await budget.registerRunning("web", { memoryBytes: G, cpu: 1 }, { requestId: "r1" });
    expect(await budget.registerRunning("web", { memoryBytes: G, cpu: 1 }, { requestId: "r1" })).toEqual({ running: entry });
    expect(budget.state().running.map((e) => e.id)).toEqual([entry.id]);
    const saved = JSON.parse(readFileSync(runningFilePath(stateDir), "utf8")) as { entries: Array<{ id: string; requestId?: string }> };
    expect(saved.entries).toEqual([expect.objectContaining({ id: entry.id, requestId: "r1" })]);
    await budget.close();
  });

  it("a write that fails otherwise (EIO) is UNAVAILABLE STATE_READ_ONLY, not taken for a shutdown", async () => {
    const tally = await RunningTally.open({ clock: new ManualClock(), stateDir, logger: quiet });
    disk.failing = "EIO";
    await expect(tally.registerDurably("web", { memoryBytes: G, cpu: 1 })).rejects.toMatchObject({
      code: "unavailable",
      reason: "STATE_READ_ONLY",
      message: expect.stringContaining("EIO"),
    });
    expect(tally.entries()).toEqual([]);
    await tally.close();
  });

  it("a stop it cannot save leaves the entry counted, as the file has it, and says STATE_READ_ONLY on a read-only remount", async () => {
    const tally = await RunningTally.open({ clock: new ManualClock(), stateDir, logger: quiet });
    const entry = await tally.registerDurably("web", { memoryBytes: G, cpu: 1 }, { ttlMs: 10_000 });
    disk.failing = "EROFS";
    await expect(tally.stopDurably(entry.id)).rejects.toMatchObject({
      code: "unavailable",
      reason: "STATE_READ_ONLY",
      message: expect.stringContaining("mounted read-only"),
    });
    expect(tally.entries().map((e) => e.id)).toEqual([entry.id]);
    disk.failing = undefined;
    expect(await tally.stopDurably(entry.id)).toBe(true);
    expect(onDisk()).toEqual([]);
    await tally.close();
  });

  it("a start it cannot save moves nothing: the reservation keeps its share, the tally counts nothing; the budget goes on admitting", async () => {
    const clock = new ManualClock();
    const sampler = new ManualSampler({ availableBytes: 64 * G, cores: 8, load1: 0 }, clock);
    const policy = { ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }), memoryBytes: 8 * G, cpu: 4, reserveBytes: G };
    const budget = await createBudget({ policy, sampler, clock, stateDir });
    const need = { items: [], start: { memoryBytes: 2 * G, cpu: 1 }, build: { memoryBytes: 0, cpu: 0 } };
    const r = await budget.admit(need, "up");
    disk.failing = "ENOSPC";
    await expect(budget.consume(r.id, "web", { memoryBytes: G, cpu: 1 }, { pid: process.pid })).rejects.toMatchObject({ reason: "DISK_FULL" });
    expect(r.start).toEqual({ memoryBytes: 2 * G, cpu: 1 });
    expect(budget.state().running).toEqual([]);
    expect(r.runningIds).toEqual([]);
    expect(budget.state().committed.memoryBytes).toBe(2 * G);
    expect((await budget.admit(need, "more")).owner).toBe("more");
    disk.failing = undefined;
    const { running: entry } = await budget.consume(r.id, "web", { memoryBytes: G, cpu: 1 }, { pid: process.pid });
    expect(onDisk()).toEqual(["web"]);
    expect(r.runningIds).toEqual([entry.id]);
    await budget.close();
  });
});

describe("after a pause", () => {
  it("leases that ran out end once, in the order they ran out, even when a late renewal is read before the timers run", async () => {
    const clock = new ManualClock();
    const ended: string[] = [];
    const logger = {
      ...quiet,
      info: (fields: object, message?: string) =>
        void (message?.includes("lease ran out") && ended.push((fields as { owner?: string; name?: string }).owner ?? (fields as { name: string }).name)),
    };
    const sampler = new ManualSampler({ availableBytes: 64 * G, cores: 8, load1: 0 }, clock);
    const policy = { ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }), memoryBytes: 8 * G, cpu: 4, reserveBytes: G };
    const budget = await createBudget({ policy, sampler, clock, stateDir, logger });
    const need = { items: [], start: { memoryBytes: G, cpu: 0 }, build: { memoryBytes: 0, cpu: 0 } };
    await budget.reserve(need, "first", { ttlMs: 1000 });
    const second = await budget.reserve(need, "second", { ttlMs: 2000 });
    const { running: daemon } = await budget.registerRunning("daemon", { memoryBytes: G, cpu: 0 }, { ttlMs: 1500 });
    await budget.registerRunning("later", { memoryBytes: G, cpu: 0 }, { ttlMs: 500 });
    clock.stall(30_000);
    expect(() => budget.renew(second.id)).toThrow(/no reservation/);
    expect(ended).toEqual(["first", "second"]);
    await expect(budget.renewRunning(daemon.id)).rejects.toMatchObject({ code: "not_found" });
    expect(ended).toEqual(["first", "second", "later", "daemon"]);
    clock.ioRead();
    clock.advance(0);
    expect(ended).toHaveLength(4);
    expect(budget.state().committed.memoryBytes).toBe(0);
    await budget.close();
  });
});
