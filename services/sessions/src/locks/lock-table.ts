/**
 * The lock table: which file is held by whom, who waits for it in what order, and the leases that
 * free a lock when its holder stops renewing.
 *
 * Everything happens in reaction to an event — a release, a lease timer, a waiter's deadline or
 * signal, a change of a seed lock file — never by polling: a released lock is handed to the first
 * waiter in the same turn of the event loop. The only timers are one per lease and one per
 * waiter, on the injected Clock, so tests drive time with `ManualClock.advance()`. Leases and waits
 * are measured on the clock's monotonic reading: a step of the wall clock neither keeps a dead
 * holder's lease nor cuts a live one short. The wall clock only stamps what people read (when a
 * lock was taken); a lease's or a wait's end is shown as wall time at the moment of answering.
 *
 * Locks are keyed by the canonical path of the file (see lock-path.ts), so every spelling of one
 * file is one lock. When the table is given `external` locks (the seed's lock files), a grant also
 * takes the file's lock file, and a lock file held by another process blocks the queue until it
 * goes away.
 */
import { randomUUID } from "node:crypto";
import { BerthError } from "@berth/shared/errors";
import { IdempotencyMemory, type IdempotencyStats, type KeyedRequest } from "@berth/shared/idempotency";
import { silentLogger, type Logger } from "@berth/shared/logger";
import { checkRequestId } from "@berth/shared/safe-id";
import type { Clock } from "@berth/shared/clock";
import type { FencingTokenSource } from "./lock-persistence.js";
import { checkFencingToken, checkOwner, checkTtl, checkWait, tooManyWaiters, type LockLimits } from "./lock-input.js";
import { canonicalLockPath } from "./lock-path.js";
import type { ExternalLockHandle, ExternalLocks, ForeignLockHolder } from "./external-locks.js";
import type { LockChangeLog } from "./lock-changes.js";
import { checkHoldSignal, checkLeaseToken, EndedLeases, lastFencingToken, lockLimits, renewedTtl, tokenCheck } from "./lease-rules.js";
import { expireOverdue, isDue, scheduleExpiry, type ExpiryHost } from "./lease-expiry.js";
import {
  berthHolder,
  dropCall,
  endChange,
  leaseOf,
  placeOf,
  seedFileHolder,
  tellLeaseEnded,
  tellWaiters,
  waitersShown,
  waitingCounts,
} from "./lock-entries.js";
import type { Entry, Held, Waiter, WaitingCall } from "./lock-entries.js";
import { callerWentAway, cancelledBeforeQueued, heldByBerth, heldByLockFile, heldByNobodyKnown } from "./lock-refusals.js";
import { acquireRequest, grantedRequest, releaseRequest, type KeyedAnswer } from "./lock-request-ids.js";
import { claimLockFile } from "./seed-file-claims.js";
import type {
  AcquireRequest,
  HoldRequest,
  Lease,
  LeaseEndReason,
  LockChange,
  LockHolderInfo,
  LockInspection,
  LockTableStats,
  TokenCheck,
} from "./source-locks-api.js";

/** What the table is built from. */
export interface LockTableOptions {
  clock: Clock;
  fencing: FencingTokenSource;
  /** The seed's lock files; absent, berth's table is the only lock. */
  external?: ExternalLocks;
  logger?: Logger;
  limits?: Partial<LockLimits>;
  /** The most ended request ids remembered (default: the shared memory's, 100,000). */
  maxEndedKeys?: number;
  /** Where the table records each change of a holder or a waiter (WatchLocks); absent, none. */
  changes?: LockChangeLog;
}

