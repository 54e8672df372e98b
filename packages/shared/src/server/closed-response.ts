/**
 * Ending a stream's response writer when the client goes away in the middle of a write.
 *
 * connect-node writes each message of a stream and, when the response cannot take it at once (the
 * client reads slowly: HTTP/2 flow control, a full socket), waits for the response's `drain` or
 * `error` before it asks the handler for the next one. A response closed under that wait, because
 * the client reset the stream (RST_STREAM CANCEL: a grpc-js `cancel()`), closed the connection or
 * dropped its socket, emits neither — over HTTP/2 the waiting write's callback even reports
 * success. The wait then never ends: the handler stays parked at its `yield` with its `finally`
 * never run (where an Admit stream drops its queue place or releases its reservation, so the budget
 * would keep them for good), the stream is never logged and `berth_streams_open` never comes down.
 */
import type { EventEmitter } from "node:events";

/** The part of a Node server response (HTTP/1.1 or HTTP/2) used here. */
type Response = Pick<EventEmitter, "emit" | "listenerCount"> & { readonly writableEnded: boolean };

/** What a write still waiting when the client went away fails with (connect-node treats this code as the client gone). */
function clientGone(): Error {
  return Object.assign(new Error("the client went away while a message was being written"), { code: "ERR_STREAM_DESTROYED" });
}

/**
 * Called when `res` closes: fails the write waiting on it, if any, when it closed before it ended.
 * connect-node then throws the failure into the stream's handler, as for any failed write, and the
 * stream ends CANCELED. A response that ended normally, or closed with no write waiting, is left
 * alone.
 */
export function failWaitingWrite(res: Response): void {
  // Only a write in progress listens for `error` on a response (nothing else in the server does).
  if (res.writableEnded || res.listenerCount("error") === 0) return;
  res.emit("error", clientGone());
}
