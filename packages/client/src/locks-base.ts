/**
 * Source locks: hold a lock for as long as a block runs (`await using lease = await locks.lock(file)`),
 * on one Hold stream, so that the lock is freed the instant the stream ends, whatever ends it (the
 * block, a release, this process dying, a page closing). Lock paths are made absolute by the entry
 * point's connection (against the working directory in Node). A lease that outlives a stream: `acquire` (with a request id, retried safely),
 * `keepAlive`, `release`. Everything else is on `rpc`.
 */
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import {
  LockHeldSchema,
  LocksWatcherLaggedSchema,
  LockService,
  type LockEvent,
  type CheckTokenResponse,
  type GetLimitsResponse,
  type HoldResponse,
  type InspectResponse,
  type Lease,
  type Renewal,
  type Waiting,
} from "@berth/api/berth/locks/v1/lock_service_pb";
import type { ServiceConnection } from "./connection.js";
import type { Endpoint } from "./endpoint.js";
import { BerthClientError, withBerthErrors } from "./errors.js";
import { callOptions, durationOfMs, linkedCall, type CallOptions } from "./options.js";
import { callWithRequestId, newRequestId } from "./request-ids.js";
import { followRevisionWatch, type RevisionWatchEvent, type RevisionWatchOptions } from "./revision-watch.js";

/** The typed details the lock service sends with its errors. */
export const LOCK_ERROR_DETAILS = [LockHeldSchema, LocksWatcherLaggedSchema] as const;

/** Options of {@link LocksClientBase.watch}: the current holders and waiters first, a revision to resume after, progress, resuming. */
export interface LockWatchOptions extends RevisionWatchOptions {
  /** Resolves a relative `file` (default: the process's working directory in Node; a page has none, and names files absolutely or gives `cwd`). */
  readonly cwd?: string;
}

/** What {@link LocksClientBase.watch} yields. */
export type LockWatchEvent = RevisionWatchEvent<LockEvent>;

/** How long a release waits for the service's answer before leaving it to the stream's end. */
const RELEASE_TIMEOUT_MS = 2_000;

/** Options of {@link LocksClientBase.lock}. */
export interface LockOptions extends CallOptions {
  /** Who holds the lock, shown to everyone who waits. Default: `user@host pid N` in Node, `browser <name> <version> tab on <origin>` in a page. */
  readonly owner?: string | undefined;
  /**
   * How long to wait for the lock: 0 tries once; unset, the service's longest wait (10 minutes by
   * default). When it runs out: RESOURCE_EXHAUSTED WAIT_EXHAUSTED, with the holder in `lockHeld`.
   */
  readonly maxWaitMs?: number | undefined;
  /** What a relative `file` is relative to. Default: the process's working directory at the call in Node; a page has none (give absolute paths or `cwd`). */
  readonly cwd?: string | undefined;
  /** Called while queued: at once, and whenever the place in line or the holder changes. */
  readonly onWaiting?: ((waiting: Waiting) => void) | undefined;
}

/** Options of {@link LocksClientBase.acquire}. */
export interface AcquireOptions extends CallOptions {
  /** As in {@link LockOptions}. */
  readonly owner?: string | undefined;
  /** As in {@link LockOptions}. */
  readonly maxWaitMs?: number | undefined;
  /** As in {@link LockOptions}. */
  readonly cwd?: string | undefined;
  /** The lease's time to live, renewed by `keepAlive`; unset: the service's default (30 s). */
  readonly ttlMs?: number | undefined;
  /**
   * The call's request id (default: a new UUID). The call is made again with it when it fails on the
   * way; give your own to retry yourself later (the same file, owner and ttl are answered the first
   * lease, anything else with it is ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED).
   */
  readonly requestId?: string | undefined;
}

/**
 * A lock held on an open Hold stream, until {@link release} (or `await using` leaving its block).
 * `signal` aborts the moment the lock is no longer held, for whatever reason: pass it to the work
 * the lock protects. Fenced writes carry {@link fencingToken}.
 */
export class HeldLock implements AsyncDisposable {
  readonly #controller = new AbortController();
  #lost: BerthClientError | undefined;
  #released: Promise<boolean> | undefined;

