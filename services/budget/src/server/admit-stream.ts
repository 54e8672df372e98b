/**
 * The Admit stream: one admission held for as long as the stream lives.
 *
 * Everything that can happen to a stream (a message from the client, the client closing its side,
 * a queue position update, the admission, a refusal, the call being cancelled or the server
 * shutting down) arrives as one event on one channel, and one loop handles them in order. So the
 * stream is never reading and deciding at the same time, and however it ends, one `finally` drops
 * the queued request or releases the reservation — or, for a start with a request id whose stream
 * broke (the connection was lost), leaves the admission to wait for a resume for the grace
 * (resumable-admissions.ts).
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type HandlerContext } from "@connectrpc/connect";
import { wallTimeOf } from "@berth/shared/clock";
import type { AdmitRequest, AdmitResponseSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { checkRequestId } from "@berth/shared/safe-id";
import { abortError, callConnectionGone, streamHolds } from "@berth/shared/server/index";
import { sendsBinary } from "@berth/shared/server/pre-encoded";
import type { AdmitAttachment, QueuedUpdate, Reservation, ReservationSnapshot } from "../index.js";
import type { BudgetHandlerDeps } from "./handler-deps.js";
import { checkName, leaseTtlMs, maxWaitMs, needItemsFromProto, pidFromProto, runCostFromProto } from "./budget-decode.js";
import { durationOf, reservationToProto, runningAnswerToProto } from "./budget-encode.js";
import { QueuedEncoder } from "./queued-encoder.js";
import { refusalError } from "./refusals.js";

/** How far the shown deadline may drift from the wall clock before it is encoded again: a step, not jitter. */
const WALL_STEP_MS = 1000;

type AdmitResponseInit = MessageInitShape<typeof AdmitResponseSchema>;

/** INVALID_ARGUMENT OUT_OF_TURN: a message the conversation does not allow now (see the proto). */
function outOfTurn(field: string, rule: string): BerthError {
  return new BerthError("invalid_argument", `${field}: ${rule}`, { field, rule }, { reason: "OUT_OF_TURN" });
}

/** ABORTED ADMIT_RESUMED: another stream resumed this one's admission (see the proto). */
function resumedElsewhere(owner: string): BerthError {
  return new BerthError(
    "aborted",
    `the admission of ${JSON.stringify(owner)} was resumed by another Admit stream with its request_id; this stream lets go of it and releases nothing`,
    {},
    { reason: "ADMIT_RESUMED" },
  );
}

/**
 * Whether a call ended with `reason` because its connection broke (lost, reset, cut) rather than by
 * its client's own doing (a cancel, its deadline) or the service shutting down. Its connection being
 * gone says so (Node ends the streams of a closed connection with the very code of a client's
 * cancel); where the server did not record the connection (a call served in memory), the reason
 * does: none, ECONNRESET (ABORTED) or an HTTP/2 error code (INTERNAL).
 */
export function isBrokenConnection(reason: unknown, context: HandlerContext): boolean {
  if (reason instanceof ConnectError && (reason.code === Code.DeadlineExceeded || reason.code === Code.Unavailable)) return false;
  const gone = callConnectionGone(context);
  if (gone !== undefined) return gone;
  if (!(reason instanceof ConnectError)) return true;
  return reason.code === Code.Aborted || reason.code === Code.Internal || reason.code === Code.Unknown;
}

type AdmitEvent =
  | { type: "request"; request: AdmitRequest; taken: () => void }
  | { type: "taken-over" }
  | { type: "end" }
  | { type: "failed"; error: unknown }
  | { type: "aborted" }
  | { type: "queued"; update: QueuedUpdate }
  | { type: "admitted"; reservation: Reservation }
  | { type: "refused"; error: unknown };

/** A FIFO of events with one reader. Queue updates coalesce: a reader that fell behind gets the latest, not a backlog. */
class EventChannel {
  private items: AdmitEvent[] = [];
  private wake: (() => void) | undefined;

