/**
 * The budget: one object that wires the policy, the sampler, the reservations, the running tally and
 * the admission queue together. The RPC layer maps each call onto one method here.
 *
 * Who re-checks the queue, and when (never on a timer of its own):
 * - a reservation changes (admitted, build released, consumed, released, lease ran out);
 * - the running tally changes (registered, stopped, a pid gone, a lease ran out);
 * - a sample arrives whose free memory or CPU-gate state differs from the last one's;
 * - the policy is reloaded.
 *
 * Memory the latest sample cannot show yet (subtracted from its free memory by the free-memory
 * gate): what reservations admitted at or after the sample's start still hold, plus running
 * entries counted at or after it. The next sample sees that memory in use (or not), and the
 * subtraction stops.
 */
import type { Clock } from "@berth/shared/clock";
import { systemClock } from "@berth/shared/clock";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import type { AdmitOptions, Page, QueueEntryInfo } from "./admission-queue.js";
import { AdmissionQueue } from "./admission-queue.js";
import type { Cost, Need, NeedItemInput, Resources, ResourceSpec } from "./costs.js";
import { checkResources, costsOf, needFromItems, total } from "./costs.js";
import type { Logger } from "./logger.js";
import { silentLogger } from "./logger.js";
import type { Policy } from "./policy.js";
import { validatePolicy } from "./policy.js";
import type { ConsumeOptions, Reservation } from "./reservations.js";
import { ReservationBook, reservationNotFound } from "./reservations.js";
import type { RunningEntry } from "./running-tally.js";
import { RunningTally } from "./running-tally.js";
import type { MachineSample, Sampler } from "./sampler.js";
import type { CheckOptions, Committed, Reason, Verdict, VerdictContext } from "./verdict.js";
import { check, cpuGate, freeMemory } from "./verdict.js";

/** Options of {@link createBudget}. */
export interface BudgetOptions {
  policy: Policy;
  /** The service's one sampler. The budget subscribes to it; starting and closing it is the caller's. */
  sampler: Sampler;
  clock?: Clock | undefined;
  /** The state directory: the running tally is kept in `<stateDir>/budget/running.json`. Undefined: in memory only. */
  stateDir?: string | undefined;
  logger?: Logger | undefined;
  /** Is `pid` (started at `startTime`) still that process? Default: process-identity's `sameProcess`. */
  isAlive?: ((pid: number, startTime: number | undefined) => boolean) | undefined;
  /** Runs a function after the current event (batches queue position updates). Default: setImmediate. */
  defer?: ((fn: () => void) => void) | undefined;
}

/** Options of a leased reservation ({@link Budget.reserve}). */
export interface ReserveOptions extends AdmitOptions {
  /** The lease: released unless renewed within this many ms. */
  ttlMs: number;
  /**
   * The caller's id for the request: a repeat while the reservation lives answers it, and a repeat
   * while the first still waits joins that wait (one place in the queue, dropped only once every
   * caller has gone). Forgotten when the reservation ends.
   */
  requestId?: string | undefined;
}

/** A reservation as `state()` shows it. */
export interface ReservationInfo {
  id: string;
  /** Its place in admission order (for paging). */
  seq: number;
  owner: string;
  start: Resources;
  build: Resources;
  admittedAt: number;
  leaseExpiresAt?: number | undefined;
}

/** Everything the budget knows right now (what `berth budget state` shows). */
export interface BudgetState {
  policy: Policy;
  /** The latest machine sample. */
  sample?: MachineSample | undefined;
  /** Running work plus in-flight reservations, and who holds what. */
  committed: Committed;
  /** Free memory as the gate sees it: the sample's, less what was admitted since. */
  freeMemoryBytes?: number | undefined;
  /** The waiters, head first, with positions and ETAs: the first `pageSize` of them. */
  queue: QueueEntryInfo[];
  /** How many wait in all. */
  queueSize: number;
  /** Where the queue's next page starts (see {@link Budget.listQueue}); undefined when `queue` is all of it. */
  queueNext?: number | undefined;
  /** Why the head waits (empty when nobody waits). */
  waitFor: Reason[];
  /** The reservations, oldest first: the first `pageSize` of them. */
  reservations: ReservationInfo[];
  reservationCount: number;
  reservationsNext?: number | undefined;
  /** The running tally, oldest first: the first `pageSize` entries. */
  running: Array<RunningEntry & { seq: number }>;
  runningCount: number;
  runningNext?: number | undefined;
  /** The moving estimate of how long a reservation is held. */
  holdMs: number;
}

