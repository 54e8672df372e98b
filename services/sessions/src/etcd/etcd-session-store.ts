/**
 * The session store on etcd (`--store etcd`): the surface the RPC layer calls (SessionStoreApi)
 * over EtcdJournal, so that several berth instances on one cluster serve the same sessions.
 *
 * etcd is the one authority: an append is the journal's transaction (head, idempotency key and
 * fence compared there), a read or a watch asks etcd, and nothing an instance keeps in memory
 * decides anything. What it keeps is a cache of snapshots (the reducer's state at a seq of an
 * incarnation of a session), so that an append (the journal's transaction brings back the appends
 * other instances made since this one's, and the watch of the heads keeps the head it compares
 * current), the append that creates a session, or a GetSnapshot of an unchanged session costs one
 * round trip; a miss (more appends since than the transaction reads, or a session new to this
 * instance) rebuilds the state from the snapshot cached in etcd plus the entries after it. Every
 * few appends an instance writes the snapshot it has to etcd's cache (`s/<session>`), so that
 * rebuilding never replays much.
 *
 * Completed sessions past `completedRetentionMs` are deleted by etcd-retention.ts. Not here
 * (refused at start, see open-etcd-store.ts): the seed's live directories.
 */
import { systemClock, type Clock } from "@berth/shared/clock";
import { isBerthError } from "@berth/shared/errors";
import { checkSessionId } from "@berth/shared/safe-id";
import { EtcdReason, type EtcdClient } from "@berth/etcd";
import { checkFromSeq, checkReadLimit, checkIdempotencyKey } from "../append-input.js";
import { checkAppend } from "../append-rules.js";
import type { Logger } from "@berth/shared/logger";
import { applyEvent, baseSnapshot, type SessionSnapshot } from "../reducer.js";
import { refuseDeletedSeqs, storeClosed, storeShuttingDown } from "../session-refusals.js";
import type {
  AppendOptions,
  AppendResult,
  DeleteOptions,
  DeleteResult,
  EventWatcher,
  JournalReading,
  SessionsWatcher,
  SessionStoreApi,
  SessionStoreLimits,
  SessionView,
  WatchAllOptions,
  WatchEvent,
  WatchOptions,
} from "../session-store-api.js";
import { storeLimits } from "../store-limits.js";
import { SweepSchedule } from "../sweep-schedule.js";
import { isCompletedPhase } from "../vocabulary.js";
import { fenceRejected } from "./etcd-append-refusals.js";
import type { EtcdJournal, PreparedEvent } from "./etcd-journal.js";
import type { EtcdAppendOptions, EtcdAppendResult, EtcdFence, EtcdKnownState, SessionState } from "./etcd-journal-api.js";
import { EtcdRetention } from "./etcd-retention.js";
import { watchAllSessions, watchSession, type EtcdWatchContext } from "./etcd-store-watches.js";
import type { PumpedWatcher } from "./pumped-watcher.js";

/** Sessions whose snapshot an instance keeps by default. */
export const DEFAULT_ETCD_SNAPSHOT_CACHE = 10_000;
/**
 * An instance writes a session's snapshot to etcd once this many entries, or
 * {@link SNAPSHOT_EVERY_APPENDS} appends, went into the journal after the last one it knows of. A
 * rebuild reads the snapshot and the appends after it (one key each) and reduces their entries: the
 * appends bound what it reads, the entries what it reduces. By entries alone, AppendEvents of 100
 * events wrote a snapshot after every append, as many etcd writes again as the appends themselves.
 */
export const DEFAULT_SNAPSHOT_EVERY = 1000;
const SNAPSHOT_EVERY_APPENDS = 100;
/** Sessions whose state ListSessions rebuilds at once. */
const LIST_CONCURRENCY = 32;

