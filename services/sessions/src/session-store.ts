/**
 * The session store: durable per-session journals, the snapshots derived from them, and their
 * watchers. The RPC layer maps its calls onto this; it returns plain objects and throws BerthError.
 *
 * The store is the domain core over the journal seam (journal/journal-store.ts): appends go
 * through the append pipeline (append-pipeline.ts: checks, sequencing on the head, durability by
 * the backend), reads and watches see the durable state only (watch-hub.ts hands new entries to
 * watchers), completed sessions are swept by retention.ts. Where and how journals are kept — the
 * seed's files, their snapshot files, other processes writing them — is the backend's business:
 * create-session-store.ts wires the file backend.
 */
import { systemClock, type Clock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import { checkSessionId, type SessionId } from "@berth/shared/safe-id";
import { checkFromSeq, checkIdempotencyKey, checkReadLimit } from "./append-input.js";
import { AppendPipeline } from "./append-pipeline.js";
import { checkExpectation } from "./append-rules.js";
import { emptyIterator } from "@berth/shared/empty-iterator";
import { eventsDigest } from "./event-digest.js";
import type { JournalStore, KeyRecord, SessionJournal, StoredEntry } from "./journal/journal-store.js";
import { baseSnapshot } from "./reducer.js";
import { CompletedRetention, type RetentionHost } from "./retention.js";
import { keyReused, refuseDeletedSeqs, seqsDeleted, sessionNotFound, storeClosed, storeShuttingDown } from "./session-refusals.js";
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
} from "./session-store-api.js";
import { findDeletedKey, repeatedDeletion } from "./session-tombstones.js";
import { storeLimits } from "./store-limits.js";
import { SweepSchedule } from "./sweep-schedule.js";
import { isCompletedPhase } from "./vocabulary.js";
import { WatchHub } from "./watch-hub.js";
import type { WatchBacklog } from "./watch-hub-api.js";
import { runRevisionBase } from "@berth/shared/revision-history";

export { MAX_IDEMPOTENCY_KEY_LENGTH } from "./append-input.js";
export type { AppendOptions, AppendResult, SessionStoreApi, SessionStoreLimits, SessionView } from "./session-store-api.js";
export { sessionNotFound, UNAVAILABLE_RETRY_AFTER_MS, type ExpectedState } from "./session-refusals.js";

export { DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_EVENTS_PER_APPEND } from "./store-limits.js";

/** What the store is built from: its journals, and the limits it enforces. */
export interface SessionStoreCoreOptions {
  /** Where the journals are kept (the seam a backend implements). */
  journals: JournalStore;
  clock?: Clock | undefined;
  logger?: Logger | undefined;
  maxEventBytes?: number | undefined;
  maxEventsPerAppend?: number | undefined;
  /** Default buffer bound of a watcher. */
  maxBuffered?: number | undefined;
  /**
   * Delete completed and discarded sessions this long (ms) after their completing entry: swept
   * at start, then when the next one is due (see retention.ts). Unset: kept forever.
   */
  completedRetentionMs?: number | undefined;
  /**
   * How long a deleted session's idempotency keys (and its deletion's own) keep answering
   * (default {@link DEFAULT_IDEMPOTENCY_WINDOW_MS}); its last seq is kept for good.
   */
  idempotencyWindowMs?: number | undefined;
}

/** Counters for metrics and tests. */
export interface SessionStoreStats {
  openSessions: number;
  /** Journal files held open for appending (bounded by the backend, see file-journal-store.ts). */
  openJournals: number;
  watchers: number;
  /** Full journal replays done (opens without a current snapshot file, and catch-ups after foreign writes). */
  replays: number;
  /** Opens served from a snapshot file (current, or of a prefix: see `tailReplays`). */
  hydrations: number;
  /** Opens from a snapshot file of the journal's prefix plus a replay of the rest. */
  tailReplays: number;
  snapshotWrites: number;
}

