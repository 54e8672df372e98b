/** The budget's watch of its changes (revisions, the current state, replay, reset, lag) and WatchMachine's revisions. */
import { afterEach, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import type { Budget, BudgetChange, BudgetWatch, RevisionedSample } from "./budget-interface.js";
import { createBudget } from "./budget.js";
import type { Need } from "./costs.js";
import { defaultPolicy, type Policy } from "./policy.js";
import { ManualSampler } from "./sampler.js";

const G = 1024 ** 3;
const BASE = 1_000_000;
const open: Budget[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((b) => b.close()));
});

async function setup(options: { watchHistory?: number; watchBuffer?: number } = {}) {
  const clock = new ManualClock();
  const sampler = new ManualSampler({ availableBytes: 64 * G, cores: 8, load1: 0 }, clock);
  const policy: Policy = { ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }), memoryBytes: 8 * G, cpu: 4, reserveBytes: G };
  const budget = await createBudget({ policy, sampler, clock, defer: (fn) => fn(), revisionBase: BASE, ...options });
  open.push(budget);
  return { clock, sampler, budget, policy };
}

const need = (memoryGb: number, cpu: number): Need => ({ items: [], start: { memoryBytes: memoryGb * G, cpu }, build: { memoryBytes: 0, cpu: 0 } });
const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

function label(change: BudgetChange): string {
  if ("request" in change) return `${change.kind} ${change.request.owner}`;
  if ("reservation" in change) return `${change.kind} ${change.reservation.owner}`;
  if ("running" in change) return `${change.kind} ${change.running.name}`;
  return change.kind;
}

/** The changes a watch has buffered now, as [revision, label]. */
async function drain(watch: BudgetWatch, count: number): Promise<Array<[number, string]>> {
  const out: Array<[number, string]> = [];
  for (let i = 0; i < count; i++) {
    const step = await watch.changes.next();
    if (step.done) break;
    out.push([step.value.revision, label(step.value.value)]);
  }
  return out;
}

describe("budget watch", () => {
  it("tells every change of the queue, reservations, tally and policy in order, one revision each", async () => {
    const { budget, clock, policy } = await setup();
    const watch = budget.watch({ includeCurrent: false, startRevision: 0 });
    expect(watch.current).toBeUndefined();
    expect(watch.caughtUp).toBeUndefined();
    const first = await budget.reserve(need(6, 1), "first", { ttlMs: 10_000 });
    const firstWaiter = budget.admit(need(4, 1), "first-waiter");
    const gone = new AbortController();
    const leaving = budget.admit(need(4, 1), "leaving", { signal: gone.signal }).catch(() => "left");
    const late = budget.admit(need(4, 1), "late", { maxWaitMs: 5_000 }).catch(() => "timed out");
    gone.abort();
    expect(await leaving).toBe("left");
    clock.advance(5_000);
    expect(await late).toBe("timed out");
    budget.release(first.id);
    const admitted = await firstWaiter;
    const running = await budget.consume(admitted.id, "web", { memoryBytes: G, cpu: 0.5 });
    await budget.stopRunning(running.running.id);
    await budget.reserve(need(1, 0), "leased", { ttlMs: 1_000 });
    clock.advance(1_000);
    budget.reloadPolicy({ ...policy, cpu: 3 });
    await settle();
    expect(await drain(watch, 13)).toEqual([
      [BASE + 1, "reservation_made first"],
      [BASE + 2, "request_queued first-waiter"],
      [BASE + 3, "request_queued leaving"],
      [BASE + 4, "request_queued late"],
      [BASE + 5, "request_left leaving"],
      [BASE + 6, "request_timed_out late"],
      [BASE + 7, "reservation_released first"],
      [BASE + 8, "reservation_made first-waiter"],
      [BASE + 9, "request_admitted first-waiter"],
      [BASE + 10, "running_registered web"],
      [BASE + 11, "reservation_changed first-waiter"],
      [BASE + 12, "running_stopped web"],
      [BASE + 13, "reservation_made leased"],
    ]);
    expect(await drain(watch, 2)).toEqual([
      [BASE + 14, "reservation_expired leased"],
      [BASE + 15, "policy_changed"],
    ]);
    expect(budget.revision).toBe(BASE + 15);
  });

  it("describes the current state at one revision, then the changes after it", async () => {
    const { budget } = await setup();
    await budget.reserve(need(6, 1), "holder", { ttlMs: 10_000 });
    void budget.admit(need(4, 1), "waiter").catch(() => undefined);
    await budget.registerRunning("db", { memoryBytes: G, cpu: 0 });
    const watch = budget.watch({ includeCurrent: true, startRevision: 0 });
    expect(watch.current?.map(label)).toEqual(["request_queued waiter", "reservation_made holder", "running_registered db", "policy_changed"]);
    expect(watch.caughtUp).toEqual({ revision: BASE + 3, reset: false, queueSize: 1 });
    await budget.registerRunning("cache", { memoryBytes: G, cpu: 0 });
    expect(await drain(watch, 1)).toEqual([[BASE + 4, "running_registered cache"]]);
  });

  it("describes only the front of the queue up to queueLimit, and says how many wait in all", async () => {
    const { budget } = await setup();
    await budget.reserve(need(6, 1), "holder", { ttlMs: 10_000 });
    for (const name of ["first", "second", "third"]) void budget.admit(need(4, 1), name).catch(() => undefined);
    const watch = budget.watch({ includeCurrent: true, startRevision: 0, queueLimit: 2 });
    expect(watch.current?.map(label)).toEqual(["request_queued first", "request_queued second", "reservation_made holder", "policy_changed"]);
    expect(watch.caughtUp).toEqual({ revision: BASE + 4, reset: false, queueSize: 3 });
  });

  it("replays exactly the changes after a revision it holds, and resets one it cannot replay", async () => {
    const { budget } = await setup({ watchHistory: 3 });
    for (const name of ["a", "b", "c"]) await budget.registerRunning(name, { memoryBytes: G, cpu: 0 });
    const resumed = budget.watch({ includeCurrent: false, startRevision: BASE + 1 });
    expect(resumed.current).toBeUndefined();
    expect(resumed.caughtUp).toEqual({ revision: BASE + 3, reset: false });
    expect(await drain(resumed, 2)).toEqual([
      [BASE + 2, "running_registered b"],
      [BASE + 3, "running_registered c"],
    ]);
    await budget.registerRunning("d", { memoryBytes: G, cpu: 0 });
    // Held: 2..4; 1's successors start at 2, so 1 still replays, 0 does not.
    expect(budget.watch({ includeCurrent: false, startRevision: BASE + 1 }).caughtUp?.reset).toBe(false);
    for (const foreign of [BASE, BASE - 5, 7, BASE + 99]) {
      const reset = budget.watch({ includeCurrent: false, startRevision: foreign });
      expect(reset.caughtUp).toEqual({ revision: BASE + 4, reset: true, queueSize: 0 });
      expect(reset.current?.map(label)).toEqual([
        "running_registered a",
        "running_registered b",
        "running_registered c",
        "running_registered d",
        "policy_changed",
      ]);
    }
  });

  it("ends a watcher that falls too far behind WATCHER_LAGGED with the revision to resume from, and a resume from it replays what it missed", async () => {
    const { budget } = await setup({ watchHistory: 10, watchBuffer: 2 });
    const watch = budget.watch({ includeCurrent: false, startRevision: 0 });
    await budget.registerRunning("a", { memoryBytes: G, cpu: 0 });
    expect(await drain(watch, 1)).toEqual([[BASE + 1, "running_registered a"]]);
    for (const name of ["b", "c", "d"]) await budget.registerRunning(name, { memoryBytes: G, cpu: 0 });
    await expect(watch.changes.next()).rejects.toMatchObject({
      code: "resource_exhausted",
      reason: "WATCHER_LAGGED",
      details: { resumeRevision: String(BASE + 1) },
    });
    // Resumed there, it replays the three it missed although its buffer holds two live ones.
    const resumed = budget.watch({ includeCurrent: false, startRevision: BASE + 1 });
    expect(resumed.caughtUp).toEqual({ revision: BASE + 4, reset: false });
    expect(await drain(resumed, 3)).toEqual([
      [BASE + 2, "running_registered b"],
      [BASE + 3, "running_registered c"],
      [BASE + 4, "running_registered d"],
    ]);
  });

  it("ends its watchers when the budget closes", async () => {
    const { budget } = await setup();
    const watch = budget.watch({ includeCurrent: false, startRevision: 0 });
    const pending = watch.changes.next();
    await budget.close();
    expect((await pending).done).toBe(true);
  });
});

