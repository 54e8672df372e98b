/**
 * What the RPC layer asks of a session store: the surface the SessionService handlers call. The
 * file store (SessionStore, over the journal seam) and the etcd store (etcd/etcd-session-store.ts)
 * both implement it; the handlers take whichever the settings chose.
 *
 * A method whose answer the file store has in memory may answer synchronously (the file store
 * does); a store that has to ask a server answers with a promise. Callers await either.
 */
import type { AppendOptions, AppendResult } from "./append-pipeline.js";
import type { StoredEntry } from "./journal/journal-store.js";
import type { EventWatcher, SessionsWatcher, WatchAllOptions, WatchEvent, WatchOptions } from "./watch-hub.js";
import type { SessionSnapshot } from "./reducer.js";

/** A value now, or later. */
export type MaybePromise<T> = T | Promise<T>;

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
