/**
 * The file backend of the journal seam (journal-store.ts): a directory of the seed's JSON-lines
 * journals, with berth's snapshot files beside them, optionally over the seed's read-only legacy
 * root.
 *
 * - A session is opened from its snapshot file when that file provably describes the journal (the
 *   journal length it records, the seed's `__journalBytes`, is the journal's); from berth's own snapshot file of a prefix of the journal plus
 *   the tail after it, when its sidecar proves the prefix unchanged; else by one replay of the
 *   journal (repairing a torn tail). A journal another process appended to (size or mtime not what
 *   we left) is caught up before the next read or append.
 * - Open sessions live in a bounded LRU; evicting one writes its snapshot file if it is behind and
 *   closes its file, and a later access re-opens it, cheaply, from that file.
 * - Descriptors: a session keeps its journal open (for appending) only while it is among the
 *   `maxOpenJournals` most recently opened; the others stay cached, their state in memory, and
 *   reopen their file at their next append. Reads open the file for a moment (journal-file.ts).
 *   When a descriptor is refused anywhere in the process, the journals of the sessions not being
 *   written to are closed (descriptors.ts) and the open is tried once more; still refused, the
 *   call is RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES.
 * - Appends go through group commit (file-appends.ts); snapshot files are written lazily
 *   (snapshot-scheduler.ts); other processes' appends reach watchers through the directory's
 *   change feed (foreign-write-follower.ts).
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { systemClock, type Clock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { ensurePrivateDir, fsyncDirectory, statOrNull } from "@berth/shared/files";
import type { Logger } from "@berth/shared/logger";
import type { SessionId } from "@berth/shared/safe-id";
import { onDescriptorShortage, retryAfterRelief } from "@berth/shared/descriptors";
import { errnoCode } from "@berth/shared/state-errors";
import type { SessionReducer, SessionSnapshot } from "../reducer.js";
import { UNAVAILABLE_RETRY_AFTER_MS } from "../session-refusals.js";
import { DeletedSessions } from "./deleted-sessions.js";
import { FileAppends, lastByte } from "./file-appends.js";
import { withDescriptors } from "./file-refusals.js";
import { FileSessionJournal, type SessionJournalContext } from "./file-session-journal.js";
import { ForeignWriteFollower } from "./foreign-write-follower.js";
import type { CommitIo, FsyncMode } from "./group-commit.js";
import { AppendTracker, lastLineCrc, replayJournalFile, storedEntry } from "./journal-file.js";
import { decodeJournalLine, forEachLine, isBlankLine, type DecodedEntry } from "./journal-format.js";
import type { Burial, JournalListener, JournalStore, JournalStoreStats, StoredEntry, Tombstone } from "./journal-store.js";
import { journalPath, sessionIdFromFileName, snapshotPath } from "./session-paths.js";
import { readPrefixSnapshot, readSnapshotFile, sidecarPath } from "./snapshot-file.js";
import { SnapshotScheduler } from "./snapshot-scheduler.js";

/** Open sessions kept in memory by default. */
export const DEFAULT_CACHE_SIZE = 1000;
/** A session's snapshot file is rewritten in the background after this many appended entries... */
export const DEFAULT_SNAPSHOT_EVERY_ENTRIES = 1000;
/** ...or once it has had no append for this long (ms). */
export const DEFAULT_SNAPSHOT_IDLE_MS = 5000;

/** Options of {@link FileJournalStore}. */
export interface FileJournalStoreOptions {
  /** Where journals and snapshot files are (created 0700 if missing). */
  dir: string;
  /** The rules that fold a journal into its snapshot (the core's reducer). */
  reducer: SessionReducer;
  /** The seed's legacy root, read-only: read when `dir` has no journal, copied to `dir` on first append. */
  legacyDir?: string | undefined;
  clock?: Clock | undefined;
  /** Default "batch" (group commit); see {@link FsyncMode}. */
  fsync?: FsyncMode | undefined;
  logger?: Logger | undefined;
  /** Open sessions kept in the LRU. */
  cacheSize?: number | undefined;
  /** Journals kept open for appending (default: the cache size); the service sets its share of the descriptor limit. */
  maxOpenJournals?: number | undefined;
  snapshotEveryEntries?: number | undefined;
  snapshotIdleMs?: number | undefined;
  /** The write/fdatasync calls of appends (tests inject one to count syncs or fail writes). */
  io?: CommitIo | undefined;
}

