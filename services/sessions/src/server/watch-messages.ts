/**
 * The messages of the watches (WatchSession, WatchSessions) and the facts of a JournalEntry
 * message, built from what the store yields; live entries and snapshots pre-encoded for binary
 * calls (wire-cache.ts).
 */
import { timestampFromMs } from "@bufbuild/protobuf/wkt";
import {
  CaughtUpSchema,
  SessionChangeSchema,
  WatchedEntriesSchema,
  WatchedEntrySchema,
  WatchProgressSchema,
  WatchSessionResponseSchema,
  WatchSessionsResponseSchema,
  type SessionChange as SessionChangeMessage,
  type WatchedEntry,
  type WatchProgress,
  type WatchSessionResponse,
  type WatchSessionsResponse,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import type { Clock } from "@berth/shared/clock";
import type { EntryIntegrity } from "../journal/journal-store.js";
import type { SessionSnapshot } from "../reducer.js";
import type { SessionChange, WatchEntry } from "../session-store-api.js";
import type { JournalEntryFacts } from "./event-codec.js";
import { isoToTimestamp } from "./timestamps.js";
import { encodedEntryField, encodedSnapshotField, entryMessage, snapshotMessage } from "./wire-cache.js";

export const WATCH_SESSION_RESPONSE = WatchSessionResponseSchema.typeName;
export const SESSION_CHANGE = SessionChangeSchema.typeName;
export const WATCH_SESSIONS_RESPONSE = WatchSessionsResponseSchema.typeName;

const CAUGHT_UP = CaughtUpSchema.typeName;
const WATCHED_ENTRY = WatchedEntrySchema.typeName;
const WATCHED_ENTRIES = WatchedEntriesSchema.typeName;
const WATCH_PROGRESS = WatchProgressSchema.typeName;
const WATCHED_ENTRY_FIELD = WatchedEntrySchema.field.entry.number;
const WATCHED_SNAPSHOT_FIELD = WatchedEntrySchema.field.snapshot.number;

// --------------------------------------------------------------------------- entries

/**
 * What a JournalEntry message says beside the seed's fields. `idempotency_key`: the key the entry
 * was appended with — on every entry of a keyed AppendEvents, not only its first. `integrity`:
 * VERIFIED for a line berth wrote (its checksum matched when it was read; a live entry is our own
 * line, checksummed as written), UNCHECKED for a line without a checksum (the seed's library
 * wrote it). A client never sees MISMATCH from this service: a damaged line is skipped by every
 * read, as an unparsable one is, and shows up only as the snapshot's
 * `journal_checksum_mismatch` diagnostic (skipping it keeps a read consistent with the replay
 * that built the snapshot, which ignores it too).
 */
export function entryFacts(stored: { idempotencyKey: string | undefined; integrity: EntryIntegrity }): JournalEntryFacts {
  return stored.idempotencyKey === undefined ? { integrity: stored.integrity } : { integrity: stored.integrity, idempotencyKey: stored.idempotencyKey };
}

// --------------------------------------------------------------------------- watches

export function caughtUpResponse(lastSeq: number, snapshot: SessionSnapshot | undefined): WatchSessionResponse {
  const caughtUp: WatchSessionResponse["kind"] & { case: "caughtUp" } = {
    case: "caughtUp",
    value: { $typeName: CAUGHT_UP, lastSeq: BigInt(lastSeq) },
  };
  if (snapshot !== undefined && lastSeq > 0) caughtUp.value.snapshot = snapshotMessage(snapshot);
  return { $typeName: WATCH_SESSION_RESPONSE, kind: caughtUp };
}

/**
 * Consecutive entries in one WatchSession message, each with its snapshot when it carries one.
 * Live entries (and their snapshots) are shared by every watcher: binary calls get them
 * pre-encoded, encoded once.
 */
export function watchEntries(events: readonly WatchEntry[], binary: boolean): WatchSessionResponse {
  const entries = events.map((event): WatchedEntry => {
    const facts = entryFacts(event);
    if (!binary) {
      const watched: WatchedEntry = { $typeName: WATCHED_ENTRY, entry: entryMessage(event.entry, facts) };
      if (event.snapshot !== undefined) watched.snapshot = snapshotMessage(event.snapshot);
      return watched;
    }
    const fields = [encodedEntryField(WATCHED_ENTRY_FIELD, event.entry, facts)];
    if (event.snapshot !== undefined) fields.push(encodedSnapshotField(WATCHED_SNAPSHOT_FIELD, event.snapshot));
    return { $typeName: WATCHED_ENTRY, $unknown: fields };
  });
  return { $typeName: WATCH_SESSION_RESPONSE, kind: { case: "entries", value: { $typeName: WATCHED_ENTRIES, entries } } };
}

export function progressOf(lastSeq: number, clock: Clock, revision = 0): WatchProgress {
  return { $typeName: WATCH_PROGRESS, lastSeq: BigInt(lastSeq), sendTime: timestampFromMs(clock.now()), revision: BigInt(revision) };
}

/** One append call's change (first..last seq, the last entry's type and time, the snapshot after it), or a deletion. */
export function sessionChange(change: SessionChange): SessionChangeMessage {
  const message: SessionChangeMessage = {
    $typeName: SESSION_CHANGE,
    sessionId: change.sessionId,
    lastSeq: BigInt(change.lastSeq),
    firstSeq: BigInt(change.firstSeq),
    // A line another process wrote may hold anything there.
    type: typeof change.entry?.type === "string" ? change.entry.type : "",
    deleted: change.deleted,
    revision: BigInt(change.revision),
  };
  const appendTime = isoToTimestamp(change.entry?.ts);
  if (appendTime !== undefined) message.appendTime = appendTime;
  if (change.snapshot !== undefined) message.snapshot = snapshotMessage(change.snapshot);
  return message;
}

export function watchSessionsChange(change: SessionChangeMessage): WatchSessionsResponse {
  return { $typeName: WATCH_SESSIONS_RESPONSE, kind: { case: "change", value: change } };
}
