/**
 * Many changes, one render: a panel's view is plain data changed in place as events arrive, and
 * the components that show it render at most once a frame however many events came (a busy box
 * sends hundreds a second).
 */
import { useEffect, useState } from "preact/hooks";

/** Tells subscribers, once per animation frame, that the data they show changed. */
export class Changes {
  readonly #listeners = new Set<() => void>();
  #scheduled = false;

  /** Call after changing the data; the render follows on the next frame. */
  changed(): void {
    if (this.#scheduled) return;
    this.#scheduled = true;
    requestAnimationFrame(() => {
      this.#scheduled = false;
      for (const listener of this.#listeners) listener();
    });
  }

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