/** Nobody listening yet: changes go nowhere. */
const NO_LISTENER: JournalListener = { appended() {}, resync() {}, watched: () => false, watching: () => false };

export class FileJournalStore implements JournalStore {
  private readonly dir: string;
  private readonly legacyDir: string | undefined;
  private readonly clock: Clock;
  private readonly fsync: FsyncMode;
  private readonly logger: Logger | undefined;
  private readonly reducer: SessionReducer;
  private readonly snapshots: SnapshotScheduler;
  private readonly cacheSize: number;
  private readonly maxOpenJournals: number;
  private readonly stopRelief: () => void;
  /** What every open journal of this store shares. */
  private readonly sessionContext: SessionJournalContext;
  private readonly follower: ForeignWriteFollower;
  private readonly deleted: DeletedSessions;
  private readonly sessions = new Map<SessionId, FileSessionJournal>();
  private readonly background = new Set<Promise<void>>();
  private readonly now: () => number;
  private readonly counters = { replays: 0, hydrations: 0, tailReplays: 0, snapshotWrites: 0 };
  private listener: JournalListener = NO_LISTENER;
  private closed = false;

  constructor(options: FileJournalStoreOptions) {
    this.dir = path.resolve(options.dir);
    this.legacyDir = options.legacyDir === undefined ? undefined : path.resolve(options.legacyDir);
    this.clock = options.clock ?? systemClock;
    this.fsync = options.fsync ?? "batch";
    this.logger = options.logger;
    this.reducer = options.reducer;
    this.cacheSize = Math.max(1, options.cacheSize ?? DEFAULT_CACHE_SIZE);
    this.maxOpenJournals = Math.max(1, Math.min(this.cacheSize, options.maxOpenJournals ?? this.cacheSize));
    this.now = () => this.clock.now();
    const appender = new FileAppends({
      dir: this.dir,
      fsync: this.fsync,
      io: options.io,
      logger: this.logger,
      monotonicNow: () => this.clock.monotonicNow(),
      makeRoomForJournal: (session) => this.makeRoomForJournal(session),
      reload: (session, preferPrimary) => this.reload(session, preferPrimary),
      forget: (session) => this.forget(session),
      open: (id) => this.open(id),
      appended: (session) => this.snapshots.schedule(session),
    });
    this.sessionContext = { dir: this.dir, reducer: this.reducer, now: this.now, appender, writeSnapshot: (session) => this.snapshots.write(session, true) };
    this.snapshots = new SnapshotScheduler({
      dir: this.dir,
      clock: this.clock,
      logger: this.logger,
      everyEntries: Math.max(1, options.snapshotEveryEntries ?? DEFAULT_SNAPSHOT_EVERY_ENTRIES),
      idleMs: options.snapshotIdleMs ?? DEFAULT_SNAPSHOT_IDLE_MS,
      running: () => !this.closed,
      current: (session) => this.sessions.get(session.id) === session,
      track: (work) => this.track(work),
      written: () => this.counters.snapshotWrites++,
    });
    this.follower = new ForeignWriteFollower(
      this.dir,
      {
        closed: () => this.closed,
        watching: () => this.listener.watching(),
        watched: (id) => this.listener.watched(id),
        changed: (id) => this.foreignChange(id),
      },
      this.logger,
    );
    ensurePrivateDir(this.dir);
    this.stopRelief = onDescriptorShortage(() => {
      const closed = this.closeIdleFiles();
      if (closed > 0) this.logger?.warn({ closed }, "no descriptor left somewhere in the service: closed the journals of idle sessions");
      return closed;
    });
    this.deleted = new DeletedSessions(this.dir, this.logger);
    // The scanning worker is not started here: it starts with the first replay of a large journal,
    // which does not wait for it, and an idle service does not keep its ~10 MB (a third of its own memory).
  }

  get location(): string {
    return this.dir;
  }

  listen(listener: JournalListener): void {
    this.listener = listener;
  }

  // ---------------------------------------------------------------- sessions in memory

  /** The session, opened (and caught up with foreign writes) when its journal exists; else undefined. */
  open(id: SessionId): FileSessionJournal | undefined {
    return withDescriptors(`session ${id}: its journal could not be opened`, id, () => {
      const cached = this.touch(id);
      if (cached) return cached;
      const opened = this.openFromDisk(id);
      if (opened) this.remember(opened);
      return opened;
    });
  }