/** Options for running work. */
export interface RunningOptions {
  pid?: number | undefined;
  ttlMs?: number | undefined;
  /** The caller's id for the request: a repeat while the entry lives answers that entry instead of counting it twice. */
  requestId?: string | undefined;
}

/** The budget's API. */
export interface Budget {
  /** Would `need` be admitted right now, ignoring the queue? Reads the cached sample, never /proc. */
  check(need: Pick<Need, "start" | "build">, options?: CheckOptions): Verdict;
  /** Waits for room and its turn; resolves with the reservation, which the caller must release (see {@link AdmissionQueue.admit} for refusals). */
  admit(need: Need, owner: string, options?: AdmitOptions): Promise<Reservation>;
  /** `admit`, then hold the reservation on a lease of `ttlMs` (for clients that cannot hold a stream); see {@link ReserveOptions.requestId} for repeats. */
  reserve(need: Need, owner: string, options: ReserveOptions): Promise<Reservation>;
  /** Renews a leased reservation. not_found when it was released or its lease ran out. */
  renew(reservationId: string, ttlMs?: number): Reservation;
  /** Releases a reservation. Idempotent: false when there was none by that id. */
  release(reservationId: string): boolean;
  /** The reservation's build phase is over: its build share goes back. */
  releaseBuild(reservationId: string): Reservation;
  /**
   * What `name` costs running when whoever reports it running declares nothing: the cost of the
   * item of that name the reservation `reservationId` was admitted with (so that what moves to the
   * running tally is what was admitted), else the policy's default run cost.
   */
  runCostOf(name: string, reservationId?: string): Resources;
  /**
   * Something the reservation starts now runs: its share moves to the running tally. Resolves once
   * the tally is on disk. A repeat of `options.requestId` while its entry lives answers that entry
   * (and moves nothing), even once the reservation is gone.
   */
  consume(reservationId: string, name: string, cost: Resources, options?: ConsumeOptions): Promise<RunningEntry>;
  /** Counts running work started outside a reservation. Resolves once the tally is on disk. */
  registerRunning(name: string, cost: Resources, options?: RunningOptions): Promise<RunningEntry>;
  /** Renews a running entry's lease. */
  renewRunning(id: string, ttlMs?: number): Promise<RunningEntry>;
  /** Stops counting running work. False when there was none by that id. Resolves once the tally is on disk. */
  stopRunning(id: string): Promise<boolean>;
  getReservation(reservationId: string): Reservation | undefined;
  /** Everything, with the first `pageSize` entries of each list (all of them by default). */
  state(pageSize?: number): BudgetState;
  /** Up to `limit` waiters that arrived after the one numbered `after` (the head first when undefined), and what the head waits for. */
  listQueue(after: number | undefined, limit: number): Page<QueueEntryInfo> & { waitFor: Reason[] };
  /** Up to `limit` reservations admitted after the one numbered `after`, oldest first. */
  listReservations(after: number | undefined, limit: number): Page<ReservationInfo>;
  /** Up to `limit` running entries counted after the one numbered `after`, oldest first. */
  listRunning(after: number | undefined, limit: number): Page<RunningEntry & { seq: number }>;
  /** The latest machine sample. */
  machine(): MachineSample | undefined;
  /** The latest sample, then every new one; a slow reader gets the newest, not a backlog. Ends when `signal` fires or the budget closes. */
  watchMachine(signal?: AbortSignal): AsyncIterable<MachineSample>;
  /** What a spec costs running and building, with the policy's defaults for what it leaves out. */
  costs(spec: ResourceSpec | undefined): { run: Cost; build: Cost };
  /** The need of the items a caller sent (defaults from the current policy). */
  needOf(items: readonly NeedItemInput[]): Need;
  policy(): Policy;
  /** Swaps the policy (validated first) and re-checks the queue. The server wires SIGHUP to it. */
  reloadPolicy(policy: Policy): Policy;
  /** Refuses every waiter (unavailable), stops every timer and waits for the tally's last write. */
  close(): Promise<void>;
}

function checkOwner(owner: unknown): string {
  if (typeof owner !== "string" || owner.trim() === "" || owner.length > 256) throw invalidArgument("owner", "must be 1 to 256 characters");
  return owner;
}

