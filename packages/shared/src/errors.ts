/**
 * The errors domain code throws. They carry a gRPC-like code by name but know nothing of Connect:
 * the server layer maps them to `ConnectError` in one place (see `server/connect-errors.ts`).
 */

/** The status a domain error should reach the client with. Mirrors the gRPC codes berth uses. */
export type BerthCode =
  | "invalid_argument"
  | "not_found"
  | "already_exists"
  | "failed_precondition"
  | "aborted"
  | "resource_exhausted"
  | "unavailable"
  | "unauthenticated"
  | "deadline_exceeded"
  | "cancelled"
  | "internal";

/** A refusal a person can act on: `message` says what happened and what to change. */
export class BerthError extends Error {
  override name = "BerthError";
  constructor(
    readonly code: BerthCode,
    message: string,
    /** The facts a client needs to react (current seq, lock holder, refusing gate…). */
    readonly details?: Record<string, unknown>,
  ) {
    super(message);
  }
}

/** True for errors thrown on purpose by berth's domain code. */
export function isBerthError(error: unknown): error is BerthError {
  return error instanceof BerthError;
}

/** An input that breaks a rule: the message names the field and the rule, e.g. `session_id: must match [A-Za-z0-9_-]{1,128}`. */
export function invalidArgument(field: string, rule: string): BerthError {
  return new BerthError("invalid_argument", `${field}: ${rule}`, { field, rule });
}
