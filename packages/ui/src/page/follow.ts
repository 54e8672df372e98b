/**
 * A watch that outlives the service: when the stream ends or fails (a restart, a network error),
 * it is opened again after a short wait, growing to a few seconds while the service stays away,
 * until the page leaves. What each watch does on a new start is its own: most describe the
 * current state again and replace their view at `caughtUp`.
 */
import { Code } from "@connectrpc/connect";
import { BerthClientError } from "@berth/client/web";

/** How a watch stands, as the header shows it. */
export type LinkState =
  | { readonly kind: "connecting" }
  | { readonly kind: "live" }
  | { readonly kind: "retrying"; readonly reason: string; readonly at: number }
  | { readonly kind: "unauthenticated"; readonly reason: string }
  | { readonly kind: "unavailable"; readonly reason: string };

const FIRST_RETRY_MS = 250;
const LAST_RETRY_MS = 4000;

/** What a watch's body gets: the page leaving, and a way to say it is caught up (live). */
export interface FollowContext {
  readonly signal: AbortSignal;
  live(): void;
}

/**
 * Runs `body` until `signal` aborts, again after each end or failure. A refusal no retry can mend
 * (UNAUTHENTICATED; a service without the feature, FAILED_PRECONDITION or UNIMPLEMENTED) stops it
 * and says why; the caller starts it again when that changes (a new token).
 */
export async function follow(body: (context: FollowContext) => Promise<void>, onState: (state: LinkState) => void, signal: AbortSignal): Promise<void> {
  let wait = FIRST_RETRY_MS;
  while (!signal.aborted) {
    onState({ kind: "connecting" });
    try {
      await body({
        signal,
        live() {
          wait = FIRST_RETRY_MS;
          onState({ kind: "live" });
        },
      });
      if (signal.aborted) return;
      onState({ kind: "retrying", reason: "the stream ended", at: Date.now() + wait });
    } catch (caught) {
      if (signal.aborted) return;
      const error = BerthClientError.from(caught);
      if (error.code === Code.Unauthenticated || error.code === Code.PermissionDenied) {
        onState({ kind: "unauthenticated", reason: error.rawMessage });
        return;
      }
      if (error.code === Code.FailedPrecondition || error.code === Code.Unimplemented) {
        onState({ kind: "unavailable", reason: error.rawMessage });
        return;
      }
      onState({ kind: "retrying", reason: error.rawMessage, at: Date.now() + wait });
    }
    await pause(wait, signal);
    wait = Math.min(wait * 2, LAST_RETRY_MS);
  }
}

function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
    function done() {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    }
  });
}
