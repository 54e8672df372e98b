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
 */
import { randomUUID } from "node:crypto";
import { systemClock, type Clock, type TimerHandle } from "@berth/shared/clock";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { checkRequestId } from "@berth/shared/safe-id";
import { checkFencingToken, checkOwner, checkTtl, checkWait, DEFAULT_LOCK_LIMITS, type LockLimits } from "../locks/lock-input.js";
import { canonicalLockPath } from "../locks/lock-path.js";
import type {
  AcquireRequest,
  HoldRequest,
  Lease,
  LockHolderInfo,
  LeaseEndReason,
  LockInspection,
  LockTableStats,
  TokenCheck,
  WaitingUpdate,
} from "../locks/lock-table.js";
import type { Logger } from "@berth/shared/logger";
import type { SourceLocksApi } from "../locks/source-locks-api.js";
import type { EtcdFence } from "./etcd-journal.js";
import type { EtcdLockGrant, EtcdLockParty, EtcdLocks } from "./etcd-locks.js";

/** The etcd lease TTL by default: how long after its instance stops renewing a lock frees. */
export const DEFAULT_ETCD_LEASE_TTL_SECONDS = 10;

export interface EtcdSourceLocksOptions {
  readonly locks: EtcdLocks;
  /** The TTL of each lock's etcd lease (seconds; etcd raises it to its minimum, 2 s by default). */
  readonly leaseTtlSeconds?: number;
  readonly clock?: Clock;
  readonly logger?: Logger;
  readonly limits?: Partial<LockLimits>;
}

/** Source locks on etcd, and the fences appends compare. */
export interface EtcdSourceLocks extends SourceLocksApi {
  /** The fence of `token` on `file` (any spelling) for an append's transaction; FENCE_REJECTED when it does not hold now. */
  fence(file: string, token: bigint): Promise<EtcdFence>;
  close(): Promise<void>;
}

type EndReason = "released" | "expired" | "lost" | "closed";

