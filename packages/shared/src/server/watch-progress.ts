/**
 * A watch's progress notifications, the same in every service: the checked `progress_interval`,
 * and pulling a watcher's items with progress notifications: the next item, or — when an interval
 * passes first — a marker that nothing came, after which the same pull goes on. A watch sends a
 * progress message on the marker (etcd's progress notifications), so an idle client knows its
 * stream is alive and up to date.
 *
 * One pull is in flight at a time and each gets exactly one callback, however many intervals pass
 * while it waits: an idle watch stays constant in memory for days. The interval's timer runs on
 * the injected clock, so tests drive it without waiting.
 */
import type { Duration } from "@bufbuild/protobuf/wkt";
import type { Clock, TimerHandle } from "../clock.js";
import { invalidArgument } from "../errors.js";
import { durationInputMs } from "./duration-input.js";

/** The shortest `progress_interval` a watch accepts. */
export const MIN_PROGRESS_INTERVAL_MS = 100;

/**
 * A watch's `progress_interval` in ms, checked: undefined (no progress messages) when unset or
 * zero; shorter than {@link MIN_PROGRESS_INTERVAL_MS}, or negative, is INVALID_ARGUMENT naming the field.
 */
export function progressIntervalMs(interval: Duration | undefined, field = "progress_interval"): number | undefined {
  const ms = durationInputMs(interval, field);
  if (ms === undefined || ms === 0) return undefined;
  if (ms < MIN_PROGRESS_INTERVAL_MS) throw invalidArgument(field, `must be unset, zero or at least ${MIN_PROGRESS_INTERVAL_MS}ms`);
  return ms;
}

/** What {@link ProgressPuller.next} answers when the interval passed without an item. */
export const PROGRESS = Symbol("progress");

type Outcome<T> = { result: IteratorResult<T> } | { error: unknown };

/** The items of `source`, or {@link PROGRESS} when an interval passes first. */
export class ProgressPuller<T> {
  private outcome: Outcome<T> | undefined;
  private pulling = false;
  private wake: (() => void) | undefined;

  constructor(
    private readonly source: AsyncIterator<T>,
    private readonly clock: Clock,
  ) {}

  /**
   * The next item; with `intervalMs`, {@link PROGRESS} if that long passes first (the pull is
   * kept: the next call continues waiting for the same item). Rejects as the source does.
   */
  async next(intervalMs?: number): Promise<IteratorResult<T> | typeof PROGRESS> {
    if (this.outcome === undefined && !this.pulling) this.pull();
    if (this.outcome === undefined) {
      const passed = await new Promise<boolean>((resolve) => {
        let timer: TimerHandle | undefined;
        this.wake = () => {
          this.wake = undefined;
          if (timer !== undefined) this.clock.clearTimeout(timer);
          resolve(false);
        };
        if (intervalMs !== undefined && intervalMs > 0) {
          timer = this.clock.setTimeout(() => {
            this.wake = undefined;
            resolve(true);
          }, intervalMs);
        }
      });
      if (passed) return PROGRESS;
    }
    const outcome = this.outcome!;
    this.outcome = undefined;
    if ("error" in outcome) throw outcome.error;
    return outcome.result;
  }

  private pull(): void {
    this.pulling = true;
    this.source.next().then(
      (result) => this.settle({ result }),
      (error: unknown) => this.settle({ error }),
    );
  }

  private settle(outcome: Outcome<T>): void {
    this.pulling = false;
    this.outcome = outcome;
    this.wake?.();
  }
}
