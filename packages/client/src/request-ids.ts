/**
 * Request ids: what makes a retried call safe. berth's calls that create or change something take a
 * `request_id`; the service answers a repeat with the same id and the same request the first call's
 * answer, and never does it twice (the rule is in each service's proto). This package gives every
 * such call an id (the caller's, or a new UUID) and, when the call fails on the way (the connection
 * broke, the service was unreachable for a moment), makes it again with the same id: a call whose
 * answer was lost is answered, not done a second time.
 */
import { Code } from "@connectrpc/connect";
import { BerthClientError } from "./errors.js";
import { delay } from "./options.js";

/** How many times a keyed call is made at most (the first and its retries). */
export const KEYED_CALL_ATTEMPTS = 5;
/** The first retry's delay; each next one doubles, up to {@link KEYED_RETRY_MAX_DELAY_MS}. */
const KEYED_RETRY_FIRST_DELAY_MS = 100;
const KEYED_RETRY_MAX_DELAY_MS = 2_000;

/** A new request id: a random UUID. */
export function newRequestId(): string {
  // A page served over plain HTTP from another host than loopback is no secure context: its
  // crypto has getRandomValues but not randomUUID.
  return typeof globalThis.crypto.randomUUID === "function" ? globalThis.crypto.randomUUID() : uuidFromRandomBytes();
}

/** A version 4 UUID from crypto.getRandomValues. */
export function uuidFromRandomBytes(): string {
  const bytes = globalThis.crypto.getRandomValues(new Uint8Array(16));
  bytes[6] = (bytes[6]! & 0x0f) | 0x40;
  bytes[8] = (bytes[8]! & 0x3f) | 0x80;
  const hex = Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/**
 * Whether `error` is a failure on the way rather than an answer: berth answers with an ErrorInfo
 * (a refusal is final, whatever its code), except UNAVAILABLE, which asks to retry; a failure with
 * no ErrorInfo (a connection reset, a stream cut, nothing listening) came from the way. The
 * caller's own cancel and deadline are never retried.
 */
export function failedOnTheWay(error: unknown, signal?: AbortSignal): boolean {
  if (signal?.aborted) return false;
  const failure = BerthClientError.from(error);
  if (failure.code === Code.DeadlineExceeded) return false;
  if (failure.code === Code.Unavailable) return true;
  return failure.errorInfo === undefined;
}

/**
 * Whether `error` says nothing listens at the service's address any more (ECONNREFUSED): its process
 * is gone, and what it held in memory with it.
 */
export function connectionRefused(error: unknown): boolean {
  for (let cause: unknown = error, depth = 0; cause instanceof Error && depth < 8; cause = cause.cause, depth++) {
    if ((cause as NodeJS.ErrnoException).code === "ECONNREFUSED") return true;
  }
  return false;
}

/**
 * Makes `call` with `requestId` (a new one when unset), and again with the same id, after a growing
 * delay (or the one the service asks), while it fails on the way, {@link KEYED_CALL_ATTEMPTS} times
 * at most. The last failure is thrown as a BerthClientError.
 */
export async function callWithRequestId<T>(
  call: (requestId: string) => Promise<T>,
  options: { readonly requestId?: string | undefined; readonly signal?: AbortSignal | undefined } = {},
): Promise<T> {
  const requestId = options.requestId ?? newRequestId();
  for (let attempt = 1; ; attempt++) {
    try {
      return await call(requestId);
    } catch (error) {
      if (attempt >= KEYED_CALL_ATTEMPTS || !failedOnTheWay(error, options.signal)) throw BerthClientError.from(error);
      const asked = error instanceof BerthClientError ? error.retryAfterMs : undefined;
      const backoff = Math.min(KEYED_RETRY_MAX_DELAY_MS, KEYED_RETRY_FIRST_DELAY_MS * 2 ** (attempt - 1));
      await delay(asked ?? backoff, options.signal).catch((aborted: unknown) => {
        throw BerthClientError.from(aborted);
      });
    }
  }
}