  /** The session to append to: opened, or a new empty one (its file is created by the first append). */
  openForAppend(id: SessionId): FileSessionJournal {
    const existing = this.open(id);
    if (existing) return existing;
    // A session deleted before continues from where it was: an id's seqs never go back.
    const fresh = this.newSession(id, journalPath(this.dir, id), false, this.reducer.baseSnapshot(id), (this.deleted.get(id)?.lastSeq ?? 0) + 1);
    fresh.onDisk = false;
    this.remember(fresh);
    return fresh;
  }

  /** The cached session (moved to the LRU's young end), caught up with foreign writes. */
  private touch(id: SessionId): FileSessionJournal | undefined {
    const session = this.sessions.get(id);
    if (!session) return undefined;
    this.sessions.delete(id);
    this.sessions.set(id, session);
    return this.refresh(session) ? session : this.open(id);
  }

  private remember(session: FileSessionJournal): void {
    this.sessions.set(session.id, session);
    if (this.sessions.size <= this.cacheSize) return;
    for (const candidate of this.sessions.values()) {
      if (this.sessions.size <= this.cacheSize) break;
      if (candidate === session || candidate.busy) continue;
      this.evict(candidate);
    }
  }

  private evict(session: FileSessionJournal): void {
    this.sessions.delete(session.id);
    this.snapshots.cancel(session);
    // Written so that the next access re-opens from the snapshot file instead of replaying.
    this.snapshots.inBackground(session, "could not write the snapshot file of an evicted session");
    this.closeFile(session);
  }

  /** Drops a session whose in-memory state can no longer be trusted; the next access re-opens it. */
  private forget(session: FileSessionJournal): void {
    if (this.sessions.get(session.id) === session) this.sessions.delete(session.id);
    this.snapshots.cancel(session);
    this.closeFile(session);
  }

  private closeFile(session: FileSessionJournal): void {
    if (session.fd === undefined) return;
    try {
      fs.closeSync(session.fd);
    } catch (error) {
      this.logger?.warn({ sessionId: session.id, err: error }, "could not close a journal");
    }
    session.fd = undefined;
    session.committer = undefined;
  }

  /**
   * Makes room for `session` to open its journal: closes the journals of the least recently used
   * sessions not being written to until fewer than `maxOpenJournals` are open. Journals with a
   * write in flight stay open, even over the bound (they close at the next call that finds them idle).
   */
  private makeRoomForJournal(session: FileSessionJournal): void {
    let open = 0;
    for (const cached of this.sessions.values()) if (cached.fd !== undefined) open++;
    for (const cached of this.sessions.values()) {
      if (open < this.maxOpenJournals) return;
      if (cached === session || cached.fd === undefined || cached.committer?.busy) continue;
      this.closeFile(cached);
      open--;
    }
  }

  /** Closes the journals of the sessions not being written to (they reopen on their next append); returns how many. */
  private closeIdleFiles(): number {
    let closed = 0;
    for (const session of this.sessions.values()) {
      if (session.fd === undefined || session.committer?.busy) continue;
      this.closeFile(session);
      closed++;
    }
    return closed;
  }

  private newSession(id: SessionId, journal: string, legacy: boolean, snapshot: SessionSnapshot, nextSeq: number): FileSessionJournal {
    return new FileSessionJournal(this.sessionContext, id, journal, legacy, snapshot, nextSeq);
  }

  // ---------------------------------------------------------------- opening

  /** Opens a session from its snapshot file or by replaying its journal; undefined when it has none. */
  private openFromDisk(id: SessionId): FileSessionJournal | undefined {
    const primary = journalPath(this.dir, id);
    let journal = primary;
    let legacy = false;
    let stat = statOrNull(primary);
    if (!stat && this.legacyDir !== undefined) {
      const legacyJournal = journalPath(this.legacyDir, id);
      stat = statOrNull(legacyJournal);
      if (stat) {
        journal = legacyJournal;
        legacy = true;
      }
    }
    if (!stat) return undefined;

    // Hydrating skips the journal entirely: the idempotency keys and seek points of its bytes are
    // recovered by a light scan on the first keyed append or read (scanJournalPrefix), not here.
    // That keeps a re-open O(snapshot) — ~1 ms — instead of O(journal); a sidecar file of keys
    // would also do, but would be one more file to keep consistent with the journal.
    const hydrated = readSnapshotFile(snapshotPath(this.dir, id), id, stat.size, this.reducer);
    if (hydrated) {
      this.counters.hydrations++;
      const session = this.newSession(id, journal, legacy, hydrated.snapshot, hydrated.nextSeq);
      session.size = session.fileSize = stat.size;
      session.mtimeMs = stat.mtimeMs;
      session.needsNewline = session.headNeedsNewline = stat.size > 0 && lastByte(journal, stat.size) !== 0x0a;
      session.keysComplete = false;
      session.scanPrefix = stat.size;
      session.snapshotFileBytes = stat.size;
      return session;
    }
    return this.openFromPrefix(id, journal, legacy, stat) ?? this.replayInto(undefined, id, journal, legacy, !legacy);
  }

