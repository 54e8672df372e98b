/**
 * Live watchers of sessions. The store publishes each append once it is durable: its entries, in
 * order, with the snapshot each produced. Each watcher has its own bounded buffer. A watcher of one session first gets the backlog read from the journal,
 * then a caught-up marker, then the live entries — it subscribes *before* the backlog is read and
 * drops live entries it already got from the backlog, so nothing is skipped or repeated across
 * the switch. A watcher whose buffer overflows is ended with resource_exhausted WATCHER_LAGGED
 * naming the seq to resume from: it may be told to come back, but it never silently misses an
 * entry. A deleted session ends its watchers with not_found SESSION_DELETED, and is one change
 * (a deletion) to the watchers of every session.
 *
 * Changes of every session are numbered by revision and the last ones held (a
 * {@link RevisionHistory}), so a watcher of every session resumes after a lag from one number: the
 * held changes after it are replayed, and one it cannot replay (too old, from an earlier run, or
 * before another process rewrote a journal) is a reset: its caller describes the current state.
 */
import { systemClock } from "@berth/shared/clock";
import type { BerthError } from "@berth/shared/errors";
import { RevisionHistory, runRevisionBase } from "@berth/shared/revision-history";
import type { StoredEntry } from "./journal/journal-store.js";
import type { SessionSnapshot } from "./reducer.js";
import { sessionsLagged, sessionWatcherLagged, storeShuttingDown, watchedSessionDeleted } from "./session-refusals.js";
import type {
  EventWatcher,
  SessionChange,
  SessionsWatcher,
  SessionsWatchStart,
  WatchAllOptions,
  WatchCaughtUp,
  WatchEntry,
  WatchEvent,
  WatchOptions,
} from "./session-store-api.js";

/** How many undelivered entries a watcher may have before it is ended. */
export const DEFAULT_MAX_BUFFERED = 1000;

/**
 * How many times a watcher's bound of changes of every session are held for replay: a watcher
 * ends lagged one change past its bound, and changes go on while its client comes back.
 */
export const HISTORY_PER_BUFFER = 4;

/** The fewest sessions' snapshots held before the replay's snapshots are swept. */
const MIN_SNAPSHOT_SWEEP = 64;

/** A newly durable entry as the store publishes it (one of an append's). */
export interface PublishedEntry extends StoredEntry {
  snapshot?: SessionSnapshot;
}

/**
 * The durable state of a session at the moment a watcher subscribed. The hub takes it right after
 * subscribing, in the same tick, so any entry made durable later reaches the watcher live.
 */
export interface WatchBacklog {
  /** The last durable seq (0 for a session without entries). */
  lastSeq: number;
  /** The durable snapshot at `lastSeq`. */
  snapshot: SessionSnapshot;
  /** Entries with seq ≥ the watcher's `fromSeq`, up to `lastSeq`, in journal order (read lazily). */
  entries(): AsyncIterator<StoredEntry>;
}

interface Subscriber<I> {
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

class SessionWatcher extends Watcher<WatchEvent, PublishedEntry> {
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

class AllSessionsWatcher extends Watcher<SessionChange, SessionChange> {
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

/** The registry of watchers of one session store. */
export class WatchHub {
  private readonly bySession = new Map<string, Set<Subscriber<PublishedEntry>>>();
  private readonly everySession = new Set<AllSessionsWatcher>();
  /** The changes held for replay, bare: a snapshot per change would hold memory in proportion to the sessions' size. */
  private history: RevisionHistory<SessionChange>;
  /** Each session's latest change in the history that carried a snapshot: a replay attaches it there. */
  private readonly latestSnapshots = new Map<string, { revision: number; snapshot: SessionSnapshot }>();
  /** When `latestSnapshots` grows past this, the entries of changes the history let go are dropped. */
  private sweepSnapshotsAt = MIN_SNAPSHOT_SWEEP;
  private closedWith: BerthError | undefined;

