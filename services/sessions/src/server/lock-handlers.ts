/**
 * The LockService RPCs, each a few lines over the lock domain (`../locks/`): protobuf in, domain
 * call, protobuf out. The domain validates paths, owners and limits and throws BerthErrors, which
 * the server maps to ConnectErrors; this layer adds what only the RPC knows about — the call's
 * signal (a caller that goes away is never granted, a Hold ends with its stream), the call's
 * deadline as a bound on the wait, and the typed `LockHeld` detail of a WAIT_EXHAUSTED refusal.
 */
import { create } from "@bufbuild/protobuf";
import { durationFromMs, timestampFromMs, type Duration } from "@bufbuild/protobuf/wkt";
import type { ConnectError, HandlerContext, ServiceImpl } from "@connectrpc/connect";
import {
  AcquireResponseSchema,
  CheckTokenResponseSchema,
  GetLimitsResponseSchema,
  HolderKind,
  HolderSchema,
  HoldResponseSchema,
  InspectResponseSchema,
  KeepAliveResponseSchema,
  KeepAliveStreamResponseSchema,
  LeaseSchema,
  LockHeldSchema,
  ReleaseResponseSchema,
  RenewalSchema,
  WaiterSchema,
  type Holder,
  type HoldResponse,
  type Lease as LeaseMessage,
  type LockService as LockServiceDesc,
  type Renewal,
  LockEventKind,
  LockEventSchema,
  LocksWatcherLaggedSchema,
  WatchCaughtUpSchema,
  WatchLocksResponseSchema,
  WatchProgressSchema,
  type WatchLocksResponse,
} from "@berth/api/berth/locks/v1/lock_service_pb";
import { ConnectError as ConnectErrorClass } from "@connectrpc/connect";
import type { Clock } from "@berth/shared/clock";
import { systemClock } from "@berth/shared/clock";
import { BerthError, invalidArgument, isBerthError } from "@berth/shared/errors";
import {
  abortable,
  abortError,
  berthErrorToConnect,
  callTimeLeftMs,
  durationInputMs,
  endOnAbort,
  handOverGrant,
  PROGRESS,
  ProgressPuller,
  progressIntervalMs,
  streamHolds,
} from "@berth/shared/server/index";
import { checkFencingToken, LOCK_RETRY_AFTER_MS } from "../locks/lock-input.js";
import type {
  Lease,
  LeaseEndReason,
  LockChange,
  LockChangeKind,
  LockHolderInfo,
  SourceLocksApi,
  TokenCheck,
  WaitingUpdate,
} from "../locks/source-locks-api.js";

/** Why a Hold's own signal ends when its stream ends for any reason but its client leaving. */
const HOLD_STREAM_ENDED = "the Hold stream ended";

/** How often an open Hold stream carries a heartbeat once the lock is granted. */
export const HOLD_HEARTBEAT_MS = 5_000;

/** The most lease tokens one unary KeepAlive renews. */
export const MAX_KEEPALIVE_TOKENS = 1_000;

/** The ErrorInfo domain of LockService's errors (as the error interceptor names it from the service). */
const ERROR_DOMAIN = "berth.locks";

/**
 * How much of a call's remaining deadline is kept back from the lock wait, so that the refusal
 * (with its holder) reaches the client before the client's own deadline fires: at most 100 ms,
 * at most a tenth of the time left.
 */
const DEADLINE_MARGIN_MS = 100;

/** What the lock handlers are built from. */
export interface LockHandlerOptions {
  readonly locks: SourceLocksApi;
  /** Heartbeat interval of Hold streams; default {@link HOLD_HEARTBEAT_MS}. */
  readonly heartbeatMs?: number;
  /** Times heartbeats; default the system clock (tests pass a ManualClock). */
  readonly clock?: Clock;
}

