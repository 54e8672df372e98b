/**
 * A watcher over an async source (an etcd watch): the source is pulled from the start, its items
 * wait in a buffer for the reader, and `takeBuffered` hands out what is already there. Items
 * before the live point (a backlog) are pulled only as the reader takes them; live items are
 * pulled as they come, and a reader more than `maxBuffered` live items behind is ended with the
 * error `lagged` makes (WATCHER_LAGGED naming where to resume), as the file store's watchers are.
 * An error the source throws reaches the reader after the items pulled before it: it names where
 * the source got to (etcd's compaction names the last seq it delivered), so none may be dropped.
 */
import type { BerthError } from "@berth/shared/errors";
import type { EventWatcher } from "../session-store-api.js";

export interface PumpedWatcherOptions<T> {
  /** The source; `signal` aborts when the watcher ends. */
  readonly source: (signal: AbortSignal) => AsyncIterable<T>;
  readonly maxBuffered: number;
  /** Whether an item (pulled in order) is live: counted against the bound, never paced. */
  readonly isLive: (item: T) => boolean;
  /** Told of each item the reader takes, in order. */
  readonly delivered?: (item: T) => void;
  /** The error that ends a watcher whose reader fell behind. */
  readonly lagged: () => BerthError;
  /** Called once when the watcher ends, however. */
  readonly ended?: () => void;
}

export class PumpedWatcher<T> implements EventWatcher<T> {
  private readonly queue: Array<{ item: T; live: boolean }> = [];
  private liveQueued = 0;
  private failure: unknown;
  private sourceDone = false;
  private finished = false;
  private wakeReader: (() => void) | undefined;
  private wakePuller: (() => void) | undefined;
  private readonly abort = new AbortController();

  constructor(private readonly options: PumpedWatcherOptions<T>) {
    void this.pump();
  }

  private async pump(): Promise<void> {
    try {
      for await (const item of this.options.source(this.abort.signal)) {
        // Ended, or failed from outside (fail() emptied the queue): nothing more is queued.
        if (this.finished || this.failure !== undefined) break;
        const live = this.options.isLive(item);
        if (live) {
          if (this.liveQueued >= this.options.maxBuffered) {
            this.fail(this.options.lagged());
            break;
          }
          this.liveQueued++;
        } else {
          // A backlog is read as fast as the reader takes it, not faster.
          while (this.queue.length >= this.options.maxBuffered && !this.finished && this.failure === undefined)
            await new Promise<void>((resolve) => (this.wakePuller = resolve));
          if (this.finished || this.failure !== undefined) break;
        }
        this.queue.push({ item, live });
        this.wakeReader?.();
      }
    } catch (error) {
      if (!this.finished) this.failure ??= error;
    } finally {
      this.sourceDone = true;
      this.wakeReader?.();
    }
  }

  async next(): Promise<IteratorResult<T>> {
    for (;;) {
      // Empty after fail(); what the source handed over before its own error comes first.
      const first = this.queue.shift();
      if (first !== undefined) {
        this.took(first);
        return { value: first.item, done: false };
      }
      if (this.failure !== undefined) {
        const failure = this.failure;
        this.failure = undefined;
        this.end();
        throw failure;
      }
      if (this.sourceDone || this.finished) {
        this.end();
        return { value: undefined, done: true };
      }
      await new Promise<void>((resolve) => (this.wakeReader = resolve));
      this.wakeReader = undefined;
    }
  }

  takeBuffered(max: number): T[] {
    const taken = this.queue.splice(0, Math.max(0, max));
    for (const one of taken) this.took(one);
    return taken.map((one) => one.item);
  }

  private took(one: { item: T; live: boolean }): void {
    if (one.live) this.liveQueued--;
    this.options.delivered?.(one.item);
    const wake = this.wakePuller;
    this.wakePuller = undefined;
    wake?.();
  }

  /** Ends the watcher with `error`: the reader gets it next (what is buffered is dropped). */
  fail(error: unknown): void {
    if (this.finished) return;
    this.failure = error;
    this.queue.length = 0;
    this.liveQueued = 0;
    this.abort.abort();
    this.wakeReader?.();
    this.wakePuller?.();
  }

  return(): Promise<IteratorResult<T>> {
    this.failure = undefined;
    this.end();
    return Promise.resolve({ value: undefined, done: true });
  }

  private end(): void {
    if (this.finished) return;
    this.finished = true;
    this.queue.length = 0;
    this.liveQueued = 0;
    this.abort.abort();
    this.wakeReader?.();
    this.wakePuller?.();
    this.options.ended?.();
  }

  [Symbol.asyncIterator](): this {
    return this;
  }
}
