/**
 * The errors domain code throws. They carry a gRPC-like code by name but know nothing of Connect:
 * the server layer maps them to `ConnectError` in one place (see `server/connect-errors.ts`).
 */

import { ANY_CALL_REASONS, type BerthReason } from "@berth/wire/reasons";

/** The status a domain error should reach the client with. Mirrors the gRPC codes berth uses. */
export type BerthCode =
  | "invalid_argument"
  | "not_found"
  | "already_exists"
  | "failed_precondition"
  | "aborted"
  | "out_of_range"
  | "resource_exhausted"
  | "unavailable"
  | "unauthenticated"
  | "deadline_exceeded"
  | "unimplemented"
  | "cancelled"
  | "internal";

/** What a client may do about an error beside reading its message. */
export interface BerthErrorOptions {
  /**
   * The case, in UPPER_SNAKE_CASE, unique within the service (`SEQ_CONFLICT`, `WAIT_EXHAUSTED`):
   * what a program branches on, sent as `google.rpc.ErrorInfo.reason`. Unset: the code's default
   * reason (see {@link defaultReason}).
   */
  readonly reason?: BerthReason;
  /** When retrying the same call later can succeed: how long to wait first (`google.rpc.RetryInfo`). */
  readonly retryAfterMs?: number;
}

/** The delay a client should wait before retrying a call the service was too busy or too closed to take. */
export const UNAVAILABLE_RETRY_AFTER_MS = 1000;

/** A refusal a person can act on: `message` says what happened and what to change. */
export class BerthError extends Error {
  override name = "BerthError";
  constructor(
    readonly code: BerthCode,
    message: string,
    /** The facts a client needs to react (current seq, lock holder, refusing gate…). */
    readonly details?: Record<string, unknown>,
    readonly options: BerthErrorOptions = {},
  ) {
    super(message);
  }

  /** The case a program branches on (`ErrorInfo.reason`). */
  get reason(): BerthReason | CodeReason {
    return this.options.reason ?? defaultReason(this.code);
  }
}

/**
 * The reason an error carries when its thrower named none: one per code, for the generic cases
 * (a bad field, a cancelled call, a shutdown). Errors with a more specific meaning name their own.
 */
export function defaultReason(code: BerthCode): BerthReason | CodeReason {
  switch (code) {
    case "invalid_argument":
      return ANY_CALL_REASONS.INVALID_FIELD;
    case "unavailable":
      return ANY_CALL_REASONS.SHUTTING_DOWN;
    case "cancelled":
      return ANY_CALL_REASONS.CANCELLED;
    default:
      return code.toUpperCase() as CodeReason;
  }
}

/** The reason of an error whose thrower named none and whose code has no case of its own: the code's name. */
export type CodeReason = Uppercase<BerthCode>;

/** True for errors thrown on purpose by berth's domain code. */
export function isBerthError(error: unknown): error is BerthError {
  return error instanceof BerthError;
}

/** An input that breaks a rule: the message names the field and the rule, e.g. `session_id: must match [A-Za-z0-9_-]{1,128}`. */
export function invalidArgument(field: string, rule: string): BerthError {
  return new BerthError("invalid_argument", `${field}: ${rule}`, { field, rule });
}