/** The LockService implementation over the source locks. */
export function createLockHandlers(options: LockHandlerOptions): ServiceImpl<typeof LockServiceDesc> {
  const { locks } = options;
  const clock = options.clock ?? systemClock;
  const heartbeatMs = options.heartbeatMs ?? HOLD_HEARTBEAT_MS;
  /** The wait a request asks for (unset: the longest), ending a little before the call's deadline. */
  const waitOf = (maxWait: Duration | undefined, context: HandlerContext) =>
    boundedByDeadline(maxWait === undefined ? locks.limits.maxWaitMs : durationInput(maxWait, "max_wait"), context);

  return {
    async acquire(request, context) {
      const waitMs = waitOf(request.maxWait, context);
      const ttlMs = durationInput(request.ttl, "ttl");
      const lease = await locks
        .acquire({ file: request.file, owner: request.owner, waitMs, ttlMs, requestId: request.requestId, signal: context.signal })
        .catch((error: unknown) => {
          throw lockError(error, context);
        });
      // A lease its caller never learns of would hold the lock to its ttl: released at once when the
      // caller has gone by the time what has arrived is read, or when the answer is not delivered —
      // unless the call has a request id, whose retry is answered this very lease (and may be
      // another call, answered the same lease, that is still there).
      const undo = request.requestId === "" ? () => locks.release(lease.leaseToken) : undefined;
      await handOverGrant(context, clock, undo);
      return create(AcquireResponseSchema, { lease: leaseMessage(lease) });
    },

    async keepAlive(request) {
      if (request.leaseTokens.length === 0) throw invalidArgument("lease_tokens", "is required: at least one lease token Acquire (or Hold) returned");
      if (request.leaseTokens.length > MAX_KEEPALIVE_TOKENS) {
        throw invalidArgument(
          "lease_tokens",
          `must hold at most ${MAX_KEEPALIVE_TOKENS} tokens, got ${request.leaseTokens.length}: renew them in several calls`,
        );
      }
      // Every token is checked before any is renewed: a refused request renews nothing.
      const tokens = request.leaseTokens.map((token, i) => leaseTokenInput(token, `lease_tokens[${i}]`));
      return create(KeepAliveResponseSchema, { renewals: await Promise.all(tokens.map((token) => renewal(locks, token))) });
    },

    async *keepAliveStream(requests, context) {
      for await (const request of abortable(requests, context.signal)) {
        const token = leaseTokenInput(request.leaseToken, "lease_token");
        yield create(KeepAliveStreamResponseSchema, { renewal: await renewal(locks, token) });
      }
    },

    async release(request) {
      const token = leaseTokenInput(request.leaseToken, "lease_token");
      return create(ReleaseResponseSchema, { released: await locks.release(token, request.requestId) });
    },

    async *hold(request, context) {
      const waitMs = waitOf(request.maxWait, context);
      // The hold lives exactly as long as this call: the client going away aborts `context.signal`
      // (whether or not this generator is running), and the generator ending for any other reason
      // (an error, shutdown, a write that failed) aborts `held` in `finally`.
      const held = new AbortController();
      const endHold = () => held.abort(context.signal.reason);
      context.signal.addEventListener("abort", endHold, { once: true });
      let stopWatchingLease = () => {};
      try {
        if (context.signal.aborted) throw abortError(context.signal);
        const lease = yield* holdStream(locks, { file: request.file, owner: request.owner, waitMs, signal: held.signal }, context);
        // Granted: heartbeats until the stream ends, or at once when the lease ends otherwise
        // (released through its lease token): the stream must not go on looking held.
        streamHolds(context, `the lock on ${lease.file} as ${JSON.stringify(lease.owner)}, fencing token ${lease.fencingToken}`);
        const leaseEnded = new AbortController();
        let endedHow: LeaseEndReason | undefined;
        stopWatchingLease = locks.whenLeaseEnds(lease.leaseToken, (how) => {
          endedHow = how;
          leaseEnded.abort(how);
        });
        const wakeUp = AbortSignal.any([held.signal, leaseEnded.signal]);
        for (;;) {
          await delay(clock, heartbeatMs, wakeUp);
          if (held.signal.aborted) {
            await afterHandOn(clock);
            throw abortError(context.signal);
          }
          // Released through Release with its lease token, which only this stream's caller was
          // given: its owner let go, as asked, and the hold ends OK (not a failure in /metrics).
          if (endedHow === "released") return;
          if (endedHow !== undefined) throw holdEnded(lease, endedHow);
          yield create(HoldResponseSchema, { kind: { case: "heartbeat", value: { sendTime: timestampFromMs(clock.now()) } } });
        }
      } finally {
        stopWatchingLease();
        context.signal.removeEventListener("abort", endHold);
        // A reason of its own: abort() without one builds a DOMException, stack and all, for every hold.
        held.abort(HOLD_STREAM_ENDED);
      }
    },

    async inspect(request) {
      const inspection = await locks.inspect(request.file);
      return create(InspectResponseSchema, {
        file: inspection.file,
        holder: inspection.holder ? holderMessage(inspection.holder) : undefined,
        waiters: inspection.waiters.map((w) =>
          create(WaiterSchema, {
            owner: w.owner,
            waitStartTime: timestampFromMs(w.since),
            waitExpireTime: timestampFromMs(w.deadline),
            kind: w.kind === "lease" ? HolderKind.LEASE : HolderKind.STREAM,
          }),
        ),
        lastFencingToken: BigInt(inspection.lastFencingToken ?? 0),
        lockPath: inspection.lockPath ?? "",
      });
    },

    async checkToken(request) {
      const check = await locks.checkToken(request.file, request.fencingToken);
      return create(CheckTokenResponseSchema, { current: check.current, currentToken: BigInt(check.currentToken ?? 0), file: check.file });
    },

    async getLimits() {
      const { limits } = locks;
      return create(GetLimitsResponseSchema, {
        defaultTtl: durationFromMs(limits.defaultTtlMs),
        maxTtl: durationFromMs(limits.maxTtlMs),
        maxWait: durationFromMs(limits.maxWaitMs),
        heartbeatInterval: durationFromMs(heartbeatMs),
        maxWaitersPerFile: limits.maxWaitersPerFile,
        maxOwnerLength: limits.maxOwnerLength,
        idempotencyWindow: durationFromMs(limits.idempotencyWindowMs),
        watchHistory: locks.watchHistory,
      });
    },

    async *watchLocks(request, context) {
      const file = request.file === "" ? undefined : locks.resolveFile(request.file);
      if (request.startRevision < 0n) throw invalidArgument("start_revision", "must not be negative");
      const progressMs = progressIntervalMs(request.progressInterval);
      const watcher = await locks.watch({ file, includeCurrent: request.includeCurrent, startRevision: request.startRevision });
      streamHolds(context, file === undefined ? "a watcher of every lock" : `a watcher of the lock of ${file}`);
      const stop = endOnAbort(watcher, context.signal);
      const puller = new ProgressPuller(watcher, clock);
      let live = false;
      try {
        for (;;) {
          const step = await puller.next(live ? progressMs : undefined);
          if (step === PROGRESS) {
            const progress = create(WatchProgressSchema, { revision: watcher.progressRevision(), sendTime: timestampFromMs(clock.now()) });
            yield create(WatchLocksResponseSchema, { kind: { case: "progress", value: progress } });
            continue;
          }
          if (step.done) break;
          const item = step.value;
          if (item.kind === "caught_up") {
            live = true;
            yield create(WatchLocksResponseSchema, {
              kind: { case: "caughtUp", value: create(WatchCaughtUpSchema, { revision: item.revision, reset: item.reset }) },
            });
            continue;
          }
          yield lockEventResponse(item.revision, item.change);
        }
        if (context.signal.aborted) throw abortError(context.signal);
      } catch (error) {
        throw watchLagged(error);
      } finally {
        stop();
        await watcher.return?.();
      }
    },
  };
}

