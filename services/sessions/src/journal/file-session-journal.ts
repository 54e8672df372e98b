/**
 * One session's journal file, open: the file backend's {@link SessionJournal}. It holds what the
 * backend knows of the file (where its durable entries end, its idempotency keys and seek points,
 * its descriptor and group commit, the state of its snapshot file) and reads it: keys, entries,
 * earlier snapshots. Opening, caching and deleting sessions are the store's (file-journal-store.ts);
 * writing is the write path's (file-appends.ts), reached through {@link JournalAppender}.
 */
import type { TimerHandle } from "@berth/shared/clock";
import type { SessionId } from "@berth/shared/safe-id";
import { stateWriteError } from "@berth/shared/state-errors";
import type { SessionReducer, SessionSnapshot } from "../reducer.js";
import { readRefusals, withDescriptors } from "./file-refusals.js";
import type { GroupCommit } from "./group-commit.js";
import { replayJournalFile, scanJournalPrefix, SeqIndex } from "./journal-file.js";
import { readJournalEntries } from "./journal-read.js";
import type { JournalBatch, KeyRecord, SessionJournal, StoredEntry } from "./journal-store.js";
import { emptyIterator } from "@berth/shared/empty-iterator";

/** A batch on its way to disk: its lines, and where they go in the file. */
export interface PendingAppend {
  bytes: Buffer;
  /** 1 when the write starts with a newline ending a foreign unterminated tail. */
  lead: number;
  lineBytes: number[];
  batch: JournalBatch;
}

/** The write path of a session's appends (file-appends.ts). */
export interface JournalAppender {
  /** Opens the journal for appending (creating it, copying a legacy journal over); throws the refusal. */
  prepare(session: FileSessionJournal): void;
  /** Writes the batch's lines through group commit. */
  submit(session: FileSessionJournal, batch: JournalBatch): void;
}

/** What an open journal needs of the store it belongs to. */
export interface SessionJournalContext {
  /** The primary directory, for the refusals of a snapshot file not written. */
  readonly dir: string;
  readonly reducer: SessionReducer;
  /** The reducer's clock, for entries without a usable `ts`. */
  readonly now: () => number;
  readonly appender: JournalAppender;
  /** Writes the session's snapshot file now. */
  writeSnapshot(session: FileSessionJournal): Promise<void>;
}

export class FileSessionJournal implements SessionJournal {
  /** The journal read: the primary, or the legacy one until the first append copies it over. */
  path: string;
  legacy: boolean;
  /** A journal file exists for this session. */
  onDisk = true;
  fd: number | undefined = undefined;
  committer: GroupCommit<PendingAppend> | undefined = undefined;

  // Durable state: what readers, watchers and snapshot files see.
  snapshot: SessionSnapshot;
  nextSeq: number;
  /** Bytes of whole entries: the end of the durable journal. */
  size = 0;
  /** The file's size as we last knew it (differs from `size` only with a tail we left in place). */
  fileSize = 0;
  /** NaN right after our own write: the next stat's mtime is taken if the size is what we wrote. */
  mtimeMs = NaN;
  needsNewline = false;
  /** Whether the next batch submitted must start with a newline (a foreign unterminated tail). */
  headNeedsNewline = false;

  /** Idempotency keys of durable appends (all of them once `keysComplete`). */
  keys = new Map<string, KeyRecord>();
  /** False after a hydration from the snapshot file until the journal's first `scanPrefix` bytes are scanned. */
  keysComplete = true;
  scanPrefix = 0;
  index = new SeqIndex();

  /**
   * The last entry as a read found it, and the journal's size then: a watch of every session reads
   * each one's last entry when it opens, and the next such watch is told from memory until the
   * journal changes (our appends and other writers' move `size`, a full replay `replays`). Only
   * an entry of at most LAST_READ_MAX_CHARS is kept: an event may be a megabyte, and a thousand of
   * those is no cache.
   */
  lastRead: { readonly stored: StoredEntry; readonly atSize: number; readonly replays: number } | undefined = undefined;
  /**
   * Full replays of this journal so far, each because another writer changed it in a way no
   * catch-up follows (a rewrite, a delete and re-create): what was read before one describes
   * another file, even at the same size and last seq.
   */
  replays = 0;

  entriesSinceSnapshot = 0;
  /** The journal size the snapshot file describes (-1 when unknown or none). */
  snapshotFileBytes = -1;
  /** When the last append became durable (monotonic clock): the idle snapshot waits for quiet. */
  lastAppendAt = 0;
  idleTimer: TimerHandle | undefined = undefined;
  snapshotWrite: Promise<void> | undefined = undefined;

