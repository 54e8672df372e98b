/** The refusals of the session store that name a session's state (its errors are BerthErrors). */
import { BerthError, UNAVAILABLE_RETRY_AFTER_MS } from "@berth/shared/errors";

export { UNAVAILABLE_RETRY_AFTER_MS } from "@berth/shared/errors";

/** What an append may expect of the session beside an exact seq. */
export type ExpectedState = "any" | "no_session" | "exists";

/** The refusal of a call naming a session that has no journal. */
export function sessionNotFound(sessionId: string): BerthError {
  return new BerthError(
    "not_found",
    `session ${sessionId} has no journal (nothing was ever appended to it, or it was deleted)`,
    { sessionId },
    { reason: "SESSION_NOT_FOUND" },
  );
}

/** The refusal of an append (or deletion) whose expectation of the session does not hold. */
export function seqConflict(sessionId: string, currentSeq: number, expectedSeq: number | undefined, expectedState: ExpectedState | undefined): BerthError {
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

/** What an idempotency key of a session can name. */
export type KeyedRequest = "append" | "deletion";

/** The refusal of an append or deletion whose idempotency key named another request. */
export function keyReused(
  sessionId: string,
  idempotencyKey: string,
  original: { firstSeq: number; lastSeq: number },
  named: KeyedRequest = "append",
): BerthError {
  const seqs = original.firstSeq === original.lastSeq ? `seq ${original.firstSeq}` : `seqs ${original.firstSeq}–${original.lastSeq}`;
  const what = named === "append" ? `a different append (${seqs})` : `the deletion of the session at seq ${original.lastSeq}`;
  return new BerthError(
    "already_exists",
    `session ${sessionId}: idempotency key ${JSON.stringify(idempotencyKey)} was used for ${what}; nothing was done — use a new key for a new request`,
    { sessionId, idempotencyKey, firstSeq: original.firstSeq, lastSeq: original.lastSeq, named },
    { reason: "IDEMPOTENCY_KEY_REUSED" },
  );
}

/**
 * The answer to a retried append whose first attempt was written to a session deleted since: it is
 * not written again, and the caller learns where it was.
 */
export function sessionDeletedUnder(
  sessionId: string,
  idempotencyKey: string,
  written: { firstSeq: number; lastSeq: number },
  deletion: { lastSeq: number },
): BerthError {
  const seqs = written.firstSeq === written.lastSeq ? `seq ${written.firstSeq}` : `seqs ${written.firstSeq}–${written.lastSeq}`;
  return new BerthError(
    "not_found",
    `session ${sessionId}: the append with idempotency key ${JSON.stringify(idempotencyKey)} was written (${seqs}) to the session deleted since at seq ${deletion.lastSeq}; it is not written again — a session created under this id continues from seq ${deletion.lastSeq + 1}`,
    { sessionId, idempotencyKey, firstSeq: written.firstSeq, lastSeq: written.lastSeq, deletedAtSeq: deletion.lastSeq },
    { reason: "SESSION_DELETED" },
  );
}

/**
 * The refusal of a read or watch from a seq that belonged to a session deleted since: the session
 * under this id now starts at `firstSeq`, and the entries before it are gone.
 */
export function seqsDeleted(sessionId: string, fromSeq: number, firstSeq: number): BerthError {
  return new BerthError(
    "not_found",
    `session ${sessionId}: seq ${fromSeq} belonged to a session deleted since; the session under this id now starts at seq ${firstSeq} — read or watch from there (or from 0) to follow it`,
    { sessionId, fromSeq, firstSeq, deletedAtSeq: firstSeq - 1 },
    { reason: "SESSION_DELETED" },
  );
}

/** Refuses a read or a watch from a seq of a session deleted since, whose seqs ran through `deletedThrough` (0: never deleted). */
export function refuseDeletedSeqs(sessionId: string, fromSeq: number, deletedThrough: number): void {
  if (fromSeq > 1 && fromSeq <= deletedThrough) throw seqsDeleted(sessionId, fromSeq, deletedThrough + 1);
}

/** The refusal of a call to a store that was closed. */
export function storeClosed(): BerthError {
  return new BerthError("unavailable", "the session store is closed", undefined, { reason: "SHUTTING_DOWN", retryAfterMs: UNAVAILABLE_RETRY_AFTER_MS });
}

/** What ends the watchers of a store that is closing. */
export function storeShuttingDown(): BerthError {
  return new BerthError("unavailable", "the session store is shutting down; watch again when it is back", undefined, {
    reason: "SHUTTING_DOWN",
    retryAfterMs: UNAVAILABLE_RETRY_AFTER_MS,
  });
}

/** WATCHER_LAGGED for a watcher of one session, for `why`: its client resumes after `lastSeq`, the last entry it got. */
export function sessionWatcherLagged(why: string, sessionId: string, lastSeq: number): BerthError {
  return new BerthError(
    "resource_exhausted",
    `${why} at seq ${lastSeq}; resume with from_seq=${lastSeq + 1}`,
    { sessionId, lastSeq },
    { reason: "WATCHER_LAGGED" },
  );
}

/** WATCHER_LAGGED for a watcher of every session, naming the revision to resume from (`lastRevision`). */
export function sessionsLagged(why: string, lastRevision: number): BerthError {
  return new BerthError("resource_exhausted", `${why}; resume with start_revision=${lastRevision}`, { lastRevision }, { reason: "WATCHER_LAGGED" });
}

/**
 * What ends a watcher of a session deleted at `lastSeq`: a later append starts a new session under
 * the id, which the watcher would otherwise take for more of the old one.
 */
export function watchedSessionDeleted(sessionId: string, lastSeq: number): BerthError {
  return new BerthError(
    "not_found",
    `session ${sessionId} was deleted (at seq ${lastSeq}); a session created again under this id continues from seq ${lastSeq + 1}`,
    { sessionId, lastSeq },
    { reason: "SESSION_DELETED" },
  );
}
