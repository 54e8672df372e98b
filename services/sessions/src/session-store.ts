/**
 * The session store: durable per-session journals in the seed's format, the snapshots derived
 * from them, and their watchers. The RPC layer maps its calls onto this; it returns plain objects
 * and throws BerthError.
 *
 * How state moves:
 * - An append is checked (ids, events, sizes, idempotency key, fence, expected seq), given its
 *   sequence numbers and applied to the in-memory *head* at once, in call order — one writer per
 *   state directory is guaranteed by the election lock, so memory is the authority for the next
 *   seq. Its lines then go through group commit; only once they are durable does the session's
 *   *durable* state (what readers and watchers see) move, and the append resolve.
 * - A failed write fails its batch and everything queued behind it, cuts the file back to the
 *   last durable byte and rolls the head back to the durable state. A write that another
 *   process's append got in front of (a seed process sharing a live directory) fails the same
 *   way, retryably, without cutting anything: see journal-guard.ts.
 * - A session is opened from its snapshot file when that file provably describes the journal
 *   (the seed's `__journalBytes` fence); from berth's own snapshot file of a prefix of the journal
 *   plus the tail after it, when its sidecar proves the prefix unchanged; else by one replay of
 *   the journal (repairing a torn tail). A journal another process appended to (size or mtime
 *   not what we left) is caught up before the next read or append.
 * - Open sessions live in a bounded LRU; evicting one writes its snapshot file if it is behind and
 *   closes its file, and a later access re-opens it, cheaply, from that file.
 * - Snapshot files are written lazily: on flush, on eviction and close, after a number of appends,
 *   or once a session has been idle for a while — never on every append.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { systemClock, type Clock, type TimerHandle } from "@berth/shared/clock";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { ensurePrivateDir, fsyncDirectory, statOrNull } from "@berth/shared/files";
import { errnoCode, stateWriteError } from "@berth/shared/state-errors";
import { checkSessionId } from "@berth/shared/safe-id";
import { GroupCommit, type CommitIo, type FsyncMode } from "./journal/group-commit.js";
import { checkJournalEnd, checkOwnWrite, ForeignAppendError } from "./journal/journal-guard.js";
import { scanWorker } from "./journal/journal-scan.js";
import { decodeJournalLine, encodeJournalLine, forEachLine, isBlankLine, type DecodedEntry } from "./journal/journal-format.js";
import {
  AppendTracker,
  lastLineCrc,
  readJournalEntries,
  replayJournalFile,
  scanJournalPrefix,
  SeqIndex,
  storedEntry,
  type JournalLogger,
  type KeyRecord,
  type StoredEntry,
} from "./journal/journal-file.js";
import { applyEvent, baseSnapshot, type JournalEntry, type SessionSnapshot } from "./reducer.js";
import { journalPath, sessionIdFromFileName, snapshotPath } from "./journal/session-paths.js";
import { readPrefixSnapshot, readSnapshotFile, sidecarPath, writeSnapshotFile } from "./journal/snapshot-file.js";
import { isCompletedPhase } from "./vocabulary.js";
import { CompletedRetention, type RetentionHost } from "./retention.js";
import { eventsDigest } from "./event-digest.js";
import { DEFAULT_MAX_BUFFERED, WatchHub, type EventWatcher, type SessionChange, type WatchBacklog, type WatchEvent, type WatchOptions } from "./watch-hub.js";

/** The largest event (its JSON, in bytes) accepted by default. */
export const DEFAULT_MAX_EVENT_BYTES = 1024 * 1024;
/** Open sessions kept in memory by default. */
export const DEFAULT_CACHE_SIZE = 1000;
/** Events in one append accepted by default. */
export const DEFAULT_MAX_EVENTS_PER_APPEND = 10_000;
/** A session's snapshot file is rewritten in the background after this many appended entries... */
export const DEFAULT_SNAPSHOT_EVERY_ENTRIES = 1000;
/** ...or once it has had no append for this long (ms). */
export const DEFAULT_SNAPSHOT_IDLE_MS = 5000;
/** The longest idempotency key, in characters. */
export const MAX_IDEMPOTENCY_KEY_LENGTH = 128;
/** How soon an append another process's line overtook may be retried (at once: nothing of it was kept). */
export const APPEND_OVERTAKEN_RETRY_MS = 10;
/** How soon a call refused because the store cannot write, or is stopping, is worth retrying. */
export const UNAVAILABLE_RETRY_AFTER_MS = 1000;

/** Options of {@link SessionStore}. */
export interface SessionStoreOptions {
  /** Where journals and snapshot files are (created 0700 if missing). */
  dir: string;
  /** The seed's legacy root, read-only: read when `dir` has no journal, copied to `dir` on first append. */
  legacyDir?: string;
  clock?: Clock;
  /** Default "batch" (group commit); see {@link FsyncMode}. */
  fsync?: FsyncMode;
  logger?: JournalLogger;
  maxEventBytes?: number;
  maxEventsPerAppend?: number;
  /** Open sessions kept in the LRU. */
  cacheSize?: number;
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
}

/** What an append may expect of the session beside an exact seq. */
export type ExpectedState = "any" | "no_session" | "exists";

/** Options of {@link SessionStore.append}. */
export interface AppendOptions {
  /** The last seq the caller saw (0: no entry yet); anything else is aborted SEQ_CONFLICT. */
  expectedSeq?: number;
  /** A state the session must be in: no entry yet (`no_session`) or at least one (`exists`). */
  expectedState?: ExpectedState;
  /** A retry with the same key returns the first append's result and writes nothing ("" = none). */
  idempotencyKey?: string;
  /** Called just before the append is sequenced; throwing (e.g. a stale lock fence) refuses it with nothing written. */
  fenceCheck?: () => void;
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

/** A session's durable state as readers see it. Treat the snapshot as read-only: it is shared. */
export interface SessionView {
  sessionId: string;
  snapshot: SessionSnapshot;
  /** The last durable seq (0 when the session has no entries). */
  lastSeq: number;
  /** False for a session with no journal (the seed answers those with a base snapshot too). */
  exists: boolean;
}

/** Counters for metrics and tests. */
export interface SessionStoreStats {
  openSessions: number;
  watchers: number;
  /** Full journal replays done (opens without a current snapshot file, and catch-ups after foreign writes). */
  replays: number;
  /** Opens served from a snapshot file (current, or of a prefix: see `tailReplays`). */
  hydrations: number;
  /** Opens from a snapshot file of the journal's prefix plus a replay of the rest. */
  tailReplays: number;
  snapshotWrites: number;
}

interface PendingAppend {
  bytes: Buffer;
  /** 1 when the write starts with a newline ending a foreign unterminated tail. */
  lead: number;
  lineBytes: number[];
  entries: JournalEntry[];
  snapshots: SessionSnapshot[];
  ikey: string | undefined;
  /** The digest of the append's events, with a key (see event-digest.ts). */
  digest: string | undefined;
  resolve(result: AppendResult): void;
  reject(error: unknown): void;
}

interface OpenSession {
  id: string;
  /** The journal read: the primary, or the legacy one until the first append copies it over. */
  path: string;
  legacy: boolean;
  /** A journal file exists for this session. */
  onDisk: boolean;
  fd: number | undefined;
  committer: GroupCommit<PendingAppend> | undefined;

