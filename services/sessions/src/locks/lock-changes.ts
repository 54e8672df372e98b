/**
 * The changes of the locks, as WatchLocks follows them: the kinds a change has, what a watcher is
 * handed, and the file store's log of them (a revisioned history in memory, @berth/shared's
 * RevisionHistory). The etcd store derives the same items from etcd's own watch
 * (etcd/etcd-lock-watch.ts).
 */
import type { Clock } from "@berth/shared/clock";
import { RevisionHistory } from "@berth/shared/revision-log";
import type { LockInspection } from "./lock-table.js";

/** What happened to a lock; "current_*" describe the state before a watch's caught-up marker. */
export type LockChangeKind = "granted" | "released" | "expired" | "waiter_joined" | "waiter_left" | "current_holder" | "current_waiter";

/** One change of one lock (never a lease token). */
export interface LockChange {
  readonly file: string;
  readonly kind: LockChangeKind;
  readonly owner: string;
  /** The holder's fencing token; 0 for a waiter. */
  readonly fencingToken: number;
  /** The lease's end as granted (wall ms); null for a hold, a waiter, or when unknown. */
  readonly expiresAt: number | null;
  /** A waiter's 1-based place; 0 for a holder. */
  readonly position: number;
  /** When it happened (wall ms). */
  readonly at: number;
  readonly holderKind: "lease" | "stream";
}

/** What a lock watcher yields: a change at its revision, or the end of the description/replay. */
export type LockWatchItem =
  | { readonly kind: "change"; readonly revision: bigint; readonly change: LockChange }
  | { readonly kind: "caught_up"; readonly revision: bigint; readonly reset: boolean };

/** A lock watcher: its items, and the revision up to which everything was delivered (for progress). */
export interface LockWatcher extends AsyncIterableIterator<LockWatchItem> {
  progressRevision(): bigint;
}

/** What a watch asks: one file (canonical) or all, the current state, a revision to resume after. */
export interface LockWatchRequest {
  readonly file: string | undefined;
  readonly includeCurrent: boolean;
  /** 0n: none. */
  readonly startRevision: bigint;
}

/** How many changes the file store keeps to replay, and how many a watcher may fall behind. */
export const DEFAULT_LOCK_WATCH_HISTORY = 10_000;

/**
 * The first revision of a run on the file store: its start time in ms times 1,000,000. Every
 * revision of an earlier run is below it (a run makes far fewer than a million changes a ms).
 */
export function firstRevisionOfRun(startWallMs: number): bigint {
  return BigInt(Math.floor(startWallMs)) * 1_000_000n;
}

/** The file store's log of lock changes, and its watchers. */
export class LockChangeLog {
  readonly history: RevisionHistory<LockChange>;

  constructor(
    private readonly clock: Clock,
    capacity = DEFAULT_LOCK_WATCH_HISTORY,
  ) {
    this.history = new RevisionHistory<LockChange>({ capacity, startRevision: firstRevisionOfRun(clock.now()) });
  }

  record(change: Omit<LockChange, "at">): void {
    this.history.record({ ...change, at: this.clock.now() });
  }

  /**
   * A watcher of `request`. `describe` gives the current state of every lock (or of one file);
   * it is read in the same turn as the watcher subscribes, so no change falls between the two.
   */
  watch(request: LockWatchRequest, describe: () => LockInspection[]): LockWatcher {
    const accept = (change: LockChange) => request.file === undefined || change.file === request.file;
    const resume = request.startRevision > 0n;
    const replay = resume && this.history.replayable(request.startRevision);
    const prelude: LockWatchItem[] = [];
    const at = this.history.revision;
    if (!replay && (request.includeCurrent || resume)) {
      const now = this.clock.now();
      for (const lock of describe()) for (const change of currentChanges(lock, now)) prelude.push({ kind: "change", revision: at, change });
    }
    const follower = this.history.follow(replay ? request.startRevision : at, accept);
    let caughtUpSent = false;
    const reset = resume && !replay;
    const watcher: LockWatcher = {
      progressRevision: () => follower.deliveredRevision,
      async next() {
        const first = prelude.shift();
        if (first !== undefined) return { value: first, done: false };
        if (!caughtUpSent && !replay) {
          caughtUpSent = true;
          return { value: { kind: "caught_up", revision: at, reset }, done: false };
        }
        if (!caughtUpSent && replay) {
          // The replay is what the follower holds up to `at`; then the marker.
          const step = follower.takeUpTo(at);
          if (step !== undefined) return { value: { kind: "change", revision: step.revision, change: step.change }, done: false };
          caughtUpSent = true;
          return { value: { kind: "caught_up", revision: at, reset: false }, done: false };
        }
        const step = await follower.next();
        if (step.done) return { value: undefined, done: true };
        return { value: { kind: "change", revision: step.value.revision, change: step.value.change }, done: false };
      },
      async return() {
        await follower.return();
        return { value: undefined, done: true };
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
    return watcher;
  }
}

/** The current state of one lock as CURRENT_HOLDER and CURRENT_WAITER changes. */
export function currentChanges(lock: LockInspection, at: number): LockChange[] {
  const changes: LockChange[] = [];
  const holder = lock.holder;
  if (holder !== null && holder.kind !== "seed-file") {
    changes.push({
      file: lock.file,
      kind: "current_holder",
      owner: holder.owner,
      fencingToken: holder.fencingToken,
      expiresAt: holder.expiresAt,
      position: 0,
      at,
      holderKind: holder.kind,
    });
  }
  lock.waiters.forEach((waiter, index) => {
    changes.push({
      file: lock.file,
      kind: "current_waiter",
      owner: waiter.owner,
      fencingToken: 0,
      expiresAt: null,
      position: index + 1,
      at,
      holderKind: waiter.kind,
    });
  });
  return changes;
}
