/**
 * The budget service: admit work for as long as a callback runs (`await budget.admit(need, async
 * (admission) => …)`), on one Admit stream, so that the reservation is released when the callback
 * settles, and by the service the moment the stream ends for any other reason (this process
 * dying). Needs are built from `start`, `build` and `appliance` items. The admission carries a
 * request id: a stream whose connection breaks is resumed on a new one with it, keeping its place in
 * the queue or its reservation. The calls that create or change something (`reserve`, `release`,
 * `releaseBuild`, `registerRunning`, `stopRunning`) carry request ids too and are retried safely.
 * Everything else is on `rpc`. On any platform: the entry point gives the connection (see
 * `connection.ts`); a page's refuses Admit, which streams both ways (`reserve` instead).
 */
import { msOfDuration } from "@berth/wire/time";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import type { Machine, Reservation } from "@berth/api/berth/budget/v1/budget_pb";
import {
  BudgetService,
  type CheckResponse,
  type GetLimitsResponse,
  type GetStateResponse,
  type Queued,
  type RegisterRunningResponse,
  type ReserveResponse,
  type BudgetEvent,
} from "@berth/api/berth/budget/v1/budget_service_pb";
import type { ServiceConnection } from "./connection.js";
import type { Endpoint } from "./endpoint.js";
import { BerthClientError, withBerthErrors } from "./errors.js";
import { callOptions, durationOfMs, linkedCall, type CallOptions } from "./options.js";
import { callWithRequestId, newRequestId } from "./request-ids.js";
import { followRevisionWatch, type RevisionWatchEvent, type RevisionWatchOptions } from "./revision-watch.js";
import {
  Admission,
  BUDGET_ERROR_DETAILS,
  costSourceOf,
  needOf,
  ResumableAdmitStream,
  type AdmitRequestInit,
  type NeedInput,
  type StartedOptions,
} from "./budget-admission.js";

export {
  Admission,
  appliance,
  BUDGET_ERROR_DETAILS,
  build,
  start,
  type ItemCost,
  type NeedInit,
  type NeedInput,
  type NeedItemInit,
  type StartedOptions,
} from "./budget-admission.js";

/** What {@link BudgetClientBase.watchBudget} yields. */
export type BudgetWatchEvent = RevisionWatchEvent<BudgetEvent>;

/** Options of {@link BudgetClientBase.watchBudget}. */
export interface BudgetWatchOptions extends RevisionWatchOptions {
  /**
   * Describe at most this many queued requests of the current state, in queue order
   * (`caughtUp`'s `queueSize` says how many wait in all); the changes after it concern every
   * request. Unset: all.
   */
  readonly queueLimit?: number | undefined;
}

/** Options of {@link BudgetClientBase.watchMachine}. */
export interface MachineWatchOptions extends CallOptions {
  /** Continue after this sample's revision (the last one the caller has). */
  readonly startRevision?: bigint | number | undefined;
  /** A `progress` whenever this long passed without a sample (at least 100 ms). */
  readonly progressIntervalMs?: number | undefined;
}

/** What {@link BudgetClientBase.watchMachine} yields: a sample with its revision (`reset`: samples before it were missed), or progress. */
export type MachineWatchEvent =
  | { readonly kind: "sample"; readonly machine: Machine; readonly revision: bigint; readonly reset: boolean }
  | { readonly kind: "progress"; readonly revision: bigint };

/**
 * How many events of the budget's current state one WatchBudget message carries: 10,000 queued
 * requests come in 10 messages rather than 10,000, each still yielded as its own event.
 */
const CURRENT_STATE_BATCH = 1000;

/**
 * How long an admission whose stream broke tries to resume it on a new connection, by default:
 * within the service's resume grace (15 s unless configured, GetLimits' `admit_resume_grace`).
 */
export const DEFAULT_ADMIT_RESUME_WITHIN_MS = 10_000;