  /**
   * Opens a session from a snapshot file of an older, shorter journal plus the journal's tail:
   * the sidecar proves the file is berth's own and records the CRC of the journal's line that
   * ended there; the same bytes still at that place mean the journal only grew since (it is
   * append-only), so the snapshot is that prefix's state and only the tail needs applying — as
   * our own appends would have been. Undefined (nothing changed) when anything does not hold or
   * the tail needs a full replay's care (see {@link catchUp}).
   */
  private openFromPrefix(id: SessionId, journal: string, legacy: boolean, stat: fs.Stats): FileSessionJournal | undefined {
    const prefix = readPrefixSnapshot(snapshotPath(this.dir, id), id, stat.size, this.reducer);
    if (!prefix || lastLineCrc(journal, prefix.journalBytes) !== prefix.lastLineCrc) return undefined;
    const session = this.newSession(id, journal, legacy, prefix.snapshot, prefix.nextSeq);
    session.size = session.fileSize = prefix.journalBytes;
    // Keys and seek points of the prefix come from the light scan, when first needed.
    session.keysComplete = false;
    session.scanPrefix = prefix.journalBytes;
    session.snapshotFileBytes = prefix.journalBytes;
    if (!this.catchUp(session, stat, true)) return undefined;
    this.counters.hydrations++;
    this.counters.tailReplays++;
    return session;
  }

  private replayInto(existing: FileSessionJournal | undefined, id: SessionId, journal: string, legacy: boolean, repair: boolean): FileSessionJournal {
    this.counters.replays++;
    const replayed = replayJournalFile(journal, id, { repair, reducer: this.reducer, logger: this.logger, now: this.now, sessionId: id });
    const session = existing ?? this.newSession(id, journal, legacy, replayed.snapshot, replayed.nextSeq);
    session.path = journal;
    session.legacy = legacy;
    session.onDisk = true;
    session.snapshot = replayed.snapshot;
    session.nextSeq = replayed.nextSeq;
    session.size = replayed.size;
    session.fileSize = replayed.fileSize;
    session.mtimeMs = replayed.mtimeMs;
    session.needsNewline = session.headNeedsNewline = replayed.needsNewline;
    session.keys = replayed.keys;
    session.keysComplete = true;
    session.scanPrefix = 0;
    session.index = replayed.index;
    session.snapshotFileBytes = -1;
    session.replays++;
    // A repair changed the file: its snapshot file (if any) is stale; write a fresh one soon.
    if (replayed.repaired) this.snapshots.schedule(session);
    return session;
  }

  // ---------------------------------------------------------------- other writers

  /**
   * Checks that the journal is still what this store last saw (the seed's size + mtime rule) and
   * catches up when it is not. Returns false when the session had to be dropped (its file vanished).
   */
  private refresh(session: FileSessionJournal): boolean {
    if (session.committer?.busy) return true; // our own bytes are landing; checked once they have
    const primary = journalPath(this.dir, session.id);
    if (session.legacy && statOrNull(primary)) {
      // A seed process migrated the journal: read the primary from now on.
      this.reload(session, true);
      return true;
    }
    const stat = statOrNull(session.path);
    if (!stat) {
      if (!session.onDisk) return true;
      this.forget(session);
      return false;
    }
    if (stat.size === session.fileSize && (Number.isNaN(session.mtimeMs) || stat.mtimeMs === session.mtimeMs)) {
      session.mtimeMs = stat.mtimeMs;
      return true;
    }
    if (stat.size > session.fileSize && this.catchUp(session, stat)) return true;
    this.reload(session, false);
    return true;
  }