  /** @internal Made by {@link LocksClientBase.lock}. */
  constructor(
    /** The grant: canonical file, fencing token, owner, when. */
    readonly lease: Lease,
    private readonly responses: AsyncIterator<HoldResponse>,
    private readonly call: AbortController,
    private readonly releaseLease: (leaseToken: string) => Promise<boolean>,
    private readonly callerSignal: AbortSignal | undefined,
    private readonly detach: () => void,
  ) {
    // The call's signal aborting frees the lock: no longer held from that moment.
    callerSignal?.addEventListener("abort", this.#onCallerAbort, { once: true });
    void this.follow();
  }

  readonly #onCallerAbort = (): void => this.end(this.callerSignal?.reason);

  /** The locked file's canonical path (every spelling of it is this one lock). */
  get file(): string {
    return this.lease.file;
  }

  /** The grant's fencing token: greater than every token granted before on this file. */
  get fencingToken(): bigint {
    return this.lease.fencingToken;
  }

  /** Aborted once the lock is no longer held: released, lost (its reason is then {@link lost}), or the call's signal aborted. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Why the lock was lost (the service ended the hold, or the connection broke), if it was; undefined while held and after a release. */
  get lost(): BerthClientError | undefined {
    return this.#lost;
  }

  /**
   * Releases the lock: asks the service to release it (so the next holder is served before this
   * process goes on), then ends the stream, which would free it anyway. Resolves true when the
   * service released it on this call; false when it was gone already or did not answer in time.
   * Calling it again answers the first call's outcome.
   */
  release(): Promise<boolean> {
    this.#released ??= (async () => {
      try {
        if (this.#controller.signal.aborted) return false;
        return await this.releaseLease(this.lease.leaseToken).catch(() => false);
      } finally {
        this.end(new DOMException("the lock was released", "AbortError"));
      }
    })();
    return this.#released;
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.release();
  }