  // Durable state: what readers, watchers and snapshot files see.
  snapshot: SessionSnapshot;
  nextSeq: number;
  /** Bytes of whole entries: the end of the durable journal. */
  size: number;
  /** The file's size as we last knew it (differs from `size` only with a tail we left in place). */
  fileSize: number;
  /** NaN right after our own write: the next stat's mtime is taken if the size is what we wrote. */
  mtimeMs: number;
  needsNewline: boolean;

  // Head: durable state plus appends queued or in flight.
  headSnapshot: SessionSnapshot;
  headNextSeq: number;
  headNeedsNewline: boolean;

  /** Idempotency keys of durable appends (all of them once `keysComplete`). */
  keys: Map<string, KeyRecord>;
  /** False after a hydration from the snapshot file until the journal's first `scanPrefix` bytes are scanned. */
  keysComplete: boolean;
  scanPrefix: number;
  index: SeqIndex;
  inflightKeys: Map<string, InflightKey>;
  /** The results of the newest keyed appends, so that a prompt retry costs no replay. */
  recentResults: Map<string, AppendResult>;

  entriesSinceSnapshot: number;
  /** The journal size the snapshot file describes (-1 when unknown or none). */
  snapshotFileBytes: number;
  /** When the last append became durable (monotonic clock): the idle snapshot waits for quiet. */
  lastAppendAt: number;
  idleTimer: TimerHandle | undefined;
  snapshotWrite: Promise<void> | undefined;
}

/** A keyed append on its way to disk: what a retry with its key waits for, or is refused by. */
interface InflightKey {
  result: Promise<AppendResult>;
  digest: string;
  firstSeq: number;
  lastSeq: number;
}

// Per open session; older keys rebuild their snapshot by a replay up to the append's last seq.
const RECENT_RESULTS = 8;

/** The store; see the module comment. Create one per state directory. */
export class SessionStore {
  readonly dir: string;
  readonly legacyDir: string | undefined;
  private readonly clock: Clock;
  private readonly fsync: FsyncMode;
  private readonly logger: JournalLogger | undefined;
  private readonly maxEventBytes: number;
  private readonly maxEventsPerAppend: number;
  private readonly cacheSize: number;
  private readonly snapshotEveryEntries: number;
  private readonly snapshotIdleMs: number;
  private readonly io: CommitIo | undefined;
  private readonly maxBuffered: number;
  private readonly completedRetentionMs: number | undefined;
  private readonly hub: WatchHub;
  private readonly sessions = new Map<string, OpenSession>();
  private readonly background = new Set<Promise<void>>();
  private readonly now: () => number;
  private closed = false;
  private readonly counters = { replays: 0, hydrations: 0, tailReplays: 0, snapshotWrites: 0 };
  /** The journal directory's change feed, while anyone watches (see {@link followForeignWrites}). */
  private directoryWatch: fs.FSWatcher | undefined;
  /** Sessions whose journal changed since the follower last looked (looked at once per turn). */
  private readonly changedJournals = new Set<string>();
  /** Deletions in progress, per session: appends to the session wait for them. */
  private readonly deletions = new Map<string, Promise<unknown>>();
  private readonly retention: CompletedRetention | undefined;

  constructor(options: SessionStoreOptions) {
    this.dir = path.resolve(options.dir);
    this.legacyDir = options.legacyDir === undefined ? undefined : path.resolve(options.legacyDir);
    this.clock = options.clock ?? systemClock;
    this.fsync = options.fsync ?? "batch";
    this.logger = options.logger;
    this.maxEventBytes = options.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES;
    this.maxEventsPerAppend = options.maxEventsPerAppend ?? DEFAULT_MAX_EVENTS_PER_APPEND;
    this.cacheSize = Math.max(1, options.cacheSize ?? DEFAULT_CACHE_SIZE);
    this.snapshotEveryEntries = Math.max(1, options.snapshotEveryEntries ?? DEFAULT_SNAPSHOT_EVERY_ENTRIES);
    this.snapshotIdleMs = options.snapshotIdleMs ?? DEFAULT_SNAPSHOT_IDLE_MS;
    this.io = options.io;
    this.maxBuffered = options.maxBuffered ?? DEFAULT_MAX_BUFFERED;
    this.completedRetentionMs = options.completedRetentionMs;
    this.hub = new WatchHub(this.maxBuffered);
    this.now = () => this.clock.now();
    ensurePrivateDir(this.dir);
    this.retention =
      options.completedRetentionMs === undefined
        ? undefined
        : new CompletedRetention(this.retentionHost(), { retentionMs: options.completedRetentionMs, clock: this.clock, logger: this.logger });
    if (this.retention !== undefined) this.track(this.retention.start());
    // Started now so that the first open of a large journal does not pay for its start-up.
    scanWorker().warm();
  }

  // ---------------------------------------------------------------- appends

  /**
   * Appends `events` to the session, atomically (one write of all their lines: all or none), and
   * resolves once they are durable as the fsync mode promises. See {@link AppendOptions}.
   */
  async append(sessionId: string, events: readonly unknown[], options: AppendOptions = {}): Promise<AppendResult> {
    this.assertOpen();
    checkSessionId(sessionId);
    const prepared = this.prepareEvents(sessionId, events);
    const ikey = checkIdempotencyKey(options.idempotencyKey);
    const digest = ikey === undefined ? undefined : eventsDigest(prepared.map((p) => p.event));
    const { expectedSeq, expectedState } = options;
    if (expectedSeq !== undefined && (!Number.isInteger(expectedSeq) || expectedSeq < 0)) {
      throw invalidArgument("expected_seq", "must be a whole number ≥ 0 (the last seq you saw; 0 for a new session)");
    }
    for (;;) {
      // A deletion of the session in progress: this append comes after it, to a new session.
      const deleting = this.deletions.get(sessionId);
      if (deleting !== undefined) {
        await deleting.catch(() => undefined);
        this.assertOpen();
        continue;
      }
      const session = this.sessionForWrite(sessionId);
      if (ikey !== undefined && digest !== undefined) {
        const inflight = session.inflightKeys.get(ikey);
        if (inflight) {
          if (inflight.digest !== digest) throw keyReused(sessionId, ikey, inflight);
          // The first attempt is still on its way to disk: answer with its outcome. If it fails,
          // this retry is a fresh attempt.
          try {
            return { ...(await inflight.result), duplicate: true };
          } catch {
            continue;
          }
        }
        let known = this.findKey(session, ikey);
        let holder = session;
        if (known?.digest === undefined && known !== undefined) {
          // A key read back from the journal: its digest comes from its entries, once.
          const recovered = await this.recoverDigest(session, ikey, known);
          if (this.deletions.has(sessionId)) continue;
          // Evicted and opened again meanwhile (its keys read again), the session is still the
          // same journal if it still has the key where it was; deleted, it does not.
          const current = this.sessionIfExists(sessionId);
          const record = current === undefined ? undefined : this.findKey(current, ikey);
          if (current === undefined || record === undefined || record.firstSeq !== known.firstSeq) continue;
          // Entries that can no longer be read (a damaged line) leave nothing to compare: the
          // key is taken at its word, as before digests.
          record.digest ??= recovered ?? digest;
          known = record;
          holder = current;
        }
        if (known !== undefined) {
          if (known.digest !== digest) throw keyReused(sessionId, ikey, known);
          return this.duplicateResult(holder, ikey, known);
        }
      }
      options.fenceCheck?.();
      const currentSeq = session.headNextSeq - 1;
      const holds =
        expectedSeq !== undefined
          ? expectedSeq === currentSeq
          : expectedState === "no_session"
            ? currentSeq === 0
            : expectedState === "exists"
              ? currentSeq > 0
              : true;
      if (!holds) throw seqConflict(sessionId, currentSeq, expectedSeq, expectedState);
      return this.enqueue(session, prepared, ikey, digest);
    }
  }