/** The in-memory lock table. See the module comment. */
export class LockTable {
  private readonly clock: Clock;
  private readonly fencing: FencingTokenSource;
  private readonly external: ExternalLocks | undefined;
  private readonly logger: Logger;
  /** The limits this table enforces (defaults filled in). */
  readonly limits: Readonly<LockLimits>;
  private readonly entries = new Map<string, Entry>();
  private readonly leases = new Map<string, Held>();
  private readonly lastTokens = new Map<string, number>();
  private readonly ended = new EndedLeases("it never existed, or ended long ago or before a restart; acquire the lock again");
  /** Every request id: the request it names and its first answer (see @berth/shared/idempotency). */
  private readonly keys: IdempotencyMemory<KeyedAnswer>;
  private readonly changes: LockChangeLog | undefined;
  /** The places of the request ids whose call still waits. */
  private readonly waitingByKey = new Map<string, Waiter>();
  private closed = false;
  private readonly expiry: ExpiryHost;

  constructor(options: LockTableOptions) {
    this.clock = options.clock;
    this.fencing = options.fencing;
    this.external = options.external;
    this.logger = options.logger ?? silentLogger;
    this.limits = lockLimits(options.limits);
    this.keys = new IdempotencyMemory({ clock: this.clock, windowMs: this.limits.idempotencyWindowMs, maxEnded: options.maxEndedKeys });
    this.changes = options.changes;
    this.expiry = {
      clock: this.clock,
      leases: () => this.leases.values(),
      entryHeldBy: (held) => {
        const entry = this.entries.get(held.lease.file);
        return entry?.holder === held ? entry : undefined;
      },
      expire: (entry, held) => this.free(entry, held, "expired"),
      pump: (entry) => this.pump(entry),
    };
  }

  private record(change: Omit<LockChange, "at">): void {
    this.changes?.record(change);
  }

  private recordWaiter(entry: Entry, waiter: Waiter, kind: "waiter_joined" | "waiter_left", position: number): void {
    this.record({
      file: entry.key,
      kind,
      owner: waiter.owner,
      fencingToken: 0,
      expiresAt: null,
      position,
      holderKind: waiter.ttlMs === null ? "stream" : "lease",
    });
  }

  /** The lock key of `file`: its canonical path (see lock-path.ts); `field` names it in refusals. */
  resolveFile(file: unknown, field = "file"): string {
    return canonicalLockPath(file, field);
  }

  /**
   * Takes the lock of `request.file`, waiting up to `waitMs` behind earlier requests. Rejects with
   * `resource_exhausted` WAIT_EXHAUSTED (details: the holder's owner, acquire time, fencing token
   * or pid, as LockHeld) when the wait runs out, TOO_MANY_WAITERS when the file's queue is full,
   * `cancelled` when `signal` aborts first, `invalid_argument` on bad input. A repeat of a
   * `requestId` answers the first request's lease, the id for another request is already_exists
   * IDEMPOTENCY_KEY_REUSED (see {@link AcquireRequest.requestId}).
   */
  async acquire(request: AcquireRequest): Promise<Lease> {
    const ttlMs = checkTtl(request.ttlMs, this.limits);
    const requestId = checkRequestId(request.requestId);
    return this.enter(request, ttlMs, undefined, requestId);
  }

  /**
   * Takes the lock and holds it while `request.signal` is not aborted: no lease timer, released the
   * moment the signal aborts (the Hold RPC passes the stream's signal). The lease's `expiresAt` is null.
   */
  async holdAsLongAs(request: HoldRequest): Promise<Lease> {
    return this.enter(request, null, checkHoldSignal(request.signal), undefined);
  }

  /**
   * Extends a lease to `ttlMs` from now (default: its own length). Throws `not_found` for a token
   * this service never granted (or forgot), `failed_precondition` for one that expired or was released.
   */
  renew(leaseToken: string, ttlMs?: number): Lease {
    const held = this.heldLease(leaseToken);
    const ttl = renewedTtl(held.ttlMs, ttlMs, this.limits);
    if (ttl === null) return leaseOf(this.clock, held);
    held.ttlMs = ttl;
    held.lease.ttlMs = ttl;
    held.deadline = this.clock.monotonicNow() + ttl;
    scheduleExpiry(this.expiry, held);
    return leaseOf(this.clock, held);
  }

