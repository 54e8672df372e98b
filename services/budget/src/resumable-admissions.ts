/**
 * Admissions that outlive a broken stream: an Admit whose start carried a request id keeps its
 * place in the queue, or its reservation, for a grace period after its stream broke, so that the
 * client can reconnect and resume it with the same id and the same request.
 *
 * An admission is attached to at most one stream at a time. A resume attaches the new stream: it
 * is told where the admission stands (its place, or its reservation) and waits up to its own wait
 * from then on; a stream still attached (the service had not seen its break yet) is told it was
 * taken over and lets go without releasing anything. A stream that breaks detaches: nothing is
 * handed to anyone meanwhile (a waiter whose turn comes is admitted and its reservation held, to
 * be handed to the stream that resumes), and when the grace runs out unresumed the request is
 * dropped or the reservation released. A stream that ends otherwise (its client released, closed
 * its side or cancelled, or the service refused a message) ends the admission at once.
 *
 * The request id follows the service's one rule (@berth/shared/idempotency): remembered while the
 * request waits or its reservation lives, then for the window, answered the first answer
 * (`admitted` as first sent) once the reservation ended; a request dropped while it waited records
 * nothing.
 */
import type { Clock, TimerHandle } from "@berth/shared/clock";
import type { IdempotencyMemory, KeyedRequest } from "@berth/shared/idempotency";
import type { Logger } from "@berth/shared/logger";
import type { AdmitOptions, QueuedRequest } from "./admission-queue.js";
import type { Need } from "./costs.js";
import { naming, type BudgetAnswer } from "./keyed-requests.js";
import type { QueuedUpdate } from "./queue-line.js";
import type { Reservation, ReservationSnapshot } from "./reservations.js";

/** How long a broken Admit stream with a request id keeps its place or reservation by default. */
export const DEFAULT_ADMIT_RESUME_GRACE_MS = 15_000;

/** The stream an admission is attached to: how to tell it things. */
export interface AdmitStreamHooks {
  /** The place changed (or a heartbeat), as `AdmitOptions.onQueued`. */
  onQueued(update: QueuedUpdate): void;
  /** Another stream resumed the admission: this one lets go, releasing nothing. */
  onTakenOver(): void;
}

/** How a stream ended: it broke (the connection was lost), or it is done (released, closed, cancelled, refused). */
export type AdmitStreamEnd = "broken" | "done";

/** An admission attached to a stream. */
export interface AdmitAttachment {
  /** True when this stream resumed an admission another stream started. */
  readonly resumed: boolean;
  /** Where a resumed admission stands: its reservation (admitted meanwhile) or its last place. */
  readonly reservation: Reservation | undefined;
  readonly queued: QueuedUpdate | undefined;
  /** Admitted, or refused. */
  readonly outcome: Promise<Reservation>;
  /** The stream ended (see {@link AdmitStreamEnd}); a stream that was taken over changes nothing. */
  end(how: AdmitStreamEnd): void;
}

/** What attaching answers: the admission, or, once it ended, its first answer. */
export type AttachResult = { ended: ReservationSnapshot } | AdmitAttachment;

/** What the admissions need from the budget around them. */
export interface ResumableAdmissionsHost {
  clock: Clock;
  logger: Logger;
  graceMs: number;
  keys: IdempotencyMemory<BudgetAnswer>;
  admit(need: Need, owner: string, options: AdmitOptions): Promise<Reservation>;
  release(reservationId: string): void;
}

interface Resumable {
  readonly requestId: string;
  readonly request: KeyedRequest;
  readonly owner: string;
  readonly drop: AbortController;
  outcome: Promise<Reservation>;
  queued: QueuedRequest | undefined;
  lastQueued: QueuedUpdate | undefined;
  reservation: Reservation | undefined;
  stream: AdmitStreamHooks | undefined;
  grace: TimerHandle | undefined;
  /** Ended by its stream, or its grace ran out: what is admitted from now on is released at once. */
  finished: boolean;
}

/** The Admit streams' admissions that carry request ids; see the module comment. */
export class ResumableAdmissions {
  private readonly active = new Map<string, Resumable>();

  constructor(private readonly host: ResumableAdmissionsHost) {}

