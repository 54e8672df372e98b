/**
 * Live watchers of sessions. The store publishes each append once it is durable: its entries, in
 * order, with the snapshot each produced. Each watcher (hub-watchers.ts) has its own bounded
 * buffer. A watcher of one session first gets the backlog read from the journal, then a
 * caught-up marker, then the live entries — it subscribes *before* the backlog is read and
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
import type { SessionSnapshot } from "./reducer.js";
import { AllSessionsWatcher, SessionWatcher, type Subscriber } from "./hub-watchers.js";
import { storeShuttingDown, watchedSessionDeleted } from "./session-refusals.js";
import type { PublishedEntry, WatchBacklog } from "./watch-hub-api.js";
import type { EventWatcher, SessionChange, SessionsWatcher, SessionsWatchStart, WatchAllOptions, WatchEvent, WatchOptions } from "./session-store-api.js";

/** How many undelivered entries a watcher may have before it is ended. */
export const DEFAULT_MAX_BUFFERED = 1000;

/**
 * How many times a watcher's bound of changes of every session are held for replay: a watcher
 * ends lagged one change past its bound, and changes go on while its client comes back.
 */
export const HISTORY_PER_BUFFER = 4;

/** The fewest sessions' snapshots held before the replay's snapshots are swept. */
const MIN_SNAPSHOT_SWEEP = 64;

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