  constructor(
    private readonly context: SessionJournalContext,
    readonly id: SessionId,
    journal: string,
    legacy: boolean,
    snapshot: SessionSnapshot,
    nextSeq: number,
  ) {
    this.path = journal;
    this.legacy = legacy;
    this.snapshot = snapshot;
    this.nextSeq = nextSeq;
  }

  get exists(): boolean {
    return this.onDisk;
  }

  get busy(): boolean {
    return this.committer?.busy ?? false;
  }

  get writing(): boolean {
    return this.busy || this.snapshotWrite !== undefined;
  }

  async idle(): Promise<void> {
    while (this.writing) {
      if (this.committer?.busy) await this.committer.idle();
      else await this.snapshotWrite?.catch(() => undefined);
    }
  }

  prepareAppend(): void {
    this.context.appender.prepare(this);
  }

  append(batch: JournalBatch): void {
    this.context.appender.submit(this, batch);
  }

  /** The durable append made with `idempotencyKey`, scanning the bytes a hydration skipped if needed. */
  findKey(idempotencyKey: string): KeyRecord | undefined {
    const known = this.keys.get(idempotencyKey);
    if (known || this.keysComplete) return known;
    withDescriptors(`session ${this.id}: its journal could not be read`, this.id, () => this.completeScan());
    return this.keys.get(idempotencyKey);
  }

  /** Every durable keyed append of the session, scanning the bytes a hydration skipped if needed. */
  keyedAppends(): ReadonlyMap<string, KeyRecord> {
    this.completeScan();
    return this.keys;
  }

  /** Recovers the keys and seek points of the journal bytes a hydration skipped. */
  private completeScan(): void {
    if (this.keysComplete) return;
    const { keys, index } = scanJournalPrefix(this.path, this.scanPrefix);
    for (const [key, record] of keys) if (!this.keys.has(key)) this.keys.set(key, record);
    this.index.prepend(index);
    this.keysComplete = true;
  }

  reader(fromSeq: number, limit = 0): () => AsyncIterableIterator<StoredEntry> {
    if (!this.onDisk) return () => emptyIterator();
    withDescriptors(`session ${this.id}: its journal could not be read`, this.id, () => this.completeScan());
    const end = this.size;
    const lastOnly = limit === 1 && fromSeq === this.nextSeq - 1;
    const known = this.lastRead;
    const replays = this.replays;
    if (lastOnly && known?.atSize === end && known.replays === replays && known.stored.entry.seq === fromSeq) return () => oneEntry(known.stored);
    const start = this.index.startFor(fromSeq);
    const journal = this.path;
    const entries = () => readRefusals(this.id, readJournalEntries(journal, { fromSeq, limit, start, end }));
    return lastOnly ? () => this.rememberingLast(entries(), fromSeq, end, replays) : entries;
  }

  private async *rememberingLast(entries: AsyncGenerator<StoredEntry>, seq: number, atSize: number, replays: number): AsyncGenerator<StoredEntry> {
    for await (const stored of entries) {
      // Kept only if the journal is still the one the read began on (the file is opened lazily).
      const current = this.size === atSize && this.replays === replays;
      if (current && stored.entry.seq === seq && JSON.stringify(stored.entry).length <= LAST_READ_MAX_CHARS) this.lastRead = { stored, atSize, replays };
      yield stored;
    }
  }

  /** The snapshot as of an earlier append, by a replay up to its last entry. */
  snapshotAt(lastSeq: number): SessionSnapshot {
    return withDescriptors(
      `session ${this.id}: its journal could not be read`,
      this.id,
      () =>
        replayJournalFile(this.path, this.id, {
          repair: false,
          reducer: this.context.reducer,
          stopAfterSeq: lastSeq,
          now: this.context.now,
          sessionId: this.id,
        }).snapshot,
    );
  }

  async flush(): Promise<void> {
    try {
      await this.context.writeSnapshot(this);
    } catch (error) {
      // The snapshot file is written atomically: the one there, if any, is still whole.
      throw stateWriteError(error, `session ${this.id}: its snapshot file was not written`, this.context.dir, { sessionId: this.id }) ?? error;
    }
  }
}

/** The largest last entry (as JSON text) a journal keeps in memory once read. */
const LAST_READ_MAX_CHARS = 8192;

async function* oneEntry(stored: StoredEntry): AsyncGenerator<StoredEntry> {
  yield stored;
}