const EVENT_KINDS: Record<LockChangeKind, LockEventKind> = {
  granted: LockEventKind.GRANTED,
  released: LockEventKind.RELEASED,
  expired: LockEventKind.EXPIRED,
  waiter_joined: LockEventKind.WAITER_JOINED,
  waiter_left: LockEventKind.WAITER_LEFT,
  current_holder: LockEventKind.CURRENT_HOLDER,
  current_waiter: LockEventKind.CURRENT_WAITER,
};

function lockEventResponse(revision: bigint, change: LockChange): WatchLocksResponse {
  const event = create(LockEventSchema, {
    revision,
    file: change.file,
    kind: EVENT_KINDS[change.kind],
    owner: change.owner,
    fencingToken: BigInt(change.fencingToken),
    position: change.position,
    time: timestampFromMs(change.at),
    holderKind: change.holderKind === "stream" ? HolderKind.STREAM : HolderKind.LEASE,
  });
  if (change.expiresAt !== null) event.expireTime = timestampFromMs(change.expiresAt);
  return create(WatchLocksResponseSchema, { kind: { case: "event", value: event } });
}

/** A lock watcher that fell behind (WATCHER_LAGGED, details `lastRevision`) → with its LocksWatcherLagged detail. */
function watchLagged(error: unknown): unknown {
  if (!isBerthError(error) || error.reason !== "WATCHER_LAGGED") return error;
  const last = error.details?.lastRevision;
  const resumeFromRevision = typeof last === "string" ? BigInt(last) : 0n;
  const base = berthErrorToConnect(error, ERROR_DOMAIN);
  const detail = { desc: LocksWatcherLaggedSchema, value: { resumeFromRevision } };
  return new ConnectErrorClass(
    base.rawMessage,
    base.code,
    base.metadata,
    [detail, ...base.details] as ConstructorParameters<typeof ConnectErrorClass>[3],
    error,
  );
}

