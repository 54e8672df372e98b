/**
 * Ending streams when the server shuts down. Handlers observe `context.signal` (which the
 * server-wide shutdown signal aborts with UNAVAILABLE) and end on their own; the interceptor here
 * is the backstop for a stream whose handler does not, so that shutdown never waits on it.
 */
import { Code, ConnectError, type Interceptor, type StreamResponse } from "@connectrpc/connect";

/** The error open streams end with when the server shuts down. */
export function shuttingDownError(): ConnectError {
  return new ConnectError("server shutting down", Code.Unavailable);
}

/**
 * The error to end a call with once `signal` is aborted: its reason when that is a ConnectError
 * (the shutdown signal's UNAVAILABLE, a deadline's DEADLINE_EXCEEDED), else CANCELED.
 */
export function abortError(signal: AbortSignal): ConnectError {
  const reason: unknown = signal.reason;
  if (reason instanceof ConnectError) return reason;
  return new ConnectError("the call was cancelled", Code.Canceled, undefined, undefined, reason);
}

/** A promise that rejects with `abortError(signal)` when `signal` aborts, and a way to stop listening. */
function whenAborted(signal: AbortSignal): { promise: Promise<never>; dispose: () => void } {
  let dispose = () => {};
  const promise = new Promise<never>((_resolve, reject) => {
    if (signal.aborted) {
      reject(abortError(signal));
      return;
    }
    const onAbort = () => reject(abortError(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    dispose = () => signal.removeEventListener("abort", onAbort);
  });
  // The race below may never consult this promise; an unobserved rejection must not crash.
  promise.catch(() => {});
  return { promise, dispose };
}

/**
 * Iterates `source` until `signal` aborts, then throws `abortError(signal)` even while `source`
 * is blocked waiting for its next item (a client-sent stream, a watcher with nothing new). The
 * abandoned source is asked to `return()` in the background so its `finally` blocks run once it
 * wakes up.
 */
export function abortable<T>(source: AsyncIterable<T>, signal: AbortSignal): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator]() {
      const it = source[Symbol.asyncIterator]();
      const abandon = () => {
        void it.return?.().catch(() => {});
      };
      return {
        async next() {
          if (signal.aborted) {
            abandon();
            throw abortError(signal);
          }
          const aborted = whenAborted(signal);
          try {
            return await Promise.race([it.next(), aborted.promise]);
          } catch (error) {
            if (signal.aborted) abandon();
            throw error;
          } finally {
            aborted.dispose();
          }
        },
        return: (value?: unknown) => (it.return ? it.return(value) : Promise.resolve({ done: true as const, value: value as T })),
        throw: (error?: unknown) => (it.throw ? it.throw(error) : Promise.reject(error)),
      };
    },
  };
}

/**
 * Ends every streaming call with `abortError(forceSignal)` once `forceSignal` aborts: the response
 * stream stops at its next wait, and a client-streaming handler still reading its input is
 * abandoned. Unary calls are left alone: they are short and shutdown waits for them.
 */
export function createStreamShutdownInterceptor(forceSignal: AbortSignal): Interceptor {
  return (next) => async (req) => {
    if (!req.stream) return next(req);
    const aborted = whenAborted(forceSignal);
    let res: StreamResponse;
    try {
      res = (await Promise.race([next(req), aborted.promise])) as StreamResponse;
    } finally {
      aborted.dispose();
    }
    return { ...res, message: abortable(res.message, forceSignal) };
  };
}
