/**
 * Validation of what a caller asks of the lock service. Every refusal is `invalid_argument` with a
 * message that names the field and the rule, so a client can fix its request without reading code.
 * Paths are checked and made canonical in lock-path.ts.
 */
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { DEFAULT_IDEMPOTENCY_WINDOW_MS } from "@berth/shared/idempotency";
import { formatDuration } from "@berth/shared/units";

/** Limits and defaults of lock requests; every field has a default (see {@link DEFAULT_LOCK_LIMITS}). */
export interface LockLimits {
  /** The lease length when a request names none. */
  defaultTtlMs: number;
  /** The longest lease a request may ask for: a crashed client's lock lives at most this long. */
  maxTtlMs: number;
  /** The longest a request may wait in the queue: what an unset wait means, and the cap of a longer one. */
  maxWaitMs: number;
  /** The longest owner label, in characters. */
  maxOwnerLength: number;
  /** How many requests may wait for one file; more are refused with resource_exhausted. */
  maxWaitersPerFile: number;
  /** How long a request id is remembered after what its call made ended (`--idempotency-window`). */
  idempotencyWindowMs: number;
}

/** Defaults: 30 s leases (renewed by KeepAlive), at most 1 h; waits of at most 10 min. */
export const DEFAULT_LOCK_LIMITS: Readonly<LockLimits> = Object.freeze({
  defaultTtlMs: 30_000,
  maxTtlMs: 3_600_000,
  maxWaitMs: 600_000,
  maxOwnerLength: 256,
  maxWaitersPerFile: 10_000,
  idempotencyWindowMs: DEFAULT_IDEMPOTENCY_WINDOW_MS,
});

/**
 * The retry delay a refusal that a later try can get past suggests (a wait that ran out, a full
 * queue, a file system that refused): soon enough for a try-once poller, not a spin.
 */
export const LOCK_RETRY_AFTER_MS = 1_000;

/** The refusal of a request that would queue behind `waiting` others when the file's queue holds at most `maxWaiters`. */
export function tooManyWaiters(file: string, waiting: number, maxWaiters: number): BerthError {
  return new BerthError(
    "resource_exhausted",
    `${waiting} requests already wait for ${file}, the most one file's queue holds; try again later`,
    { file, waiting, maxWaiters },
    { reason: "TOO_MANY_WAITERS", retryAfterMs: LOCK_RETRY_AFTER_MS },
  );
}

/** Checks the owner label (who holds the lock, shown to everyone who waits for it). */
export function checkOwner(owner: unknown, limits: LockLimits = DEFAULT_LOCK_LIMITS, field = "owner"): string {
  if (typeof owner !== "string" || owner.trim().length === 0) {
    throw invalidArgument(field, "is required: name who holds the lock (a tool, a user, a session)");
  }
  if (owner.includes("\0")) throw invalidArgument(field, "must not contain a NUL byte");
  if (owner.length > limits.maxOwnerLength) throw invalidArgument(field, `must be at most ${limits.maxOwnerLength} characters, got ${owner.length}`);
  return owner;
}

/**
 * A duration in ms, within `min` … `max`. A refusal quotes the limit and the value as durations
 * (`1h`, `2h`): a request gives them as protobuf Durations (`"7200s"` in JSON), never in ms.
 */
function checkMs(value: unknown, field: string, max: number, min: number, what?: string): number {
  if (typeof value !== "number" || !Number.isFinite(value)) throw invalidArgument(field, `must be a finite duration, got ${String(value)}`);
  if (value < min)
    throw invalidArgument(
      field,
      min === 0 ? `must not be negative, got ${formatDuration(value)}` : `must be at least ${formatDuration(min)}, got ${formatDuration(value)}`,
    );
  if (value > max)
    throw invalidArgument(field, `must be at most ${formatDuration(max)}${what === undefined ? "" : ` (${what})`}, got ${formatDuration(value)}`);
  return Math.round(value);
}

/** The lease length: `undefined` or 0 (an unset protobuf Duration) means the default; else 1 ms … `maxTtlMs`. */
export function checkTtl(ttlMs: unknown, limits: LockLimits = DEFAULT_LOCK_LIMITS, field = "ttl"): number {
  if (ttlMs === undefined || ttlMs === 0) return limits.defaultTtlMs;
  return checkMs(ttlMs, field, limits.maxTtlMs, 1, "the longest lease");
}

/**
 * How long to wait, as the budget's waits: `undefined` (unset) is the longest wait, 0 tries once, a
 * longer wait is capped to the longest (a caller asking for "as long as it takes" gets the most the
 * service gives, not a refusal); negative is refused.
 */
export function checkWait(waitMs: unknown, limits: LockLimits = DEFAULT_LOCK_LIMITS, field = "max_wait"): number {
  if (waitMs === undefined) return limits.maxWaitMs;
  return Math.min(checkMs(waitMs, field, Number.MAX_SAFE_INTEGER, 0), limits.maxWaitMs);
}

/** A fencing token as a client presents it: a positive safe integer. */
export function checkFencingToken(token: unknown, field = "fencing_token"): number {
  const value = typeof token === "bigint" ? Number(token) : token;
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 1) {
    throw invalidArgument(field, `must be a positive integer (a fencing token from Acquire), got ${String(token)}`);
  }
  return value;
}