  push(event: AdmitEvent): void {
    const last = this.items[this.items.length - 1];
    if (event.type === "queued" && last?.type === "queued") this.items[this.items.length - 1] = event;
    else this.items.push(event);
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /** Puts an event ahead of everything pending (the call ended: nothing else matters). */
  pushFront(event: AdmitEvent): void {
    this.items.unshift(event);
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  async next(): Promise<AdmitEvent> {
    while (this.items.length === 0) await new Promise<void>((resolve) => (this.wake = resolve));
    return this.items.shift()!;
  }
}

/**
 * Reads the client's messages into the channel, one at a time: the next is read only once the
 * loop has handled the previous, so a client cannot pile messages up in the server.
 */
async function pump(iterator: AsyncIterator<AdmitRequest>, channel: EventChannel): Promise<void> {
  try {
    for (;;) {
      const result = await iterator.next();
      if (result.done) {
        channel.push({ type: "end" });
        return;
      }
      await new Promise<void>((taken) => channel.push({ type: "request", request: result.value, taken }));
    }
  } catch (error) {
    channel.push({ type: "failed", error });
  }
}

/** The Admit handler (see the service's proto for the conversation). */
export async function* admitStream(requests: AsyncIterable<AdmitRequest>, context: HandlerContext, deps: BudgetHandlerDeps): AsyncGenerator<AdmitResponseInit> {
  const { budget, clock } = deps;
  const channel = new EventChannel();
  const iterator = requests[Symbol.asyncIterator]();
  const onAbort = () => channel.pushFront({ type: "aborted" });
  context.signal.addEventListener("abort", onAbort, { once: true });
  if (context.signal.aborted) onAbort();
  void pump(iterator, channel);

  const dropQueued = new AbortController();
  let outcome: Promise<Reservation> | undefined;
  let reservation: Reservation | undefined;
  let attachment: AdmitAttachment | undefined;
  /** How the stream ended, once known: it broke (its admission waits for a resume), or not. */
  let broke: boolean | undefined;
  const brokeIf = (reason: unknown) => (broke = isBrokenConnection(reason, context));
  try {
    // The first message: the need.
    const first = await channel.next();
    if (first.type === "end") return; // the client left before asking for anything
    if (first.type === "aborted") throw abortError(context.signal);
    if (first.type === "failed") throw first.error;
    if (first.type !== "request") throw new Error(`admit: unexpected first event ${first.type}`);
    first.taken();
    const start = first.request.kind;
    if (start.case !== "start") throw outOfTurn("kind", `the first message must be start (the need); got ${start.case ?? "nothing"}`);

    const policy = budget.policy();
    const need = budget.needOf(needItemsFromProto(start.value.need, "start.need"));
    const owner = checkName(start.value.owner, "start.owner");
    const wait = maxWaitMs(start.value.maxWait, "start.max_wait", policy.maxWaitMs);
    const requestId = checkRequestId(start.value.requestId, "start.request_id");
    // Measured on the monotonic clock, shown as wall time: encoded again only if the wall clock steps.
    const deadlineAt = clock.monotonicNow() + wait;
    let deadline = QueuedEncoder.deadline(wallTimeOf(clock, deadlineAt));
    const binary = sendsBinary(context);

    streamHolds(context, `a place in the admission queue for ${JSON.stringify(owner)}`);
    const onQueued = (update: QueuedUpdate) => channel.push({ type: "queued", update });
    if (requestId === undefined) {
      outcome = budget.admit(need, owner, { maxWaitMs: wait, skipLoadGate: start.value.skipLoadGate, signal: dropQueued.signal, onQueued });
    } else {
      const attached = budget.admitResumable(
        requestId,
        need,
        owner,
        { maxWaitMs: wait, skipLoadGate: start.value.skipLoadGate },
        { onQueued, onTakenOver: () => channel.pushFront({ type: "taken-over" }) },
      );
      if ("ended" in attached) {
        // Its admission ended before: the first answer, then its end.
        yield admittedMessage(attached.ended);
        yield { kind: { case: "released", value: { reservationId: attached.ended.id } } };
        return;
      }
      attachment = attached;
      outcome = attached.outcome;
      if (attached.reservation !== undefined) {
        reservation = attached.reservation;
        streamHolds(context, `reservation ${reservation.id} for ${JSON.stringify(owner)}`);
        yield admittedMessage(reservation.snapshot());
      } else if (attached.queued !== undefined) {
        yield deps.encoder.response(attached.queued, deadline, binary);
      }
    }
    outcome.then(
      (admitted) => channel.push({ type: "admitted", reservation: admitted }),
      (error: unknown) => channel.push({ type: "refused", error }),
    );
    for (;;) {
      const event = await channel.next();
      switch (event.type) {
        case "aborted":
          brokeIf(context.signal.reason);
          throw abortError(context.signal);
        case "failed":
          brokeIf(context.signal.aborted ? context.signal.reason : event.error);
          throw event.error;
        case "taken-over":
          // Another stream resumed the admission: it is that stream's now.
          attachment = undefined;
          reservation = undefined;
          outcome = undefined;
          throw resumedElsewhere(owner);
        // The client closed its side: nothing more can come, so the admission is over.
        case "end":
          return;
        case "queued":
          if (reservation === undefined) {
            deps.stats.queuedMessages++;
            const shown = wallTimeOf(clock, deadlineAt);
            if (Math.abs(shown - deadline.ms) > WALL_STEP_MS) deadline = QueuedEncoder.deadline(shown);
            yield deps.encoder.response(event.update, deadline, binary);
          }
          break;
        case "admitted":
          // A resumed stream was told its reservation already.
          if (reservation === event.reservation) break;
          reservation = event.reservation;
          streamHolds(context, `reservation ${reservation.id} for ${JSON.stringify(owner)}`);
          yield admittedMessage(reservation.snapshot());
          break;
        case "refused":
          throw refusalError(event.error, { reasons: deps.reasonContext });
        case "request": {
          try {
            const request = event.request.kind;
            switch (request.case) {
              case "start":
                throw outOfTurn("start", "sent twice: one Admit stream admits one need");
              case "buildDone": {
                if (reservation === undefined) throw outOfTurn("build_done", "sent before admitted: wait for the admitted message");
                const updated = budget.releaseBuild(reservation.id);
                yield { kind: { case: "updated", value: { reservation: reservationToProto(updated, updated.runningIds) } } };
                break;
              }
              case "started": {
                if (reservation === undefined) throw outOfTurn("started", "sent before admitted: wait for the admitted message");
                const started = request.value;
                const name = checkName(started.name, "started.name");
                const { cost, declared } = runCostFromProto(started.costSource, budget.runCostOf(name, reservation.id), "started");
                const pid = pidFromProto(started.pid, "started.pid");
                const ttlMs = leaseTtlMs(started.ttl, "started.ttl", deps.leaseLimits(), { unsetIsNone: true });
                const startedId = checkRequestId(started.requestId, "started.request_id");
                const answer = await budget.consume(reservation.id, name, cost, { pid, ttlMs, requestId: startedId, declaredCost: declared });
                yield { kind: { case: "updated", value: runningAnswerToProto(answer) } };
                break;
              }
              case "release": {
                // While still queued, a release withdraws the request.
                const id = reservation?.id ?? "";
                if (reservation !== undefined) budget.release(reservation.id);
                yield { kind: { case: "released", value: { reservationId: id } } };
                return;
              }
              default:
                throw invalidArgument("kind", "must be one of start, build_done, started, release");
            }
          } finally {
            event.taken();
          }
          break;
        }
      }
    }
  } finally {
    context.signal.removeEventListener("abort", onAbort);
    if (attachment !== undefined) {
      // Ended by the connection breaking (seen here, or the stream stopped while it wrote): kept for a resume.
      const broken = broke ?? (context.signal.aborted && isBrokenConnection(context.signal.reason, context));
      attachment.end(broken ? "broken" : "done");
    } else {
      // However the stream ended: a queued request is dropped, a reservation (now or later) released.
      dropQueued.abort();
      outcome?.then(
        (admitted) => budget.release(admitted.id),
        () => {},
      );
    }
    void iterator.return?.()?.catch(() => {});
  }
}

/** The `admitted` message of a reservation as `snapshot` shows it. */
function admittedMessage(snapshot: ReservationSnapshot): AdmitResponseInit {
  return { kind: { case: "admitted", value: { reservation: reservationToProto(snapshot, snapshot.runningIds), waited: durationOf(snapshot.waitedMs) } } };
}