/** Options of {@link BudgetClientBase.admit}. */
export interface AdmitOptions extends CallOptions {
  /** Who asks and for what, shown in the queue and the committed list. Default: `user@host pid N` in Node, `browser <name> <version> tab on <origin>` in a page. */
  readonly owner?: string | undefined;
  /**
   * How long to wait in the queue: 0 does not queue (admitted now or refused at once); unset, the
   * policy's longest wait. When it runs out: RESOURCE_EXHAUSTED WAIT_EXHAUSTED, with `refusal`.
   */
  readonly maxWaitMs?: number | undefined;
  /** Skip the cpu gate (pressure, load); the memory gates still apply. */
  readonly skipLoadGate?: boolean | undefined;
  /** Called while queued: at once, whenever the place or the reason changes, and as a heartbeat. */
  readonly onQueued?: ((queued: Queued) => void) | undefined;
  /** The admission's request id (default: a new UUID): what resumes it on a new stream after a break. */
  readonly requestId?: string | undefined;
  /**
   * How long to try resuming the admission on a new connection once its stream broke (default
   * {@link DEFAULT_ADMIT_RESUME_WITHIN_MS}); 0: never, the admission is lost with its stream, and
   * (unless `requestId` is given) it is sent without a request id, so that the service frees it the
   * moment its connection goes instead of keeping it for a resume that will not come.
   */
  readonly resumeWithinMs?: number | undefined;
}

/** What the keyed unary calls take besides the call's own options: their request id (default: a new UUID). */
export interface KeyedCallOptions extends CallOptions {
  readonly requestId?: string | undefined;
}

/** Options of {@link BudgetClientBase.reserve}. */
export interface ReserveOptions extends KeyedCallOptions {
  /** As in {@link AdmitOptions}. */
  readonly owner?: string | undefined;
  readonly maxWaitMs?: number | undefined;
  readonly skipLoadGate?: boolean | undefined;
  /** The reservation's lease, renewed by KeepAlive; unset: the service's default. */
  readonly ttlMs?: number | undefined;
}

/** A client of the budget service, on the connection its entry point gives it (`BudgetClient` of each entry). */
export class BudgetClientBase {
  /** The plain Connect client (Connect over HTTP/1.1), for every RPC but Admit; its errors are BerthClientErrors. */
  readonly rpc: Client<typeof BudgetService>;
  /** Where it connects; undefined when it was given a transport. */
  readonly endpoint: Endpoint | undefined;
  readonly #streams: () => Client<typeof BudgetService>;
  readonly #defaultOwner: () => string;

  constructor(connection: ServiceConnection) {
    this.endpoint = connection.endpoint;
    this.#defaultOwner = connection.defaultOwner;
    this.rpc = withBerthErrors(BudgetService, createClient(BudgetService, connection.unary), BUDGET_ERROR_DETAILS);
    let streams: Client<typeof BudgetService> | undefined;
    this.#streams = () => (streams ??= withBerthErrors(BudgetService, createClient(BudgetService, connection.streams()), BUDGET_ERROR_DETAILS));
  }

  /**
   * Waits for room for `need` (queued, with `onQueued` told the place, the ETA and why), then runs
   * `work` with the admission, and releases the reservation when `work` settles, answering (or
   * throwing) what `work` did. `timeoutMs` bounds the wait (DEADLINE_EXCEEDED); the signal
   * aborting withdraws the request, or, once admitted, ends the admission (`admission.signal`). A refusal is a BerthClientError with `refusal` (FAILED_PRECONDITION
   * IMPOSSIBLE, RESOURCE_EXHAUSTED QUEUE_FULL or WAIT_EXHAUSTED, with `retryAfterMs`). A stream
   * that breaks on the way is resumed on a new connection with the admission's request id, keeping
   * its place or its reservation (see {@link AdmitOptions.resumeWithinMs}).
   */
  async admit<T>(need: NeedInput, work: (admission: Admission) => Promise<T> | T, options: AdmitOptions = {}): Promise<T> {
    const call = linkedCall(options);
    const start: AdmitRequestInit = {
      kind: {
        case: "start",
        value: {
          need: needOf(need),
          owner: options.owner ?? this.#defaultOwner(),
          maxWait: durationOfMs(options.maxWaitMs),
          skipLoadGate: options.skipLoadGate ?? false,
          requestId: options.requestId ?? (options.resumeWithinMs === 0 ? "" : newRequestId()),
        },
      },
    };
    const stream = new ResumableAdmitStream(
      (requests, signal) => this.#streams().admit(requests, { signal })[Symbol.asyncIterator](),
      start,
      call.controller.signal,
      options.resumeWithinMs ?? DEFAULT_ADMIT_RESUME_WITHIN_MS,
    );
    const done = () => {
      call.dispose();
      stream.close();
      call.controller.abort();
    };
    let admission: Admission | undefined;
    try {
      while (admission === undefined) {
        const next = await stream.next();
        if (next.done) throw new ConnectError("the service ended the stream before admitting", Code.Unknown);
        const kind = next.value.kind;
        if (kind.case === "queued") options.onQueued?.(kind.value);
        else if (kind.case === "released")
          throw new ConnectError("the service released the admission while this client was away (the resume came after its grace)", Code.FailedPrecondition);
        else if (kind.case === "admitted") {
          const { reservation, waited } = kind.value;
          if (reservation === undefined) throw new ConnectError("the service admitted without a reservation", Code.Internal);
          // The deadline was the wait's: the admission is held until the work settles.
          call.clearDeadline();
          admission = new Admission(reservation, msOfDuration(waited) ?? 0, stream);
        }
      }
    } catch (error) {
      done();
      throw BerthClientError.from(error, BUDGET_ERROR_DETAILS);
    }
    // What `work` throws is its own: it passes through as it is.
    try {
      return await work(admission);
    } finally {
      await admission.release();
      done();
    }
  }

