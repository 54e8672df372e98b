/** The refusals of the session store that name a session's state (its errors are BerthErrors). */
import { BerthError } from "@berth/shared/errors";

/** How soon a call refused because the store cannot write, or is stopping, is worth retrying. */
export const UNAVAILABLE_RETRY_AFTER_MS = 1000;

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
