/** The checks of an append's input: its events, its idempotency key, a seq to read from. */
import { BerthError, invalidArgument } from "@berth/shared/errors";

/** The longest idempotency key, in characters. */
export const MAX_IDEMPOTENCY_KEY_LENGTH = 128;

/** An event ready to be sequenced: its type, and the event as the journal will hold it. */
export interface PreparedEvent {
  readonly type: string;
  readonly event: Record<string, unknown>;
}

/**
 * Checks `events` for an append to `sessionId` (objects with a string type, the session's id or
 * none, JSON, within the limits) and returns them as the journal will hold them.
 */
export function prepareEvents(sessionId: string, events: readonly unknown[], limits: { maxEventBytes: number; maxEventsPerAppend: number }): PreparedEvent[] {
  const { maxEventBytes, maxEventsPerAppend } = limits;
  if (!Array.isArray(events) || events.length === 0) throw invalidArgument("events", "must hold at least one event");
  if (events.length > maxEventsPerAppend) {
    throw new BerthError(
      "invalid_argument",
      `events: ${events.length} events in one append, over the limit of ${maxEventsPerAppend}; split the append`,
      { field: "events", rule: `at most ${maxEventsPerAppend} events (max_events_per_append)`, limit: maxEventsPerAppend, count: events.length },
      { reason: "TOO_MANY_EVENTS" },
    );
  }
  return events.map((raw, i) => {
    const field = `events[${i}]`;
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) throw invalidArgument(field, "must be an object with a string type");
    const event = raw as Record<string, unknown>;
    if (typeof event.type !== "string" || event.type.length === 0) throw invalidArgument(`${field}.type`, "must be a non-empty string");
    // The seed takes the session from `event.id || fallback`; here the session is named by the
    // call, and an event naming another one is refused rather than silently moved.
    if (event.id !== undefined && event.id !== null && event.id !== "" && event.id !== sessionId) {
      throw invalidArgument(`${field}.id`, `must be omitted or equal the session id ${JSON.stringify(sessionId)}`);
    }
    let json: string;
    try {
      json = JSON.stringify({ ...event, id: sessionId });
    } catch (error) {
      throw invalidArgument(field, `must be JSON-serialisable (${(error as Error).message})`);
    }
    const bytes = Buffer.byteLength(json);
    if (bytes > maxEventBytes) {
      throw new BerthError(
        "invalid_argument",
        `${field}: is ${bytes} bytes, over the limit of ${maxEventBytes} bytes per event (max_event_bytes)`,
        { field, rule: `at most ${maxEventBytes} bytes (max_event_bytes)`, limit: maxEventBytes, size: bytes },
        { reason: "EVENT_TOO_LARGE" },
      );
    }
    // The event as the journal will hold it (undefined fields gone, NaN as null…): the state
    // built now must be the state a replay of the file builds later.
    return { type: event.type, event: JSON.parse(json) as Record<string, unknown> };
  });
}

/** The idempotency key, undefined for none ("" is none). */
export function checkIdempotencyKey(key: unknown): string | undefined {
  if (key === undefined || key === "") return undefined;
  if (typeof key !== "string" || key.length > MAX_IDEMPOTENCY_KEY_LENGTH) {
    throw invalidArgument("idempotency_key", `must be a string of at most ${MAX_IDEMPOTENCY_KEY_LENGTH} characters`);
  }
  return key;
}

export function checkFromSeq(fromSeq: number): void {
  if (!Number.isInteger(fromSeq) || fromSeq < 0) throw invalidArgument("from_seq", "must be a whole number ≥ 0");
}

/** A read's page size: 0 reads to the end. */
export function checkReadLimit(limit: number): void {
  if (!Number.isInteger(limit) || limit < 0) throw invalidArgument("limit", "must be a whole number ≥ 0 (0: no limit)");
}
