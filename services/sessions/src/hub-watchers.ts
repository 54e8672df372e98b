/**
 * The watchers the watch hub (watch-hub.ts) hands out: each with its own live buffer, bounded (one over its
 * bound ends it WATCHER_LAGGED, resumable), one pull served at a time, and an end that is either
 * clean or an error delivered at the next pull. A session's watcher drops the live entries its
 * backlog already gave, so nothing is skipped or repeated across the switch.
 */
import type { BerthError } from "@berth/shared/errors";
import type { StoredEntry } from "./journal/journal-store.js";
import { sessionsLagged, sessionWatcherLagged } from "./session-refusals.js";
import type { EventWatcher, SessionChange, SessionsWatchStart, WatchCaughtUp, WatchEntry, WatchEvent, WatchOptions } from "./session-store-api.js";
import type { PublishedEntry, WatchBacklog } from "./watch-hub-api.js";

/** A watcher as the hub hands it what is published. */
export interface Subscriber<I> {
  includeSnapshot: boolean;
  deliver(sessionId: string, input: I): void;
  fail(error: BerthError): void;
  /** The error that ends this watcher, resumably, for `why` (falling behind, or a history it cannot follow). */
  cutOff(why: string): BerthError;
}

/** A FIFO with O(1) shift. */
class Queue<T> {
  private items: T[] = [];
  private head = 0;
  get length(): number {
    return this.items.length - this.head;
  }
  push(item: T): void {
    this.items.push(item);
  }
  shift(): T | undefined {
    if (this.head >= this.items.length) return undefined;
    const item = this.items[this.head]!;
    this.items[this.head++] = undefined as T;
    if (this.head > 1024 && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return item;
  }
  clear(): void {
    this.items = [];
    this.head = 0;
  }
}

type Waiter<T> = { resolve(result: IteratorResult<T>): void; reject(error: unknown): void };

/**
 * The part shared by both kinds of watcher: a live buffer bounded by `maxBuffered`, one waiting
 * `next()`, and an end that is either clean (`return()`) or an error delivered at the next pull.
 */
abstract class Watcher<T, I> implements EventWatcher<T>, Subscriber<I> {
  readonly includeSnapshot: boolean;
  protected readonly live = new Queue<T>();
  protected waiter: Waiter<T> | undefined;
  protected ended = false;
  protected failure: BerthError | undefined;
  private pulling: Promise<unknown> = Promise.resolve();

  constructor(
    options: WatchOptions,
    private readonly maxBuffered: number,
    private readonly unsubscribe: () => void,
  ) {
    this.includeSnapshot = options.includeSnapshot === true;
  }

  /** The item what was published becomes for this watcher, or undefined to skip it. */
  protected abstract accept(sessionId: string, input: I): T | undefined;
  /** The error that ends this watcher when it falls behind. */
  protected abstract fellBehind(): BerthError;
  abstract cutOff(why: string): BerthError;
  /** Whether live items may be handed out (the session watcher holds them back during its backlog). */
  protected abstract get liveOpen(): boolean;
  /** The next item before the live ones (the session watcher's backlog and marker). */
  protected abstract nextBeforeLive(): Promise<IteratorResult<T> | undefined>;

  deliver(sessionId: string, input: I): void {
    if (this.ended || this.failure) return;
    const value = this.accept(sessionId, input);
    if (value === undefined) return;
    if (this.waiter && this.liveOpen && this.live.length === 0) {
      if (this.alreadyDelivered(value)) return;
      const waiter = this.waiter;
      this.waiter = undefined;
      this.onDelivered(value);
      waiter.resolve({ value, done: false });
      return;
    }
    this.live.push(value);
    if (this.live.length > this.maxBuffered) this.fail(this.fellBehind());
  }

  fail(error: BerthError): void {
    if (this.ended || this.failure) return;
    this.failure = error;
    this.live.clear();
    this.unsubscribe();
    const waiter = this.waiter;
    this.waiter = undefined;
    if (waiter) {
      this.ended = true;
      waiter.reject(error);
    }
  }