  /**
   * The digest of the events a key's append wrote, read from the journal (the key's entries are
   * the lines from its first, where the key is recorded, through its last seq); undefined when
   * they cannot all be read.
   */
  private async recoverDigest(session: OpenSession, ikey: string, record: KeyRecord): Promise<string | undefined> {
    this.completeScan(session);
    const events: unknown[] = [];
    const entries = readJournalEntries(session.path, { fromSeq: record.firstSeq, start: session.index.startFor(record.firstSeq), end: session.size });
    try {
      for await (const stored of entries) {
        if (stored.idempotencyKey !== ikey) continue;
        if (stored.entry.seq > record.lastSeq) break;
        events.push(stored.entry.event);
        if (stored.entry.seq === record.lastSeq) break;
      }
    } catch (error) {
      this.logger?.warn({ sessionId: session.id, err: error }, "could not read an idempotency key's entries back");
      return undefined;
    } finally {
      await entries.return?.();
    }
    return events.length === record.lastSeq - record.firstSeq + 1 ? eventsDigest(events) : undefined;
  }

  private prepareEvents(sessionId: string, events: readonly unknown[]): Array<{ type: string; event: Record<string, unknown> }> {
    if (!Array.isArray(events) || events.length === 0) throw invalidArgument("events", "must hold at least one event");
    if (events.length > this.maxEventsPerAppend) {
      throw new BerthError(
        "invalid_argument",
        `events: ${events.length} events in one append, over the limit of ${this.maxEventsPerAppend}; split the append`,
        { field: "events", rule: `at most ${this.maxEventsPerAppend} events (max_events_per_append)`, limit: this.maxEventsPerAppend, count: events.length },
        { reason: "TOO_MANY_EVENTS" },
      );
    }
    return events.map((raw, i) => {
      const field = `events[${i}]`;
      if (raw === null || typeof raw !== "object" || Array.isArray(raw)) throw invalidArgument(field, "must be an object with a string type");
      const event = raw as Record<string, unknown>;
      if (typeof event.type !== "string" || event.type.length === 0) throw invalidArgument(`${field}.type`, "must be a non-empty string");
      // The seed takes the session from `event.id || fallback`; here the session is named by the
      // call, and an event naming another one is refused rather than silently moved.
      if (event.id !== undefined && event.id !== null && event.id !== "" && event.id !== sessionId) {
        throw invalidArgument(`${field}.id`, `must be omitted or equal the session id ${JSON.stringify(sessionId)}`);
      }
      let json: string;
      try {
        json = JSON.stringify({ ...event, id: sessionId });
      } catch (error) {
        throw invalidArgument(field, `must be JSON-serialisable (${(error as Error).message})`);
      }
      const bytes = Buffer.byteLength(json);
      if (bytes > this.maxEventBytes) {
        throw new BerthError(
          "invalid_argument",
          `${field}: is ${bytes} bytes, over the limit of ${this.maxEventBytes} bytes per event (max_event_bytes)`,
          { field, rule: `at most ${this.maxEventBytes} bytes (max_event_bytes)`, limit: this.maxEventBytes, size: bytes },
          { reason: "EVENT_TOO_LARGE" },
        );
      }
      // The event as the journal will hold it (undefined fields gone, NaN as null…): the state
      // built now must be the state a replay of the file builds later.
      return { type: event.type, event: JSON.parse(json) as Record<string, unknown> };
    });
  }

  private enqueue(
    session: OpenSession,
    prepared: Array<{ type: string; event: Record<string, unknown> }>,
    ikey: string | undefined,
    digest: string | undefined,
  ): Promise<AppendResult> {
    try {
      this.ensureWritable(session);
    } catch (error) {
      throw stateWriteError(error, `session ${session.id}: the append was not written, nothing of it kept`, this.dir, { sessionId: session.id }) ?? error;
    }
    const ts = new Date(this.clock.now()).toISOString();
    const count = prepared.length;
    const parts: string[] = [];
    const lineBytes: number[] = [];
    const entries: JournalEntry[] = [];
    const snapshots: SessionSnapshot[] = [];
    const lead = session.headNeedsNewline ? 1 : 0;
    if (lead) parts.push("\n");
    let snapshot = session.headSnapshot;
    for (let i = 0; i < count; i++) {
      const { type, event } = prepared[i]!;
      const entry: JournalEntry = { seq: session.headNextSeq + i, id: session.id, type, ts, event };
      const marks = i === 0 ? { ...(ikey !== undefined ? { ikey } : {}), ...(count > 1 ? { n: count } : {}) } : undefined;
      const line = encodeJournalLine(entry, marks);
      parts.push(line);
      lineBytes.push(Buffer.byteLength(line));
      snapshot = applyEvent(snapshot, entry, { now: this.now });
      entries.push(entry);
      snapshots.push(snapshot);
    }
    const firstSeq = session.headNextSeq;
    session.headSnapshot = snapshot;
    session.headNextSeq += count;
    session.headNeedsNewline = false;
    let item!: PendingAppend;
    const promise = new Promise<AppendResult>((resolve, reject) => {
      item = { bytes: Buffer.from(parts.join("")), lead, lineBytes, entries, snapshots, ikey, digest, resolve, reject };
    });
    if (ikey !== undefined && digest !== undefined) {
      session.inflightKeys.set(ikey, { result: promise, digest, firstSeq, lastSeq: firstSeq + count - 1 });
      promise.catch(() => undefined);
    }
    session.committer!.submit(item);
    return promise;
  }

  /** Opens the session's primary journal for appending, copying a legacy journal over first. */
  private ensureWritable(session: OpenSession): void {
    if (session.fd !== undefined) return;
    ensurePrivateDir(this.dir);
    const primary = journalPath(this.dir, session.id);
    if (session.legacy) this.migrateLegacy(session, primary);
    const existed = statOrNull(primary) !== null;
    const fd = this.openJournal(primary);
    if (!existed && this.fsync !== "none") {
      // The new file's directory entry must be durable too, or an acknowledged first append can
      // vanish with its whole file after a power loss.
      try {
        fsyncDirectory(this.dir);
      } catch (error) {
        fs.closeSync(fd);
        // No empty journal is left behind: `has` would report a session that never got an entry.
        fs.rmSync(primary, { force: true });
        throw error;
      }
    }
    session.fd = fd;
    session.onDisk = true;
    session.committer = new GroupCommit<PendingAppend>({
      fd,
      fsync: this.fsync,
      ...(this.io ? { io: this.io } : {}),
      handlers: {
        durable: (items) => this.onDurable(session, items),
        failed: (error, items, attempted) => this.onWriteFailed(session, error, items, attempted),
      },
      beforeWrite: () => checkJournalEnd(fd, session.fileSize),
      afterWrite: (data) => checkOwnWrite(fd, primary, session.fileSize, data),
    });
  }

  /**
   * Opens a journal for appending. With no descriptor left (too many clients, a low `ulimit -n`),
   * the journals of the sessions not being written to are closed (they reopen on their next append)
   * and the open is tried once more.
   */
  private openJournal(file: string): number {
    const open = () => fs.openSync(file, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT, 0o600);
    try {
      return open();
    } catch (error) {
      const code = errnoCode(error);
      if (code !== "EMFILE" && code !== "ENFILE") throw error;
      let closed = 0;
      for (const session of this.sessions.values()) {
        if (session.fd === undefined || session.committer?.busy) continue;
        this.closeFile(session);
        closed++;
      }
      this.logger?.warn({ closed, errno: code }, "no descriptor left to open a journal: closed the journals of idle sessions");
      return open();
    }
  }

