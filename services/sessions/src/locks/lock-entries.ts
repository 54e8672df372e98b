/**
 * What the lock table keeps of each file (lock-table.ts): its holder, the requests queued for it
 * and the calls waiting on each, and how a holder is shown.
 */
import type { KeyedRequest } from "@berth/shared/idempotency";
import type { Logger } from "@berth/shared/logger";
import type { BerthError } from "@berth/shared/errors";
import { wallTimeOf, wallTimesOf, type Clock, type TimerHandle } from "@berth/shared/clock";
import type { ExternalLockHandle, ForeignLockHolder } from "./external-locks.js";
import type { Lease, LeaseEndReason, LockChange, LockHolderInfo, LockWaiterInfo, WaitingUpdate } from "./source-locks-api.js";

/** One call waiting for a queued request: its own wait, its own signal, its own answer. */
export interface WaitingCall {
  waitMs: number;
  /** When it gives up (monotonic clock). */
  deadline: number;
  signal: AbortSignal | undefined;
  resolve(lease: Lease): void;
  reject(error: BerthError): void;
  timer?: TimerHandle;
  onAbort?: () => void;
}

/** A place in a file's queue, and the calls waiting on it: one, or several repeats of one request id. */
export interface Waiter {
  owner: string;
  /** null: a hold, tied to `holdSignal` instead of a lease timer. */
  ttlMs: number | null;
  holdSignal: AbortSignal | undefined;
  /** When it started waiting (monotonic clock; shown as wall time as of the answer). */
  startedAt: number;
  /** Never empty while the waiter is queued: the place goes when its last call does. */
  calls: Set<WaitingCall>;
  /** Its request id, and the request the id names, when it has one. */
  requestKey?: string;
  keyed?: KeyedRequest;
  onWaiting: ((update: WaitingUpdate) => void) | undefined;
  /** What `onWaiting` was last told, to call it only on a change. */
  toldPosition: number;
  toldHolder: string | undefined;
}

export interface Held {
  /** Its `expiresAt` is filled in when the lease is shown ({@link leaseOf}). */
  lease: Lease;
  /** The request id it was granted to: remembered while it lives, then for the idempotency window. */
  requestKey?: string;
  /** When the lease runs out (monotonic clock); null for a hold. */
  deadline: number | null;
  /** The lease length renewals default to; null for a hold. */
  ttlMs: number | null;
  /** The wall time `deadline` was last shown as, and the deadline it was for. */
  shown?: { deadline: number; expiresAt: number };
  timer?: TimerHandle;
  external?: ExternalLockHandle;
  holdSignal?: AbortSignal;
  onHoldAbort?: () => void;
  /** Told when the lease ends (see LockTable.whenLeaseEnds). */
  onEnd?: Set<(reason: LeaseEndReason) => void>;
}

export interface Entry {
  key: string;
  holder?: Held;
  /** FIFO: a Set iterates in insertion order and deletes in O(1). */
  waiters: Set<Waiter>;
  /** The outside holder that kept the first waiter from being granted, when there was one. */
  blockedBy?: ForeignLockHolder;
  /** Why the outside lock could not be taken at all the last time (a full disk, say), until it can. */
  claimError?: BerthError;
  blocked: boolean;
  unwatch?: () => void;
  /**
   * A hand-on is scheduled (LockTable.pump): until it runs, the queue's watch of the outside lock
   * and what its waiters were told stay as they are, since it may grant at once. Without this,
   * every handoff whose next request arrived in the same read started and stopped a file watch
   * and told each waiter twice.
   */
  handOnPending?: boolean;
  /** The waiters are to be told their place and holder at the next turn (LockTable.tellWaitersSoon). */
  tellPending?: boolean;
}

/** The number of requests queued before `waiter`. */
export function placeOf(entry: Entry, waiter: Waiter): number {
  let ahead = 0;
  for (const queued of entry.waiters) {
    if (queued === waiter) break;
    ahead++;
  }
  return ahead;
}

/** Takes one call off its queued request: its timer and its abort listener go with it. */
export function dropCall(clock: Clock, waiter: Waiter, call: WaitingCall): void {
  waiter.calls.delete(call);
  if (call.timer !== undefined) clock.clearTimeout(call.timer);
  delete call.timer;
  if (call.signal && call.onAbort) call.signal.removeEventListener("abort", call.onAbort);
}