/** The store; see the module comment. Create one per journal store (createSessionStore for files). */
export class SessionStore implements SessionStoreApi {
  private readonly journals: JournalStore;
  private readonly clock: Clock;
  private readonly logger: Logger | undefined;
  /** The limits it enforces (see store-limits.ts). */
  private readonly settings: Readonly<SessionStoreLimits>;
  private readonly hub: WatchHub;
  private readonly appends: AppendPipeline;
  private readonly background = new Set<Promise<void>>();
  private closed = false;
  /** Deletions in progress, per session: appends to the session wait for them. */
  private readonly deletions = new Map<string, Promise<unknown>>();
  private readonly retention: CompletedRetention | undefined;
  /** Prunes the tombstones' deletions once their idempotency window has passed. */
  private readonly tombstoneSweeps: SweepSchedule;

  constructor(options: SessionStoreCoreOptions) {
    this.journals = options.journals;
    this.clock = options.clock ?? systemClock;
    this.logger = options.logger;
    this.settings = storeLimits(options);
    this.hub = new WatchHub(this.settings.maxBuffered, runRevisionBase(this.clock));
    this.journals.listen({
      appended: (id, appends) => {
        for (const append of appends) this.hub.publish(id, [...append]);
      },
      resync: (id, reason) => this.hub.resync(id, reason),
      watched: (id) => this.hub.isWatched(id),
      watching: () => this.hub.watcherCount > 0,
    });
    this.retention =
      options.completedRetentionMs === undefined
        ? undefined
        : new CompletedRetention(this.retentionHost(), { retentionMs: options.completedRetentionMs, clock: this.clock, logger: this.logger });
    this.appends = new AppendPipeline({
      journals: this.journals,
      hub: this.hub,
      retention: this.retention,
      clock: this.clock,
      logger: this.logger,
      limits: this.settings,
      deletions: this.deletions,
      idempotencyWindowMs: this.settings.idempotencyWindowMs,
      assertOpen: () => this.assertOpen(),
    });
    if (this.retention !== undefined) this.track(this.retention.start());
    this.tombstoneSweeps = new SweepSchedule({
      onlyWhenDue: true,
      clock: this.clock,
      logger: this.logger,
      sweepOnce: async () => {
        // A deletion is remembered while now < deletedAt + window: forget those made at or before now - window.
        const oldest = this.journals.pruneTombstones(this.clock.now() - this.settings.idempotencyWindowMs + 1);
        this.tombstoneSweeps.rearm(oldest + this.settings.idempotencyWindowMs);
      },
    });
    this.track(this.tombstoneSweeps.sweep());
  }

  /**
   * Appends `events` to the session, atomically (one write of all their lines: all or none), and
   * resolves once they are durable as the backend promises. See {@link AppendOptions}.
   */
  append(sessionId: string, events: readonly unknown[], options: AppendOptions = {}): Promise<AppendResult> {
    return this.appends.append(sessionId, events, options);
  }

  // ---------------------------------------------------------------- reads

  /**
   * The session's durable snapshot and last seq. Null for a completed or discarded session unless
   * `includeCompleted`. A session with no journal gets the base snapshot with `exists: false`
   * (the seed's `getSnapshot` answers it so too); nothing is created.
   */
  getSnapshot(requestedId: string, options: { includeCompleted?: boolean } = {}): SessionView | null {
    this.assertOpen();
    const sessionId = checkSessionId(requestedId);
    const journal = this.journals.open(sessionId);
    const view: SessionView = journal?.exists
      ? { sessionId, snapshot: journal.snapshot, lastSeq: journal.nextSeq - 1, exists: true }
      : { sessionId, snapshot: baseSnapshot(sessionId), lastSeq: 0, exists: false };
    if (!options.includeCompleted && isCompletedPhase(view.snapshot.phase)) return null;
    return view;
  }

  /** True when a journal exists for the session. Never creates anything. */
  has(requestedId: string): boolean {
    this.assertOpen();
    const sessionId = checkSessionId(requestedId);
    return this.journals.has(sessionId);
  }

  /**
   * The sessions with a journal, sorted by id; completed and discarded ones only with
   * `includeCompleted` (the seed's `listActiveSessions`). With `after`, only the sessions whose id
   * sorts after it; with `limit`, at most that many: a page of the list, which sessions created or
   * deleted meanwhile cannot shift (a page starts after an id, not at a position). A session whose
   * journal has not moved costs a stat.
   */
  list(options: { includeCompleted?: boolean; after?: string; limit?: number } = {}): SessionView[] {
    this.assertOpen();
    const after = options.after;
    const ids = this.sessionIds();
    return this.existingViews(after === undefined ? ids : ids.filter((id) => id > after), options, options.limit);
  }

