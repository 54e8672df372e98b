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
import type { MessageInitShape } from "@bufbuild/protobuf";
import { sizeOfBytes } from "@berth/wire/amounts";
import { msOfDuration } from "@berth/wire/time";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import {
  NeedItemKind,
  RefusalSchema,
  type Machine,
  type NeedItemSchema,
  type NeedSchema,
  type Reservation,
  type ResourcesSchema,
} from "@berth/api/berth/budget/v1/budget_pb";
import {
  BudgetService,
  type AdmitRequestSchema,
  type AdmitResponse,
  type CheckResponse,
  type GetLimitsResponse,
  type GetStateResponse,
  type Queued,
  type RegisterRunningResponse,
  type ReserveResponse,
  type BudgetEvent,
  type ReservationUpdated,
} from "@berth/api/berth/budget/v1/budget_service_pb";
import type { ServiceConnection } from "./connection.js";
import type { Endpoint } from "./endpoint.js";
import { BerthClientError, withBerthErrors } from "./errors.js";
import { callOptions, delay, durationOfMs, linkedCall, type CallOptions } from "./options.js";
import { callWithRequestId, connectionRefused, failedOnTheWay, newRequestId } from "./request-ids.js";
import { followRevisionWatch, type RevisionWatchEvent, type RevisionWatchOptions } from "./revision-watch.js";

/** What {@link BudgetClientBase.watchBudget} yields. */
export type BudgetWatchEvent = RevisionWatchEvent<BudgetEvent>;

/** Options of {@link BudgetClientBase.watchBudget}. */
export interface BudgetWatchOptions extends RevisionWatchOptions {
  /**
   * Describe at most this many queued requests of the current state, the head first (`caughtUp`'s
   * `queueSize` says how many wait in all); the changes after it concern every request. Unset: all.
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

/** The typed details the budget service sends with its errors. */
export const BUDGET_ERROR_DETAILS = [RefusalSchema] as const;

/** How long a release waits for the service's `released` before ending the stream, which releases too. */
const RELEASE_TIMEOUT_MS = 3_000;

/**
 * How long an admission whose stream broke tries to resume it on a new connection, by default:
 * within the service's resume grace (15 s unless configured, GetLimits' `admit_resume_grace`).
 */
export const DEFAULT_ADMIT_RESUME_WITHIN_MS = 10_000;
/** The first delay between two tries to resume; each next one doubles, up to a second. */
const RESUME_FIRST_DELAY_MS = 50;
const RESUME_MAX_DELAY_MS = 1_000;

export type NeedInit = MessageInitShape<typeof NeedSchema>;
export type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;
type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;

/**
 * What a need item declares: memory as a size like `512M` or `2G` (what the service reads), or as a
 * number of bytes already read (`parseMemory`'s); cpu in cores. Unset parts take the policy's defaults.
 */
export interface ItemCost {
  readonly memory?: string | number | undefined;
  readonly cpu?: number | undefined;
}

/** A service start: its run cost, held until it is reported started or the reservation released. */
export function start(name: string, cost: ItemCost = {}): NeedItemInit {
  return { kind: NeedItemKind.START, name, costSource: { case: "spec", value: spec(cost) } };
}

/** An appliance (a container, a database) that runs beside the services started. */
export function appliance(name: string, cost: ItemCost = {}): NeedItemInit {
  return { kind: NeedItemKind.APPLIANCE, name, costSource: { case: "spec", value: spec(cost) } };
}

/** A build before the start: its build cost, held until `buildDone`. */
export function build(name: string, cost: ItemCost & { readonly wave?: number; readonly skipped?: string } = {}): NeedItemInit {
  // The service costs a build by its spec's build part.
  const item: NeedItemInit = { kind: NeedItemKind.BUILD, name, costSource: { case: "spec", value: { build: spec(cost) } } };
  return { ...item, ...(cost.wave === undefined ? {} : { wave: cost.wave }), ...(cost.skipped === undefined ? {} : { skipped: cost.skipped }) };
}

/** The spec of `cost` as the wire carries it: bytes written as the size string that reads back exactly. */
function spec(cost: ItemCost): { memory?: string; cpu?: number } {
  const memory = typeof cost.memory === "number" ? sizeOfBytes(cost.memory) : cost.memory;
  return { ...(memory === undefined ? {} : { memory }), ...(cost.cpu === undefined ? {} : { cpu: cost.cpu }) };
}

/** A need: the message (or its init), or its items. */
export type NeedInput = NeedInit | readonly NeedItemInit[];

function needOf(need: NeedInput): NeedInit {
  return Array.isArray(need) ? { items: [...(need as readonly NeedItemInit[])] } : (need as NeedInit);
}

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

/** How a started service is counted: its run cost (bytes and cores) or a spec the service costs. */
export interface StartedOptions {
  readonly pid?: number | undefined;
  readonly cost?: MessageInitShape<typeof ResourcesSchema> | undefined;
  readonly spec?: ItemCost | undefined;
  /** A lease for the running entry, renewed by KeepAlive; unset: none (it ends with its pid or StopRunning). */
  readonly ttlMs?: number | undefined;
}

/** A running service's cost as a message's oneof: its cost, its spec, or neither (the default). */
function costSourceOf(options: StartedOptions) {
  return options.cost !== undefined
    ? { case: "cost" as const, value: options.cost }
    : options.spec !== undefined
      ? { case: "spec" as const, value: spec(options.spec) }
      : { case: undefined };
}

/** An exchange on the stream waiting for its answer (`updated` answers `build_done` and `started`, in order); sent again after a resume. */
interface Pending {
  request: AdmitRequestInit;
  resolve(value: ReservationUpdated): void;
  reject(error: unknown): void;
}

/**
 * The Admit conversation over one stream at a time: when the stream breaks on the way (not a
 * refusal, not this client's cancel), a new one is opened with the same start (its request id
 * resumes the admission) and read on, within `resumeWithinMs` of the break.
 */
class ResumableAdmitStream {
  #requests: RequestStream;
  #responses: AsyncIterator<AdmitResponse>;
  #leg: AbortController;

