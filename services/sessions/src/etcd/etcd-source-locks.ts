/**
 * Source locks on etcd (`--store etcd`): the surface the LockService handlers call
 * (SourceLocksApi) over EtcdLocks, so that a lock held through one berth instance blocks Acquire
 * through every other instance on the cluster.
 *
 * What etcd decides: who holds a lock and who waits, in order (waiter keys under etcd leases,
 * FIFO by create revision), the fencing token (the holder key's create revision, rising across
 * the cluster), and, when an instance dies or is cut off, when its locks free (its etcd leases'
 * TTL, `--etcd-lease-ttl`). What the granting instance keeps: the berth lease of an Acquire (its
 * lease token, and its own TTL, renewed by KeepAlive: when it runs out the instance revokes the
 * etcd lease) and a Hold's tie to its stream (the stream ends, the instance revokes). A lease
 * token is known to the instance that granted it: KeepAlive and Release go through that instance.
 *
 * Request ids are the instance's too, as lease tokens are (the rule of @berth/shared/idempotency,
 * as the file store keeps it): a repeat through the instance that took the first call is answered
 * its answer, or joins its wait; a repeat through another instance is another request there, and
 * queues behind the first call's grant like anyone.
 */
import { randomUUID } from "node:crypto";
import { systemClock, type Clock, type TimerHandle } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { IdempotencyMemory } from "@berth/shared/idempotency";
import { checkRequestId } from "@berth/shared/safe-id";
import { checkFencingToken, checkOwner, checkTtl, checkWait, LOCK_RETRY_AFTER_MS, type LockLimits } from "../locks/lock-input.js";
import { formatDuration } from "@berth/shared/units";
import type { KeyedRequest } from "@berth/shared/idempotency";
import { canonicalLockPath } from "../locks/lock-path.js";
import { acquireRequest, grantedRequest, releaseRequest, type KeyedAnswer } from "../locks/lock-request-ids.js";
import {
  asLeaseEndReason,
  checkHoldSignal,
  checkLeaseToken,
  EndedLeases,
  lastFencingToken,
  lockLimits,
  renewedTtl,
  tokenCheck,
  type LeaseEnd,
} from "../locks/lease-rules.js";
import { callerWentAway, cancelledBeforeQueued } from "../locks/lock-refusals.js";
import type {
  AcquireRequest,
  HoldRequest,
  Lease,
  LockHolderInfo,
  LeaseEndReason,
  LockInspection,
  LockTableStats,
  SourceLocksApi,
  TokenCheck,
  WaitingUpdate,
} from "../locks/source-locks-api.js";
import type { Logger } from "@berth/shared/logger";
import { lockWatchHistory } from "../locks/lock-changes.js";
import { DEFAULT_MAX_BUFFERED } from "../watch-hub.js";
import { DEFAULT_ETCD_LEASE_TTL_SECONDS } from "./etcd-defaults.js";
import type { EtcdFence } from "./etcd-journal-api.js";
import type { EtcdLockParty } from "./etcd-lock-party.js";
import { waitExhausted, type EtcdLockGrant, type EtcdLocks } from "./etcd-locks.js";

export interface EtcdSourceLocksOptions {
  readonly locks: EtcdLocks;
  /** The TTL of each lock's etcd lease (seconds; etcd raises it to its minimum, 2 s by default). */
  readonly leaseTtlSeconds?: number;
  readonly clock?: Clock;
  readonly logger?: Logger;
  readonly limits?: Partial<LockLimits>;
  /** The most ended request ids remembered (default: the shared memory's, 100,000). */
  readonly maxEndedKeys?: number;
  /** How many changes a lock watcher may fall behind (`--watch-buffer`; default 1,000). */
  readonly watchBuffer?: number;
}

/** Source locks on etcd, and the fences appends compare. */
export interface EtcdSourceLocks extends SourceLocksApi {
  /** The fence of `token` on `file` (any spelling) for an append's transaction; FENCE_REJECTED when it does not hold now. */
  fence(file: string, token: bigint): Promise<EtcdFence>;
  close(): Promise<void>;
}

interface Granted {
  readonly lease: Lease;
  readonly grant: EtcdLockGrant;
  readonly requestKey: string | undefined;
  ttlMs: number | null;
  timer?: TimerHandle;
  readonly onEnd: Set<(reason: LeaseEndReason) => void>;
  ended: boolean;
}