  /** Called for every item handed to the consumer. */
  protected onDelivered(_value: T): void {}

  /** True for a live item the consumer already has (the session watcher's backlog overlap). */
  protected alreadyDelivered(_value: T): boolean {
    return false;
  }

  next(): Promise<IteratorResult<T>> {
    // Pulls are served one at a time, in order, even if a consumer does not await between them.
    const result = this.pulling.then(() => this.pull());
    this.pulling = result.catch(() => undefined);
    return result;
  }

  private async pull(): Promise<IteratorResult<T>> {
    for (;;) {
      if (this.ended) return { value: undefined, done: true };
      if (this.failure) {
        this.ended = true;
        throw this.failure;
      }
      if (!this.liveOpen) {
        let early: IteratorResult<T> | undefined;
        try {
          early = await this.nextBeforeLive();
        } catch (error) {
          this.end();
          throw error;
        }
        if (early) {
          if (this.ended) return { value: undefined, done: true };
          // Ended while reading: the error names the last entry handed out, so this one is not.
          if (this.failure) continue;
          if (!early.done) this.onDelivered(early.value);
          return early;
        }
        continue;
      }
      let value = this.live.shift();
      while (value !== undefined && this.alreadyDelivered(value)) value = this.live.shift();
      if (value !== undefined) {
        this.onDelivered(value);
        return { value, done: false };
      }
      return new Promise<IteratorResult<T>>((resolve, reject) => {
        this.waiter = { resolve, reject };
      });
    }
  }

  /**
   * Up to `max` live items already buffered, handed out at once (in order, as `next()` would):
   * what a consumer that sends several items per message takes after a `next()`. Never waits;
   * empty before the live part, once ended, or with nothing buffered.
   */
  takeBuffered(max: number): T[] {
    const taken: T[] = [];
    if (this.ended || this.failure || !this.liveOpen) return taken;
    while (taken.length < max) {
      const value = this.live.shift();
      if (value === undefined) break;
      if (this.alreadyDelivered(value)) continue;
      this.onDelivered(value);
      taken.push(value);
    }
    return taken;
  }

  return(): Promise<IteratorResult<T>> {
    this.end();
    return Promise.resolve({ value: undefined, done: true });
  }

  throw(error?: unknown): Promise<IteratorResult<T>> {
    this.end();
    return Promise.reject(error);
  }

  /** Ends the watcher now: unsubscribes and releases a pending `next()`. */
  protected end(): void {
    if (this.ended) return;
    this.ended = true;
    this.live.clear();
    this.unsubscribe();
    const waiter = this.waiter;
    this.waiter = undefined;
    waiter?.resolve({ value: undefined, done: true });
  }

  [Symbol.asyncIterator](): this {
    return this;
  }
}

/** A watcher of one session: its backlog read from the journal, a caught-up marker, then its live entries. */
export class SessionWatcher extends Watcher<WatchEvent, PublishedEntry> {
  private phase: "backlog" | "live" = "backlog";
  private backlog: WatchBacklog | undefined;
  private backlogEntries: AsyncIterator<StoredEntry> | undefined;
  /** The seq of the last entry handed to the consumer; what a resume continues after. */
  private lastDelivered: number;

  constructor(
    private readonly sessionId: string,
    private readonly fromSeq: number,
    options: WatchOptions,
    maxBuffered: number,
    unsubscribe: () => void,
  ) {
    super(options, maxBuffered, unsubscribe);
    this.lastDelivered = fromSeq - 1;
  }

  start(backlog: WatchBacklog): void {
    this.backlog = backlog;
  }

  protected override get liveOpen(): boolean {
    return this.phase === "live";
  }

