/**
 * Time as domain code sees it. Everything that waits (leases, queue deadlines, heartbeats) takes a
 * Clock, so tests drive time with `ManualClock.advance()` instead of sleeping.
 */

/** An opaque handle to a scheduled callback. */
export type TimerHandle = { readonly __timer: unique symbol } | object;

export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  setTimeout(callback: () => void, ms: number): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
}

/** The real clock. Timers are unref'd: a pending lease or heartbeat never keeps a process alive. */
export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout(callback, ms) {
    const timer = setTimeout(callback, Math.max(0, ms));
    timer.unref();
    return timer;
  },
  clearTimeout(handle) {
    clearTimeout(handle as ReturnType<typeof setTimeout>);
  },
};

interface ManualTimer {
  due: number;
  order: number;
  callback: () => void;
}

/** A clock that moves only when told to; due timers fire in time order (ties in scheduling order). */
export class ManualClock implements Clock {
  private current: number;
  private order = 0;
  private readonly timers = new Set<ManualTimer>();

  constructor(start = Date.UTC(2026, 0, 1)) {
    this.current = start;
  }

  now(): number {
    return this.current;
  }

  setTimeout(callback: () => void, ms: number): TimerHandle {
    const timer: ManualTimer = { due: this.current + Math.max(0, ms), order: this.order++, callback };
    this.timers.add(timer);
    return timer;
  }

  clearTimeout(handle: TimerHandle): void {
    this.timers.delete(handle as ManualTimer);
  }

  /** Moves time forward by `ms`, firing every timer that falls due on the way (including ones they schedule). */
  advance(ms: number): void {
    const target = this.current + ms;
    for (;;) {
      let next: ManualTimer | undefined;
      for (const timer of this.timers) {
        if (timer.due <= target && (!next || timer.due < next.due || (timer.due === next.due && timer.order < next.order))) {
          next = timer;
        }
      }
      if (!next) break;
      this.timers.delete(next);
      this.current = Math.max(this.current, next.due);
      next.callback();
    }
    this.current = target;
  }

  /** How many timers are still scheduled (tests use it to prove nothing is left behind). */
  pendingTimers(): number {
    return this.timers.size;
  }
}
