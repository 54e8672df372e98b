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
import type { LockWatcher, LockWatchRequest } from "./lock-changes.js";
import type { AcquireRequest, HoldRequest, Lease, LeaseEndReason, LockInspection, LockTableStats, TokenCheck } from "./lock-table.js";

/** Source locks as the RPC layer uses them; see the module comment and lock-table.ts for each promise. */
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
