import { systemClock } from "@berth/shared/clock";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { DEFAULT_IDEMPOTENCY_WINDOW_MS, IdempotencyMemory, type KeyedRequest } from "@berth/shared/idempotency";
import { RevisionHistory, runRevisionBase } from "@berth/shared/revision-history";
import { AdmissionQueue } from "./admission-queue.js";
import type { Need } from "./costs.js";
import { checkResources, costsOf, needFromItems, total } from "./costs.js";
import { silentLogger } from "@berth/shared/logger";
import { validatePolicy } from "./policy.js";
import {
  admitRequest,
  naming,
  reservationRequest,
  reserveRequest,
  runningRequest,
  runningRequestOf,
  stopRequest,
  type BudgetAnswer,
  type RunningAnswer,
} from "./keyed-requests.js";
import type { Reservation, ReservationChange, ReservationSnapshot } from "./reservations.js";
import { ReservationBook, reservationNotFound } from "./reservations.js";
import { DEFAULT_ADMIT_RESUME_GRACE_MS, ResumableAdmissions } from "./resumable-admissions.js";
import type { Holding } from "./eta.js";
import { holdingsOf } from "./holdings.js";
import { joinPendingReserve, type PendingReserve } from "./pending-reserves.js";
import { SampleFeed } from "./sample-feed.js";
import { RunTimes } from "./run-times.js";
import { topConsumers } from "./process-table.js";
import type { RunningEntry } from "./running-tally.js";
import { RunningTally } from "./running-tally.js";
import type { Committed, VerdictContext } from "./verdict.js";
import { CONSUMERS_NAMED, check, cpuGate, freeMemory } from "./verdict.js";
import {
  DEFAULT_WATCH_BUFFER,
  DEFAULT_WATCH_HISTORY,
  type Budget,
  type BudgetChange,
  type BudgetOptions,
  type KeyLimits,
  type ReservationInfo,
} from "./budget-interface.js";

function checkOwner(owner: unknown): string {
  if (typeof owner !== "string" || owner.trim() === "" || owner.length > 256) throw invalidArgument("owner", "must be 1 to 256 characters");
  return owner;
}

function checkNeed(need: Pick<Need, "start" | "build">): void {
  if (!need || typeof need !== "object") throw invalidArgument("need", "is required");
  checkResources(need.start, "need.start");
  checkResources(need.build, "need.build");
}

/** The watch events of the reservations' changes (a renewal is none: one per KeepAlive, and its expiry is told when it comes). */
const RESERVATION_EVENTS: Partial<Record<ReservationChange, Extract<BudgetChange, { reservation: unknown }>["kind"]>> = {
  admitted: "reservation_made",
  build_released: "reservation_changed",
  consumed: "reservation_changed",
  released: "reservation_released",
  expired: "reservation_expired",
};

/** RESOURCE_EXHAUSTED WATCHER_LAGGED: a watcher fell behind; it resumes from the last revision it took. */
function watcherLagged(resumeRevision: number): BerthError {
  return new BerthError(
    "resource_exhausted",
    `the watcher fell too far behind the budget's changes; watch again with start_revision ${resumeRevision}`,
    { resumeRevision: String(resumeRevision) },
    { reason: "WATCHER_LAGGED" },
  );
}