  /**
   * Applies the entries past the durable end (another process appended them, or they follow the
   * prefix a snapshot file described) on top of the durable state and, unless `opening`, hands
   * them to watchers. Returns false, having changed nothing, when the new bytes hold something a
   * full replay must handle: a damaged or unparsable line, an append of several events that is
   * not all there — and, when `opening`, an unterminated last line (a replay cuts a torn one back).
   */
  private catchUp(session: FileSessionJournal, stat: fs.Stats, opening = false): boolean {
    const start = session.size;
    const length = stat.size - start;
    const buf = Buffer.alloc(length);
    const fd = fs.openSync(session.path, "r");
    let read = 0;
    try {
      while (read < length) {
        const n = fs.readSync(fd, buf, read, length - read, start + read);
        if (n === 0) break;
        read += n;
      }
    } finally {
      fs.closeSync(fd);
    }
    const decoded: Array<{ line: DecodedEntry; offset: number }> = [];
    let clean = true;
    const consumed = forEachLine(buf.subarray(0, read), 0, (lineStart, lineEnd) => {
      if (!clean || isBlankLine(buf, lineStart, lineEnd)) return;
      const line = decodeJournalLine(buf, lineStart, lineEnd);
      if (line.kind !== "entry") clean = false;
      else decoded.push({ line, offset: start + lineStart });
    });
    // Parse diagnostics go after every event's in a replay (the seed's order): leave those to one.
    if (!clean || (opening && consumed < read)) return false;
    // A replay applies an append of several events only once all of it is there.
    const completeness = new AppendTracker();
    for (const { line } of decoded) completeness.line(line.entry);
    if (completeness.inAppend) return false;
    let snapshot = session.snapshot;
    // Published append by append, as our own appends are: the all-sessions watchers see one change each.
    const published: Array<Array<StoredEntry & { snapshot: SessionSnapshot }>> = [];
    // The new bytes start where our durable entries end: an append boundary.
    const appends = new AppendTracker();
    for (const { line, offset } of decoded) {
      const entry = line.entry;
      snapshot = this.reducer.applyEvent(snapshot, entry, { now: this.now });
      const appendStart = appends.line(entry);
      const seq = entry.seq;
      if (typeof seq === "number" && Number.isInteger(seq)) {
        if (seq + 1 > session.nextSeq) session.nextSeq = seq + 1;
        session.index.note(seq, offset, appendStart);
        const ikey = appends.key;
        if (appendStart && ikey !== undefined && !session.keys.has(ikey)) session.keys.set(ikey, { firstSeq: seq, lastSeq: seq + appends.size - 1 });
        const item = { ...storedEntry(line, ikey), snapshot };
        const current = published[published.length - 1];
        if (appendStart || current === undefined) published.push([item]);
        else current.push(item);
      }
    }
    session.snapshot = snapshot;
    session.size = start + consumed;
    session.fileSize = stat.size;
    session.mtimeMs = stat.mtimeMs;
    // An unterminated tail is left alone (it may be a write in progress); our next line starts
    // with a newline so it cannot be glued to it.
    session.needsNewline = session.headNeedsNewline = consumed < read;
    if (opening) {
      this.logger?.debug(
        { sessionId: session.id, entries: decoded.length, from: start },
        "opened from a snapshot file of the journal's prefix and replayed the rest",
      );
    } else {
      this.logger?.debug({ sessionId: session.id, entries: decoded.length }, "caught up with entries appended by another process");
      this.listener.appended(session.id, published);
    }
    this.snapshots.schedule(session);
    return true;
  }

  /** One full replay of the session's journal (another process changed it in a way we cannot follow). */
  private reload(session: FileSessionJournal, preferPrimary: boolean): void {
    const primary = journalPath(this.dir, session.id);
    const usePrimary = preferPrimary || !session.legacy || statOrNull(primary) !== null;
    const journal = usePrimary ? primary : session.path;
    this.logger?.info({ sessionId: session.id, path: journal }, "journal changed by another process; replaying it");
    this.closeFile(session);
    if (statOrNull(journal) !== null) this.replayInto(session, session.id, journal, !usePrimary, false);
    this.listener.resync(session.id, `the journal of session ${session.id} was changed by another process in a way only a full replay could follow`);
  }

  follow(): void {
    this.follower.follow();
  }

