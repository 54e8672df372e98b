/**
 * Many changes, one render: a panel's view is plain data changed in place as events arrive, and
 * the components that show it render at most once a frame however many events came (a busy box
 * sends hundreds a second), and under a stream of changes at most every MIN_RENDER_INTERVAL_MS.
 */
import { useEffect, useState } from "preact/hooks";

/**
 * The least time between two renders of one view while changes keep coming: each render lays out
 * and paints the whole panel (a list reordered by its latest change moves every row), so one a
 * frame kept the main thread about half busy at 100 events a second; a first change after a quiet
 * spell still shows on the next frame.
 */
const MIN_RENDER_INTERVAL_MS = 50;

/** Tells subscribers, on an animation frame, that the data they show changed. */
export class Changes {
  readonly #listeners = new Set<() => void>();
  #scheduled = false;
  #renderedAt = Number.NEGATIVE_INFINITY;

  /** Call after changing the data; the render follows on the next frame, or a little later under a stream of changes. */
  changed(): void {
    if (this.#scheduled) return;
    this.#scheduled = true;
    const wait = this.#renderedAt + MIN_RENDER_INTERVAL_MS - performance.now();
    if (wait <= 0) requestAnimationFrame(this.#render);
    else setTimeout(() => requestAnimationFrame(this.#render), wait);
  }

  readonly #render = (): void => {
    this.#scheduled = false;
    this.#renderedAt = performance.now();
    for (const listener of this.#listeners) listener();
  };

  subscribe(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
}

/** Re-renders the component on each frame its data changed; returns a number that grows with them. */
export function useChanges(changes: Changes): number {
  const [version, setVersion] = useState(0);
  useEffect(() => changes.subscribe(() => setVersion((v) => v + 1)), [changes]);
  return version;
}

/** The time now, refreshed every `everyMs` (countdowns and ages). */
export function useNow(everyMs = 1000): number {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), everyMs);
    return () => clearInterval(timer);
  }, [everyMs]);
  return now;
}
