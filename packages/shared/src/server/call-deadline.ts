/**
 * The time a call has left before its deadline, on the monotonic clock.
 *
 * connect-es keeps a call's deadline as a wall time fixed when the call arrived, and
 * `HandlerContext.timeoutMs()` is that wall time minus `Date.now()`: a step of the wall clock after
 * the call arrived moves it by the step (hours, for NTP or a person setting the date), while the
 * call's real deadline, its abort signal, runs on a timer and does not move. A lock wait bounded by
 * the former would end at once after a step forward, or outlive the deadline after a step back.
 */
import type { HandlerContext } from "@connectrpc/connect";
import { callStateKey } from "./logging.js";

/**
 * The milliseconds left before the call's deadline (negative once past it), or undefined when the
 * caller set none. Measured from the call's arrival on the monotonic clock when the server recorded
 * it (every call through `startServer`); otherwise connect's wall-clock reading.
 */
export function callTimeLeftMs(context: HandlerContext): number | undefined {
  const wallLeft = context.timeoutMs();
  if (wallLeft === undefined) return undefined;
  const state = context.values.get(callStateKey);
  if (state === undefined) return wallLeft;
  // connect's deadline, a wall time fixed at arrival, less the wall time at arrival: the timeout the
  // caller asked for, whatever the wall clock did since. Both wall readings are taken in the same
  // turn of the event loop (start-server stamps the request synchronously before handing it to
  // connect, which makes the context before its first await): an await between them would break it.
  const timeoutMs = wallLeft + Date.now() - state.arrivedAtWallMs;
  return timeoutMs - (performance.now() - state.started);
}