/**
 * The fence AppendEvent checks before writing (see FenceCheck). Given the fence, it refuses bad
 * input with `invalid_argument` naming `fence.file` / `fence.fencing_token` and makes the path
 * canonical, as Acquire does, so a fence given with another spelling of the locked file matches.
 * The check it returns throws `aborted` (details: file, fencingToken, currentToken — the
 * FenceRejected detail's fields) unless `token` is the current fencing token of the file's lock.
 */
export function createFenceCheck(locks: {
  resolveFile: SourceLocksApi["resolveFile"];
  /** Answered at once: the check runs inside the append's own turn. */
  checkToken(file: string, token: number): TokenCheck;
}): (file: string, token: bigint) => () => void {
  return (file, token) => {
    const key = locks.resolveFile(file, "fence.file");
    const value = checkFencingToken(token, "fence.fencing_token");
    return () => {
      const check = locks.checkToken(key, value);
      if (check.current) return;
      const current = check.currentToken === null ? "nobody holds the lock now" : `the current token is ${check.currentToken}`;
      throw new BerthError(
        "aborted",
        `fence rejected: fencing token ${value} of ${key} is no longer current (${current}); nothing was written — acquire the lock again and retry`,
        {
          reason: "FENCE_REJECTED",
          file: key,
          fencingToken: value,
          currentToken: check.currentToken ?? 0,
        },
      );
    };
  };
}