  /**
   * Releases the lease `leaseToken` and hands the lock to the next waiter. Returns false, changing
   * nothing, for a token that does not hold a lock now (already released, expired, or never granted):
   * a stale or repeated release never frees a newer holder's lock. With `requestId`, a repeat answers
   * what the first call answered (for the idempotency window), and the id for another lease is
   * already_exists IDEMPOTENCY_KEY_REUSED.
   */
  release(leaseToken: string, requestId?: string): boolean {
    const token = checkLeaseToken(leaseToken);
    const id = checkRequestId(requestId);
    if (id === undefined) return this.releaseHeld(token);
    const held = this.leases.get(token);
    const ended = this.ended.get(token);
    const keyed = releaseRequest(token, held ? { file: held.lease.file, fencingToken: held.lease.fencingToken } : ended ? { file: ended.file } : {});
    const known = this.keys.recall(id, keyed);
    if (known !== undefined && known.phase !== "pending") return "released" in known.answer && known.answer.released;
    const released = this.releaseHeld(token);
    this.keys.answered(id, keyed, { released }, { ended: true });
    return released;
  }

  private releaseHeld(token: string): boolean {
    const held = this.leases.get(token);
    if (!held) return false;
    const entry = this.entries.get(held.lease.file);
    if (!entry || entry.holder !== held) return false;
    this.free(entry, held, "released");
    this.pump(entry);
    return true;
  }

  /**
   * Calls `onEnd` once when the lease `leaseToken` ends, however it ends (released, expired, its
   * hold's signal aborted, the table closed), with how; at once when it does not hold a lock now
   * (how it ended; "expired" when that is no longer remembered). Returns the unsubscribe. A Hold
   * stream uses it to end the moment its lease is released through Release.
   */
  whenLeaseEnds(leaseToken: string, onEnd: (reason: LeaseEndReason) => void): () => void {
    const held = this.leases.get(leaseToken);
    if (!held) {
      onEnd(this.ended.reasonOf(leaseToken));
      return () => {};
    }
    (held.onEnd ??= new Set()).add(onEnd);
    return () => void held.onEnd?.delete(onEnd);
  }

  /** The holder, the waiters in order and the last fencing token of `file`. */
  inspect(file: string): LockInspection {
    const key = this.resolveFile(file);
    const entry = this.refresh(key);
    let holder: LockHolderInfo | null = null;
    if (entry?.holder) {
      holder = berthHolder(this.clock, entry.holder);
    } else {
      const foreign = this.external?.peek(key);
      if (foreign) holder = seedFileHolder(foreign);
    }
    const waiters = entry ? waitersShown(this.clock, entry) : [];
    return {
      file: key,
      lockPath: this.external?.pathFor(key) ?? null,
      holder,
      waiters,
      lastFencingToken: lastFencingToken(this.lastTokens.get(key) ?? null, holder),
    };
  }

  /** Every lock held or waited for here (of `file` alone, when given), as Inspect shows each. */
  inspectAll(file?: string): LockInspection[] {
    const keys = file === undefined ? [...this.entries.keys()] : this.entries.has(file) ? [file] : [];
    return keys.map((key) => this.inspect(key)).filter((lock) => lock.holder !== null || lock.waiters.length > 0);
  }

  /** Whether `token` is the fencing token of the lease that holds `file` now. */
  checkToken(file: string, token: number | bigint): TokenCheck {
    const key = this.resolveFile(file);
    const value = checkFencingToken(token);
    const entry = this.refresh(key);
    return tokenCheck(key, value, entry?.holder?.lease.fencingToken ?? null);
  }

  /** Counts for metrics. */
  stats(): LockTableStats {
    return { held: this.leases.size, ...waitingCounts(this.entries.values()) };
  }