/** What a repeat of a request id must ask for again: the same owner and the same shares. */
function requestKey(need: Pick<Need, "start" | "build">, owner: string): string {
  return JSON.stringify([owner, need.start.memoryBytes, need.start.cpu, need.build.memoryBytes, need.build.cpu]);
}

function requestIdReused(what: string): BerthError {
  return invalidArgument("request_id", `already names ${what}; use a new id for a new request`);
}

/** A Reserve still waiting, shared by every call that carries its request id. */
interface PendingReserve {
  key: string;
  promise: Promise<Reservation>;
  /** The calls waiting on it: the queued request is dropped when the last one goes. */
  callers: number;
  drop: AbortController;
}

function checkNeed(need: Pick<Need, "start" | "build">): void {
  if (!need || typeof need !== "object") throw invalidArgument("need", "is required");
  checkResources(need.start, "need.start");
  checkResources(need.build, "need.build");
}

function reservationInfo(r: Reservation): ReservationInfo {
  return { id: r.id, seq: r.seq, owner: r.owner, start: { ...r.start }, build: { ...r.build }, admittedAt: r.admittedAt, leaseExpiresAt: r.leaseExpiresAt };
}

/** Creates the budget: opens the running tally (dropping what ended while the service was down) and subscribes to the sampler. */
export async function createBudget(options: BudgetOptions): Promise<Budget> {
  const clock = options.clock ?? systemClock;
  const logger = options.logger ?? silentLogger;
  let policy = validatePolicy(options.policy);
  let closed = false;

  // Filled in below; the tally and the book call back into the queue on every change.
  let queueRef: AdmissionQueue | undefined;
  let cachedCommitted: { book: number; tally: number; value: Committed } | undefined;
  const recheck = () => queueRef?.recheck();
  /** Live reservations by the request id that made them, and Reserves still waiting by theirs. */
  const reserved = new Map<string, { reservation: Reservation; key: string }>();
  const reserving = new Map<string, PendingReserve>();

  const tally = await RunningTally.open({ clock, stateDir: options.stateDir, logger, onChange: recheck, isAlive: options.isAlive });
  const book = new ReservationBook({
    clock,
    tally,
    logger,
    onChange: (reservation, change) => {
      // A request id is forgotten with its reservation: a later request may use it again.
      if (change === "released" && reservation.requestId !== undefined && reserved.get(reservation.requestId)?.reservation === reservation) {
        reserved.delete(reservation.requestId);
      }
      recheck();
    },
  });

  const committed = (): Committed => {
    if (cachedCommitted && cachedCommitted.book === book.version && cachedCommitted.tally === tally.version) return cachedCommitted.value;
    const running = tally.totals();
    const held = book.totals();
    // Largest first (memory, then cpu): the first items are the ones worth reading.
    const items = [...tally.committedItems(), ...book.committedItems()].sort((a, b) => b.memoryBytes - a.memoryBytes || b.cpu - a.cpu);
    const value: Committed = { memoryBytes: running.memoryBytes + held.memoryBytes, cpu: running.cpu + held.cpu, items };
    cachedCommitted = { book: book.version, tally: tally.version, value };
    return value;
  };

  const context = (): VerdictContext => {
    const sample = options.sampler.latest();
    return {
      policy,
      committed: committed(),
      sample,
      unseenMemoryBytes: sample ? book.unseenSince(sample.monotonicAt) + tally.unseenSince(sample.monotonicAt) : 0,
    };
  };

  const queue = new AdmissionQueue({
    clock,
    logger,
    policy: () => policy,
    context,
    grant: (need, owner, waitedMs) => book.create(need, owner, { waitedMs }),
    holdMs: () => book.holdMs,
    defer: options.defer,
  });
  queueRef = queue;

  // A sample that changes neither free memory nor the CPU gate cannot change any verdict: skip it.
  let lastSampleKey = "";
  const watchers = new Set<(sample: MachineSample | undefined) => void>();
  const unsubscribe = options.sampler.onSample((sample) => {
    if (closed) return;
    tally.sweep();
    const ctx = context();
    const key = `${freeMemory(ctx)}|${cpuGate(policy, sample)}`;
    if (key !== lastSampleKey) {
      lastSampleKey = key;
      recheck();
    }
    for (const watcher of watchers) watcher(sample);
  });

  const reservation = (id: string): Reservation => {
    const found = book.get(id);
    if (!found) throw reservationNotFound(id);
    return found;
  };

  /** The live entry a repeat of `requestId` answers (checked to be the same request), or undefined. */
  const repeatedRunning = (requestId: string | undefined, name: string, reservationId: string | undefined): RunningEntry | undefined => {
    if (requestId === undefined) return undefined;
    const entry = tally.byRequestId(requestId);
    if (entry === undefined) return undefined;
    if (entry.name !== name || entry.reservationId !== reservationId) throw requestIdReused(`the running entry '${entry.name}' (${entry.id})`);
    return entry;
  };

  /** One more call waiting on `pending`; its own signal withdraws only itself. */
  const joinReserve = (requestId: string, pending: PendingReserve, signal: AbortSignal | undefined): Promise<Reservation> => {
    pending.callers++;
    return new Promise<Reservation>((resolve, reject) => {
      let left = false;
      const leave = () => {
        if (left) return;
        left = true;
        signal?.removeEventListener("abort", onAbort);
        pending.callers--;
        if (pending.callers === 0) {
          // Nobody waits any more: a later repeat starts afresh rather than joining a dropped request.
          if (reserving.get(requestId) === pending) reserving.delete(requestId);
          pending.drop.abort();
        }
      };
      const onAbort = () => {
        leave();
        reject(new BerthError("cancelled", `the Reserve with request id ${requestId} was withdrawn: its caller disconnected`, { kind: "cancelled" }));
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener("abort", onAbort, { once: true });
      pending.promise.then(
        (admitted) => {
          if (left) return;
          left = true;
          signal?.removeEventListener("abort", onAbort);
          resolve(admitted);
        },
        (error: unknown) => {
          if (left) return;
          left = true;
          signal?.removeEventListener("abort", onAbort);
          reject(error);
        },
      );
    });
  };

  const ensureOpen = () => {
    if (closed) throw new BerthError("unavailable", "the budget service is shutting down; retry once it is back");
  };

  const budget: Budget = {
    check(need, checkOptions = {}) {
      checkNeed(need);
      return check(total(need), context(), checkOptions);
    },

    admit(need, owner, admitOptions = {}) {
      try {
        ensureOpen();
        checkNeed(need);
        checkOwner(owner);
      } catch (error) {
        return Promise.reject(error);
      }
      return queue.admit(need, owner, admitOptions);
    },

    async reserve(need, owner, reserveOptions) {
      const { ttlMs, requestId, ...admitOptions } = reserveOptions;
      if (!Number.isFinite(ttlMs) || ttlMs <= 0) throw invalidArgument("ttl", `must be a positive duration; got ${ttlMs}`);
      if (requestId === undefined) {
        const admitted = await budget.admit(need, owner, admitOptions);
        // No timer can fire between the admission and this line: the lease starts with the reservation.
        book.lease(admitted, ttlMs);
        return admitted;
      }
      ensureOpen();
      checkNeed(need);
      const key = requestKey(need, owner);
      const live = reserved.get(requestId);
      if (live !== undefined) {
        if (live.key !== key) throw requestIdReused(`the reservation of '${live.reservation.owner}'`);
        return live.reservation;
      }
      let pending = reserving.get(requestId);
      if (pending !== undefined && pending.key !== key) throw requestIdReused("a waiting Reserve of another need or owner");
      if (pending === undefined) {
        const drop = new AbortController();
        const admission = budget.admit(need, owner, { ...admitOptions, signal: drop.signal });
        const created: PendingReserve = {
          key,
          callers: 0,
          drop,
          promise: admission.then(
            (admitted) => {
              if (reserving.get(requestId) === created) reserving.delete(requestId);
              // In the admission's own microtask, before any timer: the lease starts with the reservation.
              book.lease(admitted, ttlMs);
              admitted.requestId = requestId;
              reserved.set(requestId, { reservation: admitted, key });
              return admitted;
            },
            (error: unknown) => {
              if (reserving.get(requestId) === created) reserving.delete(requestId);
              throw error;
            },
          ),
        };
        // Rejections reach every caller through joinReserve; this one only keeps Node from reporting them unhandled.
        created.promise.catch(() => undefined);
        pending = created;
        reserving.set(requestId, pending);
      }
      return joinReserve(requestId, pending, admitOptions.signal);
    },

    renew(reservationId, ttlMs) {
      const found = reservation(reservationId);
      found.renew(ttlMs);
      return found;
    },

    release(reservationId) {
      const found = book.get(reservationId);
      if (!found) return false;
      found.release();
      return true;
    },

    releaseBuild(reservationId) {
      const found = reservation(reservationId);
      found.releaseBuild();
      return found;
    },

    runCostOf(name, reservationId) {
      const admitted = reservationId === undefined ? undefined : book.get(reservationId)?.runCostOf(name);
      return admitted ?? { ...policy.defaultRun };
    },

    async consume(reservationId, name, cost, consumeOptions = {}) {
      ensureOpen();
      const repeated = repeatedRunning(consumeOptions.requestId, name, reservationId);
      if (repeated !== undefined) {
        await tally.whenDurable();
        return repeated;
      }
      const found = reservation(reservationId);
      const before = { ...found.start };
      const entry = found.consume(name, cost, consumeOptions);
      try {
        await tally.whenDurable();
      } catch (error) {
        // Not saved (a full disk): undone, so a refused start moves nothing and its retry counts once.
        tally.stop(entry.id);
        if (!found.released) found.start = before;
        book.changed(found, "consumed");
        throw error;
      }
      return entry;
    },

    async registerRunning(name, cost, runningOptions = {}) {
      ensureOpen();
      const repeated = repeatedRunning(runningOptions.requestId, name, undefined);
      if (repeated === undefined) return tally.registerDurably(name, cost, runningOptions);
      await tally.whenDurable();
      return repeated;
    },

    async renewRunning(id, ttlMs) {
      ensureOpen();
      const entry = tally.renew(id, ttlMs);
      await tally.whenDurable();
      return entry;
    },

    async stopRunning(id) {
      return tally.stopDurably(id);
    },

    getReservation: (id) => book.get(id),

    state(pageSize = Number.POSITIVE_INFINITY) {
      const ctx = context();
      const waiting = queue.page(undefined, pageSize);
      const reservations = book.page(undefined, pageSize);
      const running = tally.page(undefined, pageSize);
      return {
        policy,
        sample: ctx.sample,
        committed: ctx.committed,
        freeMemoryBytes: freeMemory(ctx),
        queue: waiting.items,
        queueSize: queue.length,
        queueNext: waiting.next,
        waitFor: queue.headReasons(),
        reservations: reservations.items.map(reservationInfo),
        reservationCount: book.size,
        reservationsNext: reservations.next,
        running: running.items,
        runningCount: tally.size,
        runningNext: running.next,
        holdMs: book.holdMs,
      };
    },

    listQueue: (after, limit) => ({ ...queue.page(after, limit), waitFor: queue.headReasons() }),

    listReservations(after, limit) {
      const page = book.page(after, limit);
      return { items: page.items.map(reservationInfo), next: page.next };
    },

    listRunning: (after, limit) => tally.page(after, limit),

    machine: () => options.sampler.latest(),

    watchMachine(signal) {
      return {
        [Symbol.asyncIterator](): AsyncIterator<MachineSample> {
          let pending: MachineSample | undefined = options.sampler.latest();
          let ended = closed || signal?.aborted === true;
          let wake: (() => void) | undefined;
          const end = () => {
            ended = true;
            watchers.delete(watcher);
            wake?.();
          };
          const watcher = (sample: MachineSample | undefined) => {
            if (sample === undefined) return end();
            pending = sample;
            wake?.();
          };
          if (!ended) {
            watchers.add(watcher);
            signal?.addEventListener("abort", end, { once: true });
          }
          return {
            async next(): Promise<IteratorResult<MachineSample>> {
              while (!ended && pending === undefined) await new Promise<void>((resolve) => (wake = resolve));
              wake = undefined;
              if (pending !== undefined && !ended) {
                const sample = pending;
                pending = undefined;
                return { value: sample, done: false };
              }
              end();
              return { value: undefined, done: true };
            },
            async return(): Promise<IteratorResult<MachineSample>> {
              end();
              signal?.removeEventListener("abort", end);
              return { value: undefined, done: true };
            },
          };
        },
      };
    },

    costs: (spec) => costsOf(spec, policy),

    needOf: (items) => needFromItems(items, policy),

    policy: () => policy,

    reloadPolicy(next) {
      policy = validatePolicy(next);
      lastSampleKey = "";
      logger.info({ policy }, "budget: policy reloaded; re-checking the queue");
      queue.policyChanged();
      return policy;
    },

    async close() {
      if (closed) return;
      closed = true;
      unsubscribe();
      for (const watcher of [...watchers]) watcher(undefined);
      queue.close();
      for (const r of book.all()) r.stopLeaseTimer();
      await tally.close();
    },
  };
  return budget;
}