/** Waiting updates while queued (the latest one only, if several came between two sends), then the grant. */
async function* holdStream(
  locks: SourceLocksApi,
  request: { file: string; owner: string; waitMs: number; signal: AbortSignal },
  context: HandlerContext,
): AsyncGenerator<HoldResponse, Lease> {
  let pending: WaitingUpdate | undefined;
  let outcome: { lease: Lease } | { error: unknown } | undefined;
  let wake: () => void = () => {};
  const woken = () => new Promise<void>((resolve) => (wake = resolve));
  let next = woken();
  streamHolds(context, `a place in the queue of ${request.file} as ${JSON.stringify(request.owner)}`);
  const granted = locks.holdAsLongAs({
    ...request,
    onWaiting(update) {
      pending = update;
      wake();
    },
  });
  granted.then(
    (lease) => {
      outcome = { lease };
      wake();
    },
    (error: unknown) => {
      outcome = { error };
      wake();
    },
  );
  for (;;) {
    if (outcome && "lease" in outcome) {
      yield create(HoldResponseSchema, { kind: { case: "acquired", value: leaseMessage(outcome.lease) } });
      return outcome.lease;
    }
    if (outcome) throw lockError(outcome.error, context);
    if (pending) {
      const update = pending;
      pending = undefined;
      yield create(HoldResponseSchema, {
        kind: { case: "waiting", value: { position: update.position, holder: update.holder ? holderMessage(update.holder) : undefined } },
      });
      continue;
    }
    await next;
    next = woken();
  }
}

/** One renewal: the renewed expiry, or `alive = false` for a lease that is gone. */
async function renewal(locks: SourceLocksApi, token: string): Promise<Renewal> {
  try {
    const lease = await locks.renew(token);
    return create(RenewalSchema, {
      leaseToken: token,
      alive: true,
      expireTime: lease.expiresAt === null ? undefined : timestampFromMs(lease.expiresAt),
    });
  } catch (error) {
    // Expired, released or unknown: the proto's answer is "not alive", not an error that would
    // end the call and the renewal of every other lease in it.
    if (isBerthError(error) && (error.code === "not_found" || error.code === "failed_precondition")) {
      return create(RenewalSchema, { leaseToken: token, alive: false });
    }
    throw error;
  }
}

/**
 * A domain refusal as the client should see it: WAIT_EXHAUSTED gets the typed `LockHeld` detail
 * besides the common ones; a waiter dropped because its call ended answers with why the call ended
 * (the client's cancel or deadline, or the server shutting down).
 */
function lockError(error: unknown, context: HandlerContext): unknown {
  if (!isBerthError(error)) return error;
  if (error.code === "cancelled" && context.signal.aborted) return abortError(context.signal);
  if (error.reason !== "WAIT_EXHAUSTED" || error.details === undefined) return error;
  const connectError: ConnectError = berthErrorToConnect(error, ERROR_DOMAIN);
  const d = error.details;
  const held = create(LockHeldSchema, {
    file: typeof d.file === "string" ? d.file : "",
    owner: typeof d.owner === "string" ? d.owner : "",
    acquireTime: typeof d.acquireTime === "number" ? timestampFromMs(d.acquireTime) : undefined,
    fencingToken: typeof d.fencingToken === "number" ? BigInt(d.fencingToken) : 0n,
    kind: holderKind(d.kind),
    lockPath: typeof d.lockPath === "string" ? d.lockPath : "",
    waited: typeof d.waitedMs === "number" ? durationFromMs(d.waitedMs) : undefined,
  });
  if (typeof d.pid === "number") held.pid = d.pid;
  connectError.details.push({ desc: LockHeldSchema, value: held });
  return connectError;
}

function holderKind(kind: unknown): HolderKind {
  switch (kind) {
    case "lease":
      return HolderKind.LEASE;
    case "stream":
      return HolderKind.STREAM;
    case "seed-file":
      return HolderKind.SEED_LOCK_FILE;
    default:
      // Nobody identifiable: requests queued ahead wait for a lock file being taken over.
      return HolderKind.UNSPECIFIED;
  }
}

function leaseMessage(lease: Lease): LeaseMessage {
  return create(LeaseSchema, {
    leaseToken: lease.leaseToken,
    fencingToken: BigInt(lease.fencingToken),
    expireTime: lease.expiresAt === null ? undefined : timestampFromMs(lease.expiresAt),
    file: lease.file,
    owner: lease.owner,
    acquireTime: timestampFromMs(lease.acquiredAt),
    ttl: lease.ttlMs === null ? undefined : durationFromMs(lease.ttlMs),
  });
}