export interface EtcdSessionStoreOptions {
  readonly journal: EtcdJournal;
  /** The journal's client: the revision a watcher of every session starts after. */
  readonly client: EtcdClient;
  /** Resolves an append's fence to what its transaction compares (the etcd source locks'). */
  readonly fences?: (file: string, token: bigint) => Promise<EtcdFence>;
  readonly clock?: Clock;
  readonly logger?: Logger;
  readonly maxEventBytes: number;
  readonly maxEventsPerAppend: number;
  readonly maxBuffered?: number;
  /** Sessions whose snapshot this instance keeps (default {@link DEFAULT_ETCD_SNAPSHOT_CACHE}). */
  readonly cacheSize?: number;
  /** Entries after which a snapshot is written to etcd (default {@link DEFAULT_SNAPSHOT_EVERY}; or 100 appends, whichever comes first). */
  readonly snapshotEvery?: number;
  /**
   * Completed and discarded sessions are deleted this long after their completing entry: looked at
   * at start, then as they change and fall due (see etcd-retention.ts). Unset: kept forever.
   */
  readonly completedRetentionMs?: number | undefined;
  /** How long a deleted session's idempotency keys keep answering (default 1 h): swept from etcd after. */
  readonly idempotencyWindowMs?: number | undefined;
}

/** Plain appends written together at most (one operation each, and the head's, of etcd's 128 per transaction). */
const MAX_GROUP_APPENDS = 64;
/**
 * Their events' JSON at most, well within etcd's request size (1.5 MiB by default); a lower
 * `--etcd-max-request-bytes` lowers it to half of what one append may take (the JSON is counted,
 * the journal lines around it are a little more).
 */
const MAX_GROUP_BYTES = 512 * 1024;

/** An append waiting for its turn on a session; `options` undefined for a plain one. */
interface QueuedAppend {
  readonly events: PreparedEvent[];
  readonly options: EtcdAppendOptions | undefined;
  readonly bytes: number;
  resolve(result: Appended): void;
  reject(error: unknown): void;
}

/** An append's result with the snapshot right after it. */
type Appended = EtcdAppendResult & { readonly snapshot: SessionSnapshot };

/** A session's state this instance knows: the snapshot at `seq` of incarnation `incarnation`. */
interface Known {
  readonly incarnation: bigint;
  readonly seq: number;
  readonly snapshot: SessionSnapshot;
  /** The seq of the snapshot last written to etcd (as far as this instance knows). */
  readonly savedSeq: number;
  /** Appends (journal keys) after it, as far as this instance knows: at most the entries after it. */
  readonly unsavedAppends: number;
}

/** The session store on etcd; see the module comment. */
export class EtcdSessionStore implements SessionStoreApi {
  private readonly journal: EtcdJournal;
  private readonly client: EtcdClient;
  private readonly fences: ((file: string, token: bigint) => Promise<EtcdFence>) | undefined;
  private readonly clock: Clock;
  private readonly logger: Logger | undefined;
  /** The limits it enforces (see store-limits.ts). */
  private readonly settings: Readonly<SessionStoreLimits>;
  private readonly cacheSize: number;
  private readonly snapshotEvery: number;
  /** Plain appends' bytes written together at most. */
  private readonly groupBytes: number;
  private readonly known = new Map<string, Known>();
  private readonly watchers = new Set<PumpedWatcher<unknown>>();
  /** Watchers of every session not yet sure of their start revision: a list waits for them. */
  private readonly watchStarts = new Set<Promise<void>>();
  private readonly watchContext: EtcdWatchContext;
  private readonly inflight = new Set<Promise<unknown>>();
  /** Per session, this instance's appends waiting for their turn (see inTurn). */
  private readonly turns = new Map<string, QueuedAppend[]>();
  private readonly now: () => number;
  private readonly retention: EtcdRetention | undefined;
  /** Forgets the tombstones' deletions (and the deleted sessions' keys) once their idempotency window passed. */
  private readonly tombstoneSweeps: SweepSchedule;
  private closed = false;
  private rebuilds = 0;
  /** Ends the watch of the heads (see etcd-head-cache.ts). */
  private readonly stopFollowing = new AbortController();
  private readonly following: Promise<void>;

