/**
 * What the RPC layer asks of a session store: the surface the SessionService handlers call. The
 * file store (SessionStore, over the journal seam) and the etcd store (etcd/etcd-session-store.ts)
 * both implement it; the handlers take whichever the settings chose.
 *
 * A method whose answer the file store has in memory may answer synchronously (the file store
 * does); a store that has to ask a server answers with a promise. Callers await either.
 */
import type { EntryIntegrity, StoredEntry } from "./journal/journal-store.js";
import type { JournalEntry, SessionSnapshot } from "./reducer.js";
import type { ExpectedState } from "./session-refusals.js";

/** A value now, or later. */
export type MaybePromise<T> = T | Promise<T>;

/** Options of {@link SessionStoreApi.append}. */
export interface AppendOptions {
  /** The last seq the caller saw (0: no entry yet); anything else is aborted SEQ_CONFLICT. */
  expectedSeq?: number;
  /** A state the session must be in: no entry yet (`no_session`) or at least one (`exists`). */
  expectedState?: ExpectedState;
  /** A retry with the same key returns the first append's result and writes nothing ("" = none). */
  idempotencyKey?: string;
  /** Called just before the append is sequenced; throwing (e.g. a stale lock fence) refuses it with nothing written. */
  fenceCheck?: () => void;
  /**
   * The append's fence as the request gave it (input checked): the lock's file, any spelling, and
   * the fencing token. A store that checks fences inside its own write (etcd's transaction) takes
   * it from here; the file store has `fenceCheck` run at sequencing instead.
   */
  fence?: { readonly file: string; readonly token: bigint };
}

/** What an append returns. */
export interface AppendResult {
  firstSeq: number;
  lastSeq: number;
  /** The snapshot right after this append's last entry. */
  snapshot: SessionSnapshot;
  /** True when this was a retry of an earlier append with the same idempotency key (nothing was written). */
  duplicate: boolean;
}

// ---------------------------------------------------------------- watchers

/** A journal entry delivered to a watcher, with the snapshot it produced when asked for. */
export interface WatchEntry {
  kind: "entry";
  entry: JournalEntry;
  /** The idempotency key the entry was appended with (see {@link StoredEntry}). */
  idempotencyKey: string | undefined;
  /** The checksum verdict of the entry's line (see {@link EntryIntegrity}). */
  integrity: EntryIntegrity;
  /** The session's snapshot right after this entry (live entries of a watcher that asked only). */
  snapshot?: SessionSnapshot;
}

/** The end of the backlog: every entry up to `lastSeq` has been delivered (or was before `fromSeq`). */
export interface WatchCaughtUp {
  kind: "caught_up";
  lastSeq: number;
  /** The snapshot at `lastSeq`, for a watcher that asked for snapshots. */
  snapshot?: SessionSnapshot;
}

/** What a session watcher yields. */
export type WatchEvent = WatchEntry | WatchCaughtUp;

/** A watcher: an async iterator that can also hand out what is already buffered, all at once. */
export interface EventWatcher<T> extends AsyncIterableIterator<T> {
  /** Up to `max` live items already buffered, in order; never waits (see the watcher's doc). */
  takeBuffered(max: number): T[];
}

/**
 * A change of any session, as `watchAll` yields it: one per append call, however many events it
 * appended (an AppendEvents of N events is one change covering `firstSeq`..`lastSeq`), or the
 * session's deletion. A watcher of every session wants to know which sessions moved and where
 * they are now, not each step; one change per call also keeps its buffer (and its lag bound)
 * counting calls, so a single large batch cannot overflow it.
 */
export interface SessionChange {
  sessionId: string;
  /** The seq of the append's first entry (`lastSeq` for a deletion). */
  firstSeq: number;
  /** The seq of its last entry: the session's last seq after the change (before it, for a deletion). */
  lastSeq: number;
  /** The append's last entry; undefined for a deletion. */
  entry: JournalEntry | undefined;
  /** The snapshot after the whole append (for a watcher that asked for snapshots). */
  snapshot?: SessionSnapshot;
  /** The session was deleted. */
  deleted: boolean;
  /** The change's revision: growing with each change of any session (etcd's on the etcd store). */
  revision: number;
}

/** Where a watch of every session starts. */
export interface SessionsWatchStart {
  /** Every change after this revision is yielded. */
  after: number;
  /** The revision up to which the yielded changes are a replay (`after` when nothing is replayed). */
  caughtUpAt: number;
  /** The asked start revision could not be replayed: the watch starts at the current revision instead. */
  reset: boolean;
}

/** Options of a watcher of every session. */
export interface WatchAllOptions extends WatchOptions {
  /** Replay the changes after this revision first (0 or unset: from now). */
  startRevision?: number;
}

/** A watcher of every session. */
export interface SessionsWatcher extends AsyncIterableIterator<SessionChange> {
  /** Where it starts; settles once it is subscribed. */
  readonly started: Promise<SessionsWatchStart>;
  /** The revision up to which every change has been taken by its reader (for progress messages). */
  progressRevision(): number;
}