  constructor(
    private readonly open: (requests: RequestStream, signal: AbortSignal) => AsyncIterator<AdmitResponse>,
    private readonly start: AdmitRequestInit,
    private readonly signal: AbortSignal,
    private readonly resumeWithinMs: number,
  ) {
    ({ requests: this.#requests, responses: this.#responses, leg: this.#leg } = this.openLeg());
  }

  /** Sends on the current stream. */
  push(request: AdmitRequestInit): void {
    this.#requests.push(request);
  }

  /** Ends this side of the current stream. */
  end(): void {
    this.#requests.end();
  }

  /** Ends the current stream outright. */
  close(): void {
    this.#requests.end();
    this.#leg.abort();
  }

  /** The next answer; after a resume, `onResumed` is called first (to send again what was unanswered). */
  async next(onResumed?: () => void): Promise<IteratorResult<AdmitResponse>> {
    let giveUpAt: number | undefined;
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.#responses.next();
      } catch (error) {
        // Nothing listening any more: the service's process is gone, and the admission it kept with it.
        if (!failedOnTheWay(error, this.signal) || connectionRefused(error)) throw error;
        giveUpAt ??= Date.now() + this.resumeWithinMs;
        if (Date.now() >= giveUpAt) throw error;
        this.close();
        await delay(Math.min(RESUME_MAX_DELAY_MS, RESUME_FIRST_DELAY_MS * 2 ** attempt), this.signal);
        ({ requests: this.#requests, responses: this.#responses, leg: this.#leg } = this.openLeg());
        onResumed?.();
      }
    }
  }

  private openLeg() {
    const requests = new RequestStream();
    requests.push(this.start);
    const leg = new AbortController();
    const onAbort = () => leg.abort(this.signal.reason);
    if (this.signal.aborted) onAbort();
    else this.signal.addEventListener("abort", onAbort, { once: true });
    leg.signal.addEventListener("abort", () => this.signal.removeEventListener("abort", onAbort), { once: true });
    return { requests, responses: this.open(requests, leg.signal), leg };
  }
}

/**
 * An admission, held while the callback of {@link BudgetClientBase.admit} runs. `signal` aborts the
 * moment it is no longer held (released, or lost: the stream broke, and the service released it).
 */
export class Admission {
  readonly #controller = new AbortController();
  readonly #pending: Pending[] = [];
  #lost: BerthClientError | undefined;
  #released: ((id: string | undefined) => void) | undefined;
  readonly #releasedAnswer: Promise<string | undefined>;
  #releasedId: string | undefined;

  #releasing = false;

  /** @internal Made by {@link BudgetClientBase.admit}. */
  constructor(
    /** The reservation now held. */
    readonly reservation: Reservation,
    /** How long the request waited in the queue. */
    readonly waitedMs: number,
    private readonly stream: ResumableAdmitStream,
  ) {
    this.#releasedAnswer = new Promise((resolve) => (this.#released = resolve));
    void this.follow();
  }

  /** Aborted once the admission is no longer held. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Why the admission was lost, if it was (the stream failed); undefined while held and after the release. */
  get lost(): BerthClientError | undefined {
    return this.#lost;
  }

  /** The reservation id the service named when it confirmed the release; undefined before, or when the stream ended without it. */
  get releasedId(): string | undefined {
    return this.#releasedId;
  }

  /** The build phase is over: its share goes back. Answers the reservation as it stands now. */
  async buildDone(): Promise<Reservation | undefined> {
    return (await this.exchange({ kind: { case: "buildDone", value: {} } })).reservation;
  }

  /**
   * One of the services the reservation starts now runs: its cost leaves the reservation and is
   * counted in the running tally, which keeps it after the admission ends (until its pid is gone,
   * its lease ends, or StopRunning). Answers the reservation and the running entry made.
   */
  started(name: string, options: StartedOptions = {}): Promise<ReservationUpdated> {
    const costSource = costSourceOf(options);
    // A request id of its own: sent again after a resume, it is counted once.
    const value = { name, costSource, ...(options.pid === undefined ? {} : { pid: options.pid }), ttl: durationOfMs(options.ttlMs), requestId: newRequestId() };
    return this.exchange({ kind: { case: "started", value } });
  }

  private exchange(request: AdmitRequestInit): Promise<ReservationUpdated> {
    if (this.#controller.signal.aborted)
      return Promise.reject(this.#lost ?? BerthClientError.from(new ConnectError("the admission was released", Code.FailedPrecondition)));
    return new Promise((resolve, reject) => {
      this.#pending.push({ request, resolve, reject });
      this.stream.push(request);
    });
  }

  /** @internal Releases the reservation and ends the stream; resolves with the released id, if the service said so in time. */
  async release(): Promise<string | undefined> {
    if (this.#controller.signal.aborted) return undefined;
    this.#releasing = true;
    this.stream.push({ kind: { case: "release", value: {} } });
    this.stream.end();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timeout = new Promise<undefined>((resolve) => (timer = setTimeout(resolve, RELEASE_TIMEOUT_MS, undefined)));
    try {
      return await Promise.race([this.#releasedAnswer, timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /**
   * Reads the stream's answers after `admitted`, resuming it on a new stream after a break (what was
   * unanswered is sent again: a `started` carries its request id, a `build_done` is harmless twice);
   * its end or failure, unless released, is the loss of the admission.
   */
  private async follow(): Promise<void> {
    let failure: unknown;
    const resend = () => {
      for (const pending of this.#pending) this.stream.push(pending.request);
      if (this.#releasing) {
        this.stream.push({ kind: { case: "release", value: {} } });
        this.stream.end();
      }
    };
    try {
      for (;;) {
        const next = await this.stream.next(resend);
        if (next.done) break;
        const kind = next.value.kind;
        if (kind.case === "updated") this.#pending.shift()?.resolve(kind.value);
        else if (kind.case === "admitted") {
          // A resume tells the reservation it holds: the same one, or the admission was lost meanwhile.
          if (kind.value.reservation?.id !== this.reservation.id) {
            failure = new ConnectError("the admission was resumed to another reservation", Code.FailedPrecondition);
            break;
          }
        } else if (kind.case === "released" && !this.#releasing) {
          // The service ended the admission while this client was away (its resume grace ran out).
          failure = new ConnectError(
            `the service released reservation ${kind.value.reservationId} while this client was away (the resume came after its grace)`,
            Code.FailedPrecondition,
          );
          break;
        } else if (kind.case === "released") {
          this.#releasedId = kind.value.reservationId;
          this.#released?.(kind.value.reservationId);
          return this.end(new DOMException("the admission was released", "AbortError"));
        }
      }
    } catch (error) {
      failure = error;
    }
    this.#released?.(undefined);
    if (this.#controller.signal.aborted) return;
    this.#lost = BerthClientError.from(failure ?? new ConnectError("the service ended the admission", Code.Unavailable), BUDGET_ERROR_DETAILS);
    this.end(this.#lost);
  }

  private end(reason: unknown): void {
    for (const pending of this.#pending.splice(0)) pending.reject(this.#lost ?? reason);
    if (!this.#controller.signal.aborted) this.#controller.abort(reason);
  }
}

/** The client's messages on an Admit stream, written as the admission goes. */
class RequestStream implements AsyncIterable<AdmitRequestInit> {
  private readonly items: AdmitRequestInit[] = [];
  private ended = false;
  private wake: (() => void) | undefined;

  push(item: AdmitRequestInit): void {
    if (this.ended) return;
    this.items.push(item);
    this.poke();
  }

  end(): void {
    this.ended = true;
    this.poke();
  }

  private poke(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<AdmitRequestInit> {
    for (;;) {
      while (this.items.length === 0 && !this.ended) await new Promise<void>((resolve) => (this.wake = resolve));
      if (this.items.length === 0) return;
      yield this.items.shift()!;
    }
  }
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