function asLeaseEnd(reason: EndReason): LeaseEndReason {
  return reason === "lost" ? "expired" : reason;
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

/** How many ended leases are remembered, to tell "ended" from "never existed" on a late renew. */
const ENDED_MEMORY = 1024;

export function createEtcdSourceLocks(options: EtcdSourceLocksOptions): EtcdSourceLocks {
  const { locks } = options;
  const clock = options.clock ?? systemClock;
  const logger = options.logger;
  const limits: Readonly<LockLimits> = Object.freeze({ ...DEFAULT_LOCK_LIMITS, ...options.limits });
  const ttlSeconds = options.leaseTtlSeconds ?? DEFAULT_ETCD_LEASE_TTL_SECONDS;
  const held = new Map<string, Granted>();
  const ended = new Map<string, { file: string; reason: EndReason; at: number }>();
  const requests = new Map<string, Promise<Lease>>();
  const waiting = new Set<AbortController>();
  let closed = false;

  const resolveFile = (file: unknown, field = "file") => canonicalLockPath(file, field);

  const shuttingDown = () =>
    new BerthError("unavailable", "the lock service is shutting down; ask again when it is back", {}, { reason: "SHUTTING_DOWN", retryAfterMs: 1_000 });

  function end(granted: Granted, reason: EndReason): void {
    if (granted.ended) return;
    granted.ended = true;
    if (granted.timer !== undefined) clock.clearTimeout(granted.timer);
    held.delete(granted.lease.leaseToken);
    ended.set(granted.lease.leaseToken, { file: granted.lease.file, reason, at: clock.now() });
    if (ended.size > ENDED_MEMORY) ended.delete(ended.keys().next().value!);
    if (granted.requestKey !== undefined) requests.delete(granted.requestKey);
    logger?.info({ file: granted.lease.file, owner: granted.lease.owner, fencingToken: granted.lease.fencingToken, reason }, "lock ended");
    // A lease etcd lost ended the way an expired one does, for whoever holds the lock through it.
    for (const onEnd of granted.onEnd) onEnd(asLeaseEnd(reason));
    granted.onEnd.clear();
  }

  /** Ends the lease and frees the lock in etcd: the next waiter's watch fires. */
  async function free(granted: Granted, reason: EndReason): Promise<void> {
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
        maxWaiters: limits.maxWaitersPerFile,
        signal,
        onWaiting: (update) => request.onWaiting?.({ position: update.position, holder: update.holder === null ? null : holderInfo(update.holder) }),
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

  function heldLease(leaseToken: string): Granted {
    const granted = held.get(leaseToken);
    if (granted !== undefined) return granted;
    const shown = `${leaseToken.slice(0, 8)}…`;
    const gone = ended.get(leaseToken);
    if (gone !== undefined) {
      const what =
        gone.reason === "expired"
          ? "expired"
          : gone.reason === "released"
            ? "was released"
            : gone.reason === "lost"
              ? "was lost in etcd"
              : "ended when the service shut down";
      throw new BerthError(
        "failed_precondition",
        `lease ${shown} on ${gone.file} ${what} at ${new Date(gone.at).toISOString()}; acquire the lock again (and renew sooner than the lease length)`,
        {
          file: gone.file,
          ended: gone.reason,
          endedAt: gone.at,
        },
      );
    }
    throw new BerthError(
      "not_found",
      `no lease ${shown} is held here: it never existed, ended long ago, or was granted by another berth instance (renew and release through the instance that granted it)`,
      {},
    );
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
      const requestKey = requestId === undefined ? undefined : `${resolveFile(request.file)}\0${owner}\0${requestId}`;
      if (requestKey !== undefined) {
        const known = requests.get(requestKey);
        if (known !== undefined) return known;
      }
      const granted = take({ file: request.file, owner, waitMs: request.waitMs, ttlMs, signal: request.signal, onWaiting: request.onWaiting, requestKey });
      if (requestKey !== undefined) {
        requests.set(requestKey, granted);
        granted.catch(() => requests.delete(requestKey));
      }
      return granted;
    },

    async holdAsLongAs(request: HoldRequest): Promise<Lease> {
      if (!(request.signal instanceof AbortSignal)) throw invalidArgument("signal", "a hold needs an AbortSignal that ends it");
      const owner = checkOwner(request.owner, limits);
      const lease = await take({
        file: request.file,
        owner,
        waitMs: request.waitMs,
        ttlMs: null,
        signal: request.signal,
        onWaiting: request.onWaiting,
        requestKey: undefined,
      });
      const granted = held.get(lease.leaseToken);
      if (granted !== undefined) {
        const onAbort = () => void free(granted, "released");
        if (request.signal.aborted) onAbort();
        else {
          request.signal.addEventListener("abort", onAbort, { once: true });
          granted.onEnd.add(() => request.signal.removeEventListener("abort", onAbort));
        }
      }
      return lease;
    },

    renew(leaseToken: string, ttlMs?: number): Lease {
      const granted = heldLease(leaseToken);
      if (granted.ttlMs === null) return { ...granted.lease };
      const ttl = ttlMs === undefined ? granted.ttlMs : checkTtl(ttlMs, limits);
      granted.ttlMs = ttl;
      granted.lease.ttlMs = ttl;
      granted.lease.expiresAt = clock.now() + ttl;
      schedule(granted);
      return { ...granted.lease };
    },

    async release(leaseToken: string): Promise<boolean> {
      const granted = held.get(leaseToken);
      if (granted === undefined) return false;
      await free(granted, "released");
      return true;
    },

    whenLeaseEnds(leaseToken: string, onEnd: (reason: LeaseEndReason) => void): () => void {
      const granted = held.get(leaseToken);
      if (granted === undefined) {
        onEnd(asLeaseEnd(ended.get(leaseToken)?.reason ?? "expired"));
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
        // etcd keeps no token of a lock nobody holds: the holder's, or none.
        lastFencingToken: found.holder === null ? null : Number(found.holder.token),
      };
    },

    async checkToken(file: string, token: number | bigint): Promise<TokenCheck> {
      const key = resolveFile(file);
      const value = checkFencingToken(token);
      const check = await locks.checkToken(key, BigInt(value));
      return { file: key, current: check.current, currentToken: check.currentToken === null ? null : Number(check.currentToken) };
    },

    fence(file: string, token: bigint): Promise<EtcdFence> {
      return locks.fence(resolveFile(file, "fence.file"), BigInt(checkFencingToken(token, "fence.fencing_token")));
    },

    stats(): LockTableStats {
      return { held: held.size, waiting: waiting.size, blockedByLockFiles: 0 };
    },

    async close(): Promise<void> {
      if (closed) return;
      closed = true;
      for (const stop of waiting) stop.abort();
      await Promise.allSettled([...held.values()].map((granted) => free(granted, "closed")));
    },
  };
}