  /**
   * The seed's migration: the first append to a session that only has a legacy journal copies it
   * to the primary root (the legacy file stays, read-only). berth copies the whole entries only
   * (not a torn tail), via a temp file and a rename, so a crash leaves no half copy.
   */
  private migrateLegacy(session: OpenSession, primary: string): void {
    if (statOrNull(primary) !== null) {
      // Someone (a seed process) migrated it meanwhile: the primary is the truth now.
      this.reload(session, true);
      if (!session.legacy) return;
    }
    const temp = path.join(this.dir, `.${session.id}.jsonl.${process.pid}.migrate`);
    try {
      fs.copyFileSync(session.path, temp);
      const fd = fs.openSync(temp, "r+");
      try {
        fs.ftruncateSync(fd, session.size);
        fs.fsyncSync(fd);
      } finally {
        fs.closeSync(fd);
      }
      fs.renameSync(temp, primary);
    } catch (error) {
      // A full disk mid-copy leaves no half copy behind.
      fs.rmSync(temp, { force: true });
      throw error;
    }
    fsyncDirectory(this.dir);
    this.logger?.info({ sessionId: session.id, from: session.path, to: primary }, "copied the legacy journal to the sessions directory");
    session.path = primary;
    session.legacy = false;
    session.fileSize = session.size;
    session.needsNewline = session.headNeedsNewline = session.size > 0 && lastByte(primary, session.size) !== 0x0a;
    session.mtimeMs = NaN;
  }

  private onDurable(session: OpenSession, items: PendingAppend[]): void {
    let entriesAdded = 0;
    for (const item of items) {
      // The file's end, not `size`: an unterminated foreign tail we left in place sits before our bytes.
      let offset = session.fileSize + item.lead;
      session.fileSize += item.bytes.length;
      session.size = session.fileSize;
      for (let i = 0; i < item.entries.length; i++) {
        session.index.note(item.entries[i]!.seq, offset, i === 0);
        offset += item.lineBytes[i]!;
      }
      const firstSeq = item.entries[0]!.seq;
      const lastSeq = item.entries[item.entries.length - 1]!.seq;
      const snapshot = item.snapshots[item.snapshots.length - 1]!;
      this.retention?.appended(session.id, session.snapshot, item.entries, item.snapshots);
      session.snapshot = snapshot;
      session.nextSeq = lastSeq + 1;
      session.needsNewline = false;
      const result: AppendResult = { firstSeq, lastSeq, snapshot, duplicate: false };
      if (item.ikey !== undefined) {
        session.keys.set(item.ikey, { firstSeq, lastSeq, ...(item.digest !== undefined ? { digest: item.digest } : {}) });
        session.inflightKeys.delete(item.ikey);
        rememberResult(session, item.ikey, result);
      }
      entriesAdded += item.entries.length;
      // Checksummed lines of our own, so `verified`: a read of them later says the same.
      this.hub.publish(
        session.id,
        item.entries.map((entry, i) => ({ entry, idempotencyKey: item.ikey, integrity: "verified", snapshot: item.snapshots[i]! })),
      );
      item.resolve(result);
    }
    session.mtimeMs = NaN;
    session.entriesSinceSnapshot += entriesAdded;
    session.lastAppendAt = this.clock.monotonicNow();
    this.scheduleSnapshot(session);
  }

  private onWriteFailed(session: OpenSession, error: Error, items: PendingAppend[], attempted: number): void {
    if (error instanceof ForeignAppendError) {
      // Another process (a seed process sharing the live directory) appended after these appends
      // took their seqs: kept, they would repeat its seqs. They are refused, retryably, with
      // nothing of them left to read (journal-guard.ts), and the next access reads the other
      // process's entries first.
      const left = error.outcome === "left";
      const fields = { sessionId: session.id, expectedBytes: error.expected, fileBytes: error.found, appends: items.length, outcome: error.outcome };
      if (left) {
        this.logger?.error(fields, "another process appended to the journal while a short write of ours was split; our lines could not be undone and stay in the journal");
        // The journal holds lines of ours that no append returned: re-read it from disk.
        this.forget(session);
      } else {
        this.logger?.warn(fields, "another process appended to the journal while appends waited to be written; they were refused, nothing of them kept");
      }
      // Blanked, the append left nothing: the same call can simply be made again. Left in place,
      // its lines are in the journal: the caller must look before writing again.
      const failure = left
        ? new BerthError(
            "aborted",
            `another process appended to session ${session.id} while this append was written; it is refused, but its lines could not be undone (see the service log) — read the session before retrying`,
            { sessionId: session.id, expectedSeq: 0, currentSeq: this.currentSeqOnDisk(session.id) },
            { reason: "SEQ_CONFLICT" },
          )
        : new BerthError(
            "unavailable",
            `another process appended to session ${session.id} while this append waited to be written; nothing of it was kept (its seq would have repeated one of theirs) — retry it`,
            { sessionId: session.id },
            { reason: "APPEND_OVERTAKEN", retryAfterMs: APPEND_OVERTAKEN_RETRY_MS },
          );
      this.rejectAppends(session, items, failure);
      return;
    }
    // Bytes of the failed batch may be on disk: cut the file back to the last durable byte
    // before anything new is written, so no rejected append can reappear at the next open.
    let cutBack = false;
    try {
      if (session.fd !== undefined) {
        fs.ftruncateSync(session.fd, session.fileSize);
        cutBack = true;
      }
    } catch (truncateError) {
      this.logger?.error({ sessionId: session.id, err: truncateError }, "could not cut the journal back after a failed write");
    }
    session.mtimeMs = NaN;
    const refusal = (what: string, nothingKept: boolean) =>
      stateWriteError(error, `session ${session.id}: ${what}`, this.dir, { sessionId: session.id, ...(nothingKept ? {} : { outcome: "unknown" }) }) ??
      new BerthError(
        "unavailable",
        `could not write the journal of session ${session.id} (${error.message}); ${nothingKept ? "nothing of this append was kept — retry it" : what}`,
        { sessionId: session.id, ...(errnoCode(error) ? { errno: errnoCode(error) } : {}), ...(nothingKept ? {} : { outcome: "unknown" }) },
        { reason: "STATE_READ_ONLY", retryAfterMs: UNAVAILABLE_RETRY_AFTER_MS },
      );
    const failure = refusal("the append was not written, nothing of it kept", true);
    this.logger?.error({ sessionId: session.id, err: error, appends: items.length, cutBack }, "journal write failed; appends rejected and state rolled back");
    if (!cutBack && attempted > 0) {
      // Its bytes could not be cut back (the file system went read-only under the write): whether
      // they stay is not known, so the appends being written are not told "nothing kept". Their
      // idempotency keys find them if they stayed; the appends queued behind them never reached the file.
      const unknown = refusal(
        "the append may have been written, in whole (never in part), or not at all — its bytes could not be cut back; read the session, or retry with the same idempotency key, which answers with it if it was kept",
        false,
      );
      for (const item of items.slice(0, attempted)) {
        if (item.ikey !== undefined) session.inflightKeys.delete(item.ikey);
        item.reject(unknown);
      }
      items = items.slice(attempted);
    }
    if (!cutBack) {
      // The file's end is unknown now: forget the session; the next access re-opens it from disk,
      // where the torn-tail repair cuts an incomplete append back.
      this.forget(session);
    } else if (session.fileSize === 0 && !session.legacy) {
      // The failed append was the session's first: leave no empty journal behind (`has` would
      // report a session that never got an entry).
      this.forget(session);
      try {
        fs.rmSync(journalPath(this.dir, session.id), { force: true });
      } catch (removeError) {
        this.logger?.warn({ sessionId: session.id, err: removeError }, "could not remove the empty journal of a failed first append");
      }
    }
    this.rejectAppends(session, items, failure);
  }

