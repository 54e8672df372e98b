/**
 * What the budget offers its callers (the RPC layer, the fleet publisher, tests): the {@link Budget}
 * interface, its options, and the shapes of what it answers and watches.
 */
import type { Clock } from "@berth/shared/clock";
import type { runRevisionBase, RevisionWatcher } from "@berth/shared/revision-history";
import type { AdmitOptions, QueueEntryInfo, QueueRequestChange } from "./admission-queue.js";
import type { Page } from "./paging.js";
import type { AdmissionQueue } from "./admission-queue.js";
import type { Cost, Need, NeedItemInput, Resources } from "./costs.js";
import type { Logger } from "@berth/shared/logger";
import type { Policy } from "./policy.js";
import type { RunningAnswer } from "./keyed-requests.js";
import type { ConsumeOptions, Reservation, ReservationSnapshot } from "./reservations.js";
import type { AdmitStreamHooks, AttachResult } from "./resumable-admissions.js";
import type { ProcessTable } from "./process-table.js";
import type { RunningChange, RunningEntry } from "./running-tally.js";
import type { MachineSample, Sampler } from "./sampler.js";
import type { CheckOptions, Committed, Reason, Verdict } from "./verdict.js";

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
  /** Describe at most this many queued requests, in queue order (0 or unset: all). */
  queueLimit?: number | undefined;
}

/** A watch of the budget, opened: what to send first, then the changes. */
export interface BudgetWatch {
  /** The current state (the queue in order, reservations, running entries, the policy), when described; all at `caughtUp.revision`. */
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
  /** The waiters in queue order, with positions and ETAs: the first `pageSize` of them. */
  queue: QueueEntryInfo[];
  /** How many wait in all. */
  queueSize: number;
  /** Where the queue's next page starts (see {@link Budget.listQueue}); undefined when `queue` is all of it. */
  queueNext?: number | undefined;
  /** Why the first waiter waits (empty when nobody waits). */
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
  /** Up to `limit` waiters that arrived after the one numbered `after` (from the first waiter when undefined), and what the first waiter waits for. */
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
  /** What a service costs running and building, from what it declares of each, with the policy's defaults for what it leaves out. */
  costs(run: Partial<Resources> | undefined, build: Partial<Resources> | undefined): { run: Cost; build: Cost };
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
