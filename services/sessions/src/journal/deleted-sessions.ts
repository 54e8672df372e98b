/**
 * The tombstones of deleted sessions on files: `<dir>/.deleted/<id>.json`, one per session id
 * ever deleted, beside the journals but out of the seed's sight (it lists `<dir>/*.jsonl` only).
 * Each holds the last seq the id reached before its last deletion, kept for good, and the
 * deletions not pruned yet with the keys of their sessions' appends (see session-tombstones.ts
 * for what they answer).
 *
 * A tombstone is written atomically (temp file, fsync, rename, directory fsync) before the journal
 * it stands for is removed: a crash in between leaves the session whole, and its tombstone naming
 * a deletion that did not happen yet; the seqs of that deletion are still the journal's own, so
 * nothing a client is told disagrees with the journal. A tombstone read back is checked entry by
 * entry; one that does not parse is set aside (renamed `.damaged`) and the id treated as never
 * deleted, with a warning: seqs may then restart where the journal's own say.
 *
 * Loaded tombstones are kept in memory (they are small and consulted on every keyed append to a
 * session with no journal key), as is when each one's oldest kept deletion was made, so that a
 * prune reads only the files that fall due.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { ensurePrivateDir, writeFileAtomicSync } from "@berth/shared/files";
import type { Logger } from "@berth/shared/logger";
import { isSessionId, type SessionId } from "@berth/shared/safe-id";
import { errnoCode, stateWriteError } from "@berth/shared/state-errors";
import type { Burial, BuriedDeletion, KeyRecord, Tombstone } from "./journal-store.js";

/** The directory of tombstones inside a session directory. */
export const DELETED_DIR = ".deleted";
const SUFFIX = ".json";

export class DeletedSessions {
  readonly dir: string;
  /** Tombstones read or written, by id; null: the id has none. */
  private readonly loaded = new Map<SessionId, Tombstone | null>();
  /** When each tombstone's oldest kept deletion was made, once the directory has been read whole. */
  private due: Map<SessionId, number> | undefined;

  constructor(
    sessionDir: string,
    private readonly logger: Logger | undefined,
  ) {
    this.dir = path.join(sessionDir, DELETED_DIR);
  }

  /** The session's tombstone; undefined when it was never deleted. */
  get(sessionId: SessionId): Tombstone | undefined {
    const cached = this.loaded.get(sessionId);
    if (cached !== undefined) return cached ?? undefined;
    const read = this.read(sessionId);
    this.loaded.set(sessionId, read ?? null);
    return read;
  }

  /**
   * Adds `burial` to the session's tombstone, durably. Throws the refusal of a state directory that
   * cannot be written (nothing is then deleted).
   */
  bury(sessionId: SessionId, burial: Burial): void {
    const before = this.get(sessionId);
    const deletion: BuriedDeletion = { ...burial.deletion, keys: burial.keys };
    const after: Tombstone = { lastSeq: Math.max(before?.lastSeq ?? 0, burial.deletion.lastSeq), deletions: [...(before?.deletions ?? []), deletion] };
    this.write(sessionId, after);
    this.due?.set(sessionId, after.deletions[0]!.deletedAt);
  }

  /**
   * Forgets the deletions made before `before`, keeping each tombstone's last seq; returns when the
   * oldest deletion kept was made (Infinity: none). Reads the directory once, then only the
   * tombstones that fall due.
   */
  prune(before: number): number {
    const due = this.dueIndex();
    let oldest = Infinity;
    for (const [sessionId, deletedAt] of due) {
      if (deletedAt >= before) {
        oldest = Math.min(oldest, deletedAt);
        continue;
      }
      const tombstone = this.get(sessionId);
      if (tombstone === undefined) {
        due.delete(sessionId);
        continue;
      }
      const kept = tombstone.deletions.filter((d) => d.deletedAt >= before);
      try {
        this.write(sessionId, { lastSeq: tombstone.lastSeq, deletions: kept });
      } catch (error) {
        // Kept a little longer is no harm: the next prune tries again.
        this.logger?.warn({ sessionId, err: error }, "could not prune a deleted session's tombstone");
        oldest = Math.min(oldest, deletedAt);
        continue;
      }
      const next = kept[0]?.deletedAt;
      if (next === undefined) due.delete(sessionId);
      else {
        due.set(sessionId, next);
        oldest = Math.min(oldest, next);
      }
    }
    return oldest;
  }

