/**
 * Changes numbered by revision, the last few held for replay, and watchers of them: what a watch
 * of state kept in a process's memory needs to resume without a gap (etcd's revisions and watch,
 * for state that lives in etcd, give the same).
 *
 * Revisions grow by one per change and start at a run's base ({@link runRevisionBase}), so that a
 * revision an earlier run of the process gave is never taken for one of this run's: a watcher
 * asks {@link RevisionHistory.canReplay} and describes the current state instead when it cannot.
 * A watcher buffers what it has not taken yet, up to a bound: one that falls further behind ends
 * with the caller's lagged error, naming the last revision it took, so its client resumes from
 * there instead of the process holding an unbounded backlog. The changes a watcher replays when it
 * starts are not counted against the bound (they are what it missed, held by the history anyway):
 * a watcher resumed after a lag replays more than its bound, and counting them would end it lagged
 * again at once, from the same revision, every time. A watcher may keep only the changes it
 * accepts (one file of many): the bound counts those alone, and its {@link RevisionWatcher.deliveredRevision}
 * still moves past the ones it skipped.
 */
import type { Clock } from "./clock.js";

/** One change and its revision. */
export interface Revisioned<T> {
  readonly revision: number;
  readonly value: T;
}

/**
 * The first revision base of a run started now: the wall-clock time in microseconds since the Unix
 * epoch. A later run starts above every revision an earlier one gave unless that run averaged more
 * than a million changes a second; still below 2^53 (a safe JavaScript integer) until the 2250s.
 */
export function runRevisionBase(clock: Pick<Clock, "now">): number {
  return Math.floor(clock.now()) * 1000;
}

/** Options of {@link RevisionHistory}. */
export interface RevisionHistoryOptions {
  /** The revision before the first change: changes are numbered from `base + 1`. */
  base: number;
  /** How many of the latest changes are held for replay. */
  capacity: number;
}

/** Options of one watcher. */
export interface RevisionWatchOptions<T = unknown> {
  /** The most live changes it holds that its reader has not taken (its replay aside): one more ends it lagged. */
  maxBuffered: number;
  /** The error it ends with when lagged, given the last revision its reader took. */
  lagged: (resumeRevision: number) => Error;
  /** The changes it keeps (default: every one); the others are skipped, never buffered. */
  accept?: (value: T) => boolean;
}

/** The changes of one piece of state, numbered, the last `capacity` held. */
export class RevisionHistory<T> {
  readonly base: number;
  private latest: number;
  private readonly capacity: number;
  /** A ring of the held changes: `held` of them, the oldest at `first`. */
  private readonly ring: Array<Revisioned<T> | undefined>;
  private first = 0;
  private held = 0;
  private readonly watchers = new Set<RevisionWatcher<T>>();
  private closed = false;
  private closedWith: Error | undefined;

  constructor(options: RevisionHistoryOptions) {
    if (!Number.isSafeInteger(options.base) || options.base < 0) throw new RangeError(`revision base must be a non-negative safe integer; got ${options.base}`);
    if (!Number.isInteger(options.capacity) || options.capacity < 1) throw new RangeError(`capacity must be a positive integer; got ${options.capacity}`);
    this.base = options.base;
    this.latest = options.base;
    this.capacity = options.capacity;
    this.ring = new Array(options.capacity);
  }

  /** The latest change's revision; the base when nothing changed yet. */
  get revision(): number {
    return this.latest;
  }

  /** Numbers `value` with the next revision, holds it, and hands it to every watcher. */
  append(value: T): Revisioned<T> {
    const change: Revisioned<T> = { revision: ++this.latest, value };
    if (this.held < this.capacity) {
      this.ring[(this.first + this.held) % this.capacity] = change;
      this.held++;
    } else {
      this.ring[this.first] = change;
      this.first = (this.first + 1) % this.capacity;
    }
    for (const watcher of this.watchers) watcher.offer(change);
    return change;
  }

  /**
   * True when every change after `revision` is held: it is this run's (from the base up to the
   * latest) and not older than the oldest change held.
   */
  canReplay(revision: number): boolean {
    return Number.isSafeInteger(revision) && revision >= this.base && revision <= this.latest && revision >= this.latest - this.held;
  }

  /** The latest change; undefined before the first. */
  last(): Revisioned<T> | undefined {
    return this.held === 0 ? undefined : this.ring[(this.first + this.held - 1) % this.capacity];
  }

  /** The held changes after `revision`, oldest first. Throws a RangeError unless {@link canReplay}(revision). */
  since(revision: number): Array<Revisioned<T>> {
    if (!this.canReplay(revision)) throw new RangeError(`revision ${revision} cannot be replayed (held: ${this.latest - this.held} to ${this.latest})`);
    const changes: Array<Revisioned<T>> = [];
    for (let i = this.latest - revision; i > 0; i--) changes.push(this.ring[(this.first + this.held - i) % this.capacity]!);
    return changes;
  }

