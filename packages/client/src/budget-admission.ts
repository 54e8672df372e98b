/**
 * What an admission holds and how it is held: the need items (`start`, `build`, `appliance`) and
 * their declared costs as the wire carries them, and the {@link Admission} over its Admit stream,
 * which a broken connection resumes on a new one.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { sizeOfBytes } from "@berth/wire/amounts";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  NeedItemKind,
  RefusalSchema,
  type NeedItemSchema,
  type NeedSchema,
  type Reservation,
  type ResourcesSchema,
} from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema, AdmitResponse, ReservationUpdated } from "@berth/api/berth/budget/v1/budget_service_pb";
import { BerthClientError } from "./errors.js";
import { delay, durationOfMs } from "./options.js";
import { connectionRefused, failedOnTheWay, newRequestId } from "./request-ids.js";

/** The typed details the budget service sends with its errors. */
export const BUDGET_ERROR_DETAILS = [RefusalSchema] as const;

/** How long a release waits for the service's `released` before ending the stream, which releases too. */
const RELEASE_TIMEOUT_MS = 3_000;

/** The first delay between two tries to resume; each next one doubles, up to a second. */
const RESUME_FIRST_DELAY_MS = 50;
const RESUME_MAX_DELAY_MS = 1_000;

export type NeedInit = MessageInitShape<typeof NeedSchema>;
export type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;
export type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;

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

/** @internal A need as its message init, from the message or its items. */
export function needOf(need: NeedInput): NeedInit {
  return Array.isArray(need) ? { items: [...(need as readonly NeedItemInit[])] } : (need as NeedInit);
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
export function costSourceOf(options: StartedOptions) {
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
export class ResumableAdmitStream {
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
