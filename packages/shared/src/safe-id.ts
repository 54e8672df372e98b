/**
 * Validation of names that become paths. Bad input is refused with a message naming the field and
 * the rule, never silently rewritten: two different ids must never map to the same file.
 */
import { invalidArgument } from "./errors.js";

/** The rule a session id must follow, as shown to people in error messages. */
export const SESSION_ID_RULE = "[A-Za-z0-9_-]{1,128}";

/** {@link SESSION_ID_RULE} as an anchored pattern: no separators, dots, NUL or empty ids can pass. */
export const SESSION_ID_PATTERN = /^[A-Za-z0-9_-]{1,128}$/;

/** The longest lock path berth accepts, in UTF-8 bytes (Linux's PATH_MAX). */
export const MAX_PATH_BYTES = 4096;

/** The longest name of one path component, in UTF-8 bytes (Linux's NAME_MAX): no file can have a longer one. */
export const MAX_NAME_BYTES = 255;

declare const checkedSessionId: unique symbol;

/**
 * A session id that passed {@link checkSessionId} (or {@link isSessionId}): code past the edge that
 * checked it takes this type and trusts it, instead of checking again.
 */
export type SessionId = string & { readonly [checkedSessionId]: true };

/** True when `id` is a usable session id. */
export function isSessionId(id: unknown): id is SessionId {
  return typeof id === "string" && SESSION_ID_PATTERN.test(id);
}

/** Returns `id` when it is a valid session id; throws `invalidArgument(field, …)` otherwise. */
export function checkSessionId(id: unknown, field = "session_id"): SessionId {
  if (typeof id !== "string" || id.length === 0) throw invalidArgument(field, `is required and must match ${SESSION_ID_RULE}`);
  if (!SESSION_ID_PATTERN.test(id)) {
    throw invalidArgument(field, `must match ${SESSION_ID_RULE} (letters, digits, '_' and '-', at most 128), got ${JSON.stringify(id.slice(0, 140))}`);
  }
  return id as SessionId;
}

/** The rule a request id (what makes a retried create safe) must follow, as shown in error messages. */
export const REQUEST_ID_RULE = "[A-Za-z0-9._-]{1,128}";

/** {@link REQUEST_ID_RULE} as an anchored pattern. */
const REQUEST_ID_PATTERN = /^[A-Za-z0-9._-]{1,128}$/;

/**
 * A request id as a request carries it: "" (no id) is undefined; anything else must follow
 * {@link REQUEST_ID_RULE} (a UUID does), or is refused with `invalidArgument(field, …)`.
 */
export function checkRequestId(id: unknown, field = "request_id"): string | undefined {
  if (id === undefined || id === "") return undefined;
  if (typeof id !== "string" || !REQUEST_ID_PATTERN.test(id)) {
    const shown = typeof id === "string" ? JSON.stringify(id.slice(0, 140)) : String(id);
    throw invalidArgument(field, `must match ${REQUEST_ID_RULE} (letters, digits, '.', '_' and '-', at most 128; a UUID is a good choice), got ${shown}`);
  }
  return id;
}

/**
 * Returns `input` when it can be used as a lock file path: non-empty, no NUL byte (the kernel would
 * cut the path there), at most {@link MAX_PATH_BYTES} bytes and {@link MAX_NAME_BYTES} per name
 * between slashes (a longer one names no file that can exist). Throws `invalidArgument(field, …)` otherwise.
 */
export function checkPathInput(input: unknown, field: string): string {
  if (typeof input !== "string" || input.length === 0) throw invalidArgument(field, "is required: give a file path");
  if (input.includes("\0")) throw invalidArgument(field, "must not contain a NUL byte");
  const bytes = Buffer.byteLength(input, "utf8");
  if (bytes > MAX_PATH_BYTES) throw invalidArgument(field, `must be at most ${MAX_PATH_BYTES} bytes, got ${bytes}`);
  for (const name of input.split("/")) {
    const nameBytes = Buffer.byteLength(name, "utf8");
    if (nameBytes > MAX_NAME_BYTES) {
      throw invalidArgument(
        field,
        `must have names of at most ${MAX_NAME_BYTES} bytes between slashes, got one of ${nameBytes} (${JSON.stringify(name.slice(0, 24))}…)`,
      );
    }
  }
  return input;
}
