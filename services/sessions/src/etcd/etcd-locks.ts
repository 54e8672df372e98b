/**
 * Source locks in etcd, as etcd's own `concurrency.Mutex` takes them, so that several berth
 * instances on one cluster are one lock service:
 *
 * - Each Acquire or Hold puts a waiter key `l/<file>/w/<lease id>` under an etcd lease of its own.
 *   The holder is the waiter with the lowest create revision; the others queue in create-revision
 *   order (FIFO), each watching the deletion of the one just before it: no polling, and a release
 *   wakes one waiter, not the herd.
 * - A waiter whose predecessor's key goes holds the lock from that deletion on, with no etcd call
 *   in between, when that key was the last one ahead of it, or had held the lock itself (every key
 *   older than it was gone by then, and keys ahead only leave). A key that held was written again
 *   when it was granted, so the deletion's previous state tells: a later mod than create revision.
 *   Else (the predecessor gave up waiting, or went before its grant was recorded) one transaction
 *   takes the lock if no older key is left, or reads the queue to wait on. Its own key is there
 *   while its lease lives, which this instance keeps and hears of losing.
 * - The fencing token is the holder's create revision: revisions are global and only grow, so
 *   tokens rise across the whole cluster and across restarts, whichever instance granted them.
 * - The lease is kept alive by the instance that granted it while the grant lives; releasing
 *   revokes it (its key goes at once, and the next waiter's watch fires). An instance that dies or
 *   is cut off stops renewing, and etcd frees the lock when the lease's TTL runs out.
 * - A grant records its token under `lt/<file>` (store-keys.ts), so that Inspect still answers the
 *   last token granted once nobody holds the lock, and since when the holder holds in its key: in
 *   the transaction that grants, or, for a lock handed over by a deletion, in one sent right after
 *   the grant (off the handoff's path), on the condition that the holder's key is still there (else
 *   the grant ends, lost). Its release waits for that write, so a released lock's token is always
 *   recorded.
 * - A write fenced by a token compares `create_revision(holder key) == token` inside its own
 *   transaction (etcd-journal.ts): once the holder's key is gone (released, expired, revoked) no
 *   write with its token can land, whatever the timing.
 */
