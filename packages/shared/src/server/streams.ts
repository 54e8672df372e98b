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
 *
 * One abort listener serves the whole iteration (added at the first `next()`, removed when the
 * source ends, fails or is returned), and each item costs one promise: a stream may carry
 * thousands of messages, and a listener added and removed plus a `Promise.race` per message
 * measured ~10 µs each on these machines. Pulls are expected one at a time, as `for await` makes them.
 */
export function abortable<T>(source: AsyncIterable<T>, signal: AbortSignal): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator]: () => new AbortableIterator<T>(source[Symbol.asyncIterator](), signal),
  };
}

/**
 * Ends `watcher` (its pending `next()` resolves done) when `signal` aborts, or at once when it has
 * aborted already: the client went away, its deadline ran out (0 included), or the server is
 * shutting down. For a source that ends cleanly when returned, as a store's watcher does, this is
 * cheaper than `abortable`: one listener, nothing per message, where a watcher stream may carry
 * thousands. The caller tells an abort from the watcher's own end by `signal.aborted`. Returns the
 * function that removes the listener.
 */
export function endOnAbort(watcher: AsyncIterator<unknown>, signal: AbortSignal): () => void {
  const end = () => void watcher.return?.();
  if (signal.aborted) {
    end();
    return () => {};
  }
  signal.addEventListener("abort", end, { once: true });
  return () => signal.removeEventListener("abort", end);
}

class AbortableIterator<T> implements AsyncIterator<T> {
  private listening = false;
  private finished = false;
  // The pull in flight: settled by the source, or rejected by the abort, whichever comes first.
  private resolvePull: ((result: IteratorResult<T>) => void) | undefined;
  private rejectPull: ((error: unknown) => void) | undefined;

  constructor(
    private readonly it: AsyncIterator<T>,
    private readonly signal: AbortSignal,
  ) {}

  next(): Promise<IteratorResult<T>> {
    if (this.signal.aborted) {
      this.abandon();
      return Promise.reject(abortError(this.signal));
    }
    if (this.finished) return Promise.resolve({ done: true, value: undefined });
    if (!this.listening) {
      this.signal.addEventListener("abort", this.onAbort, { once: true });
      this.listening = true;
    }
    const pull = new Promise<IteratorResult<T>>(this.capture);
    try {
      this.it.next().then(this.onItem, this.onError);
    } catch (error) {
      this.onError(error);
    }
    return pull;
  }

  return(value?: unknown): Promise<IteratorResult<T>> {
    this.stopListening();
    this.finished = true;
    // A pull still in flight is answered too, so that nothing is left waiting on it.
    const resolve = this.resolvePull;
    this.resolvePull = this.rejectPull = undefined;
    resolve?.({ done: true, value: value as T });
    return this.it.return ? this.it.return(value) : Promise.resolve({ done: true, value: value as T });
  }

  throw(error?: unknown): Promise<IteratorResult<T>> {
    this.stopListening();
    this.finished = true;
    return this.it.throw ? this.it.throw(error) : Promise.reject(error);
  }

  // Bound once per stream, so that a pull allocates nothing but its promise.
  private readonly capture = (resolve: (result: IteratorResult<T>) => void, reject: (error: unknown) => void): void => {
    this.resolvePull = resolve;
    this.rejectPull = reject;
  };

  private readonly onItem = (result: IteratorResult<T>): void => {
    const resolve = this.resolvePull;
    this.resolvePull = this.rejectPull = undefined;
    if (result.done === true) {
      this.finished = true;
      this.stopListening();
    }
    resolve?.(result);
  };

  private readonly onError = (error: unknown): void => {
    const reject = this.rejectPull;
    this.resolvePull = this.rejectPull = undefined;
    this.finished = true;
    this.stopListening();
    reject?.(error);
  };

  private readonly onAbort = (): void => {
    this.listening = false;
    const reject = this.rejectPull;
    this.resolvePull = this.rejectPull = undefined;
    // A pull is in flight (the source is blocked): end it now; the source is told to stop.
    if (reject) {
      this.abandon();
      reject(abortError(this.signal));
    }
  };

  private abandon(): void {
    this.stopListening();
    if (this.finished) return;
    this.finished = true;
    void this.it.return?.().catch(() => {});
  }

  private stopListening(): void {
    if (!this.listening) return;
    this.listening = false;
    this.signal.removeEventListener("abort", this.onAbort);
  }
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
