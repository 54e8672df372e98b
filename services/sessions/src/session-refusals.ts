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

/** The refusal of an append whose idempotency key named another request. */
export function keyReused(sessionId: string, idempotencyKey: string, original: { firstSeq: number; lastSeq: number }): BerthError {
  const seqs = original.firstSeq === original.lastSeq ? `seq ${original.firstSeq}` : `seqs ${original.firstSeq}–${original.lastSeq}`;
  return new BerthError(
    "already_exists",
    `session ${sessionId}: idempotency key ${JSON.stringify(idempotencyKey)} was used for a different append (${seqs}); nothing was written — use a new key for a new request`,
    { sessionId, idempotencyKey, firstSeq: original.firstSeq, lastSeq: original.lastSeq },
    { reason: "IDEMPOTENCY_KEY_REUSED" },
  );
}
