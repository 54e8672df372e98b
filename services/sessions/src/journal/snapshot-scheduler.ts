/**
 * When the file backend writes a session's snapshot file: lazily — after a number of appended
 * entries, once a session has been idle for a while, and on flush, eviction and close — never on
 * every append. One write at a time per session, and {@link CONCURRENT_SNAPSHOT_WRITES} at a time
 * in all; the journal stays the truth, the file is a cache that makes the next open cheap (see
 * snapshot-file.ts).
 */
import type { Clock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import type { FileSessionJournal } from "./file-session-journal.js";
import { lastLineCrc } from "./journal-file.js";
import { snapshotPath } from "./session-paths.js";
import { writeSnapshotFile } from "./snapshot-file.js";

export interface SnapshotSchedulerOptions {
  dir: string;
  clock: Clock;
  logger: Logger | undefined;
  everyEntries: number;
  idleMs: number;
  /** False once the store is closing: nothing new is scheduled. */
  running: () => boolean;
  /** Whether the session is still the one the store has open (an evicted one is written at eviction). */
  current: (session: FileSessionJournal) => boolean;
  /** Keeps a background write for the store's `settled` and `close`. */
  track: (work: Promise<unknown>) => void;
  /** Counts a snapshot file written. */
  written: () => void;
}

/**
 * Snapshot files written at once. Each write holds two descriptors (its temp file, then the
 * directory) while it syncs: the idle timers of a thousand sessions appended to together fire
 * together, and unbounded, their writes took every descriptor the calls of the moment needed
 * (under `ulimit -n 256`, health checks and appends met EMFILE five seconds after a burst).
 */
export const CONCURRENT_SNAPSHOT_WRITES = 2;

export class SnapshotScheduler {
  private writing = 0;
  private readonly waiting: Array<() => void> = [];

  constructor(private readonly options: SnapshotSchedulerOptions) {}

  /** Resolves when this write may start (fewer than {@link CONCURRENT_SNAPSHOT_WRITES} are running); call `done` after. */
  private turn(): Promise<void> {
    if (this.writing < CONCURRENT_SNAPSHOT_WRITES) {
      this.writing++;
      return Promise.resolve();
    }
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  private done(): void {
    const next = this.waiting.shift();
    if (next) next();
    else this.writing--;
  }

  /** Writes the session's snapshot file in the background when it is due, or arms its idle timer. */
  schedule(session: FileSessionJournal): void {
    const { clock, idleMs, everyEntries } = this.options;
    if (!this.options.running()) return;
    // One background write at a time: entries landing meanwhile are picked up by the idle timer.
    if (session.entriesSinceSnapshot >= everyEntries && session.snapshotWrite === undefined) {
      this.inBackground(session, "could not write a snapshot file");
      return;
    }
    if (session.idleTimer !== undefined || idleMs <= 0) return;
    const arm = (delay: number): void => {
      session.idleTimer = clock.setTimeout(() => {
        session.idleTimer = undefined;
        if (!this.options.running() || !this.options.current(session)) return;
        const quietFor = clock.monotonicNow() - session.lastAppendAt;
        if (quietFor < idleMs) {
          arm(idleMs - quietFor);
          return;
        }
        this.inBackground(session, "could not write a snapshot file");
      }, delay);
    };
    arm(idleMs);
  }

  /** Stops the session's idle timer (it is evicted, forgotten or closed). */
  cancel(session: FileSessionJournal): void {
    if (session.idleTimer !== undefined) this.options.clock.clearTimeout(session.idleTimer);
    session.idleTimer = undefined;
  }

  /** Writes the snapshot file in the background, logging a failure as `message`. */
  inBackground(session: FileSessionJournal, message: string): void {
    this.options.track(this.write(session, false).catch((error) => this.options.logger?.warn({ sessionId: session.id, err: error }, message)));
  }

  /**
   * Writes the durable state to the snapshot file (one write at a time per session, and
   * {@link CONCURRENT_SNAPSHOT_WRITES} in all: the session is `writing` while it waits its turn).
   * `force` writes even when the file is already current.
   */
  write(session: FileSessionJournal, force: boolean): Promise<void> {
    const previous = session.snapshotWrite ?? Promise.resolve();
    const next = previous
      .catch(() => undefined)
      .then(() => this.turn())
      .then(async () => {
        try {
          if (!session.onDisk) return;
          if (!force && session.snapshotFileBytes === session.fileSize) return;
          const journalBytes = session.fileSize;
          const nextSeq = session.nextSeq;
          const snapshot = session.snapshot;
          const entries = session.entriesSinceSnapshot;
          // Recorded so that a later open can use this file even once the journal has grown past it.
          const lastLine = lastLineCrc(session.path, journalBytes);
          await writeSnapshotFile(snapshotPath(this.options.dir, session.id), snapshot, { journalBytes, nextSeq, lastLineCrc: lastLine });
          this.options.written();
          session.snapshotFileBytes = journalBytes;
          session.entriesSinceSnapshot = Math.max(0, session.entriesSinceSnapshot - entries);
        } finally {
          this.done();
        }
      });
    session.snapshotWrite = next;
    void next
      .finally(() => {
        if (session.snapshotWrite === next) session.snapshotWrite = undefined;
      })
      .catch(() => undefined);
    return next;
  }
}