  /**
   * A watcher of the changes after `revision`: the held ones first, then each as it comes. Throws
   * a RangeError unless {@link canReplay}(revision): the caller describes the current state and
   * watches from {@link revision} instead.
   */
  watch(revision: number, options: RevisionWatchOptions<T>): RevisionWatcher<T> {
    const held = this.since(revision);
    const watcher = new RevisionWatcher<T>(revision, options, () => this.watchers.delete(watcher));
    watcher.replay(held);
    if (this.closedWith !== undefined) watcher.fail(this.closedWith);
    else if (this.closed) watcher.end();
    else this.watchers.add(watcher);
    return watcher;
  }

  /** How many watchers are open. */
  get watcherCount(): number {
    return this.watchers.size;
  }

  /**
   * Ends every watcher and refuses new ones live: each takes what it has buffered, then is done;
   * or, given `error` (a shutdown its readers must hear of), each drops its buffer and throws it.
   */
  close(error?: Error): void {
    this.closed = true;
    this.closedWith = error;
    for (const watcher of [...this.watchers]) {
      if (error === undefined) watcher.end();
      else watcher.fail(error);
    }
  }
}

/** The changes after a revision, in order, each once; an async iterator that ends when closed or returned. */
export class RevisionWatcher<T> implements AsyncIterator<Revisioned<T>> {
  private buffer: Array<Revisioned<T>> = [];
  private cursor = 0;
  private wake: (() => void) | undefined;
  private ended = false;
  private lagged = false;
  private failure: Error | undefined;
  /** How many of the buffered changes, the first ones, are its replay (not counted against the bound). */
  private replaying = 0;
  private taken: number;
  /** The latest revision offered, kept or skipped. */
  private offered: number;

  /** @internal */
  constructor(
    after: number,
    private readonly options: RevisionWatchOptions<T>,
    private readonly unsubscribe: () => void,
  ) {
    this.taken = after;
    this.offered = after;
  }

  /** The revision of the last change its reader took (the one it was created after, before any). */
  get lastTaken(): number {
    return this.taken;
  }

  /**
   * Every change up to this revision was taken by its reader or skipped (not accepted): what a
   * progress message names. Past {@link lastTaken} once nothing is buffered and later changes were skipped.
   */
  get deliveredRevision(): number {
    const dropped = this.lagged || this.failure !== undefined;
    return dropped || this.buffered > 0 ? this.taken : this.offered;
  }

  /** @internal The held changes after its start, buffered whatever their number. */
  replay(changes: ReadonlyArray<Revisioned<T>>): void {
    for (const change of changes) {
      this.offered = change.revision;
      if (this.options.accept !== undefined && !this.options.accept(change.value)) continue;
      this.buffer.push(change);
      this.replaying++;
    }
  }

  /** @internal A change for this watcher; past its bound it is lagged and stops listening. */
  offer(change: Revisioned<T>): void {
    if (this.ended || this.lagged) return;
    this.offered = change.revision;
    if (this.options.accept !== undefined && !this.options.accept(change.value)) return;
    if (this.buffered - this.replaying >= this.options.maxBuffered) {
      this.lagged = true;
      this.buffer = [];
      this.cursor = 0;
      this.replaying = 0;
      this.unsubscribe();
    } else {
      this.buffer.push(change);
    }
    this.wake?.();
  }

  /** @internal No more changes come: the buffered ones are still taken. */
  end(): void {
    this.ended = true;
    this.unsubscribe();
    this.wake?.();
  }

  /** @internal Ends it with `error`, dropping what it buffered: its reader's next take throws it, once. */
  fail(error: Error): void {
    if (this.ended) return;
    this.failure = error;
    this.buffer = [];
    this.cursor = 0;
    this.replaying = 0;
    this.end();
  }

  /** Changes it holds that its reader has not taken yet. */
  get buffered(): number {
    return this.buffer.length - this.cursor;
  }

  async next(): Promise<IteratorResult<Revisioned<T>>> {
    for (;;) {
      if (this.lagged) throw this.options.lagged(this.taken);
      if (this.failure !== undefined) {
        const failure = this.failure;
        this.failure = undefined;
        throw failure;
      }
      if (this.cursor < this.buffer.length) {
        const change = this.buffer[this.cursor]!;
        this.buffer[this.cursor++] = undefined as unknown as Revisioned<T>;
        // Compacted once half is taken: a long-lived watcher's buffer stays its backlog's size.
        if (this.cursor > 1024 && this.cursor * 2 > this.buffer.length) {
          this.buffer = this.buffer.slice(this.cursor);
          this.cursor = 0;
        }
        this.taken = change.revision;
        if (this.replaying > 0) this.replaying--;
        return { value: change, done: false };
      }
      if (this.ended) return { value: undefined, done: true };
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }

  async return(): Promise<IteratorResult<Revisioned<T>>> {
    this.failure = undefined;
    this.end();
    this.buffer = [];
    this.cursor = 0;
    this.replaying = 0;
    return { value: undefined, done: true };
  }
}
