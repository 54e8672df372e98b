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
import { formatDuration } from "@berth/shared/units";
import { DEFAULT_IDEMPOTENCY_WINDOW_MS, IdempotencyMemory, type KeyedRequest } from "@berth/shared/idempotency";
import { RevisionHistory, runRevisionBase, type RevisionWatcher } from "@berth/shared/revision-history";
import type { AdmitOptions, QueueEntryInfo, QueuedRequest, QueueRequestChange } from "./admission-queue.js";
import type { Page } from "./paging.js";
import { AdmissionQueue } from "./admission-queue.js";
import type { Cost, Need, NeedItemInput, Resources, ResourceSpec } from "./costs.js";
import { checkResources, costsOf, needFromItems, total } from "./costs.js";
import { silentLogger, type Logger } from "@berth/shared/logger";
import type { Policy } from "./policy.js";
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
import type { ConsumeOptions, Reservation, ReservationChange, ReservationSnapshot } from "./reservations.js";
import { ReservationBook, reservationNotFound } from "./reservations.js";
import { DEFAULT_ADMIT_RESUME_GRACE_MS, ResumableAdmissions, type AdmitStreamHooks, type AttachResult } from "./resumable-admissions.js";
import { roughly, usualWords, type Holding } from "./eta.js";
import { RunTimes } from "./run-times.js";
import { topConsumers, type ProcessTable } from "./process-table.js";
import type { RunningChange, RunningEntry } from "./running-tally.js";
import { RunningTally } from "./running-tally.js";
import type { MachineSample, Sampler } from "./sampler.js";
import type { CheckOptions, Committed, Reason, Verdict, VerdictContext } from "./verdict.js";
import { CONSUMERS_NAMED, check, cpuGate, freeMemory } from "./verdict.js";

/** Options of {@link createBudget}. */
export interface BudgetOptions {
  policy: Policy;
  /** The service's one sampler. The budget subscribes to it; starting and closing it is the caller's. */
  sampler: Sampler;
  /** The machine's processes, read when a refusal or a wait names who uses the memory or cpu it is short of. None: reasons name berth's own work only. */
  processes?: ProcessTable | undefined;
  clock?: Clock | undefined;
  /** The state directory: the running tally is kept in `<stateDir>/budget/running.json`. Undefined: in memory only. */
  stateDir?: string | undefined;
  logger?: Logger | undefined;
  /** Is `pid` (started at `startTime`) still that process? Default: process-identity's `sameProcess`. */
  isAlive?: ((pid: number, startTime: number | undefined) => boolean) | undefined;
  /** Runs a function after the current event (batches queue position updates). Default: setImmediate. */
  defer?: ((fn: () => void) => void) | undefined;
  /** How long a request id is remembered after what its call made ended (`--idempotency-window`). Default 1 h. */
  idempotencyWindowMs?: number | undefined;
  /** The most ended request ids remembered (default: the shared memory's, 100,000). */
  maxEndedKeys?: number | undefined;
  /** How long a broken Admit stream with a request id keeps its place or reservation (`--admit-resume-grace`). Default 15 s. */
  admitResumeGraceMs?: number | undefined;
  /** How many of the latest changes a watch can replay. Default {@link DEFAULT_WATCH_HISTORY}. */
  watchHistory?: number | undefined;
  /** How many changes a watcher may hold unread before it is ended lagged; at most `watchHistory`. Default {@link DEFAULT_WATCH_BUFFER}. */
  watchBuffer?: number | undefined;
  /** The revision before the first change (default: {@link runRevisionBase} of the clock: the run's start in µs). */
  revisionBase?: number | undefined;
}

/** A machine sample as WatchMachine sends it. */
export interface RevisionedSample {
  sample: MachineSample;
  revision: number;
  /** The watcher's start revision could not be continued: samples were missed before this one. */
  reset: boolean;
}

/** How many of the latest samples WatchMachine can resume after. */
export const SAMPLE_HISTORY = 64;

/** How many changes a watch of the budget can replay. */
export const DEFAULT_WATCH_HISTORY = 10_000;
/**
 * How many changes a watcher may hold unread before it is ended lagged: a tenth of the history, so
 * that a lagged watcher that resumes at once finds every change it missed still held.
 */
export const DEFAULT_WATCH_BUFFER = 1_000;

/**
 * One change of the budget, as a watch tells it: what changed, as it stands after the change (a
 * request leaving the queue as it stood, at position 0), and when (wall clock, ms).
 */
