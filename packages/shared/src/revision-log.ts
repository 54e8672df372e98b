/**
 * A revisioned history: each change recorded gets the next revision, the last `capacity` changes
 * are kept to replay, and each follower gets every change after the revision it starts from, in
 * order, through its own bounded buffer. A follower whose client does not keep up (more than
 * `capacity` changes unsent) is ended with resource_exhausted WATCHER_LAGGED naming the revision to
 * resume from; one that asks to start from a revision the history no longer holds (older than its
 * oldest change, from before `firstRevision`, or ahead of the last) is told so (`replayable`), and
 * the caller describes the current state instead: never a gap.
 *
 * Generic over the change: the lock table's changes use it; any in-memory state with a watch can.
 * Revisions are bigints: a history may start from a large base (see `firstRevision`).
 */
import { BerthError } from "./errors.js";

/** A change with its revision. */
export interface Revisioned<T> {
  readonly revision: bigint;
  readonly change: T;
}

export interface RevisionHistoryOptions {
  /** How many changes are kept to replay, and how many a follower may have unsent. */
  readonly capacity: number;
  /**
   * The revision before the first change: the history's "now" before anything happened. Pick it
   * above every revision an earlier history (an earlier run of the process) can have given.
   */
  readonly startRevision: bigint;
}

/** A follower of a {@link RevisionHistory}. */
export interface HistoryFollower<T> extends AsyncIterableIterator<Revisioned<T>> {
  /** Every change up to this revision was delivered (or filtered out). */
  readonly deliveredRevision: bigint;
  /** The next buffered change if its revision is at most `upTo` (a replay's), without waiting. */
  takeUpTo(upTo: bigint): Revisioned<T> | undefined;
  return(): Promise<IteratorResult<Revisioned<T>>>;
}

export class RevisionHistory<T> {
  private readonly ring: Array<Revisioned<T>> = [];
  private current: bigint;
  private readonly first: bigint;
  private readonly followers = new Set<Follower<T>>();

  constructor(private readonly options: RevisionHistoryOptions) {
    if (!(options.capacity >= 1)) throw new RangeError("a revision history keeps at least one change");
    this.current = options.startRevision;
    this.first = options.startRevision;
  }

  /** The revision of the last change (the start revision before any). */
  get revision(): bigint {
    return this.current;
  }

  get capacity(): number {
    return this.options.capacity;
  }

  /** Records `change` at the next revision and hands it to every follower. Returns its revision. */
  record(change: T): bigint {
    this.current += 1n;
    const item: Revisioned<T> = { revision: this.current, change };
    this.ring.push(item);
    if (this.ring.length > this.options.capacity) this.ring.shift();
    for (const follower of this.followers) follower.push(item);
    return this.current;
  }

  /** Whether every change after `revision` is still here to replay. */
  replayable(revision: bigint): boolean {
    if (revision < this.first || revision > this.current) return false;
    const oldest = this.ring[0];
    return oldest === undefined || revision >= oldest.revision - 1n;
  }

  /**
   * Follows the history from after `revision` (replayable: check first), keeping the changes
   * `accept` takes. Ends its pending `next()` when `signal` aborts.
   */
  follow(revision: bigint, accept: (change: T) => boolean = () => true): HistoryFollower<T> {
    if (!this.replayable(revision)) throw new RangeError(`revision ${revision} cannot be replayed`);
    const follower = new Follower<T>(this.options.capacity, accept, revision, () => this.followers.delete(follower));
    for (const item of this.ring) if (item.revision > revision) follower.push(item);
    follower.caughtUpTo(this.current);
    this.followers.add(follower);
    return follower;
  }

  /** Ends every follower with `error` (a shutdown). */
  endAll(error: unknown): void {
    for (const follower of [...this.followers]) follower.fail(error);
  }
}

class Follower<T> implements HistoryFollower<T> {
  private readonly queue: Array<Revisioned<T>> = [];
  private failure: unknown;
  private done = false;
  private wake: (() => void) | undefined;
  /** The last revision seen, delivered or not; what the reader has once the queue is empty. */
  private seen: bigint;
  private delivered: bigint;

  constructor(
    private readonly capacity: number,
    private readonly accept: (change: T) => boolean,
    from: bigint,
    private readonly ended: () => void,
  ) {
    this.seen = from;
    this.delivered = from;
  }

  get deliveredRevision(): bigint {
    return this.queue.length === 0 ? this.seen : this.delivered;
  }

  push(item: Revisioned<T>): void {
    if (this.done || this.failure !== undefined) return;
    this.seen = item.revision;
    if (!this.accept(item.change)) return;
    if (this.queue.length >= this.capacity) {
      const resume = this.delivered;
      this.fail(
        new BerthError(
          "resource_exhausted",
          `watcher fell behind at revision ${resume}; resume with start_revision=${resume}`,
          { lastRevision: String(resume) },
          { reason: "WATCHER_LAGGED" },
        ),
      );
      return;
    }
    this.queue.push(item);
    this.wake?.();
  }

  takeUpTo(upTo: bigint): Revisioned<T> | undefined {
    const head = this.queue[0];
    if (head === undefined || head.revision > upTo) return undefined;
    this.queue.shift();
    this.delivered = head.revision;
    return head;
  }

  caughtUpTo(revision: bigint): void {
    if (revision > this.seen) this.seen = revision;
  }

  fail(error: unknown): void {
    if (this.done) return;
    this.failure = error;
    this.queue.length = 0;
    this.wake?.();
  }

  async next(): Promise<IteratorResult<Revisioned<T>>> {
    for (;;) {
      const item = this.queue.shift();
      if (item !== undefined) {
        this.delivered = item.revision;
        return { value: item, done: false };
      }
      if (this.failure !== undefined) {
        const failure = this.failure;
        this.failure = undefined;
        this.finish();
        throw failure;
      }
      if (this.done) return { value: undefined, done: true };
      await new Promise<void>((resolve) => (this.wake = resolve));
      this.wake = undefined;
    }
  }

  return(): Promise<IteratorResult<Revisioned<T>>> {
    this.failure = undefined;
    this.finish();
    this.wake?.();
    return Promise.resolve({ value: undefined, done: true });
  }

  private finish(): void {
    if (this.done) return;
    this.done = true;
    this.queue.length = 0;
    this.ended();
  }

  [Symbol.asyncIterator](): this {
    return this;
  }
}