/** Options of a watcher. */
export interface WatchOptions {
  /** Attach to each live entry the snapshot it produced (and the current one to the caught-up marker). */
  includeSnapshot?: boolean;
  /** Undelivered entries allowed before the watcher is ended (default: the store's `maxBuffered`). */
  maxBuffered?: number;
}

// ---------------------------------------------------------------- the store

/** A session's durable state as readers see it. Treat the snapshot as read-only: it is shared. */
export interface SessionView {
  sessionId: string;
  snapshot: SessionSnapshot;
  /** The last durable seq (0 when the session has no entries). */
  lastSeq: number;
  /** False for a session with no journal (the seed answers those with a base snapshot too). */
  exists: boolean;
}

/** A session's journal as of one moment (see {@link SessionStoreApi.read}). */
export interface JournalReading {
  /** The session's last seq at that moment. */
  lastSeq: number;
  /** Its entries from the seq asked for up to `lastSeq` (at most the limit asked for), in order. */
  entries: AsyncIterableIterator<StoredEntry>;
}

/** Options of {@link SessionStoreApi.delete}. */
export interface DeleteOptions {
  /** Delete only when this is still the session's last seq (aborted SEQ_CONFLICT otherwise). */
  expectedSeq?: number | undefined;
  /** A repeat with the same key answers the first deletion (see session-tombstones.ts); "" or unset: none. */
  idempotencyKey?: string | undefined;
}

/** What a deletion answers. */
export interface DeleteResult {
  /** The session's last seq when it was deleted. */
  lastSeq: number;
  /** True when the key named an earlier deletion: nothing was deleted by this call. */
  duplicate: boolean;
}

/** The limits a store enforces (what GetLimits reports). */
export interface SessionStoreLimits {
  maxEventBytes: number;
  maxEventsPerAppend: number;
  maxBuffered: number;
  maxIdempotencyKeyLength: number;
  completedRetentionMs: number | undefined;
  /** How long a deleted session's idempotency keys keep answering. */
  idempotencyWindowMs: number;
}

/** The session store as the RPC layer uses it; see the module comment. */
export interface SessionStoreApi {
  /** Appends `events` atomically; resolves once they are durable as the store promises. */
  append(sessionId: string, events: readonly unknown[], options?: AppendOptions): Promise<AppendResult>;
  /** The session's snapshot and last seq; null for a completed one unless `includeCompleted`; `exists: false` for none. */
  getSnapshot(sessionId: string, options?: { includeCompleted?: boolean }): MaybePromise<SessionView | null>;
  /** A page of the sessions that exist, sorted by id (after `after`, at most `limit`). */
  list(options?: { includeCompleted?: boolean; after?: string; limit?: number }): MaybePromise<SessionView[]>;
  /**
   * Every session that exists, sorted by id, in pages of 1 to `pageSize`, each read when the caller
   * asks for it: a session deleted meanwhile is left out, one created meanwhile may be too.
   * The file store lists its directory once for all the pages.
   */
  pages(options: { includeCompleted?: boolean; pageSize: number }): Iterable<SessionView[]> | AsyncIterable<SessionView[]>;
  /** Writes the session's snapshot where the store caches snapshots; the journal stays the truth. */
  flush(sessionId: string): Promise<SessionView>;
  /**
   * Deletes a session (only at `expectedSeq` when given), leaving its tombstone; not_found
   * SESSION_NOT_FOUND when it has none. See session-tombstones.ts for what a repeat answers.
   */
  delete(sessionId: string, options?: DeleteOptions): Promise<DeleteResult>;
  /**
   * The session's journal as of one moment: its last seq then and the entries with seq ≥ `fromSeq`
   * up to it, at most `limit` (0: all). Null when the session has no journal (completed ones have).
   */
  read(sessionId: string, fromSeq?: number, limit?: number): MaybePromise<JournalReading | null>;
  /** The entries from `fromSeq`, a caught-up marker, then every new entry; ended WATCHER_LAGGED when it falls behind. */
  watch(sessionId: string, fromSeq?: number, options?: WatchOptions): EventWatcher<WatchEvent>;
  /**
   * One change per append (or deletion) of any session, from the call on: a `list` called after
   * this sees no change this watcher misses (it may see changes the watcher also brings). Each
   * change carries its revision; with `startRevision`, the changes after it are replayed first, or
   * the watch starts from now with `reset` when they cannot be (see {@link SessionsWatcher.started}).
   */
  watchAll(options?: WatchAllOptions): SessionsWatcher;
  limits(): SessionStoreLimits;
  /** Gauges: sessions kept in memory, journal files held open (none on a store that keeps no file), open watchers. */
  stats(): { openSessions: number; openJournals?: number; watchers: number };
  close(): Promise<void>;
}