import { systemClock, type Clock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import {
  compare,
  EtcdLeaseLostError,
  op,
  type EtcdClient,
  type EtcdLease,
  type KeyValue,
  type RangeResult,
  type TxnCompare,
  type TxnOpResult,
} from "@berth/etcd";
import { tooManyWaiters } from "../locks/lock-input.js";
import { heldByBerth } from "../locks/lock-refusals.js";
import { fenceRejected } from "./etcd-append-refusals.js";
import type { EtcdFence } from "./etcd-journal-api.js";
import { lastTokenKey, lockWaiterKey, lockWaitersPrefix } from "./store-keys.js";
import type { LockWatchRequest } from "../locks/source-locks-api.js";
import { watchEtcdLocks } from "./etcd-lock-watch.js";
import { partyOf, type EtcdLockParty } from "./etcd-lock-party.js";

/** A request for a lock. `file` is the canonical path (lock-path.ts). */
export interface EtcdLockRequest {
  readonly file: string;
  readonly owner: string;
  readonly kind: "lease" | "stream";
  /** The etcd lease's TTL: how long after this instance stops renewing the lock frees. */
  readonly ttlSeconds: number;
  /** How long to wait in the queue (0: try once). */
  readonly waitMs: number;
  /**
   * The wait Inspect shows, when it is not `waitMs`: a request whose calls each give up on their own
   * waits in etcd as long as any may, and shows the first call's.
   */
  readonly shownWaitMs?: number;
  /**
   * The most waiters the file's queue holds (the holder aside): a request that finds this many
   * ahead of it withdraws, TOO_MANY_WAITERS. Instances queueing at once each count the keys ahead of
   * their own, so none is granted a place beyond the cap. Unset: no cap.
   */
  readonly maxWaiters?: number;
  /** Aborting it gives up a wait (cancelled); once granted, the caller releases. */
  readonly signal?: AbortSignal;
  /** Called with the place in the queue (1: next) and the holder, whenever the wait starts or moves. */
  readonly onWaiting?: (update: { position: number; holder: EtcdLockParty | null }) => void;
}

/** A granted lock. */
export interface EtcdLockGrant {
  readonly file: string;
  readonly key: string;
  /** The fencing token: the waiter key's create revision. */
  readonly token: bigint;
  readonly owner: string;
  /** When it was granted (ms since the epoch, this instance's clock). */
  readonly acquiredAt: number;
  readonly lease: EtcdLease;
  /** Aborted once the lock is lost or released (the lease's signal). */
  readonly signal: AbortSignal;
  /** The fence an append compares to write under this lock. */
  readonly fence: EtcdFence;
  /** Frees the lock: revokes the lease (the next waiter is woken by etcd), once its grant is recorded. */
  release(): Promise<void>;
}

/** A lock as Inspect shows it. */
export interface EtcdLockInspection {
  readonly file: string;
  readonly holder: EtcdLockParty | null;
  /** In the order they will be served. */
  readonly waiters: EtcdLockParty[];
  /** The last fencing token granted on the file (held or not); null when none was recorded. */
  readonly lastToken: bigint | null;
  readonly revision: bigint;
}

export interface EtcdLocksOptions {
  readonly client: EtcdClient;
  readonly clock?: Clock;
  /** Names this berth instance in the waiter keys it writes (default `<hostname>:<pid>`). */
  readonly instance?: string;
}

const decoder = new TextDecoder();

/** How many resolved fences are remembered (a token's holder key never changes: only its existence does). */
const FENCE_CACHE_SIZE = 4096;

/** Source locks in etcd; see the module comment. */
export class EtcdLocks {
  private readonly client: EtcdClient;
  private readonly clock: Clock;
  private readonly instance: string;
  private readonly fences = new Map<string, EtcdFence>();

  constructor(options: EtcdLocksOptions) {
    this.client = options.client;
    this.clock = options.clock ?? systemClock;
    this.instance = options.instance ?? `${process.env.HOSTNAME ?? "localhost"}:${process.pid}`;
  }

  /**
   * Takes the lock of `request.file`, waiting behind earlier requests up to `waitMs`. Rejects with
   * resource_exhausted WAIT_EXHAUSTED (details: the holder, as LockHeld) when the wait runs out,
   * TOO_MANY_WAITERS when the queue is full,
   * cancelled when `signal` aborts first, aborted ETCD_LEASE_LOST when the waiter's lease is lost.
   * Whatever happens, a request that is not granted leaves no key behind.
   */
  async acquire(request: EtcdLockRequest): Promise<EtcdLockGrant> {
    const since = this.clock.now();
    const lease = await this.client.grantLease(request.ttlSeconds);
    const key = lockWaiterKey(request.file, lease.id);
    const prefix = lockWaitersPrefix(request.file);
    const record = {
      owner: request.owner,
      kind: request.kind,
      pid: process.pid,
      instance: this.instance,
      since,
      until: since + (request.shownWaitMs ?? request.waitMs),
    };
    const value = JSON.stringify(record);
    const stop = new AbortController();
    const end = (reason: unknown) => stop.abort(reason);
    const deadline = request.waitMs > 0 ? this.clock.setTimeout(() => end("deadline"), request.waitMs) : undefined;
    const onCallerAbort = () => end("cancelled");
    request.signal?.addEventListener("abort", onCallerAbort, { once: true });
    const onLeaseLost = () => end(lease.signal.reason);
    lease.signal.addEventListener("abort", onLeaseLost, { once: true });
    try {
      if (request.signal?.aborted) throw cancelled(request.file);
      // The key and the queue at its revision, in one round trip. On a free lock this put is the
      // grant: the same transaction records its token, which is its own revision (unknown before
      // it commits, hence the empty value: see grantedToken).
      const readQueue = op.get({ key: prefix, prefix: true, sort: { by: "create", order: "ascend" } });
      const put = await this.client.txn({
        compare: [nobodyQueued(prefix)],
        success: [op.put(key, value, lease.id), op.put(lastTokenKey(request.file), ""), readQueue],
        failure: [op.put(key, value, lease.id), readQueue],
      });
      const token = put.revision;
      let queue = getResult(put.results.at(-1));
      let told = "";
      let acquiredAt = since;
      /** Granted by the deletion of the key ahead, with nothing written yet. */
      let handedOver = false;
      for (;;) {
        const ahead = queue.kvs.filter((kv) => kv.createRevision < token);
        if (ahead.length === 0) break;
        const holder = partyOf(ahead[0]!);
        if (request.waitMs === 0 || stop.signal.aborted) throw this.whyStopped(request, stop.signal, holder, ahead.length);
        // Those ahead only leave: a request within the cap when it queued stays within it.
        if (told === "" && request.maxWaiters !== undefined && ahead.length > request.maxWaiters) {
          throw tooManyWaiters(request.file, ahead.length - 1, request.maxWaiters);
        }
        const place = `${ahead.length}:${holder.token}`;
        if (place !== told) {
          told = place;
          request.onWaiting?.({ position: ahead.length, holder });
        }
        // The predecessor's deletion, from just after the revision the queue was read at: a
        // deletion in between is delivered too.
        const predecessor = ahead.at(-1)!;
        const gone = await this.deletion(predecessor.key, queue.revision + 1n, stop.signal);
        if (stop.signal.aborted) throw this.whyStopped(request, stop.signal, holder, ahead.length);
        // Nobody ahead any more (see the module comment): held from the deletion on.
        if (ahead.length === 1 || (gone !== undefined && gone.modRevision > gone.createRevision)) {
          acquiredAt = this.clock.now();
          handedOver = true;
          break;
        }
        // One round trip: if our key is still there and no key older than it is left, it holds, and
        // the key says since when (a put keeps its create revision, the token); else the queue now.
        const now = this.clock.now();
        const turn = await this.client.txn({
          compare: [compare.create(key, "==", token), { key: prefix, prefix: true, target: "create", op: ">", against: token - 1n }],
          success: [op.put(key, JSON.stringify({ ...record, since: now }), lease.id), op.put(lastTokenKey(request.file), String(token))],
          failure: [op.get({ key: prefix, prefix: true, sort: { by: "create", order: "ascend" } })],
        });
        if (turn.succeeded) {
          acquiredAt = now;
          break;
        }
        queue = getResult(turn.results[0]);
        // Our own key is gone: the lease expired or was revoked while we waited.
        if (!queue.kvs.some((kv) => kv.key === key)) throw new EtcdLeaseLostError(lease.id, "the waiter's key was deleted while it waited");
      }
      // Its caller gone during the round trip that took the lock: freed at once (the revoke below), never granted.
      if (request.signal?.aborted) throw cancelled(request.file);
      const fence: EtcdFence = { file: request.file, key, token };
      this.rememberFence(fence);
      // A fence cached elsewhere is still refused by the append's compare; here it is not even offered.
      lease.signal.addEventListener("abort", () => this.forgetFence(fence), { once: true });
      // Sent once the grant's answer is on its way, off the handoff's path; its release waits for it.
      const recorded = handedOver
        ? afterGrantWritten(() => this.recordGrant(request.file, key, token, JSON.stringify({ ...record, since: acquiredAt }), lease))
        : undefined;
      return {
        file: request.file,
        key,
        token,
        owner: request.owner,
        acquiredAt,
        lease,
        signal: lease.signal,
        fence,
        release: async () => {
          await recorded;
          await lease.revoke();
        },
      };
    } catch (error) {
      await lease.revoke().catch(() => undefined);
      throw error;
    } finally {
      if (deadline !== undefined) this.clock.clearTimeout(deadline);
      request.signal?.removeEventListener("abort", onCallerAbort);
      lease.signal.removeEventListener("abort", onLeaseLost);
    }
  }

  /**
   * Records a grant that a deletion handed over (see the module comment): since when it holds, in
   * its key, and its token, if its key is still there; else, or if etcd cannot say, the lease is
   * revoked and the grant ends lost. Never rejects.
   */
  private async recordGrant(file: string, key: string, token: bigint, value: string, lease: EtcdLease): Promise<void> {
    try {
      const written = await this.client.txn({
        compare: [compare.create(key, "==", token)],
        success: [op.put(key, value, lease.id), op.put(lastTokenKey(file), String(token))],
      });
      if (written.succeeded) return;
    } catch {
      // Unrecorded, the token could be shown as never granted once released: the grant ends.
    }
    await lease.revoke().catch(() => undefined);
  }

  /**
   * Resolves once `key` is deleted at or after `fromRevision`, with its state before the deletion
   * when etcd still has it; or undefined once `signal` aborts.
   */
  private async deletion(key: string, fromRevision: bigint, signal: AbortSignal): Promise<KeyValue | undefined> {
    if (signal.aborted) return undefined;
    const watching = new AbortController();
    const stop = () => watching.abort(WATCH_DONE);
    signal.addEventListener("abort", stop, { once: true });
    const batches = this.client.watch({ key, startRevision: fromRevision, only: "delete", prevKv: true, signal: watching.signal })[Symbol.asyncIterator]();
    try {
      for (;;) {
        const next = await batches.next();
        if (next.done) return undefined;
        const deleted = next.value.events.find((e) => e.type === "delete");
        if (deleted !== undefined) return deleted.prevKv;
      }
    } finally {
      signal.removeEventListener("abort", stop);
      // Closed later, not awaited (as `for await` would): the watch stream's reset and the errors
      // made for it then come after the grant this deletion hands over is written.
      void afterGrantWritten(() => {
        watching.abort(WATCH_DONE);
        batches.return?.(undefined).catch(() => undefined);
      }).catch(() => undefined);
    }
  }

  private whyStopped(request: EtcdLockRequest, signal: AbortSignal, holder: EtcdLockParty, ahead: number): BerthError {
    if (signal.reason instanceof BerthError) return signal.reason;
    if (signal.reason === "cancelled") return cancelled(request.file);
    return waitExhausted(request.file, holder, request.waitMs, ahead);
  }

  /** Follows the lock keys from etcd's watch (WatchLocks; see etcd-lock-watch.ts). */
  watch(request: LockWatchRequest, maxBuffered: number): ReturnType<typeof watchEtcdLocks> {
    return watchEtcdLocks(this.client, this.clock, request, maxBuffered);
  }

  /**
   * The holder and the waiters of `file`, in order, and the last token granted on it (the holder's,
   * whose grant may not be recorded yet, or the one recorded): one read, at one revision.
   */
  async inspect(file: string): Promise<EtcdLockInspection> {
    const read = await this.client.txn({
      compare: [],
      success: [op.get({ key: lockWaitersPrefix(file), prefix: true, sort: { by: "create", order: "ascend" } }), op.get({ key: lastTokenKey(file) })],
    });
    const queue = getResult(read.results[0]);
    const last = getResult(read.results[1]).kvs[0];
    const parties = queue.kvs.map(partyOf);
    const holder = parties[0] ?? null;
    const recorded = last === undefined ? null : grantedToken(last);
    // Tokens only rise: the holder's is the last granted.
    const lastToken = holder !== null && (recorded === null || holder.token > recorded) ? holder.token : recorded;
    return { file, holder, waiters: parties.slice(1), lastToken, revision: queue.revision };
  }

  /**
   * The fence of `token` on `file` for an append to compare: the holder key whose create revision
   * is `token`. Refused failed_precondition FENCE_REJECTED when `token` does not hold the lock now
   * (the append's own compare decides later moments).
   */
  async fence(file: string, token: bigint): Promise<EtcdFence> {
    const known = this.fences.get(`${file}\0${token}`);
    if (known) return known;
    const holder = await this.currentHolder(file);
    if (holder?.createRevision !== token) throw fenceRejected({ file, token }, holder?.createRevision ?? 0n);
    const fence: EtcdFence = { file, key: holder.key, token };
    this.rememberFence(fence);
    return fence;
  }

  /** Whether `token` is the fencing token of the holder of `file` now. */
  async checkToken(file: string, token: bigint): Promise<{ current: boolean; currentToken: bigint | null }> {
    const holder = await this.currentHolder(file);
    const currentToken = holder?.createRevision ?? null;
    return { current: currentToken === token, currentToken };
  }

  private async currentHolder(file: string): Promise<KeyValue | undefined> {
    const oldest = await this.client.range({ key: lockWaitersPrefix(file), prefix: true, sort: { by: "create", order: "ascend" }, limit: 1, keysOnly: true });
    return oldest.kvs[0];
  }

  private forgetFence(fence: EtcdFence): void {
    this.fences.delete(`${fence.file}\0${fence.token}`);
  }

  private rememberFence(fence: EtcdFence): void {
    this.fences.set(`${fence.file}\0${fence.token}`, fence);
    if (this.fences.size > FENCE_CACHE_SIZE) this.fences.delete(this.fences.keys().next().value!);
  }
}

/** Why a waiter's watch of its predecessor ends: it has what it waited for, or its wait ended (a reason of its own spares building a DOMException). */
const WATCH_DONE = "the waiter's watch is done";

/**
 * Runs `task` once what this turn of the event loop and the next one hand out has been written, and
 * resolves as it does. Node writes HTTP/2 frames at the start of the turn after the one that made
 * them, and a grant a watch event brings is answered in this turn (a Hold) or the next (an Acquire,
 * which first waits for what has arrived to be read: `whenAwake`); two turns later both are out.
 */
function afterGrantWritten(task: () => Promise<void> | void): Promise<void> {
  return new Promise((resolve, reject) =>
    setImmediate(() =>
      setImmediate(() => {
        try {
          resolve(task());
        } catch (error) {
          reject(error);
        }
      }),
    ),
  );
}

function getResult(result: TxnOpResult | undefined): RangeResult {
  if (result === undefined || !("get" in result)) throw new Error("etcd answered a lock's transaction without its read");
  return result.get;
}

/** No key under `prefix`: over a range, every key must meet a compare, and a range without keys compares as zeros. */
function nobodyQueued(prefix: string): TxnCompare {
  return { key: prefix, prefix: true, target: "create", op: "==", against: 0n };
}

/**
 * The token an `lt/` key records: its value, written by the transaction that handed the lock
 * over; empty when the grant was the put of the holder's own key, whose revision (the key's
 * mod revision) is the token.
 */
function grantedToken(kv: KeyValue): bigint {
  const value = decoder.decode(kv.value);
  return value.length === 0 ? kv.modRevision : BigInt(value);
}

function cancelled(file: string): BerthError {
  return new BerthError("cancelled", `the request for ${file} was cancelled while it waited; it was not granted`, { file });
}

/** The refusal of a wait that ran out behind `holder`, worded as both stores word it (lock-refusals.ts). */
export function waitExhausted(file: string, holder: EtcdLockParty, waitedMs: number, ahead: number): BerthError {
  return heldByBerth(
    { file, lockPath: null, waitedMs, ahead },
    { owner: holder.owner, since: holder.since, fencingToken: Number(holder.token), kind: holder.kind, pid: holder.pid },
  );
}
