/** The limits a session store enforces, and their defaults: one reckoning for every backend (what GetLimits reports). */
import { MAX_IDEMPOTENCY_KEY_LENGTH } from "./append-input.js";
import type { SessionStoreLimits } from "./session-store-api.js";
import { DEFAULT_IDEMPOTENCY_WINDOW_MS } from "@berth/shared/idempotency";
import { DEFAULT_MAX_BUFFERED } from "./watch-hub.js";

/** The largest event (its JSON, in bytes) accepted by default. */
export const DEFAULT_MAX_EVENT_BYTES = 1024 * 1024;
/** Events in one append accepted by default. */
export const DEFAULT_MAX_EVENTS_PER_APPEND = 10_000;

/** The limits a store is configured with; unset: the default. */
export interface SessionStoreLimitOptions {
  readonly maxEventBytes?: number | undefined;
  readonly maxEventsPerAppend?: number | undefined;
  /** Default buffer bound of a watcher. */
  readonly maxBuffered?: number | undefined;
  /** Completed sessions are deleted this long after their completing entry; unset: kept forever. */
  readonly completedRetentionMs?: number | undefined;
  /** How long a deleted session's idempotency keys keep answering. */
  readonly idempotencyWindowMs?: number | undefined;
}

/** The limits a store with `options` enforces. */
export function storeLimits(options: SessionStoreLimitOptions): Readonly<SessionStoreLimits> {
  return {
    maxEventBytes: options.maxEventBytes ?? DEFAULT_MAX_EVENT_BYTES,
    maxEventsPerAppend: options.maxEventsPerAppend ?? DEFAULT_MAX_EVENTS_PER_APPEND,
    maxBuffered: options.maxBuffered ?? DEFAULT_MAX_BUFFERED,
    maxIdempotencyKeyLength: MAX_IDEMPOTENCY_KEY_LENGTH,
    completedRetentionMs: options.completedRetentionMs,
    idempotencyWindowMs: options.idempotencyWindowMs ?? DEFAULT_IDEMPOTENCY_WINDOW_MS,
  };
}
