/**
 * The rules of an append every session store keeps, whichever backend holds its journals: what
 * its input must be (append-input.ts), the digest its idempotency key is kept with
 * (event-digest.ts), and the expectation of the session (`expected_seq`, `expected_state`) it is
 * written under. The file store (append-pipeline.ts) and the etcd store (etcd/) both call these,
 * so that one request is refused, or taken, alike on either.
 */
import { invalidArgument } from "@berth/shared/errors";
import { checkSessionId, type SessionId } from "@berth/shared/safe-id";
import { checkIdempotencyKey, prepareEvents, type PreparedEvent } from "./append-input.js";
import { eventsDigest } from "./event-digest.js";
import { seqConflict, type ExpectedState } from "./session-refusals.js";
import type { AppendOptions } from "./session-store-api.js";

/** What a store allows one append. */
export interface AppendLimits {
  readonly maxEventBytes: number;
  readonly maxEventsPerAppend: number;
}

/** What an append expects of the session it writes to; neither: anything. */
export interface SessionExpectation {
  /** The session's last seq (0: no entry yet). */
  readonly expectedSeq?: number | undefined;
  readonly expectedState?: ExpectedState | undefined;
}

/** An append's input once checked. */
export interface CheckedAppend {
  /** The session id, checked: what the journal seam takes. */
  readonly sessionId: SessionId;
  /** The events as the journal will hold them. */
  readonly events: PreparedEvent[];
  /** The idempotency key; undefined for none ("" is none). */
  readonly idempotencyKey: string | undefined;
  /** The digest of `events` a key is kept with (to tell a retry from a reuse); undefined without a key. */
  readonly digest: string | undefined;
}

/**
 * Checks an append's input (the session id, its events within `limits`, its idempotency key and
 * expected seq) before anything is sequenced or written; throws invalid_argument on the first
 * rule broken.
 */
export function checkAppend(sessionId: string, events: readonly unknown[], options: AppendOptions, limits: AppendLimits): CheckedAppend {
  const checkedId = checkSessionId(sessionId);
  const prepared = prepareEvents(checkedId, events, limits);
  const idempotencyKey = checkIdempotencyKey(options.idempotencyKey);
  const digest = idempotencyKey === undefined ? undefined : eventsDigest(prepared.map((p) => p.event));
  checkExpectedSeq(options.expectedSeq);
  return { sessionId: checkedId, events: prepared, idempotencyKey, digest };
}

function checkExpectedSeq(expectedSeq: number | undefined): void {
  if (expectedSeq !== undefined && (!Number.isInteger(expectedSeq) || expectedSeq < 0)) {
    throw invalidArgument("expected_seq", "must be a whole number ≥ 0 (the last seq you saw; 0 for a new session)");
  }
}

/** True when a session whose last seq is `currentSeq` (0: no entry) meets `expectation`; an exact seq outranks a state. */
export function expectationHolds(currentSeq: number, expectation: SessionExpectation): boolean {
  if (expectation.expectedSeq !== undefined) return expectation.expectedSeq === currentSeq;
  if (expectation.expectedState === "no_session") return currentSeq === 0;
  if (expectation.expectedState === "exists") return currentSeq > 0;
  return true;
}

/** Refuses (aborted SEQ_CONFLICT) a write to a session whose last seq `currentSeq` does not meet `expectation`. */
export function checkExpectation(sessionId: string, currentSeq: number, expectation: SessionExpectation): void {
  if (!expectationHolds(currentSeq, expectation)) throw seqConflict(sessionId, currentSeq, expectation.expectedSeq, expectation.expectedState);
}
