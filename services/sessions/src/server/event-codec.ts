/**
 * The sessions service's side of the event codec. The codec itself (typed `Event` ↔ the seed's
 * journal event) is the client's (`@berth/client/journal-events`), so a client's journal events are
 * exactly the journal's; here its refusals become INVALID_ARGUMENT naming the field, and journal
 * entries as the journal reader hands them over become `JournalEntry` messages.
 */
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import type { Event } from "@berth/api/berth/sessions/v1/events_pb";
import { EntryIntegrity, type JournalEntry } from "@berth/api/berth/sessions/v1/session_service_pb";
import { eventToJournal as encodeEvent, InvalidEventError, journalToEvent } from "@berth/client/journal-events";
import { invalidArgument } from "@berth/shared/errors";
import { IDEMPOTENCY_KEY_FIELD } from "../journal-format.js";

export {
  fromProtoListValue,
  fromProtoValue,
  isTypedEventType,
  journalToEvent,
  MAX_OTHER_TYPE_LENGTH,
  setOwn,
  toProtoListValue,
  toProtoValue,
  TYPED_EVENT_TYPES,
} from "@berth/client/journal-events";

const JOURNAL_ENTRY_TYPE = "berth.sessions.v1.JournalEntry";
const TIMESTAMP_TYPE = "google.protobuf.Timestamp";

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
    $typeName: JOURNAL_ENTRY_TYPE,
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

// The earliest and latest instants a Timestamp can hold (0001-01-01T00:00:00Z and
// 9999-12-31T23:59:59.999Z); outside them protobuf's JSON form is undefined.
const MIN_TIMESTAMP_MS = -62_135_596_800_000;
const MAX_TIMESTAMP_MS = 253_402_300_799_999;

/**
 * The Timestamp for an ISO 8601 time (as the journal's `ts` and the snapshot's `updatedAt` hold
 * it), to the millisecond; undefined for anything else, or a time a Timestamp cannot hold.
 */
export function isoToTimestamp(iso: unknown): Timestamp | undefined {
  if (typeof iso !== "string") return undefined;
  const ms = Date.parse(iso);
  if (!(ms >= MIN_TIMESTAMP_MS && ms <= MAX_TIMESTAMP_MS)) return undefined;
  const seconds = Math.floor(ms / 1000);
  return { $typeName: TIMESTAMP_TYPE, seconds: BigInt(seconds), nanos: (ms - seconds * 1000) * 1_000_000 };
}