export type BudgetChange =
  | { kind: `request_${QueueRequestChange}`; at: number; request: QueueEntryInfo }
  | {
      kind: "reservation_made" | "reservation_changed" | "reservation_released" | "reservation_expired";
      at: number;
      reservation: ReservationInfo & { runningIds: string[] };
    }
  | { kind: `running_${RunningChange}`; at: number; running: RunningEntry }
  | { kind: "policy_changed"; at: number; policy: Policy };

/** Where a watch of the budget starts. */
export interface BudgetWatchOptions {
  /** Describe the current state first. */
  includeCurrent: boolean;
  /** Replay every change after this revision (0: none); one that cannot be replayed describes the current state, reset. */
  startRevision: number;
  /** Describe at most this many queued requests, the head first (0 or unset: all). */
  queueLimit?: number | undefined;
}

/** A watch of the budget, opened: what to send first, then the changes. */
export interface BudgetWatch {
  /** The current state (head of the queue first, reservations, running entries, the policy), when described; all at `caughtUp.revision`. */
  current: BudgetChange[] | undefined;
  /** Sent once the state or the replayed changes are; undefined when neither was asked. `queueSize`: with the current state, how many were queued. */
  caughtUp: { revision: number; reset: boolean; queueSize?: number } | undefined;
  /** The changes after what was described or replayed. Ends RESOURCE_EXHAUSTED WATCHER_LAGGED when its reader falls too far behind. */
  changes: RevisionWatcher<BudgetChange>;
}

/** The request ids' settings in force (GetLimits). */
export interface KeyLimits {
  idempotencyWindowMs: number;
  admitResumeGraceMs: number;
}

/** Options of a leased reservation ({@link Budget.reserve}). */
export interface ReserveOptions extends AdmitOptions {
  /** The lease: released unless renewed within this many ms. */
  ttlMs: number;
  /**
   * The caller's id for the request (the rule of @berth/shared/idempotency): a repeat of the same
   * need, owner, ttl and skipLoadGate is answered the first reservation as first answered, while it
   * lives and for the window after; a repeat while the first still waits joins that wait (one place
   * in the queue, each call up to its own wait, dropped once every call has gone).
   */
  requestId?: string | undefined;
}

/** The options of a keyed change (Release, ReleaseBuild, StopRunning): a repeat answers the first answer. */
export interface KeyedOptions {
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
  /**
   * The caller's id for the request: a repeat of the same name, cost, pid, ttl (and reservation) is
   * answered the first answer instead of counting the work twice, while the entry lives (across
   * restarts: the id is saved with it) and for the window after.
   */
  requestId?: string | undefined;
  /** What the caller declared of `cost` (the rest defaulted): what a repeat is compared on. Default: all of `cost`. */
  declaredCost?: Partial<Resources> | undefined;
}

