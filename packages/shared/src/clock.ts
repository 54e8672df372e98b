/**
 * Time as domain code sees it. Everything that waits (leases, queue deadlines, heartbeats) takes a
 * Clock, so tests drive time with `ManualClock.advance()` instead of sleeping.
 *
 * A Clock has two readings. The wall clock (`now()`) is what people read: it stamps journal
 * entries and the times shown to clients, and it jumps whenever NTP or a person sets it. The
 * monotonic clock (`monotonicNow()`) never jumps: every lease, deadline, heartbeat, TTL and age is
 * measured on it, so a step of the wall clock neither keeps a dead holder's lease nor ends a live
 * one. A deadline kept on the monotonic clock is shown as wall time at the moment of answering
 * ({@link wallTimeOf}).
 *
 * What has arrived on the sockets may not have been read yet when domain code decides: Node runs
 * due timers before it polls for I/O, and reads the sockets that are ready one after another. A
 * lease that runs out, or a release read from one socket, may so come before the end of a waiting
 * client's connection that is already there, on another socket or later on the same one; after a
 * pause (SIGSTOP, a suspended VM, a loop blocked for seconds) every timer is overdue and every
 * socket full of what happened meanwhile. `whenAwake()` is how domain code hands something out (a
 * lock, an admission) only once what has arrived has been read, so that nothing is handed to a
 * client that has left.
 */

/** An opaque handle to a scheduled callback. */
export type TimerHandle = { readonly __timer: unique symbol } | object;

export interface Clock {
  /** The wall clock: milliseconds since the epoch. Stamps what people read; may jump either way. */
  now(): number;
  /**
   * Milliseconds on a clock that never jumps (only differences mean anything). Every lease,
   * deadline, heartbeat and age is measured on it.
   */
  monotonicNow(): number;
  /** Calls `callback` once `ms` milliseconds of monotonic time have passed. */
  setTimeout(callback: () => void, ms: number): TimerHandle;
  clearTimeout(handle: TimerHandle): void;
  /**
   * Calls `fn` once the I/O that has arrived by now has been read (the system clock: right after
   * the event loop's next poll for I/O, in call order), so that a hand-off it makes sees every
   * client that has left by then. A test clock calls it at once, or after `ioRead()` following a stall.
   */
  whenAwake(fn: () => void): void;
}

/** The wall-clock time (whole ms since the epoch) a monotonic reading of `clock` stands for, as of now. */
export function wallTimeOf(clock: Pick<Clock, "now" | "monotonicNow">, monotonicMs: number): number {
  return wallTimesOf(clock)(monotonicMs);
}

/**
 * {@link wallTimeOf} for several readings shown in one answer: the two clocks are read once, so
 * the times shown keep the differences of the readings (two separate reads may be a tick apart).
 */
export function wallTimesOf(clock: Pick<Clock, "now" | "monotonicNow">): (monotonicMs: number) => number {
  const offset = clock.now() - clock.monotonicNow();
  return (monotonicMs) => Math.round(offset + monotonicMs);
}

/**
 * CLOCK_MONOTONIC in milliseconds (`process.hrtime`): system-wide, so a reading another process of
 * the same boot took means the same. It does not advance while the machine is suspended: a laptop
 * that sleeps sleeps with every holder and waiter on it, and none of their leases runs out meanwhile.
 */
export function systemMonotonicNow(): number {
  return Number(process.hrtime.bigint()) / 1e6;
}

/** Where a timer callback's throw goes; undefined: it is thrown, as Node does. */
let timerErrorReporter: ((error: unknown) => void) | undefined;

/**
 * Reports the errors thrown by callbacks of {@link systemClock}'s timers to `reporter` (the
 * service's log) instead of letting them end the process: a throw in a lease's or a queue's timer
 * (a file that cannot be opened with every descriptor taken, say) would otherwise take every lock,
 * lease and queue place the process keeps down with it. Returns the function that undoes it.
 */
export function reportTimerErrorsTo(reporter: (error: unknown) => void): () => void {
  const previous = timerErrorReporter;
  timerErrorReporter = reporter;
  return () => {
    if (timerErrorReporter === reporter) timerErrorReporter = previous;
  };
}

function guarded(callback: () => void): () => void {
  return () => {
    try {
      callback();
    } catch (error) {
      if (timerErrorReporter === undefined) throw error;
      timerErrorReporter(error);
    }
  };
}