  /** What the follower does for a changed journal; a promise when our own bytes are landing (look again then). */
  private foreignChange(id: SessionId): Promise<void> | undefined {
    const cached = this.sessions.get(id);
    if (cached?.committer?.busy) return cached.committer.idle();
    if (cached !== undefined) {
      this.refresh(cached);
    } else if (this.open(id) !== undefined) {
      // Created by another process while watched: its first entries came in no append of ours.
      this.listener.resync(id, `session ${id} was created by another process`);
    }
    return undefined;
  }

  // ---------------------------------------------------------------- listing

  has(sessionId: SessionId): boolean {
    if (statOrNull(journalPath(this.dir, sessionId))) return true;
    return this.legacyDir !== undefined && statOrNull(journalPath(this.legacyDir, sessionId)) !== null;
  }

  sessionIds(): SessionId[] {
    const ids = new Set<SessionId>();
    for (const dir of [this.legacyDir, this.dir]) {
      if (dir === undefined) continue;
      let names: string[];
      try {
        names = withDescriptors("the sessions could not be listed", undefined, () => fs.readdirSync(dir));
      } catch (error) {
        if (errnoCode(error) === "ENOENT") continue;
        throw error;
      }
      for (const name of names) {
        const id = sessionIdFromFileName(name);
        if (id !== undefined) ids.add(id);
      }
    }
    return [...ids].sort();
  }

  // ---------------------------------------------------------------- deletion

  tombstone(sessionId: SessionId): Tombstone | undefined {
    return this.deleted.get(sessionId);
  }

  pruneTombstones(before: number): number {
    return this.deleted.prune(before);
  }

  /**
   * Removes a session's files, its tombstone first and the journal last: a crash in between leaves
   * a session that still exists (its journal is the truth) rather than a snapshot file that could
   * pass for the state of a new journal of the same size under the same id. The snapshot files and
   * journal in the legacy root go too (the seed's store reads a legacy journal when the primary has
   * none: left there, the session would come back with its old entries).
   */
  remove(journal: FileSessionJournal, burial: Burial): void {
    const sessionId = journal.id;
    this.deleted.bury(sessionId, burial);
    this.forget(journal);
    const snapshotFile = snapshotPath(this.dir, sessionId);
    const files = [snapshotFile, sidecarPath(snapshotFile)];
    if (this.legacyDir !== undefined) files.push(snapshotPath(this.legacyDir, sessionId), journalPath(this.legacyDir, sessionId));
    files.push(journalPath(this.dir, sessionId));
    for (const file of files) {
      try {
        fs.rmSync(file, { force: true });
      } catch (error) {
        throw new BerthError(
          "unavailable",
          `could not delete session ${sessionId}: ${file} cannot be removed (${errnoCode(error) ?? (error as Error).message}); the session still exists`,
          { sessionId, ...(errnoCode(error) ? { errno: errnoCode(error) } : {}) },
          { reason: "STATE_READ_ONLY", retryAfterMs: UNAVAILABLE_RETRY_AFTER_MS },
        );
      }
    }
    if (this.fsync === "none") return;
    for (const dir of [this.legacyDir, this.dir]) {
      if (dir === undefined) continue;
      try {
        retryAfterRelief(() => fsyncDirectory(dir));
      } catch (error) {
        if (errnoCode(error) !== "ENOENT") this.logger?.warn({ dir, err: error }, "could not sync the directory of a deleted session");
      }
    }
  }

  // ---------------------------------------------------------------- lifecycle

  stats(): JournalStoreStats {
    let openJournals = 0;
    for (const session of this.sessions.values()) if (session.fd !== undefined) openJournals++;
    return { openSessions: this.sessions.size, openJournals, ...this.counters };
  }

  get busy(): boolean {
    return [...this.sessions.values()].some((s) => s.committer?.busy) || this.background.size > 0;
  }

  async settled(): Promise<void> {
    while (this.busy) await Promise.all([...[...this.sessions.values()].map((s) => s.committer?.idle()), ...this.background]);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopRelief();
    this.follower.stop();
    await this.settled();
    for (const session of [...this.sessions.values()]) {
      this.snapshots.cancel(session);
      try {
        await this.snapshots.write(session, false);
      } catch (error) {
        this.logger?.warn({ sessionId: session.id, err: error }, "could not write the snapshot file at close");
      }
      this.closeFile(session);
    }
    this.sessions.clear();
    await Promise.allSettled([...this.background]);
  }

  private track(promise: Promise<unknown>): void {
    const done = promise.then(() => undefined);
    this.background.add(done);
    void done.finally(() => this.background.delete(done));
  }
}