/** A running entry as a watcher is shown it: without the request id, which answers a retry and is the caller's own. */
function withoutSecrets(entry: RunningEntry): RunningEntry {
  const { requestId: _requestId, ...shown } = entry;
  return shown;
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
  /** Every request id: the request it names and its first answer (see @berth/shared/idempotency). */
  const keys = new IdempotencyMemory<BudgetAnswer>({
    clock,
    windowMs: options.idempotencyWindowMs ?? DEFAULT_IDEMPOTENCY_WINDOW_MS,
    maxEnded: options.maxEndedKeys,
  });
  const keyLimits: KeyLimits = Object.freeze({
    idempotencyWindowMs: keys.windowMs,
    admitResumeGraceMs: options.admitResumeGraceMs ?? DEFAULT_ADMIT_RESUME_GRACE_MS,
  });
  /** Reserves still waiting, by request id; keyed calls still being saved (RegisterRunning, StopRunning), by request id. */
  const reserving = new Map<string, PendingReserve>();
  const saving = new Map<string, Promise<BudgetAnswer>>();
  let admissions: ResumableAdmissions | undefined;
  const watchHistory = options.watchHistory ?? DEFAULT_WATCH_HISTORY;
  const watchBuffer = Math.min(options.watchBuffer ?? DEFAULT_WATCH_BUFFER, watchHistory);
  const revisionBase = options.revisionBase ?? runRevisionBase(clock);
  const history = new RevisionHistory<BudgetChange>({ base: revisionBase, capacity: watchHistory });
  const sampleFeed = new SampleFeed(revisionBase, options.sampler.latest());

  // How long each name usually holds the budget: what the queue's ETAs rest on.
  const runTimes = new RunTimes({ stateDir: options.stateDir, logger });
  const tally = await RunningTally.open({
    clock,
    stateDir: options.stateDir,
    logger,
    onChange: recheck,
    isAlive: options.isAlive,
    // A running entry's id is remembered while it is counted, then for the window.
    onRemoved: (entry) => {
      if (entry.requestId !== undefined) keys.end(entry.requestId);
    },
    onEntry: (change, entry) => {
      history.append({ kind: `running_${change}`, at: clock.now(), running: withoutSecrets(entry) });
      // A clean end teaches the name's run time: stopped, or its process gone before any lease ran out.
      const now = clock.now();
      const processEnded = change === "expired" && entry.pid !== undefined && (entry.leaseExpiresAt === undefined || entry.leaseExpiresAt > now);
      if (change === "stopped" || processEnded) runTimes.record(entry.name, now - entry.startedAt, now);
    },
  });
  // The ids of the entries counted before a restart: their repeats are answered, never counted twice.
  for (const entry of tally.entries()) {
    if (entry.requestId === undefined) continue;
    const answer = (tally.answerOf(entry.id) as RunningAnswer | undefined) ?? { running: entry };
    const request = runningRequestOf(entry);
    const fingerprint = tally.requestFingerprintOf(entry.id) ?? request.fingerprint;
    keys.answered(entry.requestId, naming({ ...request, fingerprint }, { runningId: entry.id }), answer);
  }
  const book = new ReservationBook({
    clock,
    tally,
    logger,
    onChange: (reservation, change) => {
      // A reservation's id is remembered while it lives, then for the window.
      // A release (not a lease that ran out) teaches how long this owner holds the budget.
      if (change === "released") runTimes.record(reservation.owner, clock.monotonicNow() - reservation.admittedAtMonotonic, clock.now());
      if ((change === "released" || change === "expired") && reservation.requestId !== undefined) {
        keys.end(reservation.requestId);
        admissions?.released(reservation);
      }
      const kind = RESERVATION_EVENTS[change];
      if (kind !== undefined)
        history.append({ kind, at: clock.now(), reservation: { ...reservationInfo(reservation), runningIds: [...reservation.runningIds] } });
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

  /** What holds the budget now, each part with when it is expected to end. */
  const holdings = (): Holding[] => holdingsOf(book.all(), tally, runTimes, clock.monotonicNow());

  /** The machine's largest users of memory and cpu, berth's running work named by its pid. */
  const processes = options.processes;
  const machineConsumers =
    processes === undefined
      ? undefined
      : {
          memory: () => topConsumers(processes.reading(), "memory", CONSUMERS_NAMED, berthPids()),
          cpu: () => topConsumers(processes.reading(), "cpu", CONSUMERS_NAMED, berthPids()),
        };
  const berthPids = () => new Map(tally.entries().flatMap((entry) => (entry.pid === undefined ? [] : [[entry.pid, entry.name] as const])));

  const context = (): VerdictContext => {
    const sample = options.sampler.latest();
    return {
      policy,
      committed: committed(),
      sample,
      unseenMemoryBytes: sample ? book.unseenSince(sample.monotonicAt) + tally.unseenSince(sample.monotonicAt) : 0,
      machineConsumers,
    };
  };

  const queue = new AdmissionQueue({
    clock,
    logger,
    policy: () => policy,
    context,
    grant: (need, owner, waitedMs) => book.create(need, owner, { waitedMs }),
    holdMs: () => book.holdMs,
    etaBasis: () => ({ holdings: holdings(), usual: (name) => runTimes.usual(name) }),
    defer: options.defer,
    requestChanged: (change, request) => {
      // Admissions are logged by the reservations; the rest tells why a request left the queue.
      if (change !== "admitted") logger.debug({ owner: request.owner, position: request.position }, `budget: request ${change}`);
      history.append({ kind: `request_${change}`, at: clock.now(), request });
    },
  });
  queueRef = queue;

  // A sample that changes neither free memory nor the CPU gate cannot change any verdict: skip it.
  let lastSampleKey = "";
  const unsubscribe = options.sampler.onSample((sample) => {
    if (closed) return;
    const revision = sampleFeed.record(sample);
    tally.sweep();
    const ctx = context();
    const key = `${freeMemory(ctx)}|${cpuGate(policy, sample)}`;
    if (key !== lastSampleKey) {
      lastSampleKey = key;
      recheck();
    }
    sampleFeed.publish(sample, revision);
  });

  const reservation = (id: string): Reservation => {
    const found = book.get(id);
    if (!found) throw reservationNotFound(id);
    return found;
  };

  /**
   * A keyed call that saves the tally (RegisterRunning, StopRunning): answered the first answer once
   * there is one; a repeat while the first is being saved waits for it; a refusal records nothing.
   * `run` answers, and whether what it made has already ended (a stop makes nothing that lives).
   */
  const keyedSave = async <A extends BudgetAnswer>(
    requestId: string,
    request: KeyedRequest,
    run: () => Promise<{ answer: A; request: KeyedRequest; ended: boolean }>,
  ): Promise<A> => {
    const known = keys.recall(requestId, request);
    if (known !== undefined && known.phase !== "pending") return known.answer as A;
    const inFlight = saving.get(requestId);
    if (inFlight !== undefined) return (await inFlight) as A;
    keys.begin(requestId, request);
    const running = run().then(
      (done) => {
        keys.answered(requestId, done.request, done.answer, { ended: done.ended });
        return done.answer;
      },
      (error: unknown) => {
        keys.forget(requestId);
        throw error;
      },
    );
    saving.set(requestId, running);
    try {
      return await running;
    } finally {
      saving.delete(requestId);
    }
  };

  /** The first answer of a RegisterRunning (or `started`) whose entry is `entry`, as its request id keeps it. */
  const runningDone = (entry: RunningEntry, request: KeyedRequest, answer: RunningAnswer) => ({
    answer,
    request: naming(request, { runningId: entry.id }),
    // Gone already (its pid ended before the answer): remembered for the window from now.
    ended: tally.get(entry.id) === undefined,
  });

  /** One more call waiting on `pending`; the last to leave drops the request and frees its id. */
  const joinReserve = (requestId: string, pending: PendingReserve, waitMs: number, signal: AbortSignal | undefined) =>
    joinPendingReserve(clock, requestId, pending, waitMs, signal, () => {
      if (reserving.get(requestId) !== pending) return;
      // Nobody waits any more: dropped, and the id free (a later call is a new request).
      reserving.delete(requestId);
      keys.forget(requestId);
      pending.drop.abort();
    });

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

    admitResumable(requestId, need, owner, admitOptions, stream) {
      ensureOpen();
      checkNeed(need);
      checkOwner(owner);
      admissions ??= new ResumableAdmissions({
        clock,
        logger,
        graceMs: keyLimits.admitResumeGraceMs,
        keys,
        admit: (n, o, a) => budget.admit(n, o, a),
        release: (id) => void budget.release(id),
      });
      return admissions.attach(requestId, admitRequest(need, owner, admitOptions.skipLoadGate), need, owner, admitOptions, stream);
    },

    async reserve(need, owner, reserveOptions) {
      const { ttlMs, requestId, ...admitOptions } = reserveOptions;
      if (!Number.isFinite(ttlMs) || ttlMs <= 0) throw invalidArgument("ttl", `must be a positive duration; got ${ttlMs}`);
      if (requestId === undefined) {
        const admitted = await budget.admit(need, owner, admitOptions);
        // No timer can fire between the admission and this line: the lease starts with the reservation.
        book.lease(admitted, ttlMs);
        return admitted.snapshot();
      }
      ensureOpen();
      checkNeed(need);
      checkOwner(owner);
      const request = reserveRequest(need, owner, ttlMs, admitOptions.skipLoadGate ?? false);
      const known = keys.recall(requestId, request);
      if (known !== undefined && known.phase !== "pending") return (known.answer as { reservation: ReservationSnapshot }).reservation;
      const waitMs = admitOptions.maxWaitMs ?? policy.maxWaitMs;
      let pending = reserving.get(requestId);
      if (pending !== undefined && waitMs === 0) {
        // A repeat that will not wait answers at once, and leaves the first call's place alone.
        throw (
          pending.queued?.exhausted(0) ??
          new BerthError("resource_exhausted", `'${owner}' is being queued; it does not fit now`, {}, { reason: "WAIT_EXHAUSTED" })
        );
      }
      if (pending === undefined) {
        const drop = new AbortController();
        const created: PendingReserve = { callers: 0, drop, queued: undefined, promise: Promise.resolve(undefined as never) };
        keys.begin(requestId, request);
        reserving.set(requestId, created);
        const admission = budget.admit(need, owner, { ...admitOptions, signal: drop.signal, onQueuedRequest: (queued) => (created.queued = queued) });
        created.promise = admission.then(
          (admitted) => {
            if (reserving.get(requestId) === created) reserving.delete(requestId);
            // In the admission's own microtask, before any timer: the lease starts with the reservation.
            book.lease(admitted, ttlMs);
            admitted.requestId = requestId;
            const answer = admitted.snapshot();
            keys.answered(requestId, naming(request, { reservationId: admitted.id }), { reservation: answer });
            return answer;
          },
          (error: unknown) => {
            if (reserving.get(requestId) === created) {
              reserving.delete(requestId);
              keys.forget(requestId);
            }
            throw error;
          },
        );
        // Rejections reach every caller through joinReserve; this one only keeps Node from reporting them unhandled.
        created.promise.catch(() => undefined);
        pending = created;
      }
      return joinReserve(requestId, pending, waitMs, admitOptions.signal);
    },

    renew(reservationId, ttlMs) {
      const found = reservation(reservationId);
      found.renew(ttlMs);
      return found;
    },

    release(reservationId, keyedOptions = {}) {
      const releaseNow = () => {
        const found = book.get(reservationId);
        if (!found) return false;
        found.release();
        return true;
      };
      const { requestId } = keyedOptions;
      if (requestId === undefined) return releaseNow();
      const request = reservationRequest("Release", reservationId);
      const known = keys.recall(requestId, request);
      if (known !== undefined && known.phase !== "pending") return (known.answer as { released: boolean }).released;
      const released = releaseNow();
      keys.answered(requestId, request, { released }, { ended: true });
      return released;
    },

    releaseBuild(reservationId, keyedOptions = {}) {
      const { requestId } = keyedOptions;
      const request = reservationRequest("ReleaseBuild", reservationId);
      const known = requestId === undefined ? undefined : keys.recall(requestId, request);
      if (known !== undefined && known.phase !== "pending") return (known.answer as { reservation: ReservationSnapshot }).reservation;
      const found = reservation(reservationId);
      found.releaseBuild();
      const answer = found.snapshot();
      if (requestId !== undefined) keys.answered(requestId, request, { reservation: answer }, { ended: true });
      return answer;
    },

    runCostOf(name, reservationId) {
      const admitted = reservationId === undefined ? undefined : book.get(reservationId)?.runCostOf(name);
      return admitted ?? { ...policy.defaultRun };
    },

    async consume(reservationId, name, cost, consumeOptions = {}) {
      ensureOpen();
      const { requestId } = consumeOptions;
      const request =
        requestId === undefined
          ? undefined
          : runningRequest(name, consumeOptions.declaredCost ?? cost, consumeOptions.pid, consumeOptions.ttlMs, reservationId);
      const fingerprint = request?.fingerprint;
      const consumeNow = async (): Promise<RunningAnswer> => {
        const found = reservation(reservationId);
        const before = { ...found.start };
        // The first answer, kept (and saved) with the entry: the reservation as this start leaves it.
        const answerOf =
          requestId === undefined
            ? undefined
            : (running: RunningEntry): RunningAnswer => ({ running, reservation: { ...found.snapshot(), runningIds: [...found.runningIds, running.id] } });
        const entry = found.consume(name, cost, { ...consumeOptions, answer: answerOf, requestFingerprint: fingerprint });
        try {
          await tally.whenDurable();
        } catch (error) {
          // Not saved (a full disk): undone, so a refused start moves nothing and its retry counts once.
          tally.stop(entry.id);
          if (!found.released) found.start = before;
          book.changed(found, "consumed");
          throw error;
        }
        book.get(reservationId)?.recordRunning(entry.id);
        return (tally.answerOf(entry.id) as RunningAnswer | undefined) ?? { running: entry, reservation: found.snapshot() };
      };
      if (requestId === undefined || request === undefined) return consumeNow();
      return keyedSave(requestId, request, async () => {
        const answer = await consumeNow();
        return runningDone(answer.running, request, answer);
      });
    },

    async registerRunning(name, cost, runningOptions = {}) {
      ensureOpen();
      const { requestId } = runningOptions;
      if (requestId === undefined) return { running: await tally.registerDurably(name, cost, runningOptions) };
      const request = runningRequest(name, runningOptions.declaredCost ?? cost, runningOptions.pid, runningOptions.ttlMs, undefined);
      return keyedSave(requestId, request, async () => {
        const entry = await tally.registerDurably(name, cost, {
          ...runningOptions,
          requestFingerprint: request.fingerprint,
          answer: (running) => ({ running }),
        });
        return runningDone(entry, request, { running: entry });
      });
    },

    async renewRunning(id, ttlMs) {
      ensureOpen();
      const entry = tally.renew(id, ttlMs);
      await tally.whenDurable();
      return entry;
    },

    async stopRunning(id, keyedOptions = {}) {
      const { requestId } = keyedOptions;
      if (requestId === undefined) return tally.stopDurably(id);
      const request = stopRequest(id);
      const answer = await keyedSave(requestId, request, async () => ({ answer: { stopped: await tally.stopDurably(id) }, request, ended: true }));
      return (answer as { stopped: boolean }).stopped;
    },

    keyLimits,

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
        waitFor: queue.firstWaiterReasons(),
        reservations: reservations.items.map(reservationInfo),
        reservationCount: book.size,
        reservationsNext: reservations.next,
        running: running.items,
        runningCount: tally.size,
        runningNext: running.next,
        holdMs: book.holdMs,
      };
    },

    listQueue: (after, limit) => ({ ...queue.page(after, limit), waitFor: queue.firstWaiterReasons() }),

    listReservations(after, limit) {
      const page = book.page(after, limit);
      return { items: page.items.map(reservationInfo), next: page.next };
    },

    listRunning: (after, limit) => tally.page(after, limit),

    machine: () => options.sampler.latest(),

    watchMachine: (signal, { startRevision = 0 } = {}) => sampleFeed.watch(signal, startRevision),

    costs: (run, build) => costsOf(run, build, policy),

    needOf: (items) => needFromItems(items, policy),

    policy: () => policy,

    reloadPolicy(next) {
      policy = validatePolicy(next);
      lastSampleKey = "";
      logger.info({ policy }, "budget: policy reloaded; re-checking the queue");
      history.append({ kind: "policy_changed", at: clock.now(), policy });
      queue.policyChanged();
      return policy;
    },

    watch({ includeCurrent, startRevision, queueLimit }) {
      const options = { maxBuffered: watchBuffer, lagged: watcherLagged };
      const replay = !includeCurrent && startRevision > 0 && history.canReplay(startRevision);
      if (replay) return { current: undefined, caughtUp: { revision: history.revision, reset: false }, changes: history.watch(startRevision, options) };
      const changes = history.watch(history.revision, options);
      if (!includeCurrent && startRevision === 0) return { current: undefined, caughtUp: undefined, changes };
      // Read in the same step as the watch opened: no change can fall between the two.
      const at = clock.now();
      const queued = queueLimit ? queue.page(undefined, queueLimit).items : queue.entries();
      const current: BudgetChange[] = [
        ...queued.map((request): BudgetChange => ({ kind: "request_queued", at, request })),
        ...book.all().map((r): BudgetChange => ({ kind: "reservation_made", at, reservation: { ...reservationInfo(r), runningIds: [...r.runningIds] } })),
        ...tally.entries().map((entry): BudgetChange => ({ kind: "running_registered", at, running: withoutSecrets(entry) })),
        { kind: "policy_changed", at, policy },
      ];
      return { current, caughtUp: { revision: history.revision, reset: !includeCurrent, queueSize: queue.length }, changes };
    },

    get revision() {
      return history.revision;
    },

    async close() {
      if (closed) return;
      closed = true;
      history.close();
      unsubscribe();
      sampleFeed.close();
      admissions?.close();
      queue.close();
      for (const r of book.all()) r.stopLeaseTimer();
      await tally.close();
      await runTimes.flushed();
    },
  };
  return budget;
}