  constructor(options: EtcdSessionStoreOptions) {
    this.journal = options.journal;
    this.client = options.client;
    this.fences = options.fences;
    this.clock = options.clock ?? systemClock;
    this.logger = options.logger;
    this.settings = storeLimits(options);
    this.watchContext = {
      journal: this.journal,
      client: this.client,
      now: () => this.clock.now(),
      maxBuffered: this.settings.maxBuffered,
      watchers: this.watchers,
      watchStarts: this.watchStarts,
      stateAt: (sessionId, seq) => this.stateAt(sessionId, seq),
    };
    this.cacheSize = options.cacheSize ?? DEFAULT_ETCD_SNAPSHOT_CACHE;
    this.snapshotEvery = options.snapshotEvery ?? DEFAULT_SNAPSHOT_EVERY;
    this.groupBytes = Math.min(MAX_GROUP_BYTES, Math.floor(this.journal.maxAppendBytes / 2));
    this.now = () => this.clock.now();
    this.tombstoneSweeps = new SweepSchedule({
      clock: this.clock,
      logger: this.logger,
      sweepOnce: async () => {
        const oldest = await this.journal.sweepTombstones();
        this.tombstoneSweeps.rearm(oldest + this.settings.idempotencyWindowMs);
      },
    });
    void this.track(this.tombstoneSweeps.sweep());
    this.following = this.journal.followHeads({ signal: this.stopFollowing.signal, logger: this.logger });
    if (options.completedRetentionMs !== undefined) {
      this.retention = new EtcdRetention({
        journal: this.journal,
        retentionMs: options.completedRetentionMs,
        clock: this.clock,
        logger: this.logger,
        deleted: (sessionId) => this.known.delete(sessionId),
      });
      void this.track(this.retention.start());
    }
  }

  // ---------------------------------------------------------------- appends

  append(sessionId: string, events: readonly unknown[], options: AppendOptions = {}): Promise<AppendResult> {
    return this.track(this.appendNow(sessionId, events, options));
  }

  private async appendNow(sessionId: string, events: readonly unknown[], options: AppendOptions): Promise<AppendResult> {
    this.assertOpen();
    const { events: prepared, idempotencyKey: ikey, digest } = checkAppend(sessionId, events, options, this.settings);
    const { expectedSeq, expectedState } = options;
    let fence: EtcdFence | undefined;
    if (options.fence !== undefined) {
      if (this.fences === undefined) throw fenceRejected({ file: options.fence.file, token: options.fence.token }, 0n);
      fence = await this.fences(options.fence.file, options.fence.token);
    }
    const plain = expectedSeq === undefined && expectedState === undefined && ikey === undefined && fence === undefined;
    const result = await this.inTurn(sessionId, {
      events: prepared,
      options: plain
        ? undefined
        : {
            ...(expectedSeq !== undefined ? { expectedSeq } : {}),
            ...(expectedState !== undefined ? { expectedState } : {}),
            ...(ikey !== undefined ? { idempotencyKey: ikey, digest } : {}),
            ...(fence !== undefined ? { fence } : {}),
          },
      bytes: prepared.reduce((sum, p) => sum + JSON.stringify(p.event).length + 128, 0),
    });
    return { firstSeq: result.firstSeq, lastSeq: result.lastSeq, snapshot: result.snapshot, duplicate: result.duplicate };
  }

  /**
   * Runs this instance's appends to one session one after the other: concurrent ones would race
   * on the head's compare in etcd and all but one retry, each retry a round trip. Plain appends
   * (no expectation, key or fence) that queued meanwhile go together, in order, in one
   * transaction (the file store's group commit, on etcd). Instances still race each other, and
   * etcd decides.
   */
  private inTurn(sessionId: string, job: Omit<QueuedAppend, "resolve" | "reject">): Promise<Appended> {
    return new Promise<Appended>((resolve, reject) => {
      const queue = this.turns.get(sessionId);
      if (queue !== undefined) return void queue.push({ ...job, resolve, reject });
      this.turns.set(sessionId, [{ ...job, resolve, reject }]);
      void this.drain(sessionId);
    });
  }

  private async drain(sessionId: string): Promise<void> {
    const queue = this.turns.get(sessionId)!;
    for (let first = queue.shift(); first !== undefined; first = queue.shift()) {
      const known = this.knownState(sessionId);
      if (first.options !== undefined) {
        await this.journal
          .append(sessionId, first.events, known === undefined ? first.options : { ...first.options, known })
          .then((result) => this.withSnapshot(sessionId, result))
          .then(first.resolve, first.reject);
        continue;
      }
      const group = [first];
      let bytes = first.bytes;
      for (
        let next = queue[0];
        next !== undefined && next.options === undefined && group.length < MAX_GROUP_APPENDS && bytes + next.bytes <= this.groupBytes;
        next = queue[0]
      ) {
        group.push(queue.shift()!);
        bytes += next.bytes;
      }
      let results: EtcdAppendResult[];
      try {
        results = await this.journal.appendGroup(
          sessionId,
          group.map((job) => job.events),
          known,
        );
      } catch (error) {
        // Too large together for a lower limit than the journal was told: each goes alone, and
        // only one too large by itself is refused.
        if (group.length > 1 && isBerthError(error) && error.reason === EtcdReason.REQUEST_TOO_LARGE) {
          queue.unshift(...group.map((job) => ({ ...job, options: {} })));
          continue;
        }
        for (const job of group) job.reject(error);
        continue;
      }
      // One after the other: each snapshot is built on the one before it.
      for (const [i, job] of group.entries()) await this.withSnapshot(sessionId, results[i]!).then(job.resolve, job.reject);
    }
    this.turns.delete(sessionId);
  }

