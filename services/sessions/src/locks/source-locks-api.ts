/**
 * What the RPC layer asks of source locks: the surface the LockService handlers call. The file
 * backend (createSourceLocks: the in-memory lock table, its fencing tokens under the state
 * directory, the seed's lock files) and the etcd backend (etcd/etcd-source-locks.ts) both
 * implement it.
 *
 * A method the lock table answers from memory may answer synchronously; one that has to ask a
 * server answers with a promise. Callers await either.
 */
import type { MaybePromise } from "../session-store-api.js";
import type { LockLimits } from "./lock-input.js";

/** A granted lock. */
export interface Lease {
  /** The capability to renew and release this lease (a random UUID); only its holder knows it. */
  leaseToken: string;
  /** Strictly greater than every earlier fencing token of the same file, across restarts. */
  fencingToken: number;
  /** The canonical path of the locked file (the lock's key). */
  file: string;
  owner: string;
  /** When the lock was granted (ms since the epoch, on the table's clock). */
  acquiredAt: number;
  /**
   * When the lease runs out unless renewed (wall-clock ms, as of the answer that carries it); null
   * for a hold, which lasts as long as its signal.
   */
  expiresAt: number | null;
  /** The lease length each renewal extends it by; null for a hold. */
  ttlMs: number | null;
}

/** A queued request's place, reported to `onWaiting` whenever it changes. */
export interface WaitingUpdate {
  /** 1-based: 1 is served next. */
  position: number;
  /** Who holds the lock now (null for a moment between holders, or when unknown). */
  holder: LockHolderInfo | null;
}

/** A request for a lock. */
export interface AcquireRequest {
  /** The file to lock: an absolute path, any spelling (made canonical, see lock-path.ts). */
  file: string;
  /** Who holds it: shown to everyone who waits. */
  owner: string;
  /** How long to wait in the queue: absent, the longest wait (10 min); 0, try once; longer is capped to the longest. */
  waitMs?: number;
  /** The lease length; absent or 0: the default (30 s). */
  ttlMs?: number;
  /**
   * Makes a retry safe (the service's rule for request ids, @berth/shared/idempotency): a request
   * with the same id, file (any spelling), owner and ttl answers the first one's lease as first
   * answered, while the lease lives and for the idempotency window after it ended; while the first
   * one still waits, it waits with it (one place in the queue, one lease for both), up to its own
   * wait. The same id for anything else (another file, owner or ttl, a release) is refused
   * already_exists IDEMPOTENCY_KEY_REUSED. Absent or "": none.
   */
  requestId?: string;
  /** Aborted when the caller goes away: a waiter is dropped from the queue and never granted. */
  signal?: AbortSignal;
  /**
   * Called when the request is queued and again whenever its position or the holder changes, until
   * it is granted or given up. May be called synchronously from within the acquiring call.
   */
  onWaiting?: (update: WaitingUpdate) => void;
}

/** A request to hold a lock as long as `signal` is not aborted (the Hold RPC). */
export interface HoldRequest {
  file: string;
  owner: string;
  /** As in {@link AcquireRequest.waitMs}. */
  waitMs?: number;
  /** Aborting it drops the request while it waits and releases the lock once held. */
  signal: AbortSignal;
  /** As in {@link AcquireRequest.onWaiting}. */
  onWaiting?: (update: WaitingUpdate) => void;
}

/** The holder of a lock, as Inspect shows it. */
export type LockHolderInfo =
  | {
      /** "lease": from acquire, renewed; "stream": from holdAsLongAs, held while its signal lives. */
      kind: "lease" | "stream";
      owner: string;
      fencingToken: number;
      since: number;
      expiresAt: number | null;
      /** The pid in the lock file berth keeps for it (the service's own); absent without lock files. */
      pid?: number;
    }
  | {
      /** A lock file of a process using the seed's library. */
      kind: "seed-file";
      /** Absent while the file cannot be read. */
      owner?: string;
      pid?: number;
      since: number;
      lockFile: string;
      readable: boolean;
    };

/** A waiter, as Inspect shows it. */
export interface LockWaiterInfo {
  /** How it asked: "lease" (acquire) or "stream" (holdAsLongAs). */
  kind: "lease" | "stream";
  owner: string;
  /**
   * When it started waiting, and when it gives up: wall clock as of this answer, both from one
   * reading, so they are exactly its wait apart (after a wall-clock step, `since` is now less the
   * time waited, not the time the clock read then).
   */
  since: number;
  deadline: number;
}

