/**
 * Grants that must reach their caller: a lease or a reservation handed to a call whose answer is
 * never delivered would be held, for its whole ttl, by a caller that does not know it holds it.
 *
 * The server watches each call's response (`trackAnswerDelivery`): delivered when it is complete
 * as it closes (every byte, trailers included, handed to the connection), lost when it is not (the
 * write failed, the client reset the stream, the connection closed). connect-node
 * ends a call's signal when its handler returns, before the answer is written, so the signal alone
 * cannot tell; `whenAnswerLost` can. An answer written out whole before the service read that its
 * client had left counts as delivered: nothing on the server can tell it from one that was read.
 */
import { createContextKey, type HandlerContext } from "@connectrpc/connect";
import type { Clock } from "../clock.js";
import { abortError } from "./streams.js";

/** The fate of one call's answer, as its response tells it. */
export class AnswerDelivery {
  private state: "pending" | "delivered" | "lost" = "pending";
  private readonly onLost = new Set<() => void>();

  /** Whether the answer has been delivered, lost, or neither yet. */
  get outcome(): "pending" | "delivered" | "lost" {
    return this.state;
  }

  delivered(): void {
    if (this.state !== "pending") return;
    this.state = "delivered";
    this.onLost.clear();
  }

  lost(): void {
    if (this.state !== "pending") return;
    this.state = "lost";
    const listeners = [...this.onLost];
    this.onLost.clear();
    for (const listener of listeners) listener();
  }

  /** Calls `listener` once if the answer is lost (at once when it already is); never once it is delivered. */
  whenLost(listener: () => void): void {
    if (this.state === "lost") listener();
    else if (this.state === "pending") this.onLost.add(listener);
  }
}

/** The part of a Node server response (HTTP/1.1 or HTTP/2) watched here. */
interface WatchedResponse {
  once(event: "close", listener: () => void): unknown;
  readonly writableFinished: boolean;
  /** HTTP/2 only. */
  readonly stream?: { readonly sentTrailers?: unknown };
}

/**
 * Watches `res`, judged when it closes: delivered when it was complete by then. Over HTTP/2 a
 * response is complete once its trailers went out (the compat layer ends every response with
 * them): a stream the client reset emits `finish` all the same, without them.
 */
export function trackAnswerDelivery(res: WatchedResponse): AnswerDelivery {
  const delivery = new AnswerDelivery();
  res.once("close", () => {
    const complete = res.writableFinished && (res.stream === undefined || res.stream.sentTrailers !== undefined);
    if (complete) delivery.delivered();
    else delivery.lost();
  });
  return delivery;
}

/** Where a handler finds its call's {@link AnswerDelivery}; undefined for a call served without a response to watch (in memory, in tests). */
export const answerDeliveryKey = createContextKey<AnswerDelivery | undefined>(undefined, { description: "the delivery of the call's answer" });

/** Calls `onLost` once if the answer of `context`'s call is not delivered; never for a call whose answer is not watched. */
export function whenAnswerLost(context: HandlerContext, onLost: () => void): void {
  context.values.get(answerDeliveryKey)?.whenLost(onLost);
}

/**
 * Hands a grant over to the call that asked for it (a lease, a reservation), or undoes it. First
 * waits until what has arrived on the connections has been read (`clock.whenAwake`): a client that
 * left before then has been seen to. If the call has ended by then, runs `undo` and throws the
 * call's end (CANCELED, its deadline, shutdown); else arranges for `undo` to run should the answer
 * not be delivered. `undo` undefined keeps the grant either way (a call with a request id: its
 * retry must find what it was granted).
 */
export async function handOverGrant(context: HandlerContext, clock: Pick<Clock, "whenAwake">, undo: (() => unknown) | undefined): Promise<void> {
  await new Promise<void>((resolve) => clock.whenAwake(resolve));
  if (context.signal.aborted) {
    if (undo !== undefined) await undoQuietly(undo);
    throw abortError(context.signal);
  }
  if (undo !== undefined) whenAnswerLost(context, () => void undoQuietly(undo));
}

/** Runs `undo`; a failure is the domain's to log (an etcd lease left to expire, say): the call's answer stays what it was. */
async function undoQuietly(undo: () => unknown): Promise<void> {
  try {
    await undo();
  } catch {
    // See above.
  }
}
