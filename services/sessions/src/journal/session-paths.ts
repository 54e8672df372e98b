/**
 * Where a session's files live. berth keeps the seed's layout so that a journal can be read by
 * either side: `<dir>/<id>.jsonl` (the journal, the truth) and `<dir>/<id>.snapshot.json` (a cache
 * of the derived state, valid while the journal has the length it records). Paths are built from a {@link SessionId}
 * only: an id checked where it entered (the store's entry, or a directory entry read back), so it
 * never reaches the filesystem unchecked and is not checked again here.
 */
import * as path from "node:path";
import { isSessionId, type SessionId } from "@berth/shared/safe-id";

/** The journal file's suffix; a directory entry with it names a session. */
export const JOURNAL_SUFFIX = ".jsonl";
/** The snapshot file's suffix. */
export const SNAPSHOT_SUFFIX = ".snapshot.json";

/** `<dir>/<id>.jsonl`. */
export function journalPath(dir: string, sessionId: SessionId): string {
  return path.join(dir, sessionId + JOURNAL_SUFFIX);
}

/** `<dir>/<id>.snapshot.json`. */
export function snapshotPath(dir: string, sessionId: SessionId): string {
  return path.join(dir, sessionId + SNAPSHOT_SUFFIX);
}

/** The directories a session store reads: the primary (written) and, optionally, a read-only legacy root. */
export interface SessionDirs {
  /** Journals and snapshot files berth writes. */
  dir: string;
  /** The seed's older root: read when the primary has no journal, copied to the primary on first append. */
  legacyDir?: string;
}

/**
 * The session directories for a state directory or a project's live directory.
 *
 * - `{ stateDir }` → `<stateDir>/sessions` (berth's own state, no legacy root);
 * - `{ liveDir }` (a project's `<project>/.impeccable/live`) → `<live>/sessions`, with the seed's
 *   legacy root `<project>/.impeccable-live/sessions`, so berth serves that project's journals in
 *   place beside processes still using the seed's store.
 *
 * `liveDir` wins when both are given.
 */
export function resolveSessionDirs(options: { stateDir?: string; liveDir?: string }): SessionDirs {
  if (options.liveDir !== undefined) {
    const live = path.resolve(options.liveDir);
    // The live directory is `<project>/.impeccable/live`: the project is two levels up.
    const project = path.dirname(path.dirname(live));
    return { dir: path.join(live, "sessions"), legacyDir: path.join(project, ".impeccable-live", "sessions") };
  }
  return { dir: path.join(path.resolve(options.stateDir ?? ".berth"), "sessions") };
}

/** The session id a directory entry names, or undefined when it is not a journal with a valid id. */
export function sessionIdFromFileName(name: string): SessionId | undefined {
  if (!name.endsWith(JOURNAL_SUFFIX)) return undefined;
  const id = name.slice(0, -JOURNAL_SUFFIX.length);
  return isSessionId(id) ? id : undefined;
}