  protected override accept(_sessionId: string, item: PublishedEntry): WatchEvent | undefined {
    if (item.entry.seq < this.fromSeq) return undefined;
    const value: WatchEntry = { kind: "entry", entry: item.entry, idempotencyKey: item.idempotencyKey, integrity: item.integrity };
    if (this.includeSnapshot && item.snapshot) value.snapshot = item.snapshot;
    return value;
  }

  protected override onDelivered(value: WatchEvent): void {
    if (value.kind === "entry") this.lastDelivered = Math.max(this.lastDelivered, value.entry.seq);
  }

  // De-duplicates across the backlog → live switch: an entry already read from the journal is not
  // handed out again when a live copy of it comes by.
  protected override alreadyDelivered(value: WatchEvent): boolean {
    return value.kind === "entry" && value.entry.seq <= this.lastDelivered;
  }

  protected override fellBehind(): BerthError {
    return this.cutOff(`watcher of session ${this.sessionId} fell behind`);
  }

  /** Its client resumes from the journal after the last entry it got. */
  cutOff(why: string): BerthError {
    return sessionWatcherLagged(why, this.sessionId, this.lastDelivered);
  }

  protected override async nextBeforeLive(): Promise<IteratorResult<WatchEvent> | undefined> {
    const backlog = this.backlog!;
    if (this.phase === "backlog") {
      this.backlogEntries ??= backlog.entries();
      const step = await this.backlogEntries.next();
      if (!step.done) {
        // Entries past the subscription point arrive live; the backlog stops where they start.
        const { entry, idempotencyKey, integrity } = step.value;
        if (entry.seq > backlog.lastSeq || entry.seq <= this.lastDelivered) return undefined;
        return { value: { kind: "entry", entry, idempotencyKey, integrity }, done: false };
      }
    }
    this.phase = "live";
    // Everything up to the subscription point was in the backlog (or before fromSeq).
    this.lastDelivered = Math.max(this.lastDelivered, backlog.lastSeq);
    const marker: WatchCaughtUp = { kind: "caught_up", lastSeq: backlog.lastSeq };
    if (this.includeSnapshot) marker.snapshot = backlog.snapshot;
    return { value: marker, done: false };
  }

  protected override end(): void {
    super.end();
    void this.backlogEntries?.return?.();
  }

  override fail(error: BerthError): void {
    super.fail(error);
    if (this.failure) void this.backlogEntries?.return?.();
  }
}

/** A watcher of every session: the changes replayed from the hub's history, then the live ones. */
export class AllSessionsWatcher extends Watcher<SessionChange, SessionChange> {
  private delivered = 0;
  private taken: number;
  started!: Promise<SessionsWatchStart>;

  constructor(
    options: WatchOptions,
    maxBuffered: number,
    unsubscribe: () => void,
    after: number,
    private readonly currentRevision: () => number,
  ) {
    super(options, maxBuffered, unsubscribe);
    this.taken = after;
  }

  /** Queues replayed changes ahead of the live ones. */
  replay(changes: readonly SessionChange[]): void {
    for (const change of changes) this.live.push(this.accept("", change));
  }

  progressRevision(): number {
    // Nothing waiting: every change published so far has been taken.
    return this.live.length === 0 && !this.failure ? Math.max(this.taken, this.currentRevision()) : this.taken;
  }

  protected override get liveOpen(): boolean {
    return true;
  }

  protected override accept(_sessionId: string, change: SessionChange): SessionChange {
    if (this.includeSnapshot || change.snapshot === undefined) return change;
    const { snapshot: _dropped, ...bare } = change;
    return bare;
  }

  protected override onDelivered(change: SessionChange): void {
    this.delivered++;
    this.taken = change.revision;
  }

  protected override fellBehind(): BerthError {
    return this.cutOff("watcher of all sessions fell behind");
  }

  /** Its client watches again from the last revision it took. */
  cutOff(why: string): BerthError {
    return sessionsLagged(`${why} after ${this.delivered} changes`, this.taken);
  }

  protected override nextBeforeLive(): Promise<undefined> {
    return Promise.resolve(undefined);
  }
}
