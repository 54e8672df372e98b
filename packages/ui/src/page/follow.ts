/**
 * A watch that outlives the service: the client's `followAcrossRestarts` (opened again after a
 * short wait, growing to a few seconds while the service stays away, until the page leaves), its
 * states as the header shows them. What each watch does on a new start is its own: most describe
 * the current state again and replace their view at `caughtUp`.
 */
import { Code } from "@connectrpc/connect";
import { followAcrossRestarts, tokenRefused, type BerthClientError, type FollowContext } from "@berth/client/web";

export type { FollowContext };

/** How a watch stands, as the header shows it. */
export type LinkState =
  | { readonly kind: "connecting" }
  | { readonly kind: "live" }
  | { readonly kind: "retrying"; readonly reason: string; readonly at: number }
  | { readonly kind: "unauthenticated"; readonly reason: string }
  | { readonly kind: "unavailable"; readonly reason: string };

/**
 * Runs `body` until `signal` aborts, again after each end or failure. A refusal no retry can mend
 * (UNAUTHENTICATED; a service without the feature, FAILED_PRECONDITION or UNIMPLEMENTED) stops it
 * and says why; the caller starts it again when that changes (a new token).
 */
export function follow(body: (context: FollowContext) => Promise<void>, onState: (state: LinkState) => void, signal: AbortSignal): Promise<void> {
  return followAcrossRestarts(body, {
    signal,
    isFinal: (error) => stopped(error) !== undefined,
    onState(state) {
      if (state.kind === "retrying") onState({ kind: "retrying", reason: state.error?.rawMessage ?? "the stream ended", at: Date.now() + state.delayMs });
      else if (state.kind === "stopped") onState(stopped(state.error)!);
      else onState(state);
    },
  });
}

/** What the header says of a refusal no retry can mend; undefined for any other failure. */
function stopped(error: BerthClientError): LinkState | undefined {
  if (tokenRefused(error)) return { kind: "unauthenticated", reason: error.rawMessage };
  if (error.code === Code.FailedPrecondition || error.code === Code.Unimplemented) return { kind: "unavailable", reason: error.rawMessage };
  return undefined;
}