  /**
   * A reservation held by a lease, for a client that cannot hold a stream: waits in the queue like
   * `admit`, then lives until `release` or until its lease runs out without KeepAlive. Retried
   * safely with a request id: a retry is answered the first call's reservation, never a second one.
   */
  reserve(need: NeedInput, options: ReserveOptions = {}): Promise<ReserveResponse> {
    const request = {
      need: needOf(need),
      owner: options.owner ?? this.#defaultOwner(),
      maxWait: durationOfMs(options.maxWaitMs),
      skipLoadGate: options.skipLoadGate ?? false,
      ttl: durationOfMs(options.ttlMs),
    };
    return callWithRequestId((requestId) => this.rpc.reserve({ ...request, requestId }, callOptions(options)), options);
  }

  /** Releases a reservation: true when released by this call (or its first attempt), false when it was gone. Retried safely. */
  async release(reservationId: string, options: KeyedCallOptions = {}): Promise<boolean> {
    return (await callWithRequestId((requestId) => this.rpc.release({ reservationId, requestId }, callOptions(options)), options)).released;
  }

  /** The reservation's build phase is over: its build share goes back. Answers the reservation as it stands then. Retried safely. */
  async releaseBuild(reservationId: string, options: KeyedCallOptions = {}): Promise<Reservation | undefined> {
    return (await callWithRequestId((requestId) => this.rpc.releaseBuild({ reservationId, requestId }, callOptions(options)), options)).reservation;
  }

  /**
   * Counts a running service until `stopRunning`, its pid's end or its lease's (with `reservationId`,
   * its cost moves from that reservation). Retried safely: never counted twice.
   */
  registerRunning(
    name: string,
    options: StartedOptions & KeyedCallOptions & { readonly reservationId?: string | undefined } = {},
  ): Promise<RegisterRunningResponse> {
    const request = {
      name,
      costSource: costSourceOf(options),
      ...(options.pid === undefined ? {} : { pid: options.pid }),
      ttl: durationOfMs(options.ttlMs),
      ...(options.reservationId === undefined ? {} : { reservationId: options.reservationId }),
    };
    return callWithRequestId((requestId) => this.rpc.registerRunning({ ...request, requestId }, callOptions(options)), options);
  }

  /** Stops counting a running entry: true when stopped by this call (or its first attempt), false when it was gone. Retried safely. */
  async stopRunning(id: string, options: KeyedCallOptions = {}): Promise<boolean> {
    return (await callWithRequestId((requestId) => this.rpc.stopRunning({ id, requestId }, callOptions(options)), options)).stopped;
  }

  /** The verdict for `need` now, without admitting it: fits, impossible, or what it would wait for. */
  check(need: NeedInput, options: CallOptions & { readonly skipLoadGate?: boolean } = {}): Promise<CheckResponse> {
    return this.rpc.check({ need: needOf(need), skipLoadGate: options.skipLoadGate ?? false }, callOptions(options));
  }