  /** The session's last seq as its journal says now (0 when it has none, or it cannot be read). */
  private currentSeqOnDisk(id: string): number {
    try {
      const session = this.sessionIfExists(id);
      return session === undefined ? 0 : session.nextSeq - 1;
    } catch {
      return 0;
    }
  }

  /** Rolls the session's head back to its durable state and refuses `items`, none of which is on disk. */
  private rejectAppends(session: OpenSession, items: PendingAppend[], failure: BerthError): void {
    session.headSnapshot = session.snapshot;
    session.headNextSeq = session.nextSeq;
    session.headNeedsNewline = session.needsNewline;
    for (const item of items) {
      if (item.ikey !== undefined) session.inflightKeys.delete(item.ikey);
      item.reject(failure);
    }
  }

  // ---------------------------------------------------------------- idempotency

  private findKey(session: OpenSession, ikey: string): KeyRecord | undefined {
    const known = session.keys.get(ikey);
    if (known || session.keysComplete) return known;
    this.completeScan(session);
    return session.keys.get(ikey);
  }

  /** Recovers the keys and seek points of the journal bytes a hydration skipped. */
  private completeScan(session: OpenSession): void {
    if (session.keysComplete) return;
    const { keys, index } = scanJournalPrefix(session.path, session.scanPrefix);
    for (const [key, record] of keys) if (!session.keys.has(key)) session.keys.set(key, record);
    session.index.prepend(index);
    session.keysComplete = true;
  }

  private duplicateResult(session: OpenSession, ikey: string, record: KeyRecord): AppendResult {
    const recent = session.recentResults.get(ikey);
    if (recent) return { ...recent, duplicate: true };
    // An older key: rebuild the snapshot as of that append by replaying up to its last entry.
    const snapshot = replayJournalFile(session.path, session.id, {
      repair: false,
      stopAfterSeq: record.lastSeq,
      now: this.now,
      sessionId: session.id,
    }).snapshot;
    const result: AppendResult = { firstSeq: record.firstSeq, lastSeq: record.lastSeq, snapshot, duplicate: false };
    rememberResult(session, ikey, result);
    return { ...result, duplicate: true };
  }

  // ---------------------------------------------------------------- reads

  /**
   * The session's durable snapshot and last seq. Null for a completed or discarded session unless
   * `includeCompleted`. A session with no journal gets the base snapshot with `exists: false`
   * (the seed's `getSnapshot` answers it so too); nothing is created.
   */
  getSnapshot(sessionId: string, options: { includeCompleted?: boolean } = {}): SessionView | null {
    this.assertOpen();
    checkSessionId(sessionId);
    const session = this.sessionIfExists(sessionId);
    const view: SessionView = session
      ? { sessionId, snapshot: session.snapshot, lastSeq: session.nextSeq - 1, exists: session.onDisk }
      : { sessionId, snapshot: baseSnapshot(sessionId), lastSeq: 0, exists: false };
    if (!options.includeCompleted && isCompletedPhase(view.snapshot.phase)) return null;
    return view;
  }

  /** True when a journal exists for the session in either root. Never creates anything. */
  has(sessionId: string): boolean {
    this.assertOpen();
    checkSessionId(sessionId);
    if (statOrNull(journalPath(this.dir, sessionId))) return true;
    return this.legacyDir !== undefined && statOrNull(journalPath(this.legacyDir, sessionId)) !== null;
  }

  /**
   * The sessions with a journal in either root, sorted by id; completed and discarded ones only
   * with `includeCompleted` (the seed's `listActiveSessions`). With `after`, only the sessions
   * whose id sorts after it; with `limit`, at most that many: a page of the list, which sessions
   * created or deleted meanwhile cannot shift (a page starts after an id, not at a position). A
   * session whose journal has not moved costs a stat.
   */
  list(options: { includeCompleted?: boolean; after?: string; limit?: number } = {}): SessionView[] {
    this.assertOpen();
    const limit = options.limit ?? Infinity;
    const views: SessionView[] = [];
    for (const id of this.sessionIds()) {
      if (views.length >= limit) break;
      if (options.after !== undefined && id <= options.after) continue;
      const view = this.getSnapshot(id, options);
      if (view && view.exists) views.push(view);
    }
    return views;
  }