/** The lease as shown to its holder: a copy, its end in wall-clock time as of now. */
export function leaseOf(clock: Clock, held: Held): Lease {
  if (held.deadline === null) return { ...held.lease, expiresAt: null };
  // One deadline is shown as one wall time: converted again a moment later it may land a
  // millisecond apart, and a retried Acquire must answer the very lease it answered first. A
  // renewal moves the deadline, and so converts afresh (after a step of the wall clock too).
  if (held.shown?.deadline !== held.deadline) held.shown = { deadline: held.deadline, expiresAt: wallTimeOf(clock, held.deadline) };
  return { ...held.lease, expiresAt: held.shown.expiresAt };
}

/** A lease held through berth, as Inspect and a waiter see its holder. */
export function berthHolder(clock: Clock, held: Held): Exclude<LockHolderInfo, { kind: "seed-file" }> {
  const lease = leaseOf(clock, held);
  const holder: Exclude<LockHolderInfo, { kind: "seed-file" }> = {
    kind: lease.ttlMs === null ? "stream" : "lease",
    owner: lease.owner,
    fencingToken: lease.fencingToken,
    since: lease.acquiredAt,
    expiresAt: lease.expiresAt,
  };
  if (held.external) holder.pid = held.external.pid;
  return holder;
}

/** A lock file held by another process, as Inspect and a waiter see its holder. */
export function seedFileHolder(foreign: ForeignLockHolder): LockHolderInfo {
  const holder: LockHolderInfo = { kind: "seed-file", since: foreign.since, lockFile: foreign.lockFile, readable: foreign.readable };
  if (foreign.owner !== undefined) holder.owner = foreign.owner;
  if (foreign.pid !== undefined) holder.pid = foreign.pid;
  return holder;
}

/** Calls `onWaiting` of every waiter whose position or holder changed since it was last told. */
export function tellWaiters(clock: Clock, entry: Entry, logger: Logger): void {
  let holder: LockHolderInfo | null | undefined;
  let holderId: string | undefined;
  let position = 0;
  for (const waiter of entry.waiters) {
    position++;
    if (!waiter.onWaiting) continue;
    if (holder === undefined) {
      holder = entry.holder ? berthHolder(clock, entry.holder) : entry.blockedBy ? seedFileHolder(entry.blockedBy) : null;
      holderId = entry.holder
        ? entry.holder.lease.leaseToken
        : entry.blockedBy
          ? `${entry.blockedBy.pid}:${entry.blockedBy.token}:${entry.blockedBy.since}`
          : undefined;
    }
    if (waiter.toldPosition === position && waiter.toldHolder === holderId) continue;
    waiter.toldPosition = position;
    waiter.toldHolder = holderId;
    try {
      waiter.onWaiting({ position, holder });
    } catch (error) {
      logger.error({ file: entry.key, err: error }, "onWaiting callback failed");
    }
  }
}

/** The waiters of `entry` in order, as Inspect shows them. */
export function waitersShown(clock: Clock, entry: Entry): LockWaiterInfo[] {
  const wallTime = wallTimesOf(clock);
  return [...entry.waiters].map((w): LockWaiterInfo => {
    // Both ends from one reading of the clocks: shown together, they are exactly the wait apart.
    const since = wallTime(w.startedAt);
    const deadline = since + Math.round(Math.max(...[...w.calls].map((c) => c.deadline)) - w.startedAt);
    return { kind: w.ttlMs === null ? "stream" : "lease", owner: w.owner, since, deadline };
  });
}

/** The change WatchLocks records when `held` ends. */
export function endChange(entry: Entry, held: Held, reason: LeaseEndReason): Omit<LockChange, "at"> {
  return {
    file: entry.key,
    kind: reason === "expired" ? "expired" : "released",
    owner: held.lease.owner,
    fencingToken: held.lease.fencingToken,
    expiresAt: held.shown?.expiresAt ?? null,
    position: 0,
    holderKind: held.ttlMs === null ? "stream" : "lease",
  };
}

/** Calls, once, whoever asked to hear when `held` ends; one that throws does not stop the rest. */
export function tellLeaseEnded(entry: Entry, held: Held, reason: LeaseEndReason, logger: Logger): void {
  const listeners = held.onEnd;
  delete held.onEnd;
  for (const onEnd of listeners ?? []) {
    try {
      onEnd(reason);
    } catch (error) {
      logger.error({ file: entry.key, err: error }, "lease-end callback failed");
    }
  }
}

/** How many requests wait, and at how many files a lock file blocks them, over `entries`. */
export function waitingCounts(entries: Iterable<Entry>): { waiting: number; blockedByLockFiles: number } {
  let waiting = 0;
  let blockedByLockFiles = 0;
  for (const entry of entries) {
    waiting += entry.waiters.size;
    if (entry.blocked && entry.waiters.size > 0) blockedByLockFiles++;
  }
  return { waiting, blockedByLockFiles };
}