  /** When each tombstone's oldest kept deletion was made: the directory read once, then kept up to date. */
  private dueIndex(): Map<SessionId, number> {
    if (this.due !== undefined) return this.due;
    const due = new Map<SessionId, number>();
    let names: string[] = [];
    try {
      names = fs.readdirSync(this.dir);
    } catch (error) {
      if (errnoCode(error) !== "ENOENT") throw error;
    }
    for (const name of names) {
      if (!name.endsWith(SUFFIX)) continue;
      const sessionId = name.slice(0, -SUFFIX.length);
      if (!isSessionId(sessionId)) continue;
      const oldest = this.get(sessionId)?.deletions[0]?.deletedAt;
      if (oldest !== undefined) due.set(sessionId, oldest);
    }
    this.due = due;
    return due;
  }

  private pathOf(sessionId: SessionId): string {
    return path.join(this.dir, sessionId + SUFFIX);
  }

  private read(sessionId: SessionId): Tombstone | undefined {
    const file = this.pathOf(sessionId);
    let text: string;
    try {
      text = fs.readFileSync(file, "utf8");
    } catch (error) {
      if (errnoCode(error) === "ENOENT") return undefined;
      throw error;
    }
    const tombstone = decodeTombstone(text);
    if (tombstone !== undefined) return tombstone;
    this.logger?.warn({ sessionId, file }, "a deleted session's tombstone does not parse: set aside; the session's seqs may restart where its journal says");
    try {
      fs.renameSync(file, `${file}.damaged`);
    } catch (error) {
      this.logger?.warn({ sessionId, err: error }, "could not set a damaged tombstone aside");
    }
    return undefined;
  }

  private write(sessionId: SessionId, tombstone: Tombstone): void {
    try {
      ensurePrivateDir(this.dir);
      writeFileAtomicSync(this.pathOf(sessionId), encodeTombstone(tombstone));
    } catch (error) {
      throw (
        stateWriteError(error, `could not delete session ${sessionId}: its tombstone was not written; the session still exists`, this.dir, { sessionId }) ??
        error
      );
    }
    this.loaded.set(sessionId, tombstone);
  }
}

function encodeTombstone(tombstone: Tombstone): string {
  return `${JSON.stringify({
    lastSeq: tombstone.lastSeq,
    deletions: tombstone.deletions.map((d) => ({ ...d, keys: Object.fromEntries(d.keys) })),
  })}\n`;
}

const isSeq = (value: unknown): value is number => typeof value === "number" && Number.isSafeInteger(value) && value >= 0;

/** A tombstone file's contents, checked; undefined when anything is not what {@link encodeTombstone} writes. */
export function decodeTombstone(text: string): Tombstone | undefined {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (typeof raw !== "object" || raw === null) return undefined;
  const { lastSeq, deletions } = raw as { lastSeq?: unknown; deletions?: unknown };
  if (!isSeq(lastSeq) || !Array.isArray(deletions)) return undefined;
  const decoded: BuriedDeletion[] = [];
  for (const d of deletions as unknown[]) {
    if (typeof d !== "object" || d === null) return undefined;
    const { firstSeq, lastSeq: last, deletedAt, idempotencyKey, expectedSeq, keys } = d as Record<string, unknown>;
    if (!isSeq(firstSeq) || !isSeq(last) || typeof deletedAt !== "number" || !Number.isFinite(deletedAt)) return undefined;
    if (idempotencyKey !== undefined && typeof idempotencyKey !== "string") return undefined;
    if (expectedSeq !== undefined && !isSeq(expectedSeq)) return undefined;
    if (typeof keys !== "object" || keys === null) return undefined;
    const records = new Map<string, KeyRecord>();
    for (const [key, record] of Object.entries(keys)) {
      const { firstSeq: f, lastSeq: l, digest } = (record ?? {}) as Record<string, unknown>;
      if (!isSeq(f) || !isSeq(l) || (digest !== undefined && typeof digest !== "string")) return undefined;
      records.set(key, { firstSeq: f, lastSeq: l, ...(digest !== undefined ? { digest } : {}) });
    }
    decoded.push({
      firstSeq,
      lastSeq: last,
      deletedAt,
      ...(idempotencyKey !== undefined ? { idempotencyKey } : {}),
      ...(expectedSeq !== undefined ? { expectedSeq } : {}),
      keys: records,
    });
  }
  return { lastSeq, deletions: decoded };
}