  /**
   * Attaches `stream` to the admission of `requestId`: a new one (queued behind everyone), or the
   * one the id names (resumed), or, once that one ended, its first answer. Throws already_exists
   * IDEMPOTENCY_KEY_REUSED when the id names another request.
   */
  attach(
    requestId: string,
    request: KeyedRequest,
    need: Need,
    owner: string,
    options: { maxWaitMs: number; skipLoadGate: boolean },
    stream: AdmitStreamHooks,
  ): AttachResult {
    const known = this.host.keys.recall(requestId, request);
    const live = this.active.get(requestId);
    if (known?.phase === "ended" || (known !== undefined && known.phase !== "pending" && live === undefined)) {
      return { ended: (known.answer as { reservation: ReservationSnapshot }).reservation };
    }
    if (live === undefined || live.finished) return this.start(requestId, request, need, owner, options, stream);

    // A resume: the stream still attached (its break not seen yet) lets go.
    const previous = live.stream;
    live.stream = stream;
    if (live.grace !== undefined) this.host.clock.clearTimeout(live.grace);
    live.grace = undefined;
    previous?.onTakenOver();
    // Its own wait, from now.
    if (live.reservation === undefined) live.queued?.waitUntil(this.host.clock.monotonicNow() + options.maxWaitMs);
    this.host.logger.info({ requestId, owner, admitted: live.reservation !== undefined }, "budget: an Admit stream resumed its admission");
    return this.attachment(live, stream, true);
  }

  /** A reservation was released (by its stream, Release, its grace, the service closing): its admission is over. */
  released(reservation: Reservation): void {
    const requestId = reservation.requestId;
    if (requestId === undefined) return;
    const admission = this.active.get(requestId);
    if (admission?.reservation !== reservation) return;
    this.forget(admission);
  }

  /** Stops every grace timer (the service is closing; the queue and the reservations are closed by the budget). */
  close(): void {
    for (const admission of this.active.values()) if (admission.grace !== undefined) this.host.clock.clearTimeout(admission.grace);
    this.active.clear();
  }

  private start(
    requestId: string,
    request: KeyedRequest,
    need: Need,
    owner: string,
    options: { maxWaitMs: number; skipLoadGate: boolean },
    stream: AdmitStreamHooks,
  ): AdmitAttachment {
    const admission: Resumable = {
      requestId,
      request,
      owner,
      drop: new AbortController(),
      outcome: Promise.resolve(undefined as never),
      queued: undefined,
      lastQueued: undefined,
      reservation: undefined,
      stream,
      grace: undefined,
      finished: false,
    };
    this.active.set(requestId, admission);
    this.host.keys.begin(requestId, request);
    admission.outcome = this.host.admit(need, owner, {
      maxWaitMs: options.maxWaitMs,
      skipLoadGate: options.skipLoadGate,
      signal: admission.drop.signal,
      onQueued: (update) => {
        admission.lastQueued = update;
        admission.stream?.onQueued(update);
      },
      onQueuedRequest: (queued) => (admission.queued = queued),
    });
    admission.outcome.then(
      (reservation) => {
        reservation.requestId = requestId;
        admission.reservation = reservation;
        this.host.keys.answered(requestId, naming(request, { reservationId: reservation.id }), { reservation: reservation.snapshot() });
        // Nobody to hand it to any more: the grace ran out, or the stream ended, as it was admitted.
        if (admission.finished) this.host.release(reservation.id);
        else if (admission.stream === undefined)
          this.host.logger.info({ requestId, owner }, "budget: admitted while its Admit stream was away; held for a resume");
      },
      () => {
        // Refused or dropped: nothing recorded, the id is free for a new request.
        if (this.active.get(requestId) === admission) this.forget(admission);
      },
    );
    return this.attachment(admission, stream, false);
  }

  private attachment(admission: Resumable, stream: AdmitStreamHooks, resumed: boolean): AdmitAttachment {
    return {
      resumed,
      reservation: resumed ? admission.reservation : undefined,
      queued: resumed && admission.reservation === undefined ? admission.lastQueued : undefined,
      outcome: admission.outcome,
      end: (how) => {
        if (admission.stream !== stream) return;
        admission.stream = undefined;
        if (how === "broken" && !admission.finished) {
          admission.grace = this.host.clock.setTimeout(() => {
            admission.grace = undefined;
            this.host.logger.info(
              { requestId: admission.requestId, owner: admission.owner, admitted: admission.reservation !== undefined },
              "budget: an Admit stream that broke was not resumed within the grace; its admission ends",
            );
            this.finish(admission);
          }, this.host.graceMs);
          return;
        }
        this.finish(admission);
      },
    };
  }

  /** Ends an admission: drops its queued request, or releases its reservation. */
  private finish(admission: Resumable): void {
    if (admission.finished) return;
    admission.finished = true;
    if (admission.grace !== undefined) this.host.clock.clearTimeout(admission.grace);
    admission.grace = undefined;
    admission.drop.abort();
    if (admission.reservation !== undefined) this.host.release(admission.reservation.id);
  }

  private forget(admission: Resumable): void {
    if (admission.grace !== undefined) this.host.clock.clearTimeout(admission.grace);
    admission.grace = undefined;
    admission.finished = true;
    if (this.active.get(admission.requestId) === admission) {
      this.active.delete(admission.requestId);
      // Refused or dropped before an answer: nothing kept (an answered id stays, ended by the book).
      this.host.keys.forget(admission.requestId);
    }
  }
}
