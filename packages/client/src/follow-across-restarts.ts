/**
 * A watch followed across restarts of its service: when the stream ends or fails (the service
 * restarted, the network went away), it is opened again after a short wait, doubling while the
 * service stays away and back to the first once the watch is live again, until the caller's signal
 * aborts or a refusal no retry can mend. Where a new stream starts (a seq, a revision, the current
 * state) is the caller's, as is what the states look like on its screen. A watch resumes after
 * WATCHER_LAGGED by itself (`revision-watch.ts`, `SessionsClientBase.watch`); this is what a
 * long-lived viewer (a page, a tool) adds on top, for the process going away.
 */
import { Code } from "@connectrpc/connect";
import { BerthClientError } from "./errors.js";
import { delay } from "./options.js";

/** How a followed watch stands. */
export type FollowState =
  /** A stream is being opened. */
  | { readonly kind: "connecting" }
  /** The stream is caught up: what comes now is news. */
  | { readonly kind: "live" }
  /** The stream ended (`error` undefined) or failed; it is opened again after `delayMs`. */
  | { readonly kind: "retrying"; readonly delayMs: number; readonly error: BerthClientError | undefined }
  /** A refusal no retry can mend: following has stopped. */
  | { readonly kind: "stopped"; readonly error: BerthClientError };

/** What the body that opens and reads one stream gets. */
export interface FollowContext {
  /** The caller's signal: the stream's too. */
  readonly signal: AbortSignal;
  /** Says the stream is caught up: the state is `live`, and the next wait is the first again. */
  live(): void;
}

/** Options of {@link followAcrossRestarts}. */
export interface FollowOptions {
  /** Stops following (no more states once it aborts). */
  readonly signal: AbortSignal;
  /** Hears each state as it changes. */
  readonly onState?: ((state: FollowState) => void) | undefined;
  /**
   * Whether a failure is one no retry can mend (following stops). Default: a token refused
   * (UNAUTHENTICATED, PERMISSION_DENIED); a watch that has refusals of its own (a session that is
   * not there, a feature the service does not have) names them too.
   */
  readonly isFinal?: ((error: BerthClientError) => boolean) | undefined;
  /** The first wait before a stream is opened again (default 250 ms); it doubles after each failure. */
  readonly firstDelayMs?: number | undefined;
  /** The longest wait (default 4 s). */
  readonly maxDelayMs?: number | undefined;
}

const FIRST_DELAY_MS = 250;
const MAX_DELAY_MS = 4_000;

/** Whether a refusal is of the caller's token, which no retry with it can mend. */
export function tokenRefused(error: BerthClientError): boolean {
  return error.code === Code.Unauthenticated || error.code === Code.PermissionDenied;
}

/**
 * Runs `body` (which opens a stream and reads it to its end) until the signal aborts, again after
 * each end or failure; resolves once the signal aborts or a failure is final (after a `stopped`
 * state). `body` calls `live()` once its stream is caught up.
 */
export async function followAcrossRestarts(body: (context: FollowContext) => Promise<void>, options: FollowOptions): Promise<void> {
  const { signal } = options;
  const report = options.onState ?? (() => undefined);
  const isFinal = options.isFinal ?? tokenRefused;
  const firstDelayMs = options.firstDelayMs ?? FIRST_DELAY_MS;
  const maxDelayMs = options.maxDelayMs ?? MAX_DELAY_MS;
  let wait = firstDelayMs;
  const context: FollowContext = {
    signal,
    live() {
      wait = firstDelayMs;
      report({ kind: "live" });
    },
  };
  while (!signal.aborted) {
    report({ kind: "connecting" });
    let failure: BerthClientError | undefined;
    try {
      await body(context);
    } catch (caught) {
      failure = BerthClientError.from(caught);
    }
    if (signal.aborted) return;
    if (failure !== undefined && isFinal(failure)) {
      report({ kind: "stopped", error: failure });
      return;
    }
    report({ kind: "retrying", delayMs: wait, error: failure });
    try {
      await delay(wait, signal);
    } catch {
      return; // the signal aborted
    }
    wait = Math.min(wait * 2, maxDelayMs);
  }
}
