/**
 * The file backend's write path: a session's journal opened for appending (created, or copied over
 * from the legacy root first), a batch's lines through group commit, and what becomes of them —
 * durable (the session's durable state moves, the batch is told), or failed (the file is cut back
 * to its last durable byte, the batch and every one behind it are refused).
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { BerthError } from "@berth/shared/errors";
import { ensurePrivateDir, fsyncDirectory, statOrNull } from "@berth/shared/files";
import { retryAfterRelief } from "@berth/shared/descriptors";
import { errnoCode, stateWriteError } from "@berth/shared/state-errors";
import type { Logger } from "@berth/shared/logger";
import type { SessionId } from "@berth/shared/safe-id";
import { UNAVAILABLE_RETRY_AFTER_MS } from "../session-refusals.js";
import type { FileSessionJournal, JournalAppender, PendingAppend } from "./file-session-journal.js";
import { GroupCommit, type CommitIo, type FsyncMode } from "./group-commit.js";
import { encodeJournalLine } from "./journal-format.js";
import { checkJournalEnd, checkOwnWrite, ForeignAppendError } from "./journal-guard.js";
import type { JournalBatch } from "./journal-store.js";
import { journalPath } from "./session-paths.js";

/** How soon an append another process's line overtook may be retried (at once: nothing of it was kept). */
export const APPEND_OVERTAKEN_RETRY_MS = 10;

/** What the write path needs of the store whose sessions it writes. */
export interface AppendHost {
  /** The primary directory: journals are appended there, a legacy one copied there first. */
  readonly dir: string;
  readonly fsync: FsyncMode;
  readonly io: CommitIo | undefined;
  readonly logger: Logger | undefined;
  /** The monotonic clock: when the last append became durable. */
  monotonicNow(): number;
  /** Closes idle journals until another may be opened (the store's bound of open journals). */
  makeRoomForJournal(session: FileSessionJournal): void;
  /** One full replay of the session's journal: another process changed it (here: migrated it). */
  reload(session: FileSessionJournal, preferPrimary: boolean): void;
  /** Drops a session whose in-memory state can no longer be trusted; the next access re-opens it. */
  forget(session: FileSessionJournal): void;
  /** The session opened afresh from its journal; undefined when it has none. */
  open(id: SessionId): FileSessionJournal | undefined;
  /** Appends became durable: the session's snapshot file may be due. */
  appended(session: FileSessionJournal): void;
}

export class FileAppends implements JournalAppender {
  constructor(private readonly host: AppendHost) {}

  /**
   * Opens the session's primary journal for appending, copying a legacy journal over first. With no
   * descriptor left (too many clients, a low `ulimit -n`), the journals of the sessions not being
   * written to are closed and it is tried once more (descriptors.ts).
   */
  prepare(session: FileSessionJournal): void {
    try {
      retryAfterRelief(() => this.ensureWritable(session));
    } catch (error) {
      throw stateWriteError(error, `session ${session.id}: the append was not written, nothing of it kept`, this.host.dir, { sessionId: session.id }) ?? error;
    }
  }

  /** Writes the batch's lines (one write of all of them: all or none) through group commit. */
  submit(session: FileSessionJournal, batch: JournalBatch): void {
    const count = batch.entries.length;
    const parts: string[] = [];
    const lineBytes: number[] = [];
    const lead = session.headNeedsNewline ? 1 : 0;
    if (lead) parts.push("\n");
    const ikey = batch.idempotencyKey;
    for (let i = 0; i < count; i++) {
      const marks = i === 0 ? { ...(ikey !== undefined ? { ikey } : {}), ...(count > 1 ? { n: count } : {}) } : undefined;
      const line = encodeJournalLine(batch.entries[i]!, marks);
      parts.push(line);
      lineBytes.push(Buffer.byteLength(line));
    }
    session.headNeedsNewline = false;
    session.committer!.submit({ bytes: Buffer.from(parts.join("")), lead, lineBytes, batch });
  }

