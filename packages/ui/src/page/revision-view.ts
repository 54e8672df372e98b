/**
 * A view kept from a revision watch started with the current state: the state described before
 * `caughtUp` replaces the view at once (no half-filled list on screen); after it, each change
 * applies as it comes. A resume after the service ended the watch for falling behind replays what
 * was missed, applied at its `caughtUp`, or, when the service could no longer replay it, describes
 * the current state again (`reset`), which replaces the view.
 */
import type { RevisionWatchEvent } from "@berth/client/web";

/** The `caughtUp` that ended a description of the current state. */
export type CaughtUp = Extract<RevisionWatchEvent<unknown>, { kind: "caughtUp" }>;

/** What a panel keeps from a watch. */
export interface RevisionView<E> {
  replace(current: readonly E[], caughtUp: CaughtUp): void;
  apply(event: E): void;
}

/** Feeds `events` to `view` until they end; `live()` once the current state is on screen. */
export async function keepView<E>(events: AsyncIterable<RevisionWatchEvent<E>>, view: RevisionView<E>, live: () => void): Promise<void> {
  let held: E[] | undefined = [];
  let replaceAtCaughtUp = true;
  for await (const event of events) {
    if (event.kind === "event") {
      if (held === undefined) view.apply(event.event);
      else held.push(event.event);
    } else if (event.kind === "caughtUp" && held !== undefined) {
      if (replaceAtCaughtUp || event.reset) view.replace(held, event);
      else for (const change of held) view.apply(change);
      held = undefined;
      live();
    } else if (event.kind === "resumed") {
      held = [];
      replaceAtCaughtUp = false;
    }
  }
}