  *pages(options: { includeCompleted?: boolean; pageSize: number }): Generator<SessionView[]> {
    this.assertOpen();
    // Listed once: a page per listing of the directory would read it N / pageSize times.
    const ids = this.sessionIds();
    const pageSize = Math.max(1, Math.floor(options.pageSize));
    for (let start = 0; start < ids.length; start += pageSize) {
      this.assertOpen();
      const views = this.existingViews(ids.slice(start, start + pageSize), options);
      if (views.length > 0) yield views;
    }
  }

  /** The views of those of `ids` that exist (and are not completed, unless asked for), `limit` at most. */
  private existingViews(ids: readonly string[], options: { includeCompleted?: boolean }, limit = Infinity): SessionView[] {
    const views: SessionView[] = [];
    for (const id of ids) {
      if (views.length >= limit) break;
      const view = this.getSnapshot(id, options);
      if (view?.exists) views.push(view);
    }
    return views;
  }

  /** The ids of the sessions with a journal, sorted (code unit order, as `<` compares). */
  sessionIds(): string[] {
    this.assertOpen();
    return this.journals.sessionIds();
  }

  /**
   * Writes the session's snapshot now (the file backend: its snapshot file, atomically), so
   * another process — or the next start — can hydrate from it. The journal stays the truth.
   */
  async flush(requestedId: string): Promise<SessionView> {
    this.assertOpen();
    const sessionId = checkSessionId(requestedId);
    const journal = this.journals.open(sessionId);
    if (!journal?.exists) return { sessionId, snapshot: baseSnapshot(sessionId), lastSeq: 0, exists: false };
    const view: SessionView = { sessionId, snapshot: journal.snapshot, lastSeq: journal.nextSeq - 1, exists: true };
    await journal.flush();
    return view;
  }

  /**
   * Deletes a session: its journal and snapshots (in the legacy root too, for the file backend),
   * leaving its tombstone (session-tombstones.ts): its last seq, so that a session created again
   * under the id continues after it, and for the idempotency window its keys and this deletion.
   * Appends already sequenced land first; appends made meanwhile wait, then start the new session.
   * Watchers of the session end with not_found SESSION_DELETED; watchers of every session get a
   * deletion change. With `expectedSeq`, only when that is still the session's last seq (aborted
   * SEQ_CONFLICT). not_found SESSION_NOT_FOUND when the session has no journal. A repeat of a keyed
   * deletion answers the first one (`duplicate`), even once the session was created again.
   */
  delete(requestedId: string, options: DeleteOptions = {}): Promise<DeleteResult> {
    this.assertOpen();
    const sessionId = checkSessionId(requestedId);
    checkIdempotencyKey(options.idempotencyKey);
    // Registered before anything is awaited, so an append called after this waits for it.
    const previous = this.deletions.get(sessionId) ?? Promise.resolve();
    const deletion = previous.catch(() => undefined).then(() => this.deleteNow(sessionId, options));
    this.deletions.set(sessionId, deletion);
    void deletion
      .finally(() => {
        if (this.deletions.get(sessionId) === deletion) this.deletions.delete(sessionId);
      })
      .catch(() => undefined);
    return deletion;
  }

