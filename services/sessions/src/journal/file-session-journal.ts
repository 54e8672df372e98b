/**
 * One session's journal file, open: the file backend's {@link SessionJournal}. It holds what the
 * backend knows of the file (where its durable entries end, its idempotency keys and seek points,
 * its descriptor and group commit, the state of its snapshot file); the work is done by the store
 * it belongs to (file-journal-store.ts) and its write path (file-appends.ts).
 */
import type { TimerHandle } from "@berth/shared/clock";
import type { SessionSnapshot } from "../reducer.js";
import type { FileAppends } from "./file-appends.js";
import type { FileJournalStore } from "./file-journal-store.js";
import type { GroupCommit } from "./group-commit.js";
import { SeqIndex } from "./journal-file.js";
import type { JournalBatch, KeyRecord, SessionJournal, StoredEntry } from "./journal-store.js";

/** A batch on its way to disk: its lines, and where they go in the file. */
export interface PendingAppend {
  bytes: Buffer;
  /** 1 when the write starts with a newline ending a foreign unterminated tail. */
  lead: number;
  lineBytes: number[];
  batch: JournalBatch;
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

  entriesSinceSnapshot = 0;
  /** The journal size the snapshot file describes (-1 when unknown or none). */
  snapshotFileBytes = -1;
  /** When the last append became durable (monotonic clock): the idle snapshot waits for quiet. */
  lastAppendAt = 0;
  idleTimer: TimerHandle | undefined = undefined;
  snapshotWrite: Promise<void> | undefined = undefined;

  constructor(
    private readonly store: FileJournalStore,
    private readonly appends: FileAppends,
    readonly id: string,
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
    this.appends.prepare(this);
  }

  append(batch: JournalBatch): void {
    this.appends.submit(this, batch);
  }

  findKey(idempotencyKey: string): KeyRecord | undefined {
    return this.store.findKey(this, idempotencyKey);
  }

  keyedAppends(): ReadonlyMap<string, KeyRecord> {
    return this.store.allKeys(this);
  }

  reader(fromSeq: number, limit = 0): () => AsyncIterableIterator<StoredEntry> {
    return this.store.reader(this, fromSeq, limit);
  }

  snapshotAt(lastSeq: number): SessionSnapshot {
    return this.store.snapshotAt(this, lastSeq);
  }

  flush(): Promise<void> {
    return this.store.flush(this);
  }
}
