/**
 * The file store's log of the changes of the locks, as WatchLocks follows them (a revisioned
 * history in memory, @berth/shared's RevisionHistory). What a change and a watcher are is the
 * API's (source-locks-api.ts); the etcd store derives the same items from etcd's own watch
 * (etcd/etcd-lock-watch.ts).
 */
import type { Clock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { RevisionHistory, runRevisionBase } from "@berth/shared/revision-history";
import { DEFAULT_MAX_BUFFERED, HISTORY_PER_BUFFER } from "../watch-hub.js";
import type { LockChange, LockInspection, LockWatcher, LockWatchItem, LockWatchRequest } from "./source-locks-api.js";

/**
 * How many lock changes the file store keeps to replay (GetLimits' `watch_history`, on both
 * stores) for watchers that may each fall `watchBuffer` behind: {@link HISTORY_PER_BUFFER} times
 * it, as for the watchers of every session. A watcher ends lagged one change past its bound, so a
 * history of the bound alone would have lost that change already: every resume would be a reset.
 */
export function lockWatchHistory(watchBuffer: number): number {
  return HISTORY_PER_BUFFER * watchBuffer;
}

/**
 * The first revision of a run on the file store: its start time in microseconds, as the budget's
 * watches count theirs (runRevisionBase). Every revision of an earlier run is below it unless that
 * run averaged a change a microsecond; and revisions stay below 2^53, exact as JSON numbers.
 */
export function firstRevisionOfRun(startWallMs: number): bigint {
  return BigInt(runRevisionBase({ now: () => startWallMs }));
}

/**
 * The file store's log of lock changes, and its watchers. The history counts from 0 and the
 * revisions a watcher is handed are the run's first revision ({@link firstRevisionOfRun}) plus
 * that count, as the bigints the wire carries.
 */
export class LockChangeLog {
  private readonly history: RevisionHistory<LockChange>;
  private readonly firstRevision: bigint;

  constructor(
    private readonly clock: Clock,
    private readonly watchBuffer = DEFAULT_MAX_BUFFERED,
  ) {
    this.firstRevision = firstRevisionOfRun(clock.now());
    this.history = new RevisionHistory<LockChange>({ base: 0, capacity: lockWatchHistory(watchBuffer) });
  }

  record(change: Omit<LockChange, "at">): void {
    this.history.append({ ...change, at: this.clock.now() });
  }

  /** Ends every watcher with `error` (a shutdown). */
  close(error: Error): void {
    this.history.close(error);
  }

  /**
   * A watcher of `request`. `describe` gives the current state of every lock (or of one file);
   * it is read in the same turn as the watcher subscribes, so no change falls between the two.
   */
  watch(request: LockWatchRequest, describe: () => LockInspection[]): LockWatcher {
    const accept = (change: LockChange) => request.file === undefined || change.file === request.file;
    const resume = request.startRevision > 0n;
    const start = resume ? this.ofThisRun(request.startRevision) : undefined;
    const replay = start !== undefined && this.history.canReplay(start);
    const reset = resume && !replay;
    const at = this.history.revision;
    const prelude: LockWatchItem[] = [];
    if (!replay && (request.includeCurrent || resume)) {
      const now = this.clock.now();
      for (const lock of describe()) for (const change of currentChanges(lock, now)) prelude.push({ kind: "change", revision: this.revisionOf(at), change });
    }
    const changes = this.history.watch(replay ? start : at, {
      maxBuffered: this.watchBuffer,
      lagged: (resumeRevision) => locksWatcherLagged(this.revisionOf(resumeRevision)),
      accept,
    });
    // What it holds now is the replay, every change up to `at`: then the marker.
    let replaying = changes.buffered;
    let caughtUpSent = false;
    const revisionOf = (revision: number) => this.revisionOf(revision);
    const watcher: LockWatcher = {
      progressRevision: () => revisionOf(changes.deliveredRevision),
      async next() {
        const first = prelude.shift();
        if (first !== undefined) return { value: first, done: false };
        if (replaying === 0 && !caughtUpSent) {
          caughtUpSent = true;
          return { value: { kind: "caught_up", revision: revisionOf(at), reset }, done: false };
        }
        if (replaying > 0) replaying--;
        const step = await changes.next();
        if (step.done) return { value: undefined, done: true };
        return { value: { kind: "change", revision: revisionOf(step.value.revision), change: step.value.value }, done: false };
      },
      async return() {
        await changes.return();
        return { value: undefined, done: true };
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
    return watcher;
  }

  /** A watcher's revision of the history's. */
  private revisionOf(revision: number): bigint {
    return this.firstRevision + BigInt(revision);
  }

  /** The history's revision of a watcher's; undefined when it is not this run's (before its start, or ahead of now). */
  private ofThisRun(revision: bigint): number | undefined {
    const count = revision - this.firstRevision;
    return count < 0n || count > BigInt(this.history.revision) ? undefined : Number(count);
  }
}

/** RESOURCE_EXHAUSTED WATCHER_LAGGED for a lock watcher that fell behind: every change up to `resumeRevision` was sent. */
export function locksWatcherLagged(resumeRevision: bigint): BerthError {
  return new BerthError(
    "resource_exhausted",
    `watcher fell behind at revision ${resumeRevision}; resume with start_revision=${resumeRevision}`,
    { lastRevision: String(resumeRevision) },
    { reason: "WATCHER_LAGGED" },
  );
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