  /**
   * `revisionBase`: the revision before this run's first change (default: {@link runRevisionBase}
   * of the system clock); the last {@link HISTORY_PER_BUFFER} × `defaultMaxBuffered` changes of every
   * session are held for replay.
   */
  constructor(
    private readonly defaultMaxBuffered = DEFAULT_MAX_BUFFERED,
    revisionBase = runRevisionBase(systemClock),
  ) {
    this.history = new RevisionHistory({ base: revisionBase, capacity: HISTORY_PER_BUFFER * defaultMaxBuffered });
  }

  /** The revision of the latest change of any session. */
  get revision(): number {
    return this.history.revision;
  }

  /** Numbers a change of every session and hands it to their watchers. */
  private changed(change: Omit<SessionChange, "revision">): void {
    const numbered = { ...change, revision: this.history.revision + 1 } as SessionChange;
    const { snapshot, ...bare } = numbered;
    this.history.append(bare);
    if (snapshot === undefined) this.latestSnapshots.delete(change.sessionId);
    else this.latestSnapshots.set(change.sessionId, { revision: numbered.revision, snapshot });
    if (this.latestSnapshots.size > this.sweepSnapshotsAt) this.sweepSnapshots();
    for (const watcher of [...this.everySession]) watcher.deliver(change.sessionId, numbered);
  }

  /** Drops the snapshots of changes no longer held, so that they are bounded by the sessions changed within the history. */
  private sweepSnapshots(): void {
    for (const [sessionId, latest] of this.latestSnapshots) {
      if (!this.history.canReplay(latest.revision - 1)) this.latestSnapshots.delete(sessionId);
    }
    this.sweepSnapshotsAt = Math.max(MIN_SNAPSHOT_SWEEP, 2 * this.latestSnapshots.size);
  }

  /** A held change as a replay sends it: with its snapshot when it is its session's latest change. */
  private replayed(change: SessionChange): SessionChange {
    const latest = this.latestSnapshots.get(change.sessionId);
    return latest?.revision === change.revision ? { ...change, snapshot: latest.snapshot } : change;
  }

  /**
   * Hands the newly durable entries of one append to a session (in seq order) to its watchers,
   * entry by entry, and to the all-sessions watchers as one change.
   */
  publish(sessionId: string, items: readonly PublishedEntry[]): void {
    if (items.length === 0) return;
    const watchers = this.bySession.get(sessionId);
    if (watchers) {
      for (const item of items) for (const watcher of [...watchers]) watcher.deliver(sessionId, item);
    }
    const first = items[0]!;
    const last = items[items.length - 1]!;
    const change: Omit<SessionChange, "revision"> = { sessionId, firstSeq: first.entry.seq, lastSeq: last.entry.seq, entry: last.entry, deleted: false };
    if (last.snapshot) change.snapshot = last.snapshot;
    this.changed(change);
  }

  /**
   * The session was deleted at `lastSeq`: its watchers end with not_found SESSION_DELETED (a
   * later append starts a new session under the id, which they would otherwise take for more of
   * the old one), and the watchers of every session get a deletion change.
   */
  sessionDeleted(sessionId: string, lastSeq: number): void {
    for (const watcher of [...(this.bySession.get(sessionId) ?? [])]) {
      watcher.fail(watchedSessionDeleted(sessionId, lastSeq));
    }
    this.changed({ sessionId, firstSeq: lastSeq, lastSeq, entry: undefined, deleted: true });
  }

  /**
   * Ends the watchers of `sessionId`, and those of every session, as if they had fallen behind:
   * the session's history changed in a way that cannot be handed out entry by entry (another
   * process rewrote or damaged its journal). Each resumes from the journal as after a lag, so none
   * misses an entry; they would otherwise silently never see the entries the change brought.
   */
  resync(sessionId: string, why: string): void {
    for (const watcher of [...(this.bySession.get(sessionId) ?? [])]) watcher.fail(watcher.cutOff(why));
    for (const watcher of [...this.everySession]) watcher.fail(watcher.cutOff(why));
    // The held changes no longer tell what happened: a resume from before now is a reset.
    this.history = new RevisionHistory({ base: this.history.revision + 1, capacity: HISTORY_PER_BUFFER * this.defaultMaxBuffered });
    this.latestSnapshots.clear();
  }