  /** What this instance knows of the session, for the append to bring back what came after it. */
  private knownState(sessionId: string): EtcdKnownState | undefined {
    const known = this.known.get(sessionId);
    return known === undefined ? undefined : { seq: known.seq, incarnation: known.incarnation };
  }

  /** `result` with the snapshot right after it (run in the session's turn, so that each builds on the last). */
  private async withSnapshot(sessionId: string, result: EtcdAppendResult): Promise<Appended> {
    const snapshot = result.duplicate ? (await this.stateAt(sessionId, result.lastSeq)).snapshot : await this.afterAppend(sessionId, result);
    return { ...result, snapshot };
  }

  /** The snapshot after an append this instance wrote: from the one before it when known, else rebuilt. */
  private async afterAppend(sessionId: string, result: EtcdAppendResult): Promise<SessionSnapshot> {
    // An append that created its session (the head it compared was absent): nothing came before it
    // to read back, whatever this instance remembers of an earlier incarnation.
    const before: Known | undefined = result.created
      ? { incarnation: result.incarnation, seq: result.firstSeq - 1, snapshot: baseSnapshot(sessionId), savedSeq: result.firstSeq - 1, unsavedAppends: 0 }
      : this.caughtUp(this.known.get(sessionId), result);
    let known: Known;
    if (before !== undefined && before.incarnation === result.incarnation && before.seq === result.firstSeq - 1) {
      let snapshot = before.snapshot;
      for (const entry of result.entries) snapshot = applyEvent(snapshot, entry, { now: this.now });
      known = { incarnation: result.incarnation, seq: result.lastSeq, snapshot, savedSeq: before.savedSeq, unsavedAppends: before.unsavedAppends + 1 };
    } else {
      known = knownFrom(await this.stateAt(sessionId, result.lastSeq), before);
    }
    this.remember(sessionId, known);
    if (known.seq - known.savedSeq >= this.snapshotEvery || known.unsavedAppends >= SNAPSHOT_EVERY_APPENDS) this.save(sessionId, known);
    return known.snapshot;
  }

  /**
   * `known` with the appends other instances made before `result` applied (the journal read them in
   * the append's transactions), when they take it right up to `result`; else `known` as it was.
   */
  private caughtUp(known: Known | undefined, result: EtcdAppendResult): Known | undefined {
    if (known === undefined || result.preceding === undefined || known.incarnation !== result.incarnation) return known;
    // Another call may have moved what this instance knows meanwhile: only the appends after it count.
    const missing = result.preceding.filter((entries) => entries[0]!.seq > known.seq);
    if (missing[0] !== undefined && missing[0][0]!.seq !== known.seq + 1) return known;
    if ((missing.at(-1)?.at(-1)?.seq ?? known.seq) !== result.firstSeq - 1) return known;
    let snapshot = known.snapshot;
    for (const entries of missing) for (const entry of entries) snapshot = applyEvent(snapshot, entry, { now: this.now });
    return { ...known, seq: result.firstSeq - 1, snapshot, unsavedAppends: known.unsavedAppends + missing.length };
  }

  /** The state right after `seq`: the cached snapshot plus the tail when that is where the session is, else a replay up to it. */
  private async stateAt(sessionId: string, seq: number): Promise<SessionState> {
    this.rebuilds++;
    const state = await this.journal.state(sessionId, { now: this.now });
    if (state.lastSeq === seq) return state;
    return this.journal.state(sessionId, { now: this.now, untilSeq: seq });
  }

  /** Writes `known` to etcd's snapshot cache, in the background (a failure only costs a longer rebuild). */
  private save(sessionId: string, known: Known): void {
    this.remember(sessionId, { ...known, savedSeq: known.seq, unsavedAppends: 0 });
    void this.track(
      this.journal.saveSnapshot(sessionId, { seq: known.seq, incarnation: known.incarnation, snapshot: known.snapshot }).catch((error: unknown) => {
        this.logger?.warn({ sessionId, err: error }, "snapshot not cached in etcd");
      }),
    );
  }