/** The budget's API. */
export interface Budget {
  /** Would `need` be admitted right now, ignoring the queue? Reads the cached sample, never /proc. */
  check(need: Pick<Need, "start" | "build">, options?: CheckOptions): Verdict;
  /** Waits for room and its turn; resolves with the reservation, which the caller must release (see {@link AdmissionQueue.admit} for refusals). */
  admit(need: Need, owner: string, options?: AdmitOptions): Promise<Reservation>;
  /**
   * `admit` for an Admit stream whose start carried `requestId`: the admission outlives a broken
   * stream for the resume grace, and a stream with the same id and request resumes it (see
   * resumable-admissions.ts). Answers the attachment, or the first answer once the admission ended.
   */
  admitResumable(requestId: string, need: Need, owner: string, options: { maxWaitMs: number; skipLoadGate: boolean }, stream: AdmitStreamHooks): AttachResult;
  /** `admit`, then hold the reservation on a lease of `ttlMs` (for clients that cannot hold a stream); answers it as it stood then. See {@link ReserveOptions.requestId} for repeats. */
  reserve(need: Need, owner: string, options: ReserveOptions): Promise<ReservationSnapshot>;
  /** Renews a leased reservation. not_found when it was released or its lease ran out. */
  renew(reservationId: string, ttlMs?: number): Reservation;
  /** Releases a reservation. Idempotent: false when there was none by that id. With a request id, a repeat answers the first answer. */
  release(reservationId: string, options?: KeyedOptions): boolean;
  /** The reservation's build phase is over: its build share goes back. Answers the reservation as it stands then. */
  releaseBuild(reservationId: string, options?: KeyedOptions): ReservationSnapshot;
  /**
   * What `name` costs running when whoever reports it running declares nothing: the cost of the
   * item of that name the reservation `reservationId` was admitted with (so that what moves to the
   * running tally is what was admitted), else the policy's default run cost.
   */
  runCostOf(name: string, reservationId?: string): Resources;
  /**
   * Something the reservation starts now runs: its share moves to the running tally. Resolves once
   * the tally is on disk, with the entry and the reservation as they stand then. A repeat of
   * `options.requestId` answers the first answer (and moves nothing), even once the reservation is
   * gone (see {@link RunningOptions.requestId}).
   */
  consume(reservationId: string, name: string, cost: Resources, options?: ConsumeOptions): Promise<RunningAnswer>;
  /** Counts running work started outside a reservation. Resolves once the tally is on disk. */
  registerRunning(name: string, cost: Resources, options?: RunningOptions): Promise<RunningAnswer>;
  /** Renews a running entry's lease. */
  renewRunning(id: string, ttlMs?: number): Promise<RunningEntry>;
  /** Stops counting running work. False when there was none by that id. Resolves once the tally is on disk. With a request id, a repeat answers the first answer. */
  stopRunning(id: string, options?: KeyedOptions): Promise<boolean>;
  /** The request ids' settings in force. */
  readonly keyLimits: KeyLimits;
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
  /**
   * The latest sample, then every new one, each with its revision (the sample's number in this run,
   * from the run's revision base); a slow reader gets the newest, not a backlog. With
   * `startRevision`, the held samples after it instead of the latest; one that cannot be continued
   * (older than the last {@link SAMPLE_HISTORY} samples, another run's) gets the latest, `reset`.
   * Ends when `signal` fires or the budget closes.
   */
  watchMachine(signal?: AbortSignal, options?: { startRevision?: number | undefined }): AsyncIterable<RevisionedSample>;
  /** What a spec costs running and building, with the policy's defaults for what it leaves out. */
  costs(spec: ResourceSpec | undefined): { run: Cost; build: Cost };
  /** The need of the items a caller sent (defaults from the current policy). */
  needOf(items: readonly NeedItemInput[]): Need;
  policy(): Policy;
  /** Swaps the policy (validated first) and re-checks the queue. The server wires SIGHUP to it. */
  reloadPolicy(policy: Policy): Policy;
  /**
   * Every change of the queue, the reservations, the running tally and the policy, numbered by
   * revision: opened in one step with the state it describes, so no change falls between the two.
   */
  watch(options: BudgetWatchOptions): BudgetWatch;
  /** The latest change's revision. */
  readonly revision: number;
  /** Refuses every waiter (unavailable), stops every timer and waits for the tally's last write. */
  close(): Promise<void>;
}

function checkOwner(owner: unknown): string {
  if (typeof owner !== "string" || owner.trim() === "" || owner.length > 256) throw invalidArgument("owner", "must be 1 to 256 characters");
  return owner;
}

/** A Reserve still waiting, shared by every call that carries its request id. */
interface PendingReserve {
  promise: Promise<ReservationSnapshot>;
  /** The calls waiting on it: the queued request is dropped when the last one goes. */
  callers: number;
  drop: AbortController;
  /** Its place in the queue, once queued: each call moves its wait or gives up on its own. */
  queued: QueuedRequest | undefined;
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
  const samples = new RevisionHistory<MachineSample>({ base: revisionBase, capacity: SAMPLE_HISTORY });
  const firstSample = options.sampler.latest();
  if (firstSample !== undefined) samples.append(firstSample);

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

