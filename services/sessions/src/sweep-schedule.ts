/**
 * When a sweep of completed sessions runs: one at a time (a sweep asked for while one runs runs
 * again right after it), now when asked, else when the next known session falls due, at most
 * {@link MAX_SWEEP_PERIOD_MS} apart and at least {@link MIN_SWEEP_GAP_MS}. The stores' retentions
 * (retention.ts on files, etcd/etcd-retention.ts on etcd) decide what a sweep does; this decides
 * only when it runs.
 *
 * Due times are on the wall clock (an entry's `ts` plus the retention period); the timer's delays
 * are measured on the monotonic clock, and each sweep compares with the wall clock anew, so a step
 * of the wall clock moves the due times with it.
 */
import type { Clock, TimerHandle } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";

/** The longest time between two sweeps (and the wait after a failed one). */
export const MAX_SWEEP_PERIOD_MS = 60 * 60 * 1000;
/** The shortest time between two sweeps, however many sessions fall due one after the other. */
export const MIN_SWEEP_GAP_MS = 1000;

export interface SweepScheduleOptions {
  readonly clock: Clock;
  readonly logger?: Logger | undefined;
  /**
   * One sweep. It ends with {@link SweepSchedule.rearm} (the time the next is due), called in the
   * same turn as its last step, so that a clock driven by a test sees the timer at once.
   */
  readonly sweepOnce: () => Promise<void>;
  /**
   * True when nothing can fall due unless this process says so ({@link due}): no sweep is armed
   * while none is due. Otherwise (another writer may add work) one runs at least every
   * {@link MAX_SWEEP_PERIOD_MS}.
   */
  readonly onlyWhenDue?: boolean;
}

/** The schedule of one store's sweeps; see the module comment. */
export class SweepSchedule {
  private timer: TimerHandle | undefined;
  private dueAt = Infinity;
  private running: Promise<void> | undefined;
  private again = false;
  private stoppedNow = false;

  constructor(private readonly options: SweepScheduleOptions) {}

  /** True once {@link stop} was called: a sweep in progress ends at its next step. */
  get stopped(): boolean {
    return this.stoppedNow;
  }

  /** True while a sweep runs. */
  get sweeping(): boolean {
    return this.running !== undefined;
  }

  /** The earliest time a sweep is scheduled for (Infinity: none); for tests. */
  get nextSweepAt(): number {
    return this.dueAt;
  }

  /** Resolves once no sweep is running. */
  idle(): Promise<void> {
    return this.running ?? Promise.resolve();
  }

  /** Stops the timer; resolves once a sweep in progress has ended. */
  stop(): Promise<void> {
    this.stoppedNow = true;
    this.disarm();
    return this.running ?? Promise.resolve();
  }

  /** Sweeps now (or right after the sweep in progress). Never rejects. */
  sweep(): Promise<void> {
    if (this.stoppedNow) return Promise.resolve();
    if (this.running !== undefined) {
      this.again = true;
      return this.running;
    }
    const run = (async () => {
      do {
        this.again = false;
        try {
          await this.options.sweepOnce();
        } catch (error) {
          if (!this.stoppedNow) this.options.logger?.warn({ err: error }, "the sweep of completed sessions failed; it runs again later");
          this.arm(this.options.clock.now() + MAX_SWEEP_PERIOD_MS);
        }
      } while (this.again && !this.stoppedNow);
    })();
    this.running = run;
    void run.finally(() => {
      if (this.running === run) this.running = undefined;
    });
    return run;
  }

  /** Makes sure a sweep runs by `at` (wall clock, epoch ms). */
  due(at: number): void {
    if (this.stoppedNow || at >= this.dueAt) return;
    this.disarm();
    this.arm(at);
  }

  /** Schedules the next sweep by `at` (wall clock, epoch ms; Infinity: none is due), whatever was scheduled. */
  rearm(at: number): void {
    this.disarm();
    this.arm(at);
  }

  private arm(at: number): void {
    if (this.stoppedNow || this.timer !== undefined) return;
    if (at === Infinity && this.options.onlyWhenDue) return;
    const { clock } = this.options;
    const now = clock.now();
    const delay = Math.max(MIN_SWEEP_GAP_MS, Math.min(at, now + MAX_SWEEP_PERIOD_MS) - now);
    this.dueAt = now + delay;
    this.timer = clock.setTimeout(() => {
      this.timer = undefined;
      this.dueAt = Infinity;
      void this.sweep();
    }, delay);
  }

  private disarm(): void {
    if (this.timer !== undefined) this.options.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.dueAt = Infinity;
  }
}
