/**
 * A Reserve with a request id that is still waiting: every call carrying that id (a client's
 * retries) waits on the one queued request, each up to its own wait.
 */
import type { Clock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import type { QueuedRequest } from "./admission-queue.js";
import type { ReservationSnapshot } from "./reservations.js";

/** A Reserve still waiting, shared by every call that carries its request id. */
export interface PendingReserve {
  promise: Promise<ReservationSnapshot>;
  /** The calls waiting on it: the queued request is dropped when the last one goes. */
  callers: number;
  drop: AbortController;
  /** Its place in the queue, once queued: each call moves its wait or gives up on its own. */
  queued: QueuedRequest | undefined;
}

/**
 * One more call waiting on `pending`, up to its own wait of `waitMs`: it gives up on its own
 * deadline (WAIT_EXHAUSTED where the request stands) or signal; `lastLeft` is called when the last
 * one leaves, to drop the place.
 */
export function joinPendingReserve(
  clock: Clock,
  requestId: string,
  pending: PendingReserve,
  waitMs: number,
  signal: AbortSignal | undefined,
  lastLeft: () => void,
): Promise<ReservationSnapshot> {
  pending.callers++;
  const deadline = clock.monotonicNow() + waitMs;
  if (pending.queued !== undefined && deadline > pending.queued.deadline) pending.queued.waitUntil(deadline);
  return new Promise<ReservationSnapshot>((resolve, reject) => {
    let left = false;
    // Fires at the call's own deadline; the call whose deadline is the request's is refused by the queue.
    const timer = clock.setTimeout(() => {
      const queued = pending.queued;
      if (left || queued === undefined || queued.deadline <= deadline) return;
      leave();
      reject(queued.exhausted(waitMs));
    }, waitMs);
    const leave = () => {
      if (left) return;
      left = true;
      clock.clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
      pending.callers--;
      if (pending.callers === 0) lastLeft();
    };
    const onAbort = () => {
      leave();
      reject(new BerthError("cancelled", `the Reserve with request id ${requestId} was withdrawn: its caller disconnected`, { kind: "cancelled" }));
    };
    if (signal?.aborted) return onAbort();
    signal?.addEventListener("abort", onAbort, { once: true });
    pending.promise.then(
      (admitted) => {
        if (left) return;
        leave();
        resolve(admitted);
      },
      (error: unknown) => {
        if (left) return;
        leave();
        reject(error);
      },
    );
  });
}