  /**
   * Everything the budget holds: committed, the queue, the reservations, the running entries, the
   * policy and the machine. With `all`, each list in full (the rest fetched page by page; the page
   * tokens then come back empty); else the first page of each.
   */
  async state(options: CallOptions & { readonly pageSize?: number; readonly all?: boolean } = {}): Promise<GetStateResponse> {
    const call = callOptions(options);
    const pageSize = options.pageSize;
    const state = await this.rpc.getState({ pageSize }, call);
    if (options.all !== true) return state;
    for (let pageToken = state.queueNextPageToken; pageToken !== ""; ) {
      const page = await this.rpc.listQueue({ pageToken, pageSize }, call);
      state.queue.push(...page.queue);
      pageToken = page.nextPageToken;
    }
    for (let pageToken = state.reservationsNextPageToken; pageToken !== ""; ) {
      const page = await this.rpc.listReservations({ pageToken, pageSize }, call);
      state.reservations.push(...page.reservations);
      pageToken = page.nextPageToken;
    }
    for (let pageToken = state.runningNextPageToken; pageToken !== ""; ) {
      const page = await this.rpc.listRunning({ pageToken, pageSize }, call);
      state.running.push(...page.running);
      pageToken = page.nextPageToken;
    }
    state.queueNextPageToken = "";
    state.reservationsNextPageToken = "";
    state.runningNextPageToken = "";
    return state;
  }

  /** The last machine sample. */
  async machine(options?: CallOptions): Promise<Machine | undefined> {
    return (await this.rpc.getMachine({}, callOptions(options))).machine;
  }

  /**
   * The machine sample now, then every new one, each with its revision, until the loop breaks or
   * the signal aborts. With `startRevision` (the revision of the last sample the caller has), the
   * samples after it that the service still holds (nothing until the next sample when it was the
   * latest); one it cannot continue gets the latest sample with `reset` (samples between were
   * missed). With `progressIntervalMs`, a `progress` whenever no sample came for that long. Never
   * ended for lagging: a reader slower than the sampler gets the latest sample, its revision
   * showing how many it skipped.
   */
  async *watchMachine(options: MachineWatchOptions = {}): AsyncGenerator<MachineWatchEvent> {
    const request = { startRevision: BigInt(options.startRevision ?? 0), progressInterval: durationOfMs(options.progressIntervalMs) };
    for await (const response of this.rpc.watchMachine(request, callOptions(options))) {
      if (response.progress !== undefined) yield { kind: "progress", revision: response.revision };
      else if (response.machine !== undefined) yield { kind: "sample", machine: response.machine, revision: response.revision, reset: response.reset };
    }
  }

  /**
   * Every change of the budget (queue, reservations, running tally, policy) as WatchBudget sends
   * it, until the loop breaks or the signal aborts: with `includeCurrent`, the current state then
   * `caughtUp`; with `startRevision`, the changes after it then `caughtUp` (or the current state
   * and `caughtUp` with `reset` when they cannot be replayed: it replaces the caller's view);
   * neither, only the changes from now on; `progress` every `progressIntervalMs` of quiet. A watch
   * the service ends for falling behind (RESOURCE_EXHAUSTED WATCHER_LAGGED) resumes from the
   * revision its ErrorInfo names (`resumeRevision`), after a `resumed` event: nothing missed,
   * nothing repeated (or a reset, as above, once the service no longer holds what was missed). A
   * resume that lags again at once from the same revision throws.
   */
  async *watchBudget(options: BudgetWatchOptions = {}): AsyncGenerator<BudgetWatchEvent> {
    const progressInterval = durationOfMs(options.progressIntervalMs);
    const queueLimit = options.queueLimit ?? 0;
    yield* followRevisionWatch<BudgetEvent>(
      {
        open: (start, signal) => this.rpc.watchBudget({ ...start, progressInterval, maxBatch: CURRENT_STATE_BATCH, queueLimit }, { signal }),
        resumeRevision: (error) => {
          const revision = error.errorInfo?.metadata["resumeRevision"];
          return revision !== undefined && /^\d+$/.test(revision) ? BigInt(revision) : undefined;
        },
      },
      options,
    );
  }

  /** The limits the budget enforces: lease ttls, the longest wait, the queue's size. */
  limits(options?: CallOptions): Promise<GetLimitsResponse> {
    return this.rpc.getLimits({}, callOptions(options));
  }
}
