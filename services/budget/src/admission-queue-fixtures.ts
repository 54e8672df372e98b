/**
 * For the admission queue's tests: a queue over a fake host whose holdings, sample and policy the
 * test sets, and admissions recorded as they go.
 */
import { ManualClock } from "@berth/shared/clock";
import type { BerthError } from "@berth/shared/errors";
import { silentLogger } from "@berth/shared/logger";
import { AdmissionQueue } from "./admission-queue.js";
import type { Need, Resources } from "./costs.js";
import { total } from "./costs.js";
import type { Policy } from "./policy.js";
import { defaultPolicy } from "./policy.js";
import type { QueuedUpdate } from "./queue-line.js";
import type { Reservation } from "./reservations.js";
import type { MachineSample } from "./sampler.js";
import type { VerdictContext } from "./verdict.js";

export const G = 1024 ** 3;

/** A queue over a fake host: the test holds "reservations" as a map of label → resources and says when to re-check. */
export function setup(policyChanges: Partial<Policy> = {}, sampleChanges: Partial<MachineSample> = {}, clock = new ManualClock()) {
  let policy: Policy = { ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }), memoryBytes: 8 * G, cpu: 4, reserveBytes: 0, maxWaitMs: 60_000, ...policyChanges };
  let sample: MachineSample = {
    at: clock.now(),
    monotonicAt: clock.monotonicNow(),
    source: "host",
    availableBytes: 64 * G,
    cores: 8,
    load1: 0,
    pressure: {},
    ...sampleChanges,
  };
  const held = new Map<string, Resources>();
  /** When each holder is expected to end (monotonic), and each name's usual run time: what the ETAs rest on. */
  const ends = new Map<string, number>();
  const usual = new Map<string, number>();
  const granted: string[] = [];
  const deferred: Array<() => void> = [];
  let hold = 60_000;
  /** Memory held counts as unseen by the sample (as if no new sample came): the free-memory gate sees it. */
  let unseenCounts = false;
  const context = (): VerdictContext => {
    let memoryBytes = 0;
    let cpu = 0;
    for (const r of held.values()) {
      memoryBytes += r.memoryBytes;
      cpu += r.cpu;
    }
    return { policy, sample, committed: { memoryBytes, cpu, items: [] }, unseenMemoryBytes: unseenCounts ? memoryBytes : 0 };
  };
  const hooks: { onGrant?: (label: string) => void } = {};
  const queue = new AdmissionQueue({
    clock,
    logger: silentLogger,
    policy: () => policy,
    context,
    grant: (need: Need, label: string) => {
      hooks.onGrant?.(label);
      held.set(label, total(need));
      granted.push(label);
      return { id: label, owner: label } as unknown as Reservation;
    },
    holdMs: () => hold,
    etaBasis: () => ({
      holdings: [...held].map(([label, r]) => ({ label: `'${label}'`, ...r, endsAt: ends.get(label), endBasis: "its end in this test" })),
      usual: (name) => (usual.has(name) ? { ms: usual.get(name)!, longestMs: usual.get(name)!, runs: 1 } : undefined),
    }),
    defer: (fn) => deferred.push(fn),
  });
  const flush = () => {
    while (deferred.length > 0) deferred.shift()!();
  };
  return {
    clock,
    queue,
    held,
    ends,
    usual,
    granted,
    hooks,
    context,
    flush,
    setPolicy: (changes: Partial<Policy>) => {
      policy = { ...policy, ...changes };
      queue.policyChanged();
    },
    setSample: (changes: Partial<MachineSample>) => {
      sample = { ...sample, ...changes };
      queue.recheck();
    },
    setHold: (ms: number) => (hold = ms),
    countUnseen: () => (unseenCounts = true),
    release: (label: string) => {
      held.delete(label);
      queue.recheck();
    },
  };
}

export const need = (memoryGb: number, cpu: number): Need => ({ items: [], start: { memoryBytes: memoryGb * G, cpu }, build: { memoryBytes: 0, cpu: 0 } });

/** Admits and records what happens: the updates it hears and how it ends. */
export function track(promise: Promise<Reservation>, updates: QueuedUpdate[] = []) {
  const result: { admitted?: Reservation; error?: BerthError; updates: QueuedUpdate[] } = { updates };
  promise.then(
    (r) => (result.admitted = r),
    (e: BerthError) => (result.error = e),
  );
  return result;
}

export function admit(t: ReturnType<typeof setup>, memoryGb: number, cpu: number, label: string, options: Parameters<AdmissionQueue["admit"]>[2] = {}) {
  const updates: QueuedUpdate[] = [];
  return track(t.queue.admit(need(memoryGb, cpu), label, { onQueued: (u) => updates.push(u), ...options }), updates);
}

export const settle = () => new Promise<void>((resolve) => setImmediate(resolve));