  private remember(sessionId: string, known: Known): void {
    this.known.delete(sessionId);
    this.known.set(sessionId, known);
    if (this.known.size > this.cacheSize) this.known.delete(this.known.keys().next().value!);
  }

  // ---------------------------------------------------------------- reads

  async getSnapshot(sessionId: string, options: { includeCompleted?: boolean } = {}): Promise<SessionView | null> {
    this.assertOpen();
    checkSessionId(sessionId);
    const head = await this.journal.head(sessionId);
    const view = await this.viewOf(sessionId, head.seq, head.incarnation);
    if (!options.includeCompleted && isCompletedPhase(view.snapshot.phase)) return null;
    return view;
  }

  /** The view of a session whose head is `seq` of `incarnation`: from memory when known, else rebuilt. */
  private async viewOf(sessionId: string, seq: number, incarnation: bigint): Promise<SessionView> {
    if (incarnation === 0n) return { sessionId, snapshot: baseSnapshot(sessionId), lastSeq: 0, exists: false };
    const known = this.known.get(sessionId);
    if (known !== undefined && known.incarnation === incarnation && known.seq === seq)
      return { sessionId, snapshot: known.snapshot, lastSeq: seq, exists: true };
    this.rebuilds++;
    const state = await this.journal.state(sessionId, { now: this.now });
    if (state.exists) this.remember(sessionId, knownFrom(state, known));
    return { sessionId, snapshot: state.snapshot, lastSeq: state.lastSeq, exists: state.exists };
  }

  async list(options: { includeCompleted?: boolean; after?: string; limit?: number } = {}): Promise<SessionView[]> {
    this.assertOpen();
    // A watcher of every session opened before this list starts watching at or before what it reads.
    await Promise.all([...this.watchStarts]);
    const limit = options.limit ?? Infinity;
    const views: SessionView[] = [];
    let after = options.after;
    for (;;) {
      const page = await this.journal.list({ ...(after !== undefined ? { after } : {}), limit: LIST_CONCURRENCY });
      const found = await Promise.all(page.sessions.map((s) => this.viewOf(s.sessionId, s.lastSeq, s.incarnation)));
      for (const view of found) {
        if (views.length >= limit) return views;
        if (!view.exists || (!options.includeCompleted && isCompletedPhase(view.snapshot.phase))) continue;
        views.push(view);
      }
      const last = page.sessions.at(-1);
      if (last === undefined || page.sessions.length < LIST_CONCURRENCY || views.length >= limit) return views;
      after = last.sessionId;
    }
  }

  async *pages(options: { includeCompleted?: boolean; pageSize: number }): AsyncGenerator<SessionView[]> {
    // etcd lists a range from a key: a page is its own listing, from the last id of the one before.
    const pageSize = Math.max(1, Math.floor(options.pageSize));
    for (let after: string | undefined; ; ) {
      const views = await this.list({ ...options, limit: pageSize, ...(after !== undefined ? { after } : {}) });
      if (views.length > 0) yield views;
      if (views.length < pageSize) return;
      after = views[views.length - 1]!.sessionId;
    }
  }

  async flush(sessionId: string): Promise<SessionView> {
    this.assertOpen();
    checkSessionId(sessionId);
    const state = await this.journal.state(sessionId, { now: this.now });
    if (!state.exists) return { sessionId, snapshot: baseSnapshot(sessionId), lastSeq: 0, exists: false };
    await this.journal.saveSnapshot(sessionId, { seq: state.lastSeq, incarnation: state.incarnation, snapshot: state.snapshot });
    this.remember(sessionId, { incarnation: state.incarnation, seq: state.lastSeq, snapshot: state.snapshot, savedSeq: state.lastSeq, unsavedAppends: 0 });
    return { sessionId, snapshot: state.snapshot, lastSeq: state.lastSeq, exists: true };
  }

