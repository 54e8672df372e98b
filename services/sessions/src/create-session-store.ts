/**
 * The session store on files: the store (session-store.ts) over the file backend of the journal
 * seam (journal/file-journal-store.ts), as the service runs it.
 */
import type { Clock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import { FileJournalStore } from "./journal/file-journal-store.js";
import type { CommitIo, FsyncMode } from "./journal/group-commit.js";
import { sessionReducer } from "./reducer.js";
import { SessionStore } from "./session-store.js";

export { APPEND_OVERTAKEN_RETRY_MS } from "./journal/file-appends.js";
export { DEFAULT_CACHE_SIZE, DEFAULT_SNAPSHOT_EVERY_ENTRIES, DEFAULT_SNAPSHOT_IDLE_MS } from "./journal/file-journal-store.js";

/** Options of {@link createSessionStore}. */
export interface SessionStoreOptions {
  /** Where journals and snapshot files are (created 0700 if missing). */
  dir: string;
  /** The seed's legacy root, read-only: read when `dir` has no journal, copied to `dir` on first append. */
  legacyDir?: string;
  clock?: Clock;
  /** Default "batch" (group commit); see {@link FsyncMode}. */
  fsync?: FsyncMode;
  logger?: Logger;
  maxEventBytes?: number;
  maxEventsPerAppend?: number;
  /** Open sessions kept in the LRU. */
  cacheSize?: number;
  /** Journals of those kept open for appending (default: all of them); see file-journal-store.ts. */
  maxOpenJournals?: number;
  snapshotEveryEntries?: number;
  snapshotIdleMs?: number;
  /** Default buffer bound of a watcher. */
  maxBuffered?: number;
  /** The write/fdatasync calls of appends (tests inject one to count syncs or fail writes). */
  io?: CommitIo;
  /**
   * Delete completed and discarded sessions this long (ms) after their completing entry: swept
   * at start, then when the next one is due (see retention.ts). Unset: kept forever.
   */
  completedRetentionMs?: number;
  /** How long a deleted session's idempotency keys keep answering (default 1 h; see session-tombstones.ts). */
  idempotencyWindowMs?: number;
}

/** Creates a session store on the files of `options.dir`; see {@link SessionStoreOptions}. */
export function createSessionStore(options: SessionStoreOptions): SessionStore {
  const journals = new FileJournalStore({
    dir: options.dir,
    reducer: sessionReducer,
    legacyDir: options.legacyDir,
    clock: options.clock,
    fsync: options.fsync,
    logger: options.logger,
    cacheSize: options.cacheSize,
    maxOpenJournals: options.maxOpenJournals,
    snapshotEveryEntries: options.snapshotEveryEntries,
    snapshotIdleMs: options.snapshotIdleMs,
    io: options.io,
  });
  return new SessionStore({
    journals,
    clock: options.clock,
    logger: options.logger,
    maxEventBytes: options.maxEventBytes,
    maxEventsPerAppend: options.maxEventsPerAppend,
    maxBuffered: options.maxBuffered,
    completedRetentionMs: options.completedRetentionMs,
    idempotencyWindowMs: options.idempotencyWindowMs,
  });
}