function holderMessage(holder: LockHolderInfo): Holder {
  if (holder.kind === "seed-file") {
    const message = create(HolderSchema, {
      owner: holder.owner ?? "",
      fencingToken: 0n,
      acquireTime: timestampFromMs(holder.since),
      kind: HolderKind.SEED_LOCK_FILE,
    });
    if (holder.pid !== undefined) message.pid = holder.pid;
    return message;
  }
  const message = create(HolderSchema, {
    owner: holder.owner,
    fencingToken: BigInt(holder.fencingToken),
    acquireTime: timestampFromMs(holder.since),
    expireTime: holder.expiresAt === null ? undefined : timestampFromMs(holder.expiresAt),
    kind: holder.kind === "lease" ? HolderKind.LEASE : HolderKind.STREAM,
  });
  if (holder.pid !== undefined) message.pid = holder.pid;
  return message;
}

/** Why a hold's lease ended other than by its owner's Release: the service closing its locks, or (never for a hold, whose lease has no ttl) an expiry. */
function holdEnded(lease: Lease, how: Exclude<LeaseEndReason, "released">): BerthError {
  const what = `the hold on ${lease.file} (fencing token ${lease.fencingToken}) ended`;
  if (how === "closed")
    return new BerthError(
      "unavailable",
      `${what}: the lock service is shutting down; hold the lock again when it is back`,
      { file: lease.file },
      { reason: "SHUTTING_DOWN", retryAfterMs: LOCK_RETRY_AFTER_MS },
    );
  return new BerthError("failed_precondition", `${what}: its lease expired; hold the lock again`, { file: lease.file, fencingToken: lease.fencingToken });
}

/**
 * A protobuf Duration as milliseconds (the services' one check and the wire's rounding). Unset is 0
 * (a ttl's "the default"; an unset wait is the caller's to read first). The upper bounds that
 * matter are the domain's: this only refuses what no limit is anywhere near, before it loses
 * precision.
 */
export function durationInput(duration: Duration | undefined, field: string): number {
  return durationInputMs(duration, field, { maxMs: TEN_THOUSAND_YEARS_MS }) ?? 0;
}

const TEN_THOUSAND_YEARS_MS = 315_576_000_000_000;

/** The wait, shortened to end a little before the call's deadline when that comes first. */
function boundedByDeadline(waitMs: number, context: HandlerContext): number {
  const left = callTimeLeftMs(context);
  if (left === undefined || waitMs === 0) return waitMs;
  const bound = Math.max(0, Math.floor(left - Math.min(DEADLINE_MARGIN_MS, left / 10)));
  return Math.min(waitMs, bound);
}

/** A lease token as a request carries it: non-empty and short (they are UUIDs); `field` names it in a refusal. */
function leaseTokenInput(token: string, field: string): string {
  if (token.length === 0) throw invalidArgument(field, "is required: the lease token Acquire (or Hold) returned");
  if (token.length > 128) throw invalidArgument(field, `must be at most 128 characters, got ${token.length}`);
  return token;
}

/**
 * Resolves once the hand-on that letting go of a lock scheduled (`clock.whenAwake`: the next turn)
 * has run and what it wrote has gone out (Node writes HTTP/2 frames at the start of the turn after
 * that). A Hold whose client let go waits for it before it ends its call: its trailers, log line and
 * metrics, worked out first, were on the next holder's time (about half a millisecond a handoff).
 */
function afterHandOn(clock: Clock): Promise<void> {
  return new Promise((resolve) => clock.whenAwake(() => clock.whenAwake(resolve)));
}

/** Resolves after `ms` on `clock`, or at once when `signal` aborts. */
function delay(clock: Clock, ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clock.clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = clock.setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
