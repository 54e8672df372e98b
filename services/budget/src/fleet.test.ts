import { afterEach, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import type { Budget } from "./budget-interface.js";
import { createBudget } from "./budget.js";
import { defaultPolicy } from "./policy.js";
import { ManualSampler } from "./sampler.js";
import { fleetEntryOf, startFleetReports, type FleetEntry, type FleetPublisher } from "./fleet.js";

const G = 1024 ** 3;
const identity = { machine: "box-a", hostname: "box-a.example", pid: 42 };

/** A publisher that records, and whose publications settle when the test says. */
function recordingPublisher() {
  const published: FleetEntry[] = [];
  const pending: Array<{ resolve: () => void; reject: (error: Error) => void }> = [];
  let closed = 0;
  const publisher: FleetPublisher = {
    publish(entry) {
      published.push(entry);
      return new Promise<void>((resolve, reject) => pending.push({ resolve, reject }));
    },
    list: async () => ({ entries: [...published], more: false }),
    async close() {
      closed++;
    },
  };
  return {
    publisher,
    published,
    settle: async (error?: Error) => {
      const next = pending.shift()!;
      if (error) next.reject(error);
      else next.resolve();
      // Let the reporter see the settlement.
      await new Promise((resolve) => setImmediate(resolve));
    },
    closed: () => closed,
  };
}

const open: Budget[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((b) => b.close()));
});

async function setup() {
  const clock = new ManualClock();
  const sampler = new ManualSampler({ availableBytes: 10 * G, totalBytes: 16 * G, cores: 8, load1: 0 }, clock);
  const policy = { ...defaultPolicy({ totalBytes: 16 * G, cpus: 8 }), memoryBytes: 8 * G, cpu: 4, reserveBytes: G };
  const budget = await createBudget({ policy, sampler, clock });
  open.push(budget);
  return { clock, sampler, budget };
}

const need = (memoryGb: number, cpu: number) => ({ items: [], start: { memoryBytes: memoryGb * G, cpu }, build: { memoryBytes: 0, cpu: 0 } });

describe("the fleet entry", () => {
  it("says what is committed and the room left: the budget less committed, memory capped by the free memory beyond the reserve", async () => {
    const { budget, sampler, clock } = await setup();
    expect(fleetEntryOf(budget, identity, clock.now())).toMatchObject({
      ...identity,
      enabled: true,
      budget: { memoryBytes: 8 * G, cpu: 4 },
      committed: { memoryBytes: 0, cpu: 0 },
      room: { memoryBytes: 8 * G, cpu: 4 },
      cpuBusy: false,
      queueLength: 0,
    });
    await budget.admit(need(3, 1), "holder");
    // 5G left in the budget, but only 4G free beyond the 1G reserve once the sample shows 5G available.
    clock.advance(10);
    sampler.set({ availableBytes: 5 * G });
    const entry = fleetEntryOf(budget, identity, clock.now());
    expect(entry.committed).toEqual({ memoryBytes: 3 * G, cpu: 1 });
    expect(entry.room).toEqual({ memoryBytes: 4 * G, cpu: 3 });
    expect(entry.reservationCount).toBe(1);
    // A busy cpu (load over 1 per core on 8 cores) and a waiter show too; room never goes below zero.
    sampler.set({ load1: 20, availableBytes: 0 });
    void budget.admit(need(1, 1), "waiter").catch(() => undefined);
    const busy = fleetEntryOf(budget, identity, clock.now());
    expect(busy).toMatchObject({ cpuBusy: true, queueLength: 1, room: { memoryBytes: 0, cpu: 3 } });
  });
});

describe("fleet reports", () => {
  it("publish on samples at most once per interval and one at a time, and withdraw on close", async () => {
    const { budget, sampler, clock } = await setup();
    const recorder = recordingPublisher();
    const reports = startFleetReports({ budget, sampler, publisher: recorder.publisher, identity, clock, minIntervalMs: 1000 });
    sampler.set();
    expect(recorder.published).toHaveLength(1);
    await recorder.settle();
    // Within the interval of the last publication: skipped.
    clock.advance(500);
    sampler.set();
    expect(recorder.published).toHaveLength(1);
    clock.advance(600);
    await budget.admit(need(2, 1), "holder");
    sampler.set();
    expect(recorder.published).toHaveLength(2);
    expect(recorder.published[1]!.committed).toEqual({ memoryBytes: 2 * G, cpu: 1 });
    // In flight: the next sample is skipped even once the interval has passed.
    clock.advance(1500);
    sampler.set();
    expect(recorder.published).toHaveLength(2);
    // A failed publication does not stop the next one.
    await recorder.settle(new Error("etcd is away"));
    sampler.set();
    expect(recorder.published).toHaveLength(3);
    await recorder.settle();
    await reports.close();
    expect(recorder.closed()).toBe(1);
    clock.advance(5000);
    sampler.set();
    expect(recorder.published).toHaveLength(3);
    expect(sampler.listenerCount()).toBe(1); // the budget's own
  });

  it("publishNow publishes whatever the interval, after the one in flight", async () => {
    const { budget, sampler, clock } = await setup();
    const recorder = recordingPublisher();
    const reports = startFleetReports({ budget, sampler, publisher: recorder.publisher, identity, clock, minIntervalMs: 1000 });
    sampler.set();
    const now = reports.publishNow();
    expect(recorder.published).toHaveLength(1);
    await recorder.settle();
    await new Promise((resolve) => setImmediate(resolve));
    expect(recorder.published).toHaveLength(2);
    await recorder.settle();
    await now;
    await reports.close();
  });
});