/** One call waiting on a keyed Acquire: its own wait, its own signal, its own answer. */
interface JoinedCall {
  readonly resolve: (lease: Lease) => void;
  readonly reject: (error: unknown) => void;
  readonly onWaiting: ((update: WaitingUpdate) => void) | undefined;
  leave(): void;
}

/** A keyed Acquire still waiting in etcd, and the calls waiting on it (the first and its repeats). */
interface Joined {
  readonly calls: Set<JoinedCall>;
  /** Withdraws the etcd wait: the last call left. */
  readonly stop: AbortController;
  /** Where it stood when last told, for the refusal of a call whose own wait ran out. */
  place: { position: number; holder: EtcdLockParty } | undefined;
  /** Settles once the etcd wait ended and the request id was remembered (granted) or forgotten. */
  settled: Promise<void>;
}

export function createEtcdSourceLocks(options: EtcdSourceLocksOptions): EtcdSourceLocks {
  const { locks } = options;
  const clock = options.clock ?? systemClock;
  const logger = options.logger;
  const limits = lockLimits(options.limits);
  const ttlSeconds = options.leaseTtlSeconds ?? DEFAULT_ETCD_LEASE_TTL_SECONDS;
  const held = new Map<string, Granted>();
  const ended = new EndedLeases(
    "it never existed, ended long ago, or was granted by another berth instance (renew and release through the instance that granted it)",
  );
  const keys = new IdempotencyMemory<KeyedAnswer>({ clock, windowMs: limits.idempotencyWindowMs, maxEnded: options.maxEndedKeys });
  const joins = new Map<string, Joined>();
  const releasing = new Map<string, Promise<boolean>>();
  const waiting = new Set<AbortController>();
  let closed = false;
  const watchBuffer = options.watchBuffer ?? DEFAULT_MAX_BUFFERED;
  const watchers = new Set<ReturnType<EtcdLocks["watch"]>>();

  const resolveFile = (file: unknown, field = "file") => canonicalLockPath(file, field);

  const shuttingDown = () =>
    new BerthError("unavailable", "the lock service is shutting down; ask again when it is back", {}, { reason: "SHUTTING_DOWN", retryAfterMs: 1_000 });

  function end(granted: Granted, reason: LeaseEnd): void {
    if (granted.ended) return;
    granted.ended = true;
    if (granted.timer !== undefined) clock.clearTimeout(granted.timer);
    held.delete(granted.lease.leaseToken);
    ended.remember(granted.lease.leaseToken, { file: granted.lease.file, reason, at: clock.now() });
    if (granted.requestKey !== undefined) keys.end(granted.requestKey);
    logger?.info({ file: granted.lease.file, owner: granted.lease.owner, fencingToken: granted.lease.fencingToken, reason }, "lock ended");
    // A lease etcd lost ended the way an expired one does, for whoever holds the lock through it.
    for (const onEnd of granted.onEnd) onEnd(asLeaseEndReason(reason));
    granted.onEnd.clear();
  }

  /** Ends the lease and frees the lock in etcd: the next waiter's watch fires. */
  async function free(granted: Granted, reason: LeaseEnd): Promise<void> {
    end(granted, reason);
    await granted.grant
      .release()
      .catch((error: unknown) => logger?.warn({ file: granted.lease.file, err: error }, "lock not revoked in etcd: it frees when its etcd lease expires"));
  }

  function schedule(granted: Granted): void {
    if (granted.timer !== undefined) clock.clearTimeout(granted.timer);
    if (granted.ttlMs === null) return;
    granted.timer = clock.setTimeout(() => void free(granted, "expired"), granted.ttlMs);
  }

  async function take(request: {
    file: string;
    owner: string;
    waitMs: number | undefined;
    ttlMs: number | null;
    signal: AbortSignal | undefined;
    onWaiting: ((update: WaitingUpdate) => void) | undefined;
    requestKey: string | undefined;
    onPlace?: (place: { position: number; holder: EtcdLockParty }) => void;
    shownWaitMs?: number;
  }): Promise<Lease> {
    if (closed) throw shuttingDown();
    const file = resolveFile(request.file);
    const waitMs = checkWait(request.waitMs, limits);
    const stop = new AbortController();
    waiting.add(stop);
    const signal = request.signal === undefined ? stop.signal : AbortSignal.any([request.signal, stop.signal]);
    let grant: EtcdLockGrant;
    try {
      grant = await locks.acquire({
        file,
        owner: request.owner,
        kind: request.ttlMs === null ? "stream" : "lease",
        ttlSeconds,
        waitMs,
        ...(request.shownWaitMs === undefined ? {} : { shownWaitMs: request.shownWaitMs }),
        maxWaiters: limits.maxWaitersPerFile,
        signal,
        onWaiting: (update) => {
          if (update.holder !== null) request.onPlace?.({ position: update.position, holder: update.holder });
          request.onWaiting?.({ position: update.position, holder: update.holder === null ? null : holderInfo(update.holder) });
        },
      });
    } catch (error) {
      if (closed && stop.signal.aborted) throw shuttingDown();
      throw error;
    } finally {
      waiting.delete(stop);
    }
    const lease: Lease = {
      leaseToken: randomUUID(),
      fencingToken: Number(grant.token),
      file,
      owner: request.owner,
      acquiredAt: grant.acquiredAt,
      expiresAt: request.ttlMs === null ? null : clock.now() + request.ttlMs,
      ttlMs: request.ttlMs,
    };
    const granted: Granted = { lease, grant, requestKey: request.requestKey, ttlMs: request.ttlMs, onEnd: new Set(), ended: false };
    held.set(lease.leaseToken, granted);
    // Lost in etcd (expired there, revoked elsewhere, this instance cut off past its TTL): over here too.
    grant.signal.addEventListener("abort", () => end(granted, "lost"), { once: true });
    if (grant.signal.aborted) end(granted, "lost");
    schedule(granted);
    if (closed) await free(granted, "closed");
    logger?.info({ file, owner: request.owner, fencingToken: lease.fencingToken }, "lock granted");
    return { ...lease };
  }

  async function releaseHeld(leaseToken: string): Promise<boolean> {
    const granted = held.get(leaseToken);
    if (granted === undefined) return false;
    await free(granted, "released");
    return true;
  }

  /** Records `lease` as the answer of the request id `requestId`: every repeat gets it. Returns it. */
  function remember(requestId: string, keyed: KeyedRequest, lease: Lease): Lease {
    keys.answered(requestId, grantedRequest(keyed, lease), { lease: { ...lease } });
    // Ended already (lost in etcd between the grant and here): remembered for the window from now.
    const granted = held.get(lease.leaseToken);
    if (granted === undefined || granted.ended) keys.end(requestId);
    return lease;
  }

  /**
   * The etcd wait of a keyed Acquire, shared by the calls that carry its id: it waits as long as the
   * longest wait a call may ask (each call gives up on its own), and is withdrawn when the last call
   * leaves. Granted after every call left, its lease is kept for a repeat (it ends at its ttl unless
   * renewed), as a lease whose call ended as it was granted is.
   */
  function startJoined(requestId: string, keyed: KeyedRequest, file: string, owner: string, ttlMs: number, firstWaitMs: number): Joined {
    const joined: Joined = { calls: new Set(), stop: new AbortController(), place: undefined, settled: Promise.resolve() };
    joins.set(requestId, joined);
    keys.begin(requestId, keyed);
    const settle = () => {
      if (joins.get(requestId) === joined) joins.delete(requestId);
      const calls = [...joined.calls];
      for (const call of calls) call.leave();
      return calls;
    };
    joined.settled = take({
      file,
      owner,
      waitMs: limits.maxWaitMs,
      shownWaitMs: firstWaitMs,
      ttlMs,
      signal: joined.stop.signal,
      onWaiting: (update) => {
        for (const call of joined.calls) call.onWaiting?.(update);
      },
      onPlace: (place) => (joined.place = place),
      requestKey: requestId,
    }).then(
      (lease) => {
        remember(requestId, keyed, lease);
        for (const call of settle()) call.resolve({ ...lease });
      },
      (error: unknown) => {
        keys.forget(requestId);
        for (const call of settle()) call.reject(error);
      },
    );
    return joined;
  }

  /** One more call on `joined`: it leaves on its own signal, or when its own wait runs out. */
  function joinCall(
    joined: Joined,
    file: string,
    waitMs: number,
    signal: AbortSignal | undefined,
    onWaiting: ((update: WaitingUpdate) => void) | undefined,
  ): Promise<Lease> {
    return new Promise<Lease>((resolve, reject) => {
      let timer: TimerHandle | undefined;
      const giveUp = (error: unknown) => {
        call.leave();
        if (joined.calls.size > 0) {
          reject(error);
          return;
        }
        joined.stop.abort("cancelled");
        // The last call is answered once the request has left etcd and its id is forgotten (or
        // remembered, granted as it left): a retry made on this answer is then a new request,
        // not a repeat of one still leaving (refused IDEMPOTENCY_KEY_REUSED for other fields, or
        // joined to a wait being withdrawn).
        void joined.settled.then(() => reject(error));
      };
      const onAbort = () => giveUp(callerWentAway(file));
      const call: JoinedCall = {
        resolve,
        reject,
        onWaiting,
        leave() {
          joined.calls.delete(call);
          if (timer !== undefined) clock.clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
        },
      };
      joined.calls.add(call);
      timer = clock.setTimeout(() => giveUp(joinedWaitExhausted(file, joined, waitMs)), waitMs);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** The refusal of a call on `joined` whose own wait of `waitMs` ran out: where the request stood, and who held the lock. */
  function joinedWaitExhausted(file: string, joined: Joined, waitMs: number): BerthError {
    if (joined.place !== undefined) return waitExhausted(file, joined.place.holder, waitMs, joined.place.position);
    const waited = waitMs === 0 ? "it was not free (max_wait was 0: try once)" : `it was not granted within the wait of ${formatDuration(waitMs)}`;
    return new BerthError(
      "resource_exhausted",
      `source locked: ${file} was not free: the request was still being queued; ${waited}; wait longer`,
      { file, lockPath: null, waitedMs: waitMs, waiting: 0, owner: "", acquireTime: null, fencingToken: 0, kind: "unknown" },
      { reason: "WAIT_EXHAUSTED", retryAfterMs: LOCK_RETRY_AFTER_MS },
    );
  }

  function heldLease(leaseToken: string): Granted {
    const token = checkLeaseToken(leaseToken);
    const granted = held.get(token);
    if (granted !== undefined) return granted;
    throw ended.notHeld(token);
  }

  function holderInfo(party: EtcdLockParty): LockHolderInfo {
    const local = [...held.values()].find((g) => g.grant.key === party.key);
    return {
      kind: party.kind,
      owner: party.owner,
      fencingToken: Number(party.token),
      // Granted here: since the grant; elsewhere, since its request (the waiter key records no more).
      since: local?.lease.acquiredAt ?? party.since,
      expiresAt: local?.lease.expiresAt ?? null,
      ...(party.pid > 0 ? { pid: party.pid } : {}),
    };
  }

  return {
    limits,
    resolveFile,

    async acquire(request: AcquireRequest): Promise<Lease> {
      const ttlMs = checkTtl(request.ttlMs, limits);
      const requestId = checkRequestId(request.requestId);
      const owner = checkOwner(request.owner, limits);
      if (requestId === undefined) {
        return take({ file: request.file, owner, waitMs: request.waitMs, ttlMs, signal: request.signal, onWaiting: request.onWaiting, requestKey: undefined });
      }
      const file = resolveFile(request.file);
      const waitMs = checkWait(request.waitMs, limits);
      const keyed = acquireRequest(file, owner, ttlMs);
      const known = keys.recall(requestId, keyed);
      // Answered: the first answer, whether the lease lives or ended since.
      if (known !== undefined && known.phase !== "pending" && "lease" in known.answer) return { ...known.answer.lease };
      if (request.signal?.aborted) throw cancelledBeforeQueued(file);
      let joined = joins.get(requestId);
      if (joined === undefined && waitMs === 0) {
        // Tried once, alone: nothing to join, nothing kept unless granted.
        const lease = await take({ file, owner, waitMs: 0, ttlMs, signal: request.signal, onWaiting: request.onWaiting, requestKey: requestId });
        return remember(requestId, keyed, lease);
      }
      if (joined === undefined) joined = startJoined(requestId, keyed, file, owner, ttlMs, waitMs);
      else if (waitMs === 0) {
        // A repeat that will not wait answers at once, and leaves the first call's place alone.
        throw joinedWaitExhausted(file, joined, 0);
      } else logger?.debug({ file, owner, requestId }, "lock request joined by a repeat");
      return joinCall(joined, file, waitMs, request.signal, request.onWaiting);
    },

    async holdAsLongAs(request: HoldRequest): Promise<Lease> {
      const signal = checkHoldSignal(request.signal);
      const owner = checkOwner(request.owner, limits);
      const lease = await take({
        file: request.file,
        owner,
        waitMs: request.waitMs,
        ttlMs: null,
        signal,
        onWaiting: request.onWaiting,
        requestKey: undefined,
      });
      const granted = held.get(lease.leaseToken);
      if (granted !== undefined) {
        const onAbort = () => void free(granted, "released");
        if (signal.aborted) onAbort();
        else {
          signal.addEventListener("abort", onAbort, { once: true });
          granted.onEnd.add(() => signal.removeEventListener("abort", onAbort));
        }
      }
      return lease;
    },

    renew(leaseToken: string, ttlMs?: number): Lease {
      const granted = heldLease(leaseToken);
      const ttl = renewedTtl(granted.ttlMs, ttlMs, limits);
      if (ttl === null) return { ...granted.lease };
      granted.ttlMs = ttl;
      granted.lease.ttlMs = ttl;
      granted.lease.expiresAt = clock.now() + ttl;
      schedule(granted);
      return { ...granted.lease };
    },

    async release(token: string, requestId?: string): Promise<boolean> {
      const leaseToken = checkLeaseToken(token);
      const id = checkRequestId(requestId);
      if (id === undefined) return releaseHeld(leaseToken);
      const granted = held.get(leaseToken);
      const gone = ended.get(leaseToken);
      const keyed = releaseRequest(
        leaseToken,
        granted ? { file: granted.lease.file, fencingToken: granted.lease.fencingToken } : gone ? { file: gone.file } : {},
      );
      const known = keys.recall(id, keyed);
      if (known !== undefined && known.phase !== "pending" && "released" in known.answer) return known.answer.released;
      const inFlight = releasing.get(id);
      if (inFlight !== undefined) return inFlight;
      keys.begin(id, keyed);
      const releasingNow = releaseHeld(leaseToken);
      releasing.set(id, releasingNow);
      try {
        const released = await releasingNow;
        keys.answered(id, keyed, { released }, { ended: true });
        return released;
      } catch (error) {
        keys.forget(id);
        throw error;
      } finally {
        releasing.delete(id);
      }
    },

    whenLeaseEnds(leaseToken: string, onEnd: (reason: LeaseEndReason) => void): () => void {
      const granted = held.get(leaseToken);
      if (granted === undefined) {
        onEnd(ended.reasonOf(leaseToken));
        return () => {};
      }
      granted.onEnd.add(onEnd);
      return () => void granted.onEnd.delete(onEnd);
    },

    async inspect(file: string): Promise<LockInspection> {
      const key = resolveFile(file);
      const found = await locks.inspect(key);
      const holder = found.holder === null ? null : holderInfo(found.holder);
      return {
        file: key,
        lockPath: null,
        holder,
        waiters: found.waiters.map((w) => ({ kind: w.kind, owner: w.owner, since: w.since, deadline: w.until })),
        lastFencingToken: lastFencingToken(found.lastToken === null ? null : Number(found.lastToken), holder),
      };
    },

    async checkToken(file: string, token: number | bigint): Promise<TokenCheck> {
      const key = resolveFile(file);
      const value = checkFencingToken(token);
      const check = await locks.checkToken(key, BigInt(value));
      return tokenCheck(key, value, check.currentToken === null ? null : Number(check.currentToken));
    },

    fence(file: string, token: bigint): Promise<EtcdFence> {
      return locks.fence(resolveFile(file, "fence.file"), BigInt(checkFencingToken(token, "fence.fencing_token")));
    },

    watchHistory: lockWatchHistory(watchBuffer),
    watch(request) {
      if (closed) throw shuttingDown();
      const watcher = locks.watch(request, watchBuffer);
      watchers.add(watcher);
      const ended = watcher.return.bind(watcher);
      watcher.return = () => {
        watchers.delete(watcher);
        return ended();
      };
      return watcher;
    },

    stats(): LockTableStats {
      return { held: held.size, waiting: waiting.size, blockedByLockFiles: 0 };
    },

    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      for (const watcher of watchers) watcher.fail(shuttingDown());
      for (const stop of waiting) stop.abort();
      await Promise.allSettled([...held.values()].map((granted) => free(granted, "closed")));
    },
  };
}