  /** Reads the rest of the stream (heartbeats); its end, unless asked for, is the loss of the lock. */
  private async follow(): Promise<void> {
    let error: unknown;
    try {
      for (;;) {
        const next = await this.responses.next();
        if (next.done) break;
      }
    } catch (caught) {
      error = caught;
    }
    if (this.#controller.signal.aborted || this.#released !== undefined) return;
    if (this.callerSignal?.aborted) return this.end(this.callerSignal.reason);
    // The service ends a hold OK only when its lease is released through Release: here that was
    // not this lock's release(), but a Release with its lease token from elsewhere.
    const releasedElsewhere = new ConnectError(
      `the lock on ${this.lease.file} was released through Release with its lease token, not by this lock's release()`,
      Code.FailedPrecondition,
    );
    this.#lost = BerthClientError.from(error ?? releasedElsewhere, LOCK_ERROR_DETAILS);
    this.end(this.#lost);
  }

  private end(reason: unknown): void {
    this.callerSignal?.removeEventListener("abort", this.#onCallerAbort);
    this.detach();
    this.call.abort();
    if (!this.#controller.signal.aborted) this.#controller.abort(reason);
  }
}

/** A client of the sessions service's source locks, on the connection its entry point gives it (`LocksClient` of each entry). */
export class LocksClientBase {
  /** The plain Connect client (Connect over HTTP/1.1), for every RPC; its errors are BerthClientErrors. */
  readonly rpc: Client<typeof LockService>;
  /** Where it connects; undefined when it was given a transport. */
  readonly endpoint: Endpoint | undefined;
  readonly #streams: () => Client<typeof LockService>;
  readonly #connection: ServiceConnection;

  constructor(connection: ServiceConnection) {
    this.#connection = connection;
    this.endpoint = connection.endpoint;
    this.rpc = withBerthErrors(LockService, createClient(LockService, connection.unary), LOCK_ERROR_DETAILS);
    let streams: Client<typeof LockService> | undefined;
    this.#streams = () => (streams ??= withBerthErrors(LockService, createClient(LockService, connection.streams()), LOCK_ERROR_DETAILS));
  }

  /**
   * Waits for the lock on `file` (queued in arrival order behind the holder) and holds it until
   * released: `await using lease = await locks.lock("src/app.css")`. A wait that runs out is
   * RESOURCE_EXHAUSTED WAIT_EXHAUSTED (`lockHeld` names the holder); `timeoutMs` bounds the wait
   * (DEADLINE_EXCEEDED); the signal aborting, while waiting or holding, withdraws or frees it.
   */
  async lock(file: string, options: LockOptions = {}): Promise<HeldLock> {
    const call = linkedCall(options);
    const request = {
      file: this.#connection.lockPath(file, options.cwd),
      owner: options.owner ?? this.#connection.defaultOwner(),
      maxWait: durationOfMs(options.maxWaitMs),
    };
    const responses = this.#streams().hold(request, { signal: call.controller.signal })[Symbol.asyncIterator]();
    try {
      for (;;) {
        const next = await responses.next();
        if (next.done) throw new ConnectError("the service ended the stream before granting the lock", Code.Unknown);
        const kind = next.value.kind;
        if (kind.case === "waiting") options.onWaiting?.(kind.value);
        else if (kind.case === "acquired") {
          // The deadline was the wait's: the lock is held until released.
          call.clearDeadline();
          const release = (leaseToken: string) =>
            this.rpc.release({ leaseToken, requestId: newRequestId() }, { timeoutMs: RELEASE_TIMEOUT_MS }).then((r) => r.released);
          return new HeldLock(kind.value, responses, call.controller, release, options.signal, () => call.dispose());
        }
      }
    } catch (error) {
      call.dispose();
      call.controller.abort();
      throw BerthClientError.from(error, LOCK_ERROR_DETAILS);
    }
  }

  /**
   * Takes the lock on `file` as a lease, waiting in line like `lock`: the lease lives until
   * `release`, or until its ttl passes without `keepAlive`. The call carries a request id and is
   * made again with it when it fails on the way (the connection broke, the service was unreachable
   * for a moment), so a retry is answered the lease the first call got, never a second place in line.
   */
  async acquire(file: string, options: AcquireOptions = {}): Promise<Lease> {
    const request = {
      file: this.#connection.lockPath(file, options.cwd),
      owner: options.owner ?? this.#connection.defaultOwner(),
      maxWait: durationOfMs(options.maxWaitMs),
      ttl: durationOfMs(options.ttlMs),
    };
    const response = await callWithRequestId((requestId) => this.rpc.acquire({ ...request, requestId }, callOptions(options)), options);
    if (response.lease === undefined) throw BerthClientError.from(new ConnectError("the service granted no lease", Code.Internal));
    return response.lease;
  }

  /** Renews leases, each for its ttl: one answer per token, `alive = false` for a lease that is gone. */
  async keepAlive(leaseTokens: readonly string[], options?: CallOptions): Promise<Renewal[]> {
    return (await this.rpc.keepAlive({ leaseTokens: [...leaseTokens] }, callOptions(options))).renewals;
  }

  /**
   * Releases a lease: true when it was released by this call (or by its first attempt, whose answer
   * was lost), false when it was gone already. Retried safely with a request id, as `acquire` is.
   */
  async release(leaseToken: string, options: CallOptions & { readonly requestId?: string | undefined } = {}): Promise<boolean> {
    return (await callWithRequestId((requestId) => this.rpc.release({ leaseToken, requestId }, callOptions(options)), options)).released;
  }

  /** Who holds the lock on `file`, who waits, the last fencing token. */
  async inspect(file: string, options: CallOptions & { readonly cwd?: string } = {}): Promise<InspectResponse> {
    return this.rpc.inspect({ file: this.#connection.lockPath(file, options.cwd) }, callOptions(options));
  }

  /** Whether `fencingToken` is still the current token of the lock on `file`. */
  async checkToken(file: string, fencingToken: bigint | number, options: CallOptions & { readonly cwd?: string } = {}): Promise<CheckTokenResponse> {
    return this.rpc.checkToken({ file: this.#connection.lockPath(file, options.cwd), fencingToken: BigInt(fencingToken) }, callOptions(options));
  }

  /**
   * Follows the locks (WatchLocks) of `file`, or of every file when it is undefined: `caughtUp`,
   * then each change as it happens, until the loop breaks or the signal aborts. A watch the
   * service ends for falling behind resumes from the revision it names, after a `resumed` event:
   * nothing missed, nothing repeated; when the service can no longer replay what was missed, the
   * current holders and waiters come again, then a `caughtUp` with `reset` (they replace the
   * caller's view). A resume that lags again at once from the same revision throws.
   */
  async *watch(file: string | undefined, options: LockWatchOptions = {}): AsyncGenerator<LockWatchEvent> {
    const target = file === undefined ? "" : this.#connection.lockPath(file, options.cwd);
    const progressInterval = durationOfMs(options.progressIntervalMs);
    yield* followRevisionWatch<LockEvent>(
      {
        open: (start, signal) => this.rpc.watchLocks({ file: target, ...start, progressInterval }, { signal }),
        resumeRevision: (error) => error.locksWatcherLagged?.resumeFromRevision,
      },
      options,
    );
  }

  /** The limits the locks enforce: ttls, the longest wait, waiters per file, the longest owner. */
  limits(options?: CallOptions): Promise<GetLimitsResponse> {
    return this.rpc.getLimits({}, callOptions(options));
  }
}