  /** The ids of the sessions with a journal in either root, sorted (code unit order, as `<` compares). */
  sessionIds(): string[] {
    this.assertOpen();
    const ids = new Set<string>();
    for (const dir of [this.legacyDir, this.dir]) {
      if (dir === undefined) continue;
      let names: string[];
      try {
        names = fs.readdirSync(dir);
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

  /**
   * Writes the session's snapshot file now (atomically), so another process — or the next start —
   * can hydrate from it. The journal stays the truth; this only refreshes the cache.
   */
  async flush(sessionId: string): Promise<SessionView> {
    this.assertOpen();
    checkSessionId(sessionId);
    const session = this.sessionIfExists(sessionId);
    if (!session || !session.onDisk) return { sessionId, snapshot: baseSnapshot(sessionId), lastSeq: 0, exists: false };
    const view: SessionView = { sessionId, snapshot: session.snapshot, lastSeq: session.nextSeq - 1, exists: true };
    try {
      await this.writeSnapshot(session, true);
    } catch (error) {
      // The snapshot file is written atomically: the one there, if any, is still whole.
      throw stateWriteError(error, `session ${sessionId}: its snapshot file was not written`, this.dir, { sessionId }) ?? error;
    }
    return view;
  }

  /**
   * Deletes a session: its snapshot files, then its journal, in the primary root and in the legacy
   * one (the seed's store reads a legacy journal when the primary has none: left there, the session
   * would come back with its old entries), and with them its idempotency keys and cached state.
   * Appends already sequenced land first; appends made meanwhile wait, then start a new session
   * from seq 1. Watchers of the session end with not_found SESSION_DELETED; watchers of every
   * session get a deletion change. With `expectedSeq`, only when that is still the session's last
   * seq (aborted SEQ_CONFLICT). not_found SESSION_NOT_FOUND when the session has no journal.
   */
  delete(sessionId: string, options: { expectedSeq?: number } = {}): Promise<{ lastSeq: number }> {
    this.assertOpen();
    checkSessionId(sessionId);
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

  private async deleteNow(sessionId: string, options: { expectedSeq?: number }): Promise<{ lastSeq: number }> {
    for (;;) {
      this.assertOpen();
      const session = this.sessionIfExists(sessionId);
      if (!session || !session.onDisk) throw sessionNotFound(sessionId);
      // Appends sequenced before the deletion land (or fail) first; a snapshot file being written
      // must not be written again after the deletion.
      if (session.committer?.busy) {
        await session.committer.idle();
        continue;
      }
      if (session.snapshotWrite !== undefined) {
        await session.snapshotWrite.catch(() => undefined);
        continue;
      }
      const lastSeq = session.nextSeq - 1;
      if (options.expectedSeq !== undefined && options.expectedSeq !== lastSeq) throw seqConflict(sessionId, lastSeq, options.expectedSeq, undefined);
      this.forget(session);
      this.removeSessionFiles(sessionId);
      this.logger?.info({ sessionId, lastSeq }, "session deleted");
      this.retention?.forget(sessionId);
      this.hub.sessionDeleted(sessionId, lastSeq);
      return { lastSeq };
    }
  }

  /**
   * Removes a session's files, the journal last: a crash in between leaves a session that still
   * exists (its journal is the truth) rather than a snapshot file that could pass for the state of
   * a new journal of the same size under the same id.
   */
  private removeSessionFiles(sessionId: string): void {
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
        fsyncDirectory(dir);
      } catch (error) {
        if (errnoCode(error) !== "ENOENT") this.logger?.warn({ dir, err: error }, "could not sync the directory of a deleted session");
      }
    }
  }

  /**
   * The durable entries with seq ≥ `fromSeq`, at most `limit` (0: all), in journal order, read
   * from the file in chunks: each as the seed wrote it (without berth's bookkeeping fields), with
   * the idempotency key it was appended with and its line's checksum verdict.
   */
  read(sessionId: string, fromSeq = 1, limit = 0): AsyncIterableIterator<StoredEntry> {
    this.assertOpen();
    checkSessionId(sessionId);
    checkFromSeq(fromSeq);
    if (!Number.isInteger(limit) || limit < 0) throw invalidArgument("limit", "must be a whole number ≥ 0 (0: no limit)");
    const session = this.sessionIfExists(sessionId);
    if (!session || !session.onDisk) return emptyIterator();
    this.completeScan(session);
    return readJournalEntries(session.path, { fromSeq, limit, start: session.index.startFor(fromSeq), end: session.size });
  }

  /**
   * Watches a session: entries with seq ≥ `fromSeq` from the journal, a caught-up marker, then
   * every new durable entry (with the snapshot it produced, when `includeSnapshot`). A watcher
   * more than `maxBuffered` entries behind is ended with resource_exhausted naming the seq to
   * resume from. `return()` on the iterator unsubscribes at once.
   */
  watch(sessionId: string, fromSeq = 1, options: WatchOptions = {}): EventWatcher<WatchEvent> {
    this.assertOpen();
    checkSessionId(sessionId);
    checkFromSeq(fromSeq);
    this.followForeignWrites();
    return this.hub.watchSession(sessionId, fromSeq, options, (): WatchBacklog => {
      const session = this.sessionIfExists(sessionId);
      if (!session || !session.onDisk) return { lastSeq: 0, snapshot: baseSnapshot(sessionId), entries: () => emptyIterator() };
      this.completeScan(session);
      const start = session.index.startFor(fromSeq);
      const end = session.size;
      const journal = session.path;
      return {
        lastSeq: session.nextSeq - 1,
        snapshot: session.snapshot,
        entries: () => readJournalEntries(journal, { fromSeq, start, end }),
      };
    });
  }

  /**
   * Watches every session: one change per durable append (an append of several events is one
   * change, first..last seq), with the snapshot after it when asked.
   */
  watchAll(options: WatchOptions = {}): AsyncIterableIterator<SessionChange> {
    this.assertOpen();
    this.followForeignWrites();
    return this.hub.watchAll(options);
  }

  /**
   * While anyone watches, follows the journal directory's change feed (inotify: no polling), so
   * that entries another process appends (a seed process sharing a live directory) reach watchers
   * as they land, not at the next call that happens to read the session. Our own appends show up
   * in the feed too; their check is one stat. The feed is dropped at the first change seen with
   * nobody watching.
   */
  private followForeignWrites(): void {
    if (this.directoryWatch !== undefined) return;
    try {
      this.directoryWatch = fs.watch(this.dir, { persistent: false }, (_event, name) => this.journalChanged(name));
    } catch (error) {
      // Without the feed (no inotify watches left), foreign entries still arrive at the next read.
      this.logger?.warn({ dir: this.dir, err: error }, "cannot follow the journal directory; entries other processes append reach watchers at the next read of their session");
      return;
    }
    this.directoryWatch.on("error", (error) => {
      this.logger?.warn({ dir: this.dir, err: error }, "lost the journal directory's change feed");
      this.stopFollowing();
    });
  }

  private stopFollowing(): void {
    this.directoryWatch?.close();
    this.directoryWatch = undefined;
    this.changedJournals.clear();
  }

  private journalChanged(name: string | null): void {
    if (this.closed || this.hub.watcherCount === 0) {
      this.stopFollowing();
      return;
    }
    const id = name === null ? undefined : sessionIdFromFileName(name);
    if (id !== undefined && this.hub.isWatched(id)) this.catchUpSoon(id);
  }

  /** Looks at `id`'s journal on the next turn, once for every change the feed reported meanwhile. */
  private catchUpSoon(id: string): void {
    if (this.changedJournals.size === 0) setImmediate(() => this.catchUpChanged());
    this.changedJournals.add(id);
  }

  /** Reads what other processes appended to the changed journals: handed to watchers as our own appends are. */
  private catchUpChanged(): void {
    const ids = [...this.changedJournals];
    this.changedJournals.clear();
    for (const id of ids) {
      if (this.closed) return;
      const cached = this.sessions.get(id);
      if (cached?.committer?.busy) {
        // Our own bytes are landing; look again once they have (refresh skips a busy session).
        void cached.committer.idle().then(() => {
          if (!this.closed) this.catchUpSoon(id);
        });
        continue;
      }
      try {
        if (cached !== undefined) {
          this.refresh(cached);
        } else if (this.sessionIfExists(id) !== undefined) {
          // Created by another process while watched: its first entries came in no append of ours.
          this.hub.resync(id, `session ${id} was created by another process`);
        }
      } catch (error) {
        this.logger?.warn({ sessionId: id, err: error }, "could not read what another process appended");
      }
    }
  }

  /** What retention reads and does through the store (see retention.ts). */
  private retentionHost(): RetentionHost {
    return {
      sessionIds: () => this.sessionIds(),
      view: (id) => {
        const view = this.getSnapshot(id, { includeCompleted: true });
        return view !== null && view.exists ? view : undefined;
      },
      entries: (id) => this.read(id, 1, 0),
      delete: (id, lastSeq) => this.delete(id, { expectedSeq: lastSeq }),
    };
  }

  /** Runs the sweep of completed sessions now (tests; the store sweeps by itself). */
  sweepCompleted(): Promise<void> {
    return this.retention?.sweep() ?? Promise.resolve();
  }

  /** The limits the store enforces (what GetLimits reports). */
  limits(): { maxEventBytes: number; maxEventsPerAppend: number; maxBuffered: number; maxIdempotencyKeyLength: number; completedRetentionMs: number | undefined } {
    return {
      maxEventBytes: this.maxEventBytes,
      maxEventsPerAppend: this.maxEventsPerAppend,
      maxBuffered: this.maxBuffered,
      maxIdempotencyKeyLength: MAX_IDEMPOTENCY_KEY_LENGTH,
      completedRetentionMs: this.completedRetentionMs,
    };
  }

  /** Counters for metrics. */
  stats(): SessionStoreStats {
    return { openSessions: this.sessions.size, watchers: this.hub.watcherCount, ...this.counters };
  }

  /** Resolves once no append is in flight and no background snapshot write or retention sweep is running. */
  async settled(): Promise<void> {
    for (;;) {
      const pending = [...[...this.sessions.values()].map((s) => s.committer?.idle()), ...this.background, this.retention?.idle()].filter(Boolean);
      await Promise.all(pending);
      if ([...this.sessions.values()].every((s) => !s.committer?.busy) && this.background.size === 0 && !this.retention?.sweeping) return;
    }
  }

  /**
   * Stops the store: refuses new calls, ends watchers (unavailable), waits for appends in flight,
   * writes the snapshot files that are behind and closes every journal.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopFollowing();
    this.hub.close(new BerthError("unavailable", "the session store is shutting down; watch again when it is back", undefined, { reason: "SHUTTING_DOWN", retryAfterMs: UNAVAILABLE_RETRY_AFTER_MS }));
    await this.retention?.stop();
    await this.settled();
    for (const session of [...this.sessions.values()]) {
      if (session.idleTimer !== undefined) this.clock.clearTimeout(session.idleTimer);
      session.idleTimer = undefined;
      try {
        await this.writeSnapshot(session, false);
      } catch (error) {
        this.logger?.warn({ sessionId: session.id, err: error }, "could not write the snapshot file at close");
      }
      this.closeFile(session);
    }
    this.sessions.clear();
    await Promise.allSettled([...this.background]);
  }

  // ---------------------------------------------------------------- sessions in memory

  /** The session, opened (and caught up with foreign writes) when its journal exists; else undefined. */
  private sessionIfExists(id: string): OpenSession | undefined {
    const cached = this.touch(id);
    if (cached) return cached;
    const opened = this.open(id);
    if (opened) this.remember(opened);
    return opened;
  }

  /** The session to append to: opened, or a new empty one (its file is created by the first append). */
  private sessionForWrite(id: string): OpenSession {
    const existing = this.sessionIfExists(id);
    if (existing) return existing;
    const primary = journalPath(this.dir, id);
    const fresh = newSession(id, primary, false, baseSnapshot(id), 1);
    fresh.onDisk = false;
    this.remember(fresh);
    return fresh;
  }

  /** The cached session (moved to the LRU's young end), caught up with foreign writes. */
  private touch(id: string): OpenSession | undefined {
    const session = this.sessions.get(id);
    if (!session) return undefined;
    this.sessions.delete(id);
    this.sessions.set(id, session);
    return this.refresh(session) ? session : this.sessionIfExists(id);
  }

  private remember(session: OpenSession): void {
    this.sessions.set(session.id, session);
    if (this.sessions.size <= this.cacheSize) return;
    for (const candidate of this.sessions.values()) {
      if (this.sessions.size <= this.cacheSize) break;
      if (candidate === session || candidate.committer?.busy || candidate.inflightKeys.size > 0) continue;
      this.evict(candidate);
    }
  }

  private evict(session: OpenSession): void {
    this.sessions.delete(session.id);
    if (session.idleTimer !== undefined) this.clock.clearTimeout(session.idleTimer);
    session.idleTimer = undefined;
    // Written so that the next access re-opens from the snapshot file instead of replaying.
    this.track(this.writeSnapshot(session, false).catch((error) => this.logger?.warn({ sessionId: session.id, err: error }, "could not write the snapshot file of an evicted session")));
    this.closeFile(session);
  }

  /** Drops a session whose in-memory state can no longer be trusted; the next access re-opens it. */
  private forget(session: OpenSession): void {
    if (this.sessions.get(session.id) === session) this.sessions.delete(session.id);
    if (session.idleTimer !== undefined) this.clock.clearTimeout(session.idleTimer);
    session.idleTimer = undefined;
    this.closeFile(session);
  }

  private closeFile(session: OpenSession): void {
    if (session.fd === undefined) return;
    try {
      fs.closeSync(session.fd);
    } catch (error) {
      this.logger?.warn({ sessionId: session.id, err: error }, "could not close a journal");
    }
    session.fd = undefined;
    session.committer = undefined;
  }

  /** Opens a session from its snapshot file or by replaying its journal; undefined when it has none. */
  private open(id: string): OpenSession | undefined {
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
    const hydrated = readSnapshotFile(snapshotPath(this.dir, id), id, stat.size);
    if (hydrated) {
      this.counters.hydrations++;
      const session = newSession(id, journal, legacy, hydrated.snapshot, hydrated.nextSeq);
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
  private openFromPrefix(id: string, journal: string, legacy: boolean, stat: fs.Stats): OpenSession | undefined {
    const prefix = readPrefixSnapshot(snapshotPath(this.dir, id), id, stat.size);
    if (!prefix || lastLineCrc(journal, prefix.journalBytes) !== prefix.lastLineCrc) return undefined;
    const session = newSession(id, journal, legacy, prefix.snapshot, prefix.nextSeq);
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

  private replayInto(existing: OpenSession | undefined, id: string, journal: string, legacy: boolean, repair: boolean): OpenSession {
    this.counters.replays++;
    const replayed = replayJournalFile(journal, id, { repair, logger: this.logger, now: this.now, sessionId: id });
    const session = existing ?? newSession(id, journal, legacy, replayed.snapshot, replayed.nextSeq);
    session.path = journal;
    session.legacy = legacy;
    session.onDisk = true;
    session.snapshot = session.headSnapshot = replayed.snapshot;
    session.nextSeq = session.headNextSeq = replayed.nextSeq;
    session.size = replayed.size;
    session.fileSize = replayed.fileSize;
    session.mtimeMs = replayed.mtimeMs;
    session.needsNewline = session.headNeedsNewline = replayed.needsNewline;
    session.keys = replayed.keys;
    session.keysComplete = true;
    session.scanPrefix = 0;
    session.index = replayed.index;
    session.recentResults.clear();
    session.snapshotFileBytes = -1;
    // A repair changed the file: its snapshot file (if any) is stale; write a fresh one soon.
    if (replayed.repaired) this.scheduleSnapshot(session);
    return session;
  }

  /**
   * Checks that the journal is still what this store last saw (the seed's size + mtime rule) and
   * catches up when it is not. Returns false when the session had to be dropped (its file vanished).
   */
  private refresh(session: OpenSession): boolean {
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
  private catchUp(session: OpenSession, stat: fs.Stats, opening = false): boolean {
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
      snapshot = applyEvent(snapshot, entry, { now: this.now });
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
    session.snapshot = session.headSnapshot = snapshot;
    session.headNextSeq = session.nextSeq;
    session.size = start + consumed;
    session.fileSize = stat.size;
    session.mtimeMs = stat.mtimeMs;
    // An unterminated tail is left alone (it may be a write in progress); our next line starts
    // with a newline so it cannot be glued to it.
    session.needsNewline = session.headNeedsNewline = consumed < read;
    if (opening) {
      this.logger?.debug({ sessionId: session.id, entries: decoded.length, from: start }, "opened from a snapshot file of the journal's prefix and replayed the rest");
    } else {
      this.logger?.debug({ sessionId: session.id, entries: decoded.length }, "caught up with entries appended by another process");
      for (const append of published) this.hub.publish(session.id, append);
    }
    this.scheduleSnapshot(session);
    return true;
  }

  /** One full replay of the session's journal (another process changed it in a way we cannot follow). */
  private reload(session: OpenSession, preferPrimary: boolean): void {
    const primary = journalPath(this.dir, session.id);
    const usePrimary = preferPrimary || !session.legacy || statOrNull(primary) !== null;
    const journal = usePrimary ? primary : session.path;
    this.logger?.info({ sessionId: session.id, path: journal }, "journal changed by another process; replaying it");
    this.closeFile(session);
    if (statOrNull(journal) !== null) this.replayInto(session, session.id, journal, !usePrimary, false);
    this.hub.resync(session.id, `the journal of session ${session.id} was changed by another process in a way only a full replay could follow`);
  }

  // ---------------------------------------------------------------- snapshot files

  private scheduleSnapshot(session: OpenSession): void {
    if (this.closed) return;
    // One background write at a time: entries landing meanwhile are picked up by the idle timer.
    if (session.entriesSinceSnapshot >= this.snapshotEveryEntries && session.snapshotWrite === undefined) {
      this.track(this.writeSnapshot(session, false).catch((error) => this.logger?.warn({ sessionId: session.id, err: error }, "could not write a snapshot file")));
      return;
    }
    if (session.idleTimer !== undefined || this.snapshotIdleMs <= 0) return;
    const arm = (delay: number): void => {
      session.idleTimer = this.clock.setTimeout(() => {
        session.idleTimer = undefined;
        if (this.closed || this.sessions.get(session.id) !== session) return;
        const quietFor = this.clock.monotonicNow() - session.lastAppendAt;
        if (quietFor < this.snapshotIdleMs) {
          arm(this.snapshotIdleMs - quietFor);
          return;
        }
        this.track(this.writeSnapshot(session, false).catch((error) => this.logger?.warn({ sessionId: session.id, err: error }, "could not write a snapshot file")));
      }, delay);
    };
    arm(this.snapshotIdleMs);
  }

  /**
   * Writes the durable state to the snapshot file (one write at a time per session). `force`
   * writes even when the file is already current.
   */
  private writeSnapshot(session: OpenSession, force: boolean): Promise<void> {
    const previous = session.snapshotWrite ?? Promise.resolve();
    const next = previous
      .catch(() => undefined)
      .then(async () => {
        if (!session.onDisk) return;
        if (!force && session.snapshotFileBytes === session.fileSize) return;
        const journalBytes = session.fileSize;
        const nextSeq = session.nextSeq;
        const snapshot = session.snapshot;
        const entries = session.entriesSinceSnapshot;
        // Recorded so that a later open can use this file even once the journal has grown past it.
        const lastLine = lastLineCrc(session.path, journalBytes);
        await writeSnapshotFile(snapshotPath(this.dir, session.id), snapshot, { journalBytes, nextSeq, lastLineCrc: lastLine });
        this.counters.snapshotWrites++;
        session.snapshotFileBytes = journalBytes;
        session.entriesSinceSnapshot = Math.max(0, session.entriesSinceSnapshot - entries);
      });
    session.snapshotWrite = next;
    void next.finally(() => {
      if (session.snapshotWrite === next) session.snapshotWrite = undefined;
    }).catch(() => undefined);
    return next;
  }

  private track(promise: Promise<unknown>): void {
    const done = promise.then(() => undefined);
    this.background.add(done);
    void done.finally(() => this.background.delete(done));
  }

  private assertOpen(): void {
    if (this.closed) throw new BerthError("unavailable", "the session store is closed", undefined, { reason: "SHUTTING_DOWN", retryAfterMs: UNAVAILABLE_RETRY_AFTER_MS });
  }
}

function newSession(id: string, journal: string, legacy: boolean, snapshot: SessionSnapshot, nextSeq: number): OpenSession {
  return {
    id,
    path: journal,
    legacy,
    onDisk: true,
    fd: undefined,
    committer: undefined,
    snapshot,
    nextSeq,
    size: 0,
    fileSize: 0,
    mtimeMs: NaN,
    needsNewline: false,
    headSnapshot: snapshot,
    headNextSeq: nextSeq,
    headNeedsNewline: false,
    keys: new Map(),
    keysComplete: true,
    scanPrefix: 0,
    index: new SeqIndex(),
    inflightKeys: new Map(),
    recentResults: new Map(),
    entriesSinceSnapshot: 0,
    snapshotFileBytes: -1,
    lastAppendAt: 0,
    idleTimer: undefined,
    snapshotWrite: undefined,
  };
}

function rememberResult(session: OpenSession, ikey: string, result: AppendResult): void {
  session.recentResults.delete(ikey);
  session.recentResults.set(ikey, result);
  if (session.recentResults.size > RECENT_RESULTS) {
    const oldest = session.recentResults.keys().next().value;
    if (oldest !== undefined) session.recentResults.delete(oldest);
  }
}

function lastByte(file: string, size: number): number | undefined {
  const fd = fs.openSync(file, "r");
  try {
    const buf = Buffer.alloc(1);
    return fs.readSync(fd, buf, 0, 1, size - 1) === 1 ? buf[0] : undefined;
  } finally {
    fs.closeSync(fd);
  }
}

function checkIdempotencyKey(key: unknown): string | undefined {
  if (key === undefined || key === "") return undefined;
  if (typeof key !== "string" || key.length > MAX_IDEMPOTENCY_KEY_LENGTH) {
    throw invalidArgument("idempotency_key", `must be a string of at most ${MAX_IDEMPOTENCY_KEY_LENGTH} characters`);
  }
  return key;
}

/** The refusal of a call naming a session that has no journal. */
export function sessionNotFound(sessionId: string): BerthError {
  return new BerthError("not_found", `session ${sessionId} has no journal (nothing was ever appended to it, or it was deleted)`, { sessionId }, { reason: "SESSION_NOT_FOUND" });
}

/** The refusal of an append (or deletion) whose expectation of the session does not hold. */
function seqConflict(sessionId: string, currentSeq: number, expectedSeq: number | undefined, expectedState: ExpectedState | undefined): BerthError {
  const expected =
    expectedSeq !== undefined ? `expected seq ${expectedSeq}` : expectedState === "no_session" ? "expected no session yet" : "expected an existing session";
  const retry = currentSeq > 0 ? `retry with expected_seq=${currentSeq}` : "it has no entry yet";
  return new BerthError(
    "aborted",
    `session ${sessionId}: ${expected} but the session is at seq ${currentSeq}; read it again, redo the change and ${retry}`,
    { sessionId, expectedSeq: expectedSeq ?? 0, currentSeq, ...(expectedState !== undefined ? { expectedState } : {}) },
    { reason: "SEQ_CONFLICT" },
  );
}

/** The refusal of an append whose idempotency key named another request. */
function keyReused(sessionId: string, idempotencyKey: string, original: { firstSeq: number; lastSeq: number }): BerthError {
  const seqs = original.firstSeq === original.lastSeq ? `seq ${original.firstSeq}` : `seqs ${original.firstSeq}–${original.lastSeq}`;
  return new BerthError(
    "already_exists",
    `session ${sessionId}: idempotency key ${JSON.stringify(idempotencyKey)} was used for a different append (${seqs}); nothing was written — use a new key for a new request`,
    { sessionId, idempotencyKey, firstSeq: original.firstSeq, lastSeq: original.lastSeq },
    { reason: "IDEMPOTENCY_KEY_REUSED" },
  );
}

function checkFromSeq(fromSeq: number): void {
  if (!Number.isInteger(fromSeq) || fromSeq < 0) throw invalidArgument("from_seq", "must be a whole number ≥ 0");
}

function emptyIterator<T>(): AsyncIterableIterator<T> {
  return {
    next: () => Promise.resolve({ value: undefined, done: true }),
    return: () => Promise.resolve({ value: undefined, done: true }),
    [Symbol.asyncIterator]() {
      return this;
    },
  };
}

/** Creates a session store; see {@link SessionStoreOptions}. */
export function createSessionStore(options: SessionStoreOptions): SessionStore {
  return new SessionStore(options);
}
