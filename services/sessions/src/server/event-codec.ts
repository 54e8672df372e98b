/**
 * The sessions service's side of the event codec. The codec itself (typed `Event` ↔ the seed's
 * journal event) is `@berth/wire/journal-events`, which the client uses too, so a client's journal events
 * are exactly the journal's; here its refusals become INVALID_ARGUMENT naming the field, and journal
 * entries as the journal reader hands them over become `JournalEntry` messages.
 */
import type { Event } from "@berth/api/berth/sessions/v1/events_pb";
import { EntryIntegrity, JournalEntrySchema, type JournalEntry } from "@berth/api/berth/sessions/v1/session_service_pb";
import { eventToJournal as encodeEvent, InvalidEventError, journalToEvent } from "@berth/wire/journal-events";
import { invalidArgument } from "@berth/shared/errors";
import { IDEMPOTENCY_KEY_FIELD } from "../journal/journal-format.js";
import { isoToTimestamp } from "./timestamps.js";

/**
 * The journal event for a typed event (see the client's `eventToJournal`); an event that breaks a
 * rule of events.proto is `invalid_argument` naming the field (`field` is the event's path in the
 * request: `event`, or `events[2]` in a batch).
 */
export function eventToJournal(event: Event, field = "event"): Record<string, unknown> {
  try {
    return encodeEvent(event, field);
  } catch (error) {
    if (error instanceof InvalidEventError) throw invalidArgument(error.field, error.rule);
    throw error;
  }
}

// --- journal entries -------------------------------------------------------------------------

/** What the journal reader could verify about an entry's line (`EntryIntegrity`, by name). */
export type EntryIntegrityName = "verified" | "unchecked" | "mismatch";

/** Facts about a journal entry that are not in the seed's `{seq, id, type, ts, event}`. */
export interface JournalEntryFacts {
  /**
   * The checksum verdict of the entry's line: `verified` (berth's checksum matches), `unchecked`
   * (no checksum: a line the seed's library wrote), `mismatch` (damaged). Unset: UNSPECIFIED.
   */
  integrity?: EntryIntegrityName;
  /** The idempotency key the entry was appended with; defaults to the line's `ikey` field. */
  idempotencyKey?: string;
}

const INTEGRITY: Record<EntryIntegrityName, EntryIntegrity> = {
  verified: EntryIntegrity.VERIFIED,
  unchecked: EntryIntegrity.UNCHECKED,
  mismatch: EntryIntegrity.MISMATCH,
};

/**
 * The `JournalEntry` message for a journal entry `{seq, id, type, ts, event, …}` as the journal
 * reader hands it over. The event is decoded by {@link journalToEvent}, so it reproduces the
 * line's event exactly. An entry without an `event` object is what the seed's reducer applies
 * then (`entry.event || entry`): the entry itself, its `seq` and `ts` landing in `extra`. A `seq`
 * that is not a non-negative safe integer is 0, a `ts` that does not parse is unset; `type` is
 * the entry's, or the event's when the entry has no string `type`.
 */
export function journalEntryToProto(entry: Record<string, unknown>, facts: JournalEntryFacts = {}): JournalEntry {
  const raw = entry.event;
  const eventJson = raw !== null && typeof raw === "object" && !Array.isArray(raw) ? (raw as Record<string, unknown>) : entry;
  const event = journalToEvent(eventJson);
  const seq = entry.seq;
  const ikey = facts.idempotencyKey ?? entry[IDEMPOTENCY_KEY_FIELD];
  const type = typeof entry.type === "string" ? entry.type : typeof eventJson.type === "string" ? eventJson.type : "";
  const message: JournalEntry = {
    $typeName: JournalEntrySchema.typeName,
    seq: typeof seq === "number" && Number.isSafeInteger(seq) && seq >= 0 ? BigInt(seq) : 0n,
    sessionId: typeof entry.id === "string" ? entry.id : "",
    type,
    event,
    idempotencyKey: typeof ikey === "string" ? ikey : "",
    integrity: facts.integrity ? INTEGRITY[facts.integrity] : EntryIntegrity.UNSPECIFIED,
  };
  const ts = isoToTimestamp(entry.ts);
  if (ts !== undefined) message.appendTime = ts;
  return message;
}