  async delete(sessionId: string, options: DeleteOptions = {}): Promise<DeleteResult> {
    this.assertOpen();
    checkSessionId(sessionId);
    const ikey = checkIdempotencyKey(options.idempotencyKey);
    const { lastSeq, duplicate } = await this.track(
      this.journal.delete(sessionId, {
        ...(options.expectedSeq !== undefined ? { expectedSeq: options.expectedSeq } : {}),
        ...(ikey !== undefined ? { idempotencyKey: ikey } : {}),
      }),
    );
    if (duplicate) return { lastSeq, duplicate };
    this.known.delete(sessionId);
    this.tombstoneSweeps.due(this.clock.now() + this.settings.idempotencyWindowMs);
    this.logger?.info({ sessionId, lastSeq }, "session deleted");
    return { lastSeq, duplicate };
  }

  async read(sessionId: string, fromSeq = 1, limit = 0): Promise<JournalReading | null> {
    this.assertOpen();
    checkSessionId(sessionId);
    checkFromSeq(fromSeq);
    checkReadLimit(limit);
    // The head and the first page in one transaction: the last seq and the entries agree.
    const read = await this.journal.read(sessionId, fromSeq, limit);
    if (read.incarnation === 0n) return null;
    refuseDeletedSeqs(sessionId, fromSeq, read.deletedThrough);
    return { lastSeq: read.lastSeq, entries: read.entries() };
  }

  // ---------------------------------------------------------------- watches

  /** The entries from `fromSeq`, a caught-up marker, then every new entry (see etcd-store-watches.ts). */
  watch(sessionId: string, fromSeq = 1, options: WatchOptions = {}): EventWatcher<WatchEvent> {
    this.assertOpen();
    checkSessionId(sessionId);
    checkFromSeq(fromSeq);
    return watchSession(this.watchContext, sessionId, fromSeq, options);
  }

  /**
   * Watches every session at etcd's revisions. With `startRevision`, etcd's watch from the
   * revision after it replays what followed, unless etcd compacted it or it is ahead of the current
   * revision: then the watch starts at the current revision with `reset`. A watcher that falls
   * behind names the last revision all of whose changes it took (see etcd-store-watches.ts).
   */
  watchAll(options: WatchAllOptions = {}): SessionsWatcher {
    this.assertOpen();
    return watchAllSessions(this.watchContext, options);
  }

  // ---------------------------------------------------------------- the rest

  limits(): SessionStoreLimits {
    return { ...this.settings };
  }

  /** Gauges; `rebuilds`: states read back from etcd because this instance's memory did not have them. */
  stats(): { openSessions: number; watchers: number; rebuilds: number } {
    return { openSessions: this.known.size, watchers: this.watchers.size, rebuilds: this.rebuilds };
  }

  /** Runs the sweep of completed sessions now (tests; the store sweeps by itself). */
  sweepCompleted(): Promise<void> {
    return this.retention?.schedule.sweep() ?? Promise.resolve();
  }

  /** Resolves once the retention has heard of every append and deletion up to etcd revision `revision` (tests). */
  retentionSeen(revision: bigint): Promise<void> {
    return this.retention?.seen(revision) ?? Promise.resolve();
  }

  /** Resolves once no append, deletion, snapshot write or retention sweep of this instance is in flight. */
  async settled(): Promise<void> {
    while (this.inflight.size > 0 || this.retention?.schedule.sweeping) await Promise.allSettled([...this.inflight, this.retention?.schedule.idle()]);
  }

  /** Refuses new calls, ends watchers (unavailable SHUTTING_DOWN), waits for appends in flight. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const shutdown = storeShuttingDown();
    for (const watcher of this.watchers) watcher.fail(shutdown);
    this.stopFollowing.abort();
    await this.following;
    await this.retention?.stop();
    await this.tombstoneSweeps.stop();
    await this.settled();
  }

  private track<T>(promise: Promise<T>): Promise<T> {
    this.inflight.add(promise);
    void promise.then(
      () => this.inflight.delete(promise),
      () => this.inflight.delete(promise),
    );
    return promise;
  }

  private assertOpen(): void {
    if (this.closed) throw storeClosed();
  }
}

/**
 * What an instance knows of a session rebuilt from etcd: the state, and the snapshot it last saved
 * when that was of the same incarnation. The appends after it are not counted on a rebuild: at
 * most one per entry.
 */
function knownFrom(state: SessionState, earlier: Known | undefined): Known {
  const savedSeq = earlier?.incarnation === state.incarnation ? earlier.savedSeq : 0;
  return { incarnation: state.incarnation, seq: state.lastSeq, snapshot: state.snapshot, savedSeq, unsavedAppends: state.lastSeq - savedSeq };
}