  /** How many request ids are remembered (live, and ended within the window). */
  keyStats(): IdempotencyStats {
    return this.keys.stats();
  }

  /**
   * Ends everything: waiters are rejected with `unavailable`, leases released (their lock files
   * removed), watches stopped. Later calls are refused with `unavailable`. Idempotent.
   */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const entry of this.entries.values()) {
      for (const waiter of [...entry.waiters]) {
        const calls = [...waiter.calls];
        this.dropWaiter(entry, waiter);
        for (const call of calls)
          call.reject(new BerthError("unavailable", `lock service is shutting down; ${entry.key} was not granted`, { file: entry.key }));
      }
      if (entry.holder) this.free(entry, entry.holder, "closed");
      entry.unwatch?.();
      delete entry.unwatch;
    }
    this.entries.clear();
  }

  private enter(
    request: AcquireRequest | HoldRequest,
    ttlMs: number | null,
    holdSignal: AbortSignal | undefined,
    requestId: string | undefined,
  ): Promise<Lease> {
    if (this.closed) throw new BerthError("unavailable", "lock service is shutting down");
    const key = this.resolveFile(request.file);
    const owner = checkOwner(request.owner, this.limits);
    const waitMs = checkWait(request.waitMs, this.limits);
    const signal = request.signal;
    if (signal?.aborted) throw cancelledBeforeQueued(key);

    this.refresh(key);
    const keyed = requestId === undefined || ttlMs === null ? undefined : acquireRequest(key, owner, ttlMs);
    const known = keyed === undefined ? undefined : this.keys.recall(requestId!, keyed);
    // Answered: the first answer, whether the lease lives or ended since.
    if (known !== undefined && known.phase !== "pending" && "lease" in known.answer) return Promise.resolve({ ...known.answer.lease });
    const entry = this.entryFor(key);
    const joined = known?.phase === "pending" ? this.waitingByKey.get(requestId!) : undefined;
    if (joined !== undefined) {
      // A repeat of a request that still waits: its own wait, the first one's place.
      if (waitMs === 0) throw this.lockedError(entry, 0, placeOf(entry, joined));
      this.logger.debug({ file: key, owner, requestId }, "lock request joined by a repeat");
      return new Promise<Lease>((resolve, reject) => this.addCall(entry, joined, { waitMs, signal, resolve, reject }));
    }

    // FIFO: a free lock goes to the newcomer only when nobody queued before it.
    if (!entry.holder && entry.waiters.size === 0) {
      const now = this.clock.now();
      const claim = this.claimExternal(entry, owner, now, true);
      if (claim) {
        try {
          const held = this.grant(entry, owner, ttlMs, claim === true ? undefined : claim, holdSignal);
          return Promise.resolve(keyed === undefined ? leaseOf(this.clock, held) : this.remember(requestId!, keyed, held));
        } finally {
          this.settle(entry);
        }
      }
    }
    if (waitMs === 0) {
      const error = this.lockedError(entry, 0, entry.waiters.size);
      this.settle(entry);
      throw error;
    }
    if (entry.waiters.size >= this.limits.maxWaitersPerFile) throw tooManyWaiters(key, entry.waiters.size, this.limits.maxWaitersPerFile);

    return new Promise<Lease>((resolve, reject) => {
      const startedAt = this.clock.monotonicNow();
      const waiter: Waiter = { owner, ttlMs, holdSignal, startedAt, calls: new Set(), onWaiting: request.onWaiting, toldPosition: 0, toldHolder: undefined };
      if (keyed !== undefined) {
        waiter.requestKey = requestId!;
        waiter.keyed = keyed;
        this.waitingByKey.set(requestId!, waiter);
        this.keys.begin(requestId!, keyed);
      }
      entry.waiters.add(waiter);
      this.recordWaiter(entry, waiter, "waiter_joined", entry.waiters.size);
      this.addCall(entry, waiter, { waitMs, signal, resolve, reject }, startedAt);
      this.settle(entry);
    });
  }

  /** Adds a call to a queued request: it gives up on its own deadline or signal; the place goes with the last call. */
  private addCall(entry: Entry, waiter: Waiter, request: Pick<WaitingCall, "waitMs" | "signal" | "resolve" | "reject">, now = this.clock.monotonicNow()): void {
    const call: WaitingCall = { ...request, deadline: now + request.waitMs };
    waiter.calls.add(call);
    this.scheduleDeadline(entry, waiter, call);
    const signal = call.signal;
    if (signal) {
      call.onAbort = () => {
        if (!waiter.calls.has(call)) return;
        dropCall(this.clock, waiter, call);
        call.reject(callerWentAway(entry.key));
        if (waiter.calls.size > 0) return;
        this.dropWaiter(entry, waiter);
        this.pump(entry);
      };
      signal.addEventListener("abort", call.onAbort, { once: true });
    }
  }

  /**
   * Notes that the request id `requestKey` was granted `held`: its answer, the lease as shown now, is
   * what every repeat gets, while the lease lives and for the window after it ends. Returns it.
   */
  private remember(requestKey: string, keyed: KeyedRequest, held: Held): Lease {
    held.requestKey = requestKey;
    const lease = leaseOf(this.clock, held);
    this.keys.answered(requestKey, grantedRequest(keyed, lease), { lease: { ...lease } });
    return lease;
  }

  /**
   * Takes the lock file for a grant (see seed-file-claims.ts). When it cannot be taken at all, a
   * direct request (`failLoudly`) is refused saying why; for the queue it counts as busy, and the
   * re-check tries again.
   */
  private claimExternal(entry: Entry, owner: string, at: number, failLoudly = false): ExternalLockHandle | true | undefined {
    const claim = claimLockFile(this.external, entry, owner, at, this.logger);
    if (claim === undefined && failLoudly && entry.claimError !== undefined) {
      const refusal = entry.claimError;
      this.settle(entry);
      throw refusal;
    }
    return claim;
  }

  private grant(entry: Entry, owner: string, ttlMs: number | null, external: ExternalLockHandle | undefined, holdSignal: AbortSignal | undefined): Held {
    let fencingToken: number;
    try {
      fencingToken = this.fencing.next();
    } catch (error) {
      if (external) this.external?.release(external);
      throw error;
    }
    const lease: Lease = { leaseToken: randomUUID(), fencingToken, file: entry.key, owner, acquiredAt: this.clock.now(), expiresAt: null, ttlMs };
    const held: Held = { lease, deadline: ttlMs === null ? null : this.clock.monotonicNow() + ttlMs, ttlMs };
    if (external) held.external = external;
    entry.holder = held;
    this.leases.set(lease.leaseToken, held);
    this.lastTokens.set(entry.key, fencingToken);
    if (ttlMs !== null) scheduleExpiry(this.expiry, held);
    if (holdSignal) {
      held.holdSignal = holdSignal;
      held.onHoldAbort = () => this.release(lease.leaseToken);
      holdSignal.addEventListener("abort", held.onHoldAbort, { once: true });
    }
    this.logger.debug({ file: entry.key, owner, fencingToken }, "lock granted");
    this.record({
      file: entry.key,
      kind: "granted",
      owner,
      fencingToken,
      expiresAt: leaseOf(this.clock, held).expiresAt,
      position: 0,
      holderKind: ttlMs === null ? "stream" : "lease",
    });
    return held;
  }

  /**
   * Hands the lock to waiters in order for as long as it is free — once the clock is awake: right
   * after a pause (the service was stopped) the I/O that piled up is read first, so that a waiter
   * whose client left during the pause is dropped before its turn comes.
   */
  private pump(entry: Entry): void {
    if (this.entries.get(entry.key) !== entry) return;
    this.expireIfDue(entry);
    if (entry.handOnPending) return;
    entry.handOnPending = true;
    this.clock.whenAwake(() => {
      entry.handOnPending = false;
      this.handOn(entry);
    });
  }

  private handOn(entry: Entry): void {
    if (this.closed || this.entries.get(entry.key) !== entry) return;
    this.expireIfDue(entry);
    while (!entry.holder) {
      const firstWaiter = entry.waiters.values().next().value;
      if (!firstWaiter) break;
      const claim = this.claimExternal(entry, firstWaiter.owner, this.clock.now());
      if (!claim) break;
      const calls = [...firstWaiter.calls];
      this.dropWaiter(entry, firstWaiter, true);
      let held: Held;
      try {
        held = this.grant(entry, firstWaiter.owner, firstWaiter.ttlMs, claim === true ? undefined : claim, firstWaiter.holdSignal);
      } catch (error) {
        const refusal =
          error instanceof BerthError ? error : new BerthError("internal", `granting ${entry.key} failed: ${(error as Error).message}`, { file: entry.key });
        this.recordWaiter(entry, firstWaiter, "waiter_left", 1);
        for (const call of calls) call.reject(refusal);
        continue;
      }
      const lease =
        firstWaiter.requestKey !== undefined && firstWaiter.keyed !== undefined
          ? this.remember(firstWaiter.requestKey, firstWaiter.keyed, held)
          : leaseOf(this.clock, held);
      for (const call of calls) call.resolve({ ...lease });
    }
    this.settle(entry);
  }

  /** Starts or stops watching the outside lock, tells the waiters, and forgets an idle entry. */
  private settle(entry: Entry): void {
    const idle = !entry.holder && entry.waiters.size === 0;
    if (idle && this.entries.get(entry.key) === entry) this.entries.delete(entry.key);
    // The hand-on settles a queue when it runs (an idle entry it skips: its watch stops here).
    if (entry.handOnPending && !idle) return;
    const needsWatch = this.external !== undefined && !entry.holder && entry.waiters.size > 0;
    if (needsWatch && !entry.unwatch) {
      entry.unwatch = this.external!.watch(entry.key, () => this.pump(entry));
    } else if (!needsWatch && entry.unwatch) {
      entry.unwatch();
      delete entry.unwatch;
    }
    this.tellWaitersSoon(entry);
  }

  /**
   * Tells the waiters their place and holder a turn later (`whenAwake`), once per turn however
   * often the queue moved. A hand-on's grant is then written before the waiters' updates, so the
   * next holder's answer is not queued behind one message per waiter on the service and on clients
   * that share a process; and a waiter that left meanwhile is not told.
   */
  private tellWaitersSoon(entry: Entry): void {
    if (entry.tellPending) return;
    entry.tellPending = true;
    this.clock.whenAwake(() => {
      entry.tellPending = false;
      if (!this.closed) tellWaiters(this.clock, entry, this.logger);
    });
  }

  private free(entry: Entry, held: Held, reason: LeaseEndReason): void {
    if (held.timer !== undefined) this.clock.clearTimeout(held.timer);
    if (held.holdSignal && held.onHoldAbort) held.holdSignal.removeEventListener("abort", held.onHoldAbort);
    if (entry.holder === held) delete entry.holder;
    this.leases.delete(held.lease.leaseToken);
    if (held.requestKey !== undefined) this.keys.end(held.requestKey);
    this.ended.remember(held.lease.leaseToken, { file: entry.key, reason, at: this.clock.now() });
    if (held.external) {
      try {
        this.external?.release(held.external);
      } catch (error) {
        this.logger.error({ file: entry.key, err: error }, "cannot remove the lock file");
      }
    }
    this.record(endChange(entry, held, reason));
    const log = reason === "expired" ? this.logger.info : this.logger.debug;
    log.call(this.logger, { file: entry.key, owner: held.lease.owner, fencingToken: held.lease.fencingToken, reason }, `lock ${reason}`);
    tellLeaseEnded(entry, held, reason, this.logger);
  }

  /**
   * Frees `entry`'s lease when its time is up even if its timer has not fired yet (a busy event
   * loop, a pause), with every other lease whose time is up, earliest first.
   */
  private expireIfDue(entry: Entry): boolean {
    if (!isDue(this.clock, entry.holder)) return false;
    expireOverdue(this.expiry, entry);
    return true;
  }

  /** The entry of `key` after serving an overdue expiry (to the next waiter, if any). */
  private refresh(key: string): Entry | undefined {
    const entry = this.entries.get(key);
    if (entry && this.expireIfDue(entry)) this.pump(entry);
    return this.entries.get(key);
  }

  private scheduleDeadline(entry: Entry, waiter: Waiter, call: WaitingCall): void {
    call.timer = this.clock.setTimeout(() => {
      delete call.timer;
      if (!waiter.calls.has(call)) return;
      if (this.clock.monotonicNow() < call.deadline) return this.scheduleDeadline(entry, waiter, call);
      // The first waiter's turn may have come without an event (a lock file we could not watch): look once more.
      this.pump(entry);
      if (!waiter.calls.has(call)) return;
      const ahead = placeOf(entry, waiter);
      dropCall(this.clock, waiter, call);
      const last = waiter.calls.size === 0;
      if (last) this.dropWaiter(entry, waiter);
      // Free but for a lock file that could not be made (a full disk): that is the reason to give.
      call.reject(!entry.holder && entry.claimError ? entry.claimError : this.lockedError(entry, call.waitMs, ahead));
      if (last) this.pump(entry);
    }, call.deadline - this.clock.monotonicNow());
  }

  /** Takes a request out of the queue with every call on it (their answers are the caller's to give). */
  private dropWaiter(entry: Entry, waiter: Waiter, granted = false): void {
    if (!granted && entry.waiters.has(waiter)) this.recordWaiter(entry, waiter, "waiter_left", placeOf(entry, waiter) + 1);
    entry.waiters.delete(waiter);
    for (const call of [...waiter.calls]) dropCall(this.clock, waiter, call);
    if (waiter.requestKey !== undefined && this.waitingByKey.get(waiter.requestKey) === waiter) {
      this.waitingByKey.delete(waiter.requestKey);
      // Not granted (yet): a request refused or given up records nothing; a grant records its answer next.
      this.keys.forget(waiter.requestKey);
    }
  }

  private entryFor(key: string): Entry {
    const entry = this.entries.get(key) ?? { key, waiters: new Set<Waiter>(), blocked: false };
    this.entries.set(key, entry);
    return entry;
  }

  private heldLease(leaseToken: string): Held {
    const token = checkLeaseToken(leaseToken);
    const held = this.leases.get(token);
    if (held) {
      this.refresh(held.lease.file);
      if (this.leases.has(token)) return held;
    }
    throw this.ended.notHeld(token);
  }

  /** The refusal of a wait that ran out (or a try-once that found the lock taken); see lock-refusals.ts. */
  private lockedError(entry: Entry, waitedMs: number, ahead: number): BerthError {
    const wait = { file: entry.key, lockPath: this.external?.pathFor(entry.key) ?? null, waitedMs, ahead };
    if (entry.holder) return heldByBerth(wait, berthHolder(this.clock, entry.holder));
    let foreign: ForeignLockHolder | undefined;
    try {
      foreign = this.external?.peek(entry.key);
    } catch (error) {
      // (No descriptor left to read the lock file with, say.) The refusal must still go out: the
      // waiter is already out of the queue.
      this.logger.warn({ file: entry.key, err: error }, "cannot read the lock file to name its holder");
    }
    foreign ??= entry.blockedBy;
    return foreign ? heldByLockFile(wait, foreign) : heldByNobodyKnown(wait);
  }
}