  private async deleteNow(sessionId: SessionId, options: DeleteOptions): Promise<DeleteResult> {
    const ikey = options.idempotencyKey === "" ? undefined : options.idempotencyKey;
    for (;;) {
      this.assertOpen();
      const journal = this.journals.open(sessionId);
      const lastSeq = journal?.exists ? journal.nextSeq - 1 : 0;
      if (ikey !== undefined) {
        const live = journal?.exists ? journal.findKey(ikey) : undefined;
        if (live !== undefined) throw keyReused(sessionId, ikey, live);
        const known = findDeletedKey(this.journals.tombstone(sessionId), ikey, this.clock.now(), this.settings.idempotencyWindowMs);
        // A deletion whose tombstone was written but whose journal outlived a crash is done again;
        // any other is answered as it was (the session may have been created again since).
        if (known !== undefined && !(known.kind === "deletion" && journal?.exists && known.deletion.lastSeq === lastSeq)) {
          return { ...repeatedDeletion(sessionId, ikey, options.expectedSeq, known), duplicate: true };
        }
      }
      if (!journal?.exists) throw sessionNotFound(sessionId);
      // Appends sequenced before the deletion land (or fail) first; a snapshot being written
      // must not be written again after the deletion.
      if (journal.writing) {
        await journal.idle();
        continue;
      }
      checkExpectation(sessionId, lastSeq, { expectedSeq: options.expectedSeq });
      const { keys, firstSeq } = await burialOf(journal);
      // Reading the keys back may have let the session move (a foreign write, an eviction).
      if (this.journals.open(sessionId) !== journal || journal.writing || journal.nextSeq - 1 !== lastSeq) continue;
      const deletedAt = this.clock.now();
      this.journals.remove(journal, {
        deletion: {
          firstSeq,
          lastSeq,
          deletedAt,
          ...(ikey !== undefined ? { idempotencyKey: ikey } : {}),
          ...(options.expectedSeq !== undefined ? { expectedSeq: options.expectedSeq } : {}),
        },
        keys,
      });
      this.tombstoneSweeps.due(deletedAt + this.settings.idempotencyWindowMs);
      this.logger?.info({ sessionId, lastSeq }, "session deleted");
      this.retention?.forget(sessionId);
      this.hub.sessionDeleted(sessionId, lastSeq);
      return { lastSeq, duplicate: false };
    }
  }

  /**
   * The session's last durable seq and its entries with seq ≥ `fromSeq` up to it, at most `limit`
   * (0: all), in journal order: each as the seed wrote it (without berth's bookkeeping fields), with
   * the idempotency key it was appended with and its line's checksum verdict. Both as of the call.
   */
  read(requestedId: string, fromSeq = 1, limit = 0): JournalReading | null {
    this.assertOpen();
    const sessionId = checkSessionId(requestedId);
    checkFromSeq(fromSeq);
    checkReadLimit(limit);
    const journal = this.journals.open(sessionId);
    if (!journal?.exists) return null;
    return { lastSeq: journal.nextSeq - 1, entries: this.guardDeletedSeqs(sessionId, fromSeq, journal.reader(fromSeq, limit)()) };
  }