  private ensureWritable(session: FileSessionJournal): void {
    if (session.fd !== undefined) return;
    const { dir, fsync, io } = this.host;
    ensurePrivateDir(dir);
    const primary = journalPath(dir, session.id);
    if (session.legacy) this.migrateLegacy(session, primary);
    const existed = statOrNull(primary) !== null;
    this.host.makeRoomForJournal(session);
    const fd = fs.openSync(primary, fs.constants.O_WRONLY | fs.constants.O_APPEND | fs.constants.O_CREAT, 0o600);
    if (!existed && fsync !== "none") {
      // The new file's directory entry must be durable too, or an acknowledged first append can
      // vanish with its whole file after a power loss.
      try {
        fsyncDirectory(dir);
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
      fsync,
      ...(io ? { io } : {}),
      handlers: {
        durable: (items) => this.onDurable(session, items),
        failed: (error, items, attempted) => this.onWriteFailed(session, error, items, attempted),
      },
      beforeWrite: () => checkJournalEnd(fd, session.fileSize),
      afterWrite: (data) => checkOwnWrite(fd, primary, session.fileSize, data),
    });
  }

  /**
   * The seed's migration: the first append to a session that only has a legacy journal copies it
   * to the primary root (the legacy file stays, read-only). berth copies the whole entries only
   * (not a torn tail), via a temp file and a rename, so a crash leaves no half copy.
   */
  private migrateLegacy(session: FileSessionJournal, primary: string): void {
    const { dir } = this.host;
    if (statOrNull(primary) !== null) {
      // Someone (a seed process) migrated it meanwhile: the primary is the truth now.
      this.host.reload(session, true);
      if (!session.legacy) return;
    }
    const temp = path.join(dir, `.${session.id}.jsonl.${process.pid}.migrate`);
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
    fsyncDirectory(dir);
    this.host.logger?.info({ sessionId: session.id, from: session.path, to: primary }, "copied the legacy journal to the sessions directory");
    session.path = primary;
    session.legacy = false;
    session.fileSize = session.size;
    session.needsNewline = session.headNeedsNewline = session.size > 0 && lastByte(primary, session.size) !== 0x0a;
    session.mtimeMs = NaN;
  }

  private onDurable(session: FileSessionJournal, items: PendingAppend[]): void {
    let entriesAdded = 0;
    for (const item of items) {
      const { batch } = item;
      // The file's end, not `size`: an unterminated foreign tail we left in place sits before our bytes.
      let offset = session.fileSize + item.lead;
      session.fileSize += item.bytes.length;
      session.size = session.fileSize;
      for (let i = 0; i < batch.entries.length; i++) {
        session.index.note(batch.entries[i]!.seq, offset, i === 0);
        offset += item.lineBytes[i]!;
      }
      const firstSeq = batch.entries[0]!.seq;
      const lastSeq = batch.entries[batch.entries.length - 1]!.seq;
      const previous = session.snapshot;
      session.snapshot = batch.snapshots[batch.snapshots.length - 1]!;
      session.nextSeq = lastSeq + 1;
      session.needsNewline = false;
      if (batch.idempotencyKey !== undefined) {
        session.keys.set(batch.idempotencyKey, { firstSeq, lastSeq, ...(batch.digest !== undefined ? { digest: batch.digest } : {}) });
      }
      entriesAdded += batch.entries.length;
      batch.durable(previous);
    }
    session.mtimeMs = NaN;
    session.entriesSinceSnapshot += entriesAdded;
    session.lastAppendAt = this.host.monotonicNow();
    this.host.appended(session);
  }

