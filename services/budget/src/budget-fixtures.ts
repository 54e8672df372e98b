/**
 * For the budget's tests: budgets over a manual clock and sampler, each with a state directory of
 * its own under one temporary root, and admissions recorded as they go.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { ManualClock } from "@berth/shared/clock";
import type { BerthError } from "@berth/shared/errors";
import type { Budget } from "./budget-interface.js";
import { createBudget } from "./budget.js";
import type { Need } from "./costs.js";
import type { Policy } from "./policy.js";
import { defaultPolicy } from "./policy.js";
import type { QueuedUpdate } from "./queue-line.js";
import type { Reservation, ReservationSnapshot } from "./reservations.js";
import type { MachineSample } from "./sampler.js";
import { ManualSampler } from "./sampler.js";

export const G = 1024 ** 3;
export const M = 1024 ** 2;

/** Makes budgets (`setup`); `closeAll` closes every one made (for afterEach), `removeAll` their state directories (for afterAll). */
export function testBudgets() {
  const root = mkdtempSync(path.join(tmpdir(), "berth-budget-"));
  const open: Budget[] = [];
  let dirs = 0;
  async function setup(
    options: { policy?: Partial<Policy>; sample?: Partial<MachineSample>; stateDir?: string; clock?: ManualClock; idempotencyWindowMs?: number } = {},
  ) {
    const clock = options.clock ?? new ManualClock();
    const sampler = new ManualSampler({ availableBytes: 64 * G, cores: 8, load1: 0, ...options.sample }, clock);
    const deferred: Array<() => void> = [];
    const stateDir = options.stateDir ?? path.join(root, String(++dirs));
    const policy: Policy = { ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }), memoryBytes: 8 * G, cpu: 4, reserveBytes: G, ...options.policy };
    const budget = await createBudget({ policy, sampler, clock, stateDir, defer: (fn) => deferred.push(fn), idempotencyWindowMs: options.idempotencyWindowMs });
    open.push(budget);
    const flush = () => {
      while (deferred.length > 0) deferred.shift()!();
    };
    return { clock, sampler, budget, stateDir, flush };
  }

  return {
    setup,
    async closeAll() {
      await Promise.all(open.splice(0).map((b) => b.close()));
    },
    removeAll: () => rmSync(root, { recursive: true, force: true }),
  };
}

export const need = (memoryGb: number, cpu: number, buildGb = 0, buildCpu = 0): Need => ({
  items: [],
  start: { memoryBytes: memoryGb * G, cpu },
  build: { memoryBytes: buildGb * G, cpu: buildCpu },
});

export function track<R extends Reservation | ReservationSnapshot>(promise: Promise<R>) {
  const result: { reservation?: R; error?: BerthError; updates: QueuedUpdate[] } = { updates: [] };
  promise.then(
    (r) => (result.reservation = r),
    (e: BerthError) => (result.error = e),
  );
  return result;
}

export function admit(budget: Budget, n: Need, label: string, options: Parameters<Budget["admit"]>[2] = {}) {
  const updates: QueuedUpdate[] = [];
  const result = track(budget.admit(n, label, { onQueued: (u) => updates.push(u), ...options }));
  result.updates = updates;
  return result;
}

export const settle = () => new Promise<void>((resolve) => setImmediate(resolve));