  /**
   * `entries` (read from `fromSeq`), refused not_found SESSION_DELETED when they start past
   * `fromSeq` because the seqs asked for belonged to a session deleted since: a reader resuming
   * from an old seq is told, rather than handed the new session's entries as if they followed.
   */
  private guardDeletedSeqs(sessionId: SessionId, fromSeq: number, entries: AsyncIterableIterator<StoredEntry>): AsyncIterableIterator<StoredEntry> {
    if (fromSeq <= 1 || this.journals.tombstone(sessionId) === undefined) return entries;
    let first = true;
    return {
      next: async () => {
        const step = await entries.next();
        if (first && !step.done) {
          first = false;
          if (step.value.entry.seq > fromSeq) {
            await entries.return?.();
            throw seqsDeleted(sessionId, fromSeq, step.value.entry.seq);
          }
        }
        return step;
      },
      return: async () => (await entries.return?.()) ?? { value: undefined, done: true },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }

  /**
   * Watches a session: entries with seq ≥ `fromSeq` from the journal, a caught-up marker, then
   * every new durable entry (with the snapshot it produced, when `includeSnapshot`). A watcher
   * more than `maxBuffered` entries behind is ended with resource_exhausted naming the seq to
   * resume from. `return()` on the iterator unsubscribes at once.
   */
  watch(requestedId: string, fromSeq = 1, options: WatchOptions = {}): EventWatcher<WatchEvent> {
    this.assertOpen();
    const sessionId = checkSessionId(requestedId);
    checkFromSeq(fromSeq);
    this.journals.follow();
    // The seqs of a session deleted since cannot be waited for: the new one continues after them.
    const deletedThrough = this.journals.open(sessionId)?.exists ? 0 : (this.journals.tombstone(sessionId)?.lastSeq ?? 0);
    refuseDeletedSeqs(sessionId, fromSeq, deletedThrough);
    return this.hub.watchSession(sessionId, fromSeq, options, (): WatchBacklog => {
      const journal = this.journals.open(sessionId);
      if (!journal?.exists) return { lastSeq: 0, snapshot: baseSnapshot(sessionId), entries: () => emptyIterator() };
      const reader = journal.reader(fromSeq);
      return { lastSeq: journal.nextSeq - 1, snapshot: journal.snapshot, entries: () => this.guardDeletedSeqs(sessionId, fromSeq, reader()) };
    });
  }

  /**
   * Watches every session: one change per durable append (an append of several events is one
   * change, first..last seq), with the snapshot after it when asked; from `startRevision` when the
   * hub still holds the changes after it (see {@link WatchHub.watchAll}).
   */
  watchAll(options: WatchAllOptions = {}): SessionsWatcher {
    this.assertOpen();
    this.journals.follow();
    return this.hub.watchAll(options);
  }

  /** What retention reads and does through the store (see retention.ts). */
  private retentionHost(): RetentionHost {
    return {
      sessionIds: () => this.sessionIds(),
      view: (id) => {
        const view = this.getSnapshot(id, { includeCompleted: true });
        return view?.exists ? view : undefined;
      },
      entries: (id) => this.read(id, 1, 0)?.entries ?? emptyIterator(),
      delete: (id, lastSeq) => this.delete(id, { expectedSeq: lastSeq }),
    };
  }

  /** Runs the sweep of completed sessions now (tests; the store sweeps by itself). */
  sweepCompleted(): Promise<void> {
    return this.retention?.schedule.sweep() ?? Promise.resolve();
  }

  /** The limits the store enforces (what GetLimits reports). */
  limits(): SessionStoreLimits {
    return { ...this.settings };
  }

  /** Counters for metrics. */
  stats(): SessionStoreStats {
    const { openSessions, openJournals, replays, hydrations, tailReplays, snapshotWrites } = this.journals.stats();
    return { openSessions, openJournals, watchers: this.hub.watcherCount, replays, hydrations, tailReplays, snapshotWrites };
  }

  /** Resolves once no append is in flight and no background write or retention sweep is running. */
  async settled(): Promise<void> {
    for (;;) {
      await Promise.all([this.journals.settled(), ...this.background, this.retention?.schedule.idle()]);
      if (!this.journals.busy && this.background.size === 0 && !this.retention?.schedule.sweeping) return;
    }
  }

  /**
   * Stops the store: refuses new calls, ends watchers (unavailable), waits for appends in flight,
   * and closes the journals (the file backend writes the snapshot files that are behind).
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    // Closed at once: nothing new is scheduled from here on; it settles and writes below.
    const closing = this.journals.close();
    this.hub.close(storeShuttingDown());
    await this.retention?.stop();
    await this.tombstoneSweeps.stop();
    await this.settled();
    await closing;
    await Promise.allSettled([...this.background]);
  }

  private track(promise: Promise<unknown>): void {
    const done = promise.then(() => undefined);
    this.background.add(done);
    void done.finally(() => this.background.delete(done));
  }

  private assertOpen(): void {
    if (this.closed) throw storeClosed();
  }
}

/**
 * What a deleted journal's tombstone keeps of it: its first seq, and its keyed appends, each with
 * the digest of its events (read back from the journal for those this process did not write).
 */
async function burialOf(journal: SessionJournal): Promise<{ keys: Map<string, KeyRecord>; firstSeq: number }> {
  const keys = new Map(journal.keyedAppends());
  const missing = new Map<string, { record: KeyRecord; events: unknown[] }>();
  for (const [key, record] of keys) if (record.digest === undefined) missing.set(key, { record, events: [] });
  let firstSeq: number | undefined;
  const entries: AsyncIterableIterator<StoredEntry> = journal.reader(1, missing.size === 0 ? 1 : 0)();
  try {
    for await (const { entry, idempotencyKey } of entries) {
      firstSeq ??= entry.seq;
      const pending = idempotencyKey === undefined ? undefined : missing.get(idempotencyKey);
      if (pending !== undefined && entry.seq >= pending.record.firstSeq && entry.seq <= pending.record.lastSeq) pending.events.push(entry.event);
    }
  } finally {
    await entries.return?.();
  }
  // Entries that could not all be read (a damaged line) leave the key without a digest: taken at its word.
  for (const [key, { record, events }] of missing) {
    if (events.length === record.lastSeq - record.firstSeq + 1) keys.set(key, { ...record, digest: eventsDigest(events) });
  }
  return { keys, firstSeq: firstSeq ?? journal.nextSeq };
}
