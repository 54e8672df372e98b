/** Options every service client and every call share. */
import type { Duration } from "@bufbuild/protobuf/wkt";
import { optionalDurationFromMs } from "@berth/wire/time";
import { Code, ConnectError } from "@connectrpc/connect";

/**
 * Deadlines and cancellation, on every call: `signal` cancels (the call fails with CANCELED; a
 * stream held for a lock or an admission ends, which frees what it held), `timeoutMs` is the
 * call's deadline (DEADLINE_EXCEEDED; for a lock or an admission, the deadline of the wait).
 * `AbortSignal.timeout(ms)` works as a signal too.
 */
export interface CallOptions {
  readonly signal?: AbortSignal | undefined;
  readonly timeoutMs?: number | undefined;
}

/** Connect's call options from ours. */
export function callOptions(options: CallOptions | undefined): { signal?: AbortSignal; timeoutMs?: number } {
  const out: { signal?: AbortSignal; timeoutMs?: number } = {};
  if (options?.signal !== undefined) out.signal = options.signal;
  if (options?.timeoutMs !== undefined) out.timeoutMs = options.timeoutMs;
  return out;
}

/** Resolves after `ms`, or rejects with the signal's reason once it aborts. */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** A Duration of `ms` milliseconds (see wire-time: rounded to the millisecond; undefined stays undefined; negative is a RangeError). */
export function durationOfMs(ms: number | undefined): Duration | undefined {
  return optionalDurationFromMs(ms);
}

/** A stream call's own abort controller, linked to the caller's signal and deadline. */
export interface LinkedCall {
  /** Aborts with the caller's reason when its signal aborts, with DEADLINE_EXCEEDED when the deadline passes. */
  readonly controller: AbortController;
  /** Stops the deadline (a lock or an admission, once granted). */
  clearDeadline(): void;
  /** Stops listening to the caller's signal and clears the deadline. */
  dispose(): void;
}

/**
 * The controller of a stream call, which this package aborts itself when it is done with the
 * stream (a loop broken, a lock released) so that nothing of the call outlives it, and whose
 * deadline timer never keeps the process alive.
 */
export function linkedCall(options: CallOptions | undefined): LinkedCall {
  const controller = new AbortController();
  const signal = options?.signal;
  const onAbort = () => controller.abort(signal?.reason);
  if (signal?.aborted) onAbort();
  else signal?.addEventListener("abort", onAbort, { once: true });
  const timeoutMs = options?.timeoutMs;
  let timer: ReturnType<typeof setTimeout> | undefined;
  if (timeoutMs !== undefined) {
    timer = setTimeout(() => controller.abort(new ConnectError(`the deadline (${timeoutMs} ms) passed`, Code.DeadlineExceeded)), timeoutMs);
    // Node's timers keep the process alive unless unref'd; a browser's are numbers, with nothing to keep alive.
    (timer as { unref?: () => void }).unref?.();
  }
  return {
    controller,
    clearDeadline: () => clearTimeout(timer),
    dispose() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    },
  };
}