/** What Inspect answers. */
export interface LockInspection {
  file: string;
  /** The seed's lock file for this file; null when the service keeps no lock files. */
  lockPath: string | null;
  holder: LockHolderInfo | null;
  /** In the order they will be served. */
  waiters: LockWaiterInfo[];
  /** The last fencing token this service granted for the file (held or not), null when none. */
  lastFencingToken: number | null;
}

/** What CheckToken answers. */
export interface TokenCheck {
  file: string;
  /** True while `token` is the fencing token of the lease that holds the file now. */
  current: boolean;
  /** The fencing token of the current berth holder, null when berth holds no lease on it. */
  currentToken: number | null;
}

/** Counts for metrics. */
export interface LockTableStats {
  /** Leases held. */
  held: number;
  /** Requests waiting. */
  waiting: number;
  /** Files whose queue waits for a lock file held by another process. */
  blockedByLockFiles: number;
}

/** How a lease ended: released (through its token, or its hold's stream ending), expired, or the table closed. */
export type LeaseEndReason = "released" | "expired" | "closed";

/** What happened to a lock; "current_*" describe the state before a watch's caught-up marker. */
export type LockChangeKind = "granted" | "released" | "expired" | "waiter_joined" | "waiter_left" | "current_holder" | "current_waiter";

/** One change of one lock (never a lease token). */
export interface LockChange {
  readonly file: string;
  readonly kind: LockChangeKind;
  readonly owner: string;
  /** The holder's fencing token; 0 for a waiter. */
  readonly fencingToken: number;
  /** The lease's end as granted (wall ms); null for a hold, a waiter, or when unknown. */
  readonly expiresAt: number | null;
  /** A waiter's 1-based place; 0 for a holder. */
  readonly position: number;
  /** When it happened (wall ms). */
  readonly at: number;
  readonly holderKind: "lease" | "stream";
}

/** What a lock watcher yields: a change at its revision, or the end of the description/replay. */
export type LockWatchItem =
  | { readonly kind: "change"; readonly revision: bigint; readonly change: LockChange }
  | { readonly kind: "caught_up"; readonly revision: bigint; readonly reset: boolean };

/** A lock watcher: its items, and the revision up to which everything was delivered (for progress). */
export interface LockWatcher extends AsyncIterableIterator<LockWatchItem> {
  progressRevision(): bigint;
}

/** What a watch asks: one file (canonical) or all, the current state, a revision to resume after. */
export interface LockWatchRequest {
  readonly file: string | undefined;
  readonly includeCurrent: boolean;
  /** 0n: none. */
  readonly startRevision: bigint;
}

/** Source locks as the RPC layer uses them; see the module comment, and lock-table.ts and etcd/etcd-source-locks.ts for how each store keeps each promise. */
export interface SourceLocksApi {
  /** The limits enforced (defaults filled in). */
  readonly limits: Readonly<LockLimits>;
  acquire(request: AcquireRequest): Promise<Lease>;
  holdAsLongAs(request: HoldRequest): Promise<Lease>;
  /** not_found for a token never granted here, failed_precondition for one that ended. */
  renew(leaseToken: string, ttlMs?: number): MaybePromise<Lease>;
  /** False, changing nothing, for a token that does not hold a lock now. With `requestId`, a repeat answers the first call's answer. */
  release(leaseToken: string, requestId?: string): MaybePromise<boolean>;
  /** Calls `onEnd` once when the lease ends (at once when it holds nothing); returns the unsubscribe. */
  whenLeaseEnds(leaseToken: string, onEnd: (reason: LeaseEndReason) => void): () => void;
  inspect(file: string): MaybePromise<LockInspection>;
  checkToken(file: string, token: number | bigint): MaybePromise<TokenCheck>;
  /** The lock key of `file`: its canonical path; `field` names it in refusals. */
  resolveFile(file: unknown, field?: string): string;
  /**
   * Follows the locks (WatchLocks): the current state or a replay as asked, a caught-up marker,
   * then every change. Ends resource_exhausted WATCHER_LAGGED (details `lastRevision`) when its
   * reader falls behind, unavailable SHUTTING_DOWN when the service closes.
   */
  watch(request: LockWatchRequest): LockWatcher | Promise<LockWatcher>;
  /** How many changes the file store keeps to replay: lockWatchHistory of what a watcher may fall behind. */
  readonly watchHistory: number;
  /** Gauges. */
  stats(): LockTableStats;
  /** Ends waiters, releases every lease granted here. Idempotent. */
  close(): void | Promise<void>;
}