describe("watchMachine revisions", () => {
  async function take(iterator: AsyncIterator<RevisionedSample>): Promise<[number, number, boolean]> {
    const { value } = await iterator.next();
    return [value!.revision, value!.sample.availableBytes! / G, value!.reset];
  }

  it("numbers samples from the run's base; resumes after a held one without repeating it; resets one it cannot continue", async () => {
    const { budget, sampler } = await setup();
    const live = budget.watchMachine()[Symbol.asyncIterator]();
    expect(await take(live)).toEqual([BASE + 1, 64, false]);
    sampler.set({ availableBytes: 32 * G });
    sampler.set({ availableBytes: 16 * G });
    // A reader behind gets the newest sample, its revision telling what it skipped.
    expect(await take(live)).toEqual([BASE + 3, 16, false]);
    const resumed = budget.watchMachine(undefined, { startRevision: BASE + 1 })[Symbol.asyncIterator]();
    expect(await take(resumed)).toEqual([BASE + 2, 32, false]);
    expect(await take(resumed)).toEqual([BASE + 3, 16, false]);
    const upToDate = budget.watchMachine(undefined, { startRevision: BASE + 3 })[Symbol.asyncIterator]();
    const next = take(upToDate);
    sampler.set({ availableBytes: 8 * G });
    expect(await next).toEqual([BASE + 4, 8, false]);
    for (const foreign of [BASE - 1, BASE + 50]) {
      expect(await take(budget.watchMachine(undefined, { startRevision: foreign })[Symbol.asyncIterator]())).toEqual([BASE + 4, 8, true]);
    }
    await Promise.all([live, resumed, upToDate].map((it) => it.return?.()));
  });

  it("resets after more samples than it holds", async () => {
    const { budget, sampler } = await setup();
    for (let i = 0; i < 70; i++) sampler.set({ availableBytes: (i + 1) * G });
    const iterator = budget.watchMachine(undefined, { startRevision: BASE + 2 })[Symbol.asyncIterator]();
    expect(await take(iterator)).toEqual([BASE + 71, 70, true]);
    await iterator.return?.();
  });
});
