/**
 * The fleet view: each budget publishes what it knows of its machine (the sample, what is
 * committed, the queue) where every other budget can read it, so that one can tell which machine
 * has room now. Admission stays per machine: nothing published here changes a verdict.
 *
 * The core knows the seam only ({@link FleetPublisher}); where entries live (etcd, under a lease,
 * so a machine whose budget dies leaves the view) is the backend's business (`etcd/`).
 */
import type { Clock } from "@berth/shared/clock";
import { systemClock } from "@berth/shared/clock";
import { silentLogger, type Logger } from "@berth/shared/logger";
import type { Budget } from "./budget-interface.js";
import type { Resources } from "./costs.js";
import type { MachineSample, Sampler } from "./sampler.js";
import { cpuGate } from "./verdict.js";

/** One machine as its budget last published it. */
export interface FleetEntry {
  /** The name it publishes under (`--machine-name`, the hostname by default): one entry per name. */
  machine: string;
  /** The host's own name. */
  hostname: string;
  /** The budget's process. */
  pid: number;
  /** When it was published (wall clock, ms). */
  publishedAt: number;
  /** The machine's last sample. */
  sample?: MachineSample | undefined;
  /** False: the policy admits everything (the budget only counts). */
  enabled: boolean;
  /** The policy's budget. */
  budget: Resources;
  /** Running work plus in-flight reservations. */
  committed: Resources;
  /**
   * What a new need could take now: the budget less what is committed and, for memory, no more
   * than the free memory beyond the policy's reserve. Never below zero.
   */
  room: Resources;
  /** True when the cpu gate (pressure or load) holds every need with cpu now. */
  cpuBusy: boolean;
  /** Requests waiting in the admission queue. */
  queueLength: number;
  reservationCount: number;
  runningCount: number;
}

/** Where a budget publishes its entry and reads everyone's. */
export interface FleetPublisher {
  /** Publishes (or replaces) this machine's entry; it stays visible while this publisher lives. */
  publish(entry: FleetEntry): Promise<void>;
  /** The live entries in machine-name order, from the one after `after`, at most `limit`. */
  list(options: { after?: string | undefined; limit: number }): Promise<{ entries: FleetEntry[]; more: boolean }>;
  /** Withdraws this machine's entry (at once, when the backend can) and stops keeping it alive. */
  close(): Promise<void>;
}

/** Who publishes. */
export interface FleetIdentity {
  machine: string;
  hostname: string;
  pid: number;
}

/** The entry the budget's state makes now. */
export function fleetEntryOf(budget: Budget, identity: FleetIdentity, now: number): FleetEntry {
  const state = budget.state(1);
  const { policy, committed } = state;
  let roomMemory = policy.memoryBytes - committed.memoryBytes;
  if (state.freeMemoryBytes !== undefined) roomMemory = Math.min(roomMemory, state.freeMemoryBytes - policy.reserveBytes);
  return {
    ...identity,
    publishedAt: now,
    sample: state.sample,
    enabled: policy.enabled,
    budget: { memoryBytes: policy.memoryBytes, cpu: policy.cpu },
    committed: { memoryBytes: committed.memoryBytes, cpu: committed.cpu },
    room: { memoryBytes: Math.max(0, roomMemory), cpu: Math.max(0, policy.cpu - committed.cpu) },
    cpuBusy: cpuGate(policy, state.sample) !== 0,
    queueLength: state.queueSize,
    reservationCount: state.reservationCount,
    runningCount: state.runningCount,
  };
}

/** The fewest milliseconds between two publications (samples come every second by default). */
export const DEFAULT_FLEET_MIN_INTERVAL_MS = 1000;

/** Options of {@link startFleetReports}. */
export interface FleetReportOptions {
  budget: Budget;
  sampler: Sampler;
  publisher: FleetPublisher;
  identity: FleetIdentity;
  clock?: Clock | undefined;
  /** At most one publication per this many ms (monotonic); default {@link DEFAULT_FLEET_MIN_INTERVAL_MS}. */
  minIntervalMs?: number | undefined;
  logger?: Logger | undefined;
}

/** Publishing this machine's entry on samples; `close` stops and withdraws it. */
export interface FleetReports {
  /** Publishes now, whatever the throttle (resolves once published, rejects with the backend's error). */
  publishNow(): Promise<void>;
  close(): Promise<void>;
}

/**
 * Publishes the budget's entry on each sample, at most once per `minIntervalMs` and one at a time:
 * a sample that comes while a publication is in flight, or too soon after the last, is skipped (a
 * later one carries newer figures). A failed publication is logged once until one succeeds again;
 * admission never waits on it.
 */
export function startFleetReports(options: FleetReportOptions): FleetReports {
  const clock = options.clock ?? systemClock;
  const logger = options.logger ?? silentLogger;
  const minIntervalMs = options.minIntervalMs ?? DEFAULT_FLEET_MIN_INTERVAL_MS;
  let lastAt: number | undefined;
  let inFlight: Promise<void> | undefined;
  let failing = false;
  let closed = false;

  const publish = (): Promise<void> => {
    lastAt = clock.monotonicNow();
    const attempt = options.publisher.publish(fleetEntryOf(options.budget, options.identity, clock.now())).then(
      () => {
        if (failing) logger.info({ machine: options.identity.machine }, "fleet: publishing again");
        failing = false;
      },
      (error: unknown) => {
        if (!failing) logger.warn({ err: error, machine: options.identity.machine }, "fleet: this machine's entry could not be published; admission goes on");
        failing = true;
        throw error;
      },
    );
    const settled = attempt.catch(() => undefined);
    inFlight = settled;
    void settled.then(() => {
      if (inFlight === settled) inFlight = undefined;
    });
    return attempt;
  };

  const unsubscribe = options.sampler.onSample(() => {
    if (closed || inFlight !== undefined) return;
    if (lastAt !== undefined && clock.monotonicNow() - lastAt < minIntervalMs) return;
    publish().catch(() => undefined);
  });

  return {
    async publishNow() {
      if (closed) return;
      await inFlight;
      await publish();
    },
    async close() {
      if (closed) return;
      closed = true;
      unsubscribe();
      await inFlight;
      await options.publisher.close();
    },
  };
}