  /** True when some watcher of `sessionId` (or of every session) wants per-entry snapshots. */
  wantsSnapshots(sessionId: string): boolean {
    for (const watcher of this.bySession.get(sessionId) ?? []) if (watcher.includeSnapshot) return true;
    for (const watcher of this.everySession) if (watcher.includeSnapshot) return true;
    return false;
  }

  /**
   * Watches one session from `fromSeq`: the backlog, a caught-up marker, then live entries.
   * `backlog` is called right after the watcher is subscribed, in the same tick.
   */
  watchSession(sessionId: string, fromSeq: number, options: WatchOptions, backlog: () => WatchBacklog): EventWatcher<WatchEvent> {
    this.assertOpen();
    let set = this.bySession.get(sessionId);
    if (!set) {
      set = new Set();
      this.bySession.set(sessionId, set);
    }
    const watchers = set;
    const watcher: SessionWatcher = new SessionWatcher(sessionId, Math.max(1, fromSeq), options, this.maxBufferedOf(options), () => {
      watchers.delete(watcher);
      if (watchers.size === 0 && this.bySession.get(sessionId) === watchers) this.bySession.delete(sessionId);
    });
    watchers.add(watcher);
    try {
      watcher.start(backlog());
    } catch (error) {
      void watcher.return();
      throw error;
    }
    return watcher;
  }

  /**
   * Watches every session: one change per durable append or deletion, with the snapshot after it
   * when asked (a replayed change has it when it is its session's latest and a watcher wanted
   * snapshots when it was made: that one says what the earlier ones led to). With
   * `startRevision`, the held changes after it first, or, when they cannot be replayed, from now
   * with `reset` (see {@link SessionsWatchStart}).
   */
  watchAll(options: WatchAllOptions = {}): SessionsWatcher {
    this.assertOpen();
    const current = this.history.revision;
    const start = options.startRevision ?? 0;
    const replay = start > 0 && this.history.canReplay(start);
    const after = replay ? start : current;
    const watcher: AllSessionsWatcher = new AllSessionsWatcher(
      options,
      this.maxBufferedOf(options),
      () => this.everySession.delete(watcher),
      after,
      () => this.history.revision,
    );
    if (replay) watcher.replay(this.history.since(start).map((held) => this.replayed(held.value)));
    watcher.started = Promise.resolve({ after, caughtUpAt: current, reset: start > 0 && !replay });
    this.everySession.add(watcher);
    return watcher;
  }

  /** How many sessions' snapshots the history holds for replay (bounded by the sessions changed within it). */
  get heldSnapshotCount(): number {
    return this.latestSnapshots.size;
  }

  /** True when someone follows `sessionId`: a watcher of it, or of every session. */
  isWatched(sessionId: string): boolean {
    return this.everySession.size > 0 || this.bySession.has(sessionId);
  }

  /** How many watchers are subscribed. */
  get watcherCount(): number {
    let count = this.everySession.size;
    for (const set of this.bySession.values()) count += set.size;
    return count;
  }

  /** Ends every watcher with `error` (delivered at its next pull) and refuses new ones. */
  close(error = storeShuttingDown()): void {
    this.closedWith = error;
    for (const set of [...this.bySession.values()]) for (const watcher of [...set]) watcher.fail(error);
    for (const watcher of [...this.everySession]) watcher.fail(error);
  }

  private maxBufferedOf(options: WatchOptions): number {
    const value = options.maxBuffered ?? this.defaultMaxBuffered;
    return Number.isInteger(value) && value > 0 ? value : this.defaultMaxBuffered;
  }

  private assertOpen(): void {
    if (this.closedWith) throw this.closedWith;
  }
}