  private onWriteFailed(session: FileSessionJournal, error: Error, items: PendingAppend[], attempted: number): void {
    const { logger, dir } = this.host;
    if (error instanceof ForeignAppendError) {
      // Another process (a seed process sharing the live directory) appended after these appends
      // took their seqs: kept, they would repeat its seqs. They are refused, retryably, with
      // nothing of them left to read (journal-guard.ts), and the next access reads the other
      // process's entries first.
      const left = error.outcome === "left";
      const fields = { sessionId: session.id, expectedBytes: error.expected, fileBytes: error.found, appends: items.length, outcome: error.outcome };
      if (left) {
        logger?.error(
          fields,
          "another process appended to the journal while a short write of ours was split; our lines could not be undone and stay in the journal",
        );
        // The journal holds lines of ours that no append returned: re-read it from disk.
        this.host.forget(session);
      } else {
        logger?.warn(fields, "another process appended to the journal while appends waited to be written; they were refused, nothing of them kept");
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
      rejectAppends(session, items, failure);
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
      logger?.error({ sessionId: session.id, err: truncateError }, "could not cut the journal back after a failed write");
    }
    session.mtimeMs = NaN;
    const refusal = (what: string, nothingKept: boolean) =>
      stateWriteError(error, `session ${session.id}: ${what}`, dir, { sessionId: session.id, ...(nothingKept ? {} : { outcome: "unknown" }) }) ??
      new BerthError(
        "unavailable",
        `could not write the journal of session ${session.id} (${error.message}); ${nothingKept ? "nothing of this append was kept — retry it" : what}`,
        { sessionId: session.id, ...(errnoCode(error) ? { errno: errnoCode(error) } : {}), ...(nothingKept ? {} : { outcome: "unknown" }) },
        { reason: "STATE_READ_ONLY", retryAfterMs: UNAVAILABLE_RETRY_AFTER_MS },
      );
    const failure = refusal("the append was not written, nothing of it kept", true);
    logger?.error({ sessionId: session.id, err: error, appends: items.length, cutBack }, "journal write failed; appends rejected and state rolled back");
    if (!cutBack && attempted > 0) {
      // Its bytes could not be cut back (the file system went read-only under the write): whether
      // they stay is not known, so the appends being written are not told "nothing kept". Their
      // idempotency keys find them if they stayed; the appends queued behind them never reached the file.
      const unknown = refusal(
        "the append may have been written, in whole (never in part), or not at all — its bytes could not be cut back; read the session, or retry with the same idempotency key, which answers with it if it was kept",
        false,
      );
      for (const item of items.slice(0, attempted)) item.batch.failed(unknown);
      items = items.slice(attempted);
    }
    if (!cutBack) {
      // The file's end is unknown now: forget the session; the next access re-opens it from disk,
      // where the torn-tail repair cuts an incomplete append back.
      this.host.forget(session);
    } else if (session.fileSize === 0 && !session.legacy) {
      // The failed append was the session's first: leave no empty journal behind (`has` would
      // report a session that never got an entry).
      this.host.forget(session);
      try {
        fs.rmSync(journalPath(dir, session.id), { force: true });
      } catch (removeError) {
        logger?.warn({ sessionId: session.id, err: removeError }, "could not remove the empty journal of a failed first append");
      }
    }
    rejectAppends(session, items, failure);
  }

  /** The session's last seq as its journal says now (0 when it has none, or it cannot be read). */
  private currentSeqOnDisk(id: SessionId): number {
    try {
      const session = this.host.open(id);
      return session === undefined ? 0 : session.nextSeq - 1;
    } catch {
      return 0;
    }
  }
}

/** Refuses `items`, none of which is on disk: the next batch starts from the durable end. */
function rejectAppends(session: FileSessionJournal, items: PendingAppend[], failure: BerthError): void {
  session.headNeedsNewline = session.needsNewline;
  for (const item of items) item.batch.failed(failure);
}

/** The byte at `size - 1` of `file`. */
export function lastByte(file: string, size: number): number | undefined {
  const fd = fs.openSync(file, "r");
  try {
    const buf = Buffer.alloc(1);
    return fs.readSync(fd, buf, 0, 1, size - 1) === 1 ? buf[0] : undefined;
  } finally {
    fs.closeSync(fd);
  }
}
