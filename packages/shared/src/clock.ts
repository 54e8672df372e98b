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
 * A process that resumes after a pause (SIGSTOP, a suspended VM, a loop blocked for seconds) finds
 * its timers overdue and its sockets full of what happened meanwhile: clients that left, releases,
 * renewals. Which of the two it handles first is up to the event loop. `whenAwake()` is how domain
 * code hands something out (a lock, an admission) only once that backlog has been read, so that
 * nothing is handed to a client that left during the pause.
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
   * Calls `fn` now; or, when the process has just resumed after a pause, once the I/O that piled up
   * meanwhile has been read (calls deferred so run in call order).
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

/** No tick of the loop for this long: the process was paused (or its loop blocked) and has just resumed. */
export const STALL_MS = 1000;
/** How often the loop notes that it is alive, while anything asks whether it just woke. */
const TICK_MS = 250;

/** What {@link systemClock} knows of the loop's pauses. */
const wake = {
  lastTick: 0,
  ticker: undefined as ReturnType<typeof setInterval> | undefined,
  /** A pause was seen and the I/O it left has not been read yet: these wait for it. */
  deferred: undefined as Array<() => void> | undefined,
};

/** A pause was seen: everything handed to `whenAwake` waits for the next check phase, right after the loop's poll for I/O. */
function pauseSeen(): void {
  if (wake.deferred !== undefined) return;
  const deferred: Array<() => void> = [];
  wake.deferred = deferred;
  setImmediate(() => {
    wake.deferred = undefined;
    wake.lastTick = systemMonotonicNow();
    for (const fn of deferred) guarded(fn)();
  });
}

/**
 * Starts noting the loop's ticks, from the first timer or `whenAwake` on: from then on there is
 * timed state (a lease, a deadline) that a pause can overtake.
 */
function watchForPauses(): void {
  if (wake.ticker !== undefined) return;
  wake.lastTick = systemMonotonicNow();
  // The tick notices a pause by its own gap: when the loop runs its overdue timers before its I/O,
  // the first of them is this tick (it was due soonest), and the rest wait.
  wake.ticker = setInterval(() => {
    const tick = systemMonotonicNow();
    if (tick - wake.lastTick > STALL_MS) pauseSeen();
    wake.lastTick = tick;
  }, TICK_MS);
  wake.ticker.unref();
}

function systemWhenAwake(fn: () => void): void {
  watchForPauses();
  // When the loop reads its I/O first, the tick has not run yet: its age says the loop was away.
  if (systemMonotonicNow() - wake.lastTick > STALL_MS) pauseSeen();
  if (wake.deferred === undefined) fn();
  else wake.deferred.push(fn);
}

/** The real clock. Timers are unref'd: a pending lease or heartbeat never keeps a process alive. */
export const systemClock: Clock = {
  now: () => Date.now(),
  monotonicNow: systemMonotonicNow,
  setTimeout(callback, ms) {
    watchForPauses();
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