  /**
   * What holds the budget now, each part with when it is expected to end: at its usual run time
   * while it has not run past it, else when its lease runs out, else nothing says.
   */
  const holdings = (): Holding[] => {
    const now = clock.monotonicNow();
    const holding = (name: string, held: Resources, startedAt: number, leaseDeadline: number | undefined, ends: boolean): Holding => {
      const label = `'${name}'`;
      const usual = runTimes.usual(name);
      if (usual !== undefined && startedAt + usual.ms > now) return { label, ...held, endsAt: startedAt + usual.ms, endBasis: usualWords(usual) };
      // Past its usual time: by its longest run, while it has not run longer than that too.
      if (usual !== undefined && startedAt + usual.longestMs > now)
        return {
          label,
          ...held,
          endsAt: startedAt + usual.longestMs,
          endBasis: `${usualWords(usual)} and has run longer; its longest run took ${formatDuration(roughly(usual.longestMs))}`,
        };
      if (leaseDeadline !== undefined) {
        const lease = "its lease runs out unless renewed";
        return {
          label,
          ...held,
          endsAt: leaseDeadline,
          endBasis: usual === undefined ? lease : `${usualWords(usual)}, has run longer than ever, and ${lease}`,
        };
      }
      return {
        label,
        ...held,
        ends,
        noEnd: usual === undefined ? "no lease, no past runs" : `no lease, and it has run longer than any of its ${usual.runs} past runs`,
      };
    };
    const found: Holding[] = [];
    for (const r of book.all()) {
      const held = r.held();
      // A reservation's work ends; running work may be a service that runs until stopped.
      if (held.memoryBytes > 0 || held.cpu > 0) found.push(holding(r.owner, held, r.admittedAtMonotonic, r.leaseDeadline, true));
    }
    for (const t of tally.timings()) found.push(holding(t.name, t.cost, t.startedAt, t.leaseDeadline, false));
    return found;
  };

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
    requestChanged: (change, request) => history.append({ kind: `request_${change}`, at: clock.now(), request }),
  });
  queueRef = queue;

  // A sample that changes neither free memory nor the CPU gate cannot change any verdict: skip it.
  let lastSampleKey = "";
  const watchers = new Set<(sample: RevisionedSample | undefined) => void>();
  const unsubscribe = options.sampler.onSample((sample) => {
    if (closed) return;
    const numbered = samples.append(sample);
    tally.sweep();
    const ctx = context();
    const key = `${freeMemory(ctx)}|${cpuGate(policy, sample)}`;
    if (key !== lastSampleKey) {
      lastSampleKey = key;
      recheck();
    }
    for (const watcher of watchers) watcher({ sample, revision: numbered.revision, reset: false });
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

  /**
   * One more call waiting on `pending`, up to its own wait of `waitMs`: it gives up on its own
   * deadline (WAIT_EXHAUSTED where the request stands) or signal; the place goes with the last.
   */
  const joinReserve = (requestId: string, pending: PendingReserve, waitMs: number, signal: AbortSignal | undefined): Promise<ReservationSnapshot> => {
    pending.callers++;
    const deadline = clock.monotonicNow() + waitMs;
    if (pending.queued !== undefined && deadline > pending.queued.deadline) pending.queued.waitUntil(deadline);
    return new Promise<ReservationSnapshot>((resolve, reject) => {
      let left = false;
      // Fires at the call's own deadline; the call whose deadline is the request's is refused by the queue.
      const timer = clock.setTimeout(() => {
        const queued = pending.queued;
        if (left || queued === undefined || queued.deadline <= deadline) return;
        leave();
        reject(queued.exhausted(waitMs));
      }, waitMs);
      const leave = () => {
        if (left) return;
        left = true;
        clock.clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        pending.callers--;
        if (pending.callers === 0 && reserving.get(requestId) === pending) {
          // Nobody waits any more: dropped, and the id free (a later call is a new request).
          reserving.delete(requestId);
          keys.forget(requestId);
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
          leave();
          resolve(admitted);
        },
        (error: unknown) => {
          if (left) return;
          leave();
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

    watchMachine(signal, { startRevision = 0 } = {}) {
      return {
        [Symbol.asyncIterator](): AsyncIterator<RevisionedSample> {
          const resuming = startRevision > 0 && samples.canReplay(startRevision);
          // The held samples after the start revision, each sent; live samples are states, so a
          // reader behind gets the newest one only.
          const replay: RevisionedSample[] = resuming
            ? samples.since(startRevision).map(({ revision, value }) => ({ sample: value, revision, reset: false }))
            : [];
          const latest = samples.last();
          // A start that cannot be continued is told on the first sample it gets (the latest, or the next one).
          let resetDue = startRevision > 0 && !resuming;
          let live: RevisionedSample | undefined =
            resuming || latest === undefined ? undefined : { sample: latest.value, revision: latest.revision, reset: resetDue };
          if (live !== undefined) resetDue = false;
          let ended = closed || signal?.aborted === true;
          let wake: (() => void) | undefined;
          const end = () => {
            ended = true;
            watchers.delete(watcher);
            wake?.();
          };
          const watcher = (sample: RevisionedSample | undefined) => {
            if (sample === undefined) return end();
            live = { ...sample, reset: resetDue || live?.reset === true };
            resetDue = false;
            wake?.();
          };
          if (!ended) {
            watchers.add(watcher);
            signal?.addEventListener("abort", end, { once: true });
          }
          return {
            async next(): Promise<IteratorResult<RevisionedSample>> {
              while (!ended && replay.length === 0 && live === undefined) await new Promise<void>((resolve) => (wake = resolve));
              wake = undefined;
              let sample = replay.shift();
              if (sample === undefined) {
                sample = live;
                live = undefined;
              } else if (live !== undefined && live.revision <= sample.revision) {
                live = undefined;
              }
              if (sample !== undefined && !ended) return { value: sample, done: false };
              end();
              return { value: undefined, done: true };
            },
            async return(): Promise<IteratorResult<RevisionedSample>> {
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
      for (const watcher of [...watchers]) watcher(undefined);
      admissions?.close();
      queue.close();
      for (const r of book.all()) r.stopLeaseTimer();
      await tally.close();
      await runTimes.flushed();
    },
  };
  return budget;
}