/**
 * Late by more than this, a timer's callback was held up by a pause of the process (or a loop
 * blocked that long): other timers are overdue too, and may be earlier.
 */
export const STALL_MS = 1000;

/** The `whenAwake` calls waiting for the next check phase, in call order; undefined when none waits. */
let awaitingIo: Array<() => void> | undefined;

function systemWhenAwake(fn: () => void): void {
  if (awaitingIo !== undefined) {
    awaitingIo.push(fn);
    return;
  }
  const batch = [fn];
  awaitingIo = batch;
  // The check phase runs right after the poll phase: by then the loop has read every socket that
  // was ready, the ends of connections included (called from the check phase itself, the next one).
  setImmediate(() => {
    awaitingIo = undefined;
    for (const deferred of batch) guarded(deferred)();
  });
}

/** The real clock. Timers are unref'd: a pending lease or heartbeat never keeps a process alive. */
export const systemClock: Clock = {
  now: () => Date.now(),
  monotonicNow: systemMonotonicNow,
  setTimeout(callback, ms) {
    // Node's timers run on libuv's monotonic clock already: a wall-clock step does not move them.
    const timer = setTimeout(guarded(callback), Math.max(0, ms));
    timer.unref();
    return timer;
  },
  clearTimeout(handle) {
    clearTimeout(handle as ReturnType<typeof setTimeout>);
  },
  whenAwake: systemWhenAwake,
};

interface ManualTimer {
  due: number;
  order: number;
  callback: () => void;
}

/**
 * A clock that moves only when told to; due timers fire in time order (ties in scheduling order).
 * Its two readings move together under `advance()`; `stepWall()` moves the wall clock alone (NTP,
 * a person setting the date), and `stall()` moves time without running anything (a process
 * stopped with SIGSTOP: its timers are all overdue when it resumes). After a stall, `whenAwake()`
 * holds its calls until `ioRead()` says the I/O the pause left has been read.
 */
export class ManualClock implements Clock {
  private wall: number;
  private monotonic: number;
  private order = 0;
  private readonly timers = new Set<ManualTimer>();
  private awaitingIo: Array<() => void> | undefined;

  constructor(start = Date.UTC(2026, 0, 1), monotonicStart = 1_000_000) {
    this.wall = start;
    this.monotonic = monotonicStart;
  }

  now(): number {
    return this.wall;
  }

  monotonicNow(): number {
    return this.monotonic;
  }

  setTimeout(callback: () => void, ms: number): TimerHandle {
    const timer: ManualTimer = { due: this.monotonic + Math.max(0, ms), order: this.order++, callback };
    this.timers.add(timer);
    return timer;
  }

  clearTimeout(handle: TimerHandle): void {
    this.timers.delete(handle as ManualTimer);
  }

  /** Moves time forward by `ms`, firing every timer that falls due on the way (including ones they schedule). */
  advance(ms: number): void {
    const target = this.monotonic + ms;
    for (;;) {
      let next: ManualTimer | undefined;
      for (const timer of this.timers) {
        if (timer.due <= target && (!next || timer.due < next.due || (timer.due === next.due && timer.order < next.order))) {
          next = timer;
        }
      }
      if (!next) break;
      this.timers.delete(next);
      this.moveTo(Math.max(this.monotonic, next.due));
      next.callback();
    }
    this.moveTo(target);
  }

  /** Steps the wall clock alone by `ms` (negative: back); the monotonic clock and the timers do not move. */
  stepWall(ms: number): void {
    this.wall += ms;
  }

  /**
   * Moves both readings by `ms` without firing anything, as a stopped process sees time when it
   * resumes. The next `advance()` (`advance(0)` for none more) fires what fell due, in time order.
   */
  stall(ms: number): void {
    this.moveTo(this.monotonic + ms);
    this.awaitingIo ??= [];
  }

  whenAwake(fn: () => void): void {
    if (this.awaitingIo === undefined) fn();
    else this.awaitingIo.push(fn);
  }

  /** The I/O a stall left has been read: runs what `whenAwake()` held, in call order. */
  ioRead(): void {
    const held = this.awaitingIo ?? [];
    this.awaitingIo = undefined;
    for (const fn of held) fn();
  }

  /** How many timers are still scheduled (tests use it to prove nothing is left behind). */
  pendingTimers(): number {
    return this.timers.size;
  }

  private moveTo(monotonic: number): void {
    this.wall += monotonic - this.monotonic;
    this.monotonic = monotonic;
  }
}
