/**
 * The RPC layer of `berth.sessions.v1.SessionService`: each RPC checks its request, delegates to
 * the session store, and maps the result onto the proto (session_service.proto's comments are the
 * contract). Domain refusals are the store's BerthErrors; where the proto defines a typed error
 * detail (SeqConflict, FenceRejected, WatcherLagged) the error is turned into a ConnectError
 * carrying it here, beside the Struct detail and header every BerthError gets.
 *
 * Per-append work is kept small (the journal should hide behind the RPC's own cost): one codec
 * pass over the event, the store's append, and a snapshot encoded once however many watchers
 * receive it (see wire-cache.ts).
 */
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import { ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import type { Event } from "@berth/api/berth/sessions/v1/events_pb";
import {
  FenceRejectedSchema,
  SeqConflictSchema,
  WatcherLaggedSchema,
  type AppendEventResponse,
  type AppendEventsResponse,
  type Fence,
  type JournalEntry as JournalEntryMessage,
  type SessionChange as SessionChangeMessage,
  type SessionService,
  type WatchedEntry,
  type WatchSessionResponse,
  type WatchSessionsResponse,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { BerthError, invalidArgument, isBerthError } from "@berth/shared/errors";
import { checkPathInput, checkSessionId } from "@berth/shared/safe-id";
import { abortError, berthErrorToConnect, streamHolds } from "@berth/shared/server/index";
import { sendsBinary } from "@berth/shared/server/pre-encoded";
import type { EntryIntegrity } from "../journal-file.js";
import type { JournalEntry, SessionSnapshot } from "../reducer.js";
import type { AppendOptions, AppendResult, SessionStore } from "../session-store.js";
import { isCompletedPhase } from "../vocabulary.js";
import type { SessionChange, WatchEntry, WatchEvent } from "../watch-hub.js";
import { eventToJournal, isoToTimestamp, journalEntryToProto, type JournalEntryFacts } from "./event-codec.js";
import { encodedEntryField, encodedSnapshotField, entryMessage, snapshotMessage } from "./wire-cache.js";

/**
 * A fence's check, in two steps, supplied by the lock service. Called with the request's fence, it
 * checks the input (invalid_argument naming `fence.file` or `fence.fencing_token`) and makes the
 * path canonical, as every lock RPC does, so a fence matches its lock however the path is spelled.
 * The function it returns runs right before the append is sequenced and throws a BerthError
 * `aborted` unless `token` is still the current fencing token of the file's lock (details: `file`
 * — the canonical path —, `currentToken`, null or 0 when nobody holds it).
 */
export type FenceCheck = (file: string, token: bigint) => () => void;

/** Options of {@link createSessionHandlers}. */
export interface SessionHandlerOptions {
  readonly store: SessionStore;
  /** Checks an append's fence; without one, a fenced append is refused (it cannot be verified). */
  readonly fenceCheck?: FenceCheck | undefined;
  /** Entries per ReadJournal message at most (default {@link READ_BATCH_MAX_ENTRIES}). */
  readonly readBatchEntries?: number;
  /** Approximate bytes per ReadJournal message at most (default {@link READ_BATCH_MAX_BYTES}). */
  readonly readBatchBytes?: number;
}

/** Entries per ReadJournal message at most. */
export const READ_BATCH_MAX_ENTRIES = 256;
/**
 * A ReadJournal message is closed once its entries' journal JSON reaches this many bytes: well
 * under the default 4 MiB message limit even with one maximal (1 MiB) event on top.
 */
export const READ_BATCH_MAX_BYTES = 256 * 1024;

const APPEND_EVENT_RESPONSE = "berth.sessions.v1.AppendEventResponse";
const APPEND_EVENTS_RESPONSE = "berth.sessions.v1.AppendEventsResponse";
const WATCH_SESSION_RESPONSE = "berth.sessions.v1.WatchSessionResponse";
const WATCH_SESSIONS_RESPONSE = "berth.sessions.v1.WatchSessionsResponse";
const WATCHED_ENTRIES = "berth.sessions.v1.WatchedEntries";
const WATCHED_ENTRY = "berth.sessions.v1.WatchedEntry";
const CAUGHT_UP = "berth.sessions.v1.CaughtUp";
const SESSION_CHANGE = "berth.sessions.v1.SessionChange";
const SESSIONS_CAUGHT_UP = "berth.sessions.v1.SessionsCaughtUp";
const READ_JOURNAL_RESPONSE = "berth.sessions.v1.ReadJournalResponse";

// Field numbers of the responses whose fields are sent pre-encoded (session_service.proto).
const APPEND_EVENT_SNAPSHOT_FIELD = 2;
const APPEND_EVENTS_SNAPSHOT_FIELD = 3;
const WATCH_ENTRY_FIELD = 1;
const WATCH_SNAPSHOT_FIELD = 3;
const WATCHED_ENTRY_FIELD = 1;
const WATCHED_SNAPSHOT_FIELD = 2;

/** Most live entries one WatchSession message carries, whatever `max_batch` asks. */
export const MAX_WATCH_BATCH = 1000;

/** The SessionService implementation over `options.store`. */
export function createSessionHandlers(options: SessionHandlerOptions): ServiceImpl<typeof SessionService> {
  const { store, fenceCheck } = options;
  const batchEntries = options.readBatchEntries ?? READ_BATCH_MAX_ENTRIES;
  const batchBytes = options.readBatchBytes ?? READ_BATCH_MAX_BYTES;

  /** The store's append options for a request's concurrency fields, every one checked. */
  function appendOptions(req: { expectedSeq?: bigint | undefined; idempotencyKey: string; fence?: Fence | undefined }): AppendOptions {
    const out: AppendOptions = {};
    if (req.expectedSeq !== undefined) out.expectedSeq = safeSeq(req.expectedSeq, "expected_seq");
    if (req.idempotencyKey !== "") out.idempotencyKey = req.idempotencyKey;
    if (req.fence !== undefined) out.fenceCheck = fenceChecker(req.fence, fenceCheck);
    return out;
  }

  return {
    async appendEvent(req, context) {
      const sessionId = checkSessionId(req.sessionId);
      if (req.event === undefined) throw invalidArgument("event", "is required: set one event type");
      const event = eventToJournal(req.event, "event");
      const result = await appendOrExplain(store, sessionId, [event], appendOptions(req));
      const response: AppendEventResponse = {
        $typeName: APPEND_EVENT_RESPONSE,
        seq: BigInt(result.lastSeq),
        duplicate: result.duplicate,
      };
      attachSnapshot(response, APPEND_EVENT_SNAPSHOT_FIELD, result.snapshot, context);
      return response;
    },

    async appendEvents(req, context) {
      const sessionId = checkSessionId(req.sessionId);
      if (req.events.length === 0) throw invalidArgument("events", "must hold at least one event");
      const events = req.events.map((event: Event, i) => eventToJournal(event, `events[${i}]`));
      const result = await appendOrExplain(store, sessionId, events, appendOptions(req));
      const response: AppendEventsResponse = {
        $typeName: APPEND_EVENTS_RESPONSE,
        firstSeq: BigInt(result.firstSeq),
        lastSeq: BigInt(result.lastSeq),
        duplicate: result.duplicate,
      };
      attachSnapshot(response, APPEND_EVENTS_SNAPSHOT_FIELD, result.snapshot, context);
      return response;
    },

    getSnapshot(req) {
      const sessionId = checkSessionId(req.sessionId);
      // Asked with completed sessions included so that `exists` and `last_seq` are known even when
      // the snapshot itself is hidden.
      const view = store.getSnapshot(sessionId, { includeCompleted: true });
      if (view === null || !view.exists) return { exists: false, lastSeq: 0n };
      const hidden = !req.includeCompleted && isCompletedPhase(view.snapshot.phase);
      return { exists: true, lastSeq: BigInt(view.lastSeq), ...(hidden ? {} : { snapshot: snapshotMessage(view.snapshot) }) };
    },

    listSessions(req) {
      const views = store.list({ includeCompleted: req.includeCompleted });
      return { sessions: views.map((view) => snapshotMessage(view.snapshot)) };
    },

    hasSession(req) {
      return { exists: store.has(checkSessionId(req.sessionId)) };
    },

    async flushSnapshot(req) {
      const sessionId = checkSessionId(req.sessionId);
      const view = await store.flush(sessionId);
      if (!view.exists) throw noJournal(sessionId);
      return { snapshot: snapshotMessage(view.snapshot), lastSeq: BigInt(view.lastSeq) };
    },

    async *readJournal(req, context) {
      const sessionId = checkSessionId(req.sessionId);
      const fromSeq = Math.max(1, safeSeq(req.fromSeq, "from_seq"));
      if (!store.has(sessionId)) throw noJournal(sessionId);
      const entries = store.read(sessionId, fromSeq, req.limit);
      let batch: JournalEntryMessage[] = [];
      let bytes = 0;
      try {
        for await (const stored of entries) {
          if (context.signal.aborted) throw abortError(context.signal);
          batch.push(journalEntryToProto(stored.entry as unknown as Record<string, unknown>, entryFacts(stored)));
          bytes += approximateBytes(stored.entry);
          if (batch.length >= batchEntries || bytes >= batchBytes) {
            yield { $typeName: READ_JOURNAL_RESPONSE, entries: batch };
            batch = [];
            bytes = 0;
          }
        }
      } finally {
        await entries.return?.();
      }
      if (batch.length > 0) yield { $typeName: READ_JOURNAL_RESPONSE, entries: batch };
    },

    async *watchSession(req, context) {
      const sessionId = checkSessionId(req.sessionId);
      const fromSeq = Math.max(1, safeSeq(req.fromSeq, "from_seq"));
      const binary = sendsBinary(context);
      const maxBatch = Math.min(req.maxBatch, MAX_WATCH_BATCH);
      const watcher = store.watch(sessionId, fromSeq, { includeSnapshot: req.includeSnapshot });
      streamHolds(context, `a watcher of ${sessionId} from seq ${fromSeq}`);
      const stop = endOnAbort(watcher, context.signal);
      try {
        for await (const event of watcher) {
          // Entries that piled up while this message was on its way go together in the next one.
          const more = maxBatch > 1 && event.kind === "entry" ? watcher.takeBuffered(maxBatch - 1) : [];
          yield more.length === 0 ? watchSessionResponse(event, binary) : watchBatchResponse([event, ...more] as WatchEntry[], binary);
        }
        if (context.signal.aborted) throw abortError(context.signal);
      } catch (error) {
        throw lagged(error, sessionId);
      } finally {
        stop();
        await watcher.return?.();
      }
    },

    async *watchSessions(req, context) {
      // Subscribed before the current state is read, so no change falls between the two; changes
      // already described by the current state are skipped below.
      const watcher = store.watchAll({ includeSnapshot: req.includeSnapshot });
      streamHolds(context, "a watcher of every session");
      const stop = endOnAbort(watcher, context.signal);
      const described = new Map<string, number>();
      try {
        if (req.includeCurrent) {
          const views = store.list({ includeCompleted: req.includeCompleted });
          for (const view of views) {
            if (context.signal.aborted) throw abortError(context.signal);
            const last = await lastEntry(store, view.sessionId, view.lastSeq);
            described.set(view.sessionId, view.lastSeq);
            const change: SessionChangeMessage = {
              $typeName: SESSION_CHANGE,
              sessionId: view.sessionId,
              lastSeq: BigInt(view.lastSeq),
              firstSeq: BigInt(view.lastSeq),
              type: typeof last?.type === "string" ? last.type : "",
            };
            const ts = isoToTimestamp(last?.ts ?? view.snapshot.updatedAt);
            if (ts !== undefined) change.ts = ts;
            if (req.includeSnapshot) change.snapshot = snapshotMessage(view.snapshot);
            yield watchSessionsChange(change);
          }
          yield {
            $typeName: WATCH_SESSIONS_RESPONSE,
            kind: { case: "caughtUp", value: { $typeName: SESSIONS_CAUGHT_UP, sessions: views.length } },
          };
        }
        for await (const change of watcher) {
          const seen = described.get(change.sessionId);
          if (seen !== undefined) {
            if (change.lastSeq <= seen) continue;
            described.delete(change.sessionId);
          }
          yield watchSessionsChange(sessionChange(change));
        }
        if (context.signal.aborted) throw abortError(context.signal);
      } catch (error) {
        throw lagged(error, "");
      } finally {
        stop();
        await watcher.return?.();
      }
    },
  };
}

// --------------------------------------------------------------------------- appends

async function appendOrExplain(store: SessionStore, sessionId: string, events: Record<string, unknown>[], options: AppendOptions): Promise<AppendResult> {
  try {
    return await store.append(sessionId, events, options);
  } catch (error) {
    if (isBerthError(error) && error.code === "failed_precondition" && error.details?.currentSeq !== undefined) {
      throw withTypedDetail(error, {
        desc: SeqConflictSchema,
        value: {
          sessionId,
          expectedSeq: BigInt(options.expectedSeq ?? 0),
          currentSeq: BigInt(numberOr(error.details.currentSeq, 0)),
        },
      });
    }
    throw error;
  }
}

/** The store's fence hook for a request's fence: checked input, the lock service's verdict as FenceRejected. */
function fenceChecker(fence: Fence, fenceCheck: FenceCheck | undefined): () => void {
  const file = checkPathInput(fence.file, "fence.file");
  const token = fence.fencingToken;
  if (token === 0n) throw invalidArgument("fence.fencing_token", "must be a positive integer (the fencing token of your lease)");
  if (fenceCheck === undefined) {
    throw new BerthError("unavailable", "fence: this service cannot check fencing tokens (its lock service is not running); nothing was written");
  }
  const check = fenceCheck(file, token);
  return () => {
    try {
      check();
    } catch (error) {
      if (!isBerthError(error) || error.code !== "aborted") throw error;
      const details = error.details ?? {};
      throw withTypedDetail(error, {
        desc: FenceRejectedSchema,
        value: {
          file: typeof details.file === "string" ? details.file : file,
          fencingToken: token,
          currentToken: BigInt(numberOr(details.currentToken, 0)),
        },
      });
    }
  };
}

/** Puts the snapshot in a response: pre-encoded for binary calls, as a message for the others. */
function attachSnapshot(
  response: AppendEventResponse | AppendEventsResponse,
  field: number,
  snapshot: SessionSnapshot,
  context: HandlerContext,
): void {
  if (sendsBinary(context)) response.$unknown = [encodedSnapshotField(field, snapshot)];
  else response.snapshot = snapshotMessage(snapshot);
}

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
function entryFacts(stored: { idempotencyKey: string | undefined; integrity: EntryIntegrity }): JournalEntryFacts {
  return stored.idempotencyKey === undefined ? { integrity: stored.integrity } : { integrity: stored.integrity, idempotencyKey: stored.idempotencyKey };
}

// --------------------------------------------------------------------------- watches

function watchSessionResponse(event: WatchEvent, binary: boolean): WatchSessionResponse {
  if (event.kind === "caught_up") {
    const caughtUp: WatchSessionResponse["kind"] & { case: "caughtUp" } = {
      case: "caughtUp",
      value: { $typeName: CAUGHT_UP, lastSeq: BigInt(event.lastSeq) },
    };
    if (event.snapshot !== undefined && event.lastSeq > 0) caughtUp.value.snapshot = snapshotMessage(event.snapshot);
    return { $typeName: WATCH_SESSION_RESPONSE, kind: caughtUp };
  }
  const facts = entryFacts(event);
  if (!binary) {
    const response: WatchSessionResponse = { $typeName: WATCH_SESSION_RESPONSE, kind: { case: "entry", value: entryMessage(event.entry, facts) } };
    if (event.snapshot !== undefined) response.snapshot = snapshotMessage(event.snapshot);
    return response;
  }
  // Live entries (and their snapshots) are shared by every watcher: sent pre-encoded.
  const fields = [encodedEntryField(WATCH_ENTRY_FIELD, event.entry, facts)];
  if (event.snapshot !== undefined) fields.push(encodedSnapshotField(WATCH_SNAPSHOT_FIELD, event.snapshot));
  return { $typeName: WATCH_SESSION_RESPONSE, kind: { case: undefined }, $unknown: fields };
}

/** Several live entries in one WatchSession message, each with its snapshot (pre-encoded like one). */
function watchBatchResponse(events: readonly WatchEntry[], binary: boolean): WatchSessionResponse {
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
  return { $typeName: WATCH_SESSION_RESPONSE, kind: { case: "batch", value: { $typeName: WATCHED_ENTRIES, entries } } };
}

/** One append call's change (first..last seq, the last entry's type and time, the snapshot after it). */
function sessionChange(change: SessionChange): SessionChangeMessage {
  const message: SessionChangeMessage = {
    $typeName: SESSION_CHANGE,
    sessionId: change.sessionId,
    lastSeq: BigInt(change.lastSeq),
    firstSeq: BigInt(change.firstSeq),
    // A line another process wrote may hold anything there.
    type: typeof change.entry.type === "string" ? change.entry.type : "",
  };
  const ts: Timestamp | undefined = isoToTimestamp(change.entry.ts);
  if (ts !== undefined) message.ts = ts;
  if (change.snapshot !== undefined) message.snapshot = snapshotMessage(change.snapshot);
  return message;
}

function watchSessionsChange(change: SessionChangeMessage): WatchSessionsResponse {
  return { $typeName: WATCH_SESSIONS_RESPONSE, kind: { case: "change", value: change } };
}

/** The session's entry at `seq` (its last), read from the journal; undefined when it has none. */
async function lastEntry(store: SessionStore, sessionId: string, seq: number): Promise<JournalEntry | undefined> {
  if (seq < 1) return undefined;
  const entries = store.read(sessionId, seq, 1);
  try {
    const step = await entries.next();
    return step.done ? undefined : step.value.entry;
  } finally {
    await entries.return?.();
  }
}

/**
 * Ends `watcher` (its pending `next()` resolves done) when `signal` aborts: the client went away,
 * its deadline ran out, or the server is shutting down. One listener for the whole stream, rather
 * than a race per message as `abortable` does: a watcher stream may carry thousands of messages.
 * Returns the function that removes the listener.
 */
function endOnAbort(watcher: AsyncIterator<unknown>, signal: AbortSignal): () => void {
  const end = () => void watcher.return?.();
  if (signal.aborted) {
    end();
    return () => {};
  }
  signal.addEventListener("abort", end, { once: true });
  return () => signal.removeEventListener("abort", end);
}

/** A watcher that fell behind (the store's resource_exhausted) → RESOURCE_EXHAUSTED with WatcherLagged. */
function lagged(error: unknown, sessionId: string): unknown {
  if (!isBerthError(error) || error.code !== "resource_exhausted") return error;
  const lastSeq = error.details?.lastSeq;
  const resumeFromSeq = sessionId !== "" && typeof lastSeq === "number" ? BigInt(lastSeq + 1) : 0n;
  return withTypedDetail(error, { desc: WatcherLaggedSchema, value: { sessionId, resumeFromSeq } });
}

// --------------------------------------------------------------------------- helpers

/** The error of a call naming a session that has no journal. */
function noJournal(sessionId: string): BerthError {
  return new BerthError("not_found", `session ${sessionId} has no journal (nothing was ever appended to it)`, { sessionId });
}

/**
 * A BerthError as the ConnectError the server would send (code, message, Struct detail, details
 * header) with a typed detail first, so clients that decode the proto's own message find it.
 */
/** A detail as `new ConnectError` takes it (the type is not exported by connect). */
type OutgoingDetail = NonNullable<ConstructorParameters<typeof ConnectError>[3]>[number];

function withTypedDetail<D extends DescMessage>(error: BerthError, detail: { desc: D; value: Omit<MessageShape<D>, "$typeName"> }): ConnectError {
  const base = berthErrorToConnect(error);
  const details: OutgoingDetail[] = [detail as unknown as OutgoingDetail, ...(base.details as OutgoingDetail[])];
  return new ConnectError(base.rawMessage, base.code, base.metadata, details, error);
}

/** A uint64 request field as a number, refusing values no seq can reach. */
function safeSeq(value: bigint, field: string): number {
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw invalidArgument(field, `must be at most ${Number.MAX_SAFE_INTEGER}`);
  return Number(value);
}

function numberOr(value: unknown, fallback: number): number | bigint {
  if (typeof value === "bigint") return value;
  if (typeof value === "number" && Number.isSafeInteger(value) && value >= 0) return value;
  return fallback;
}

/** The size a journal entry adds to a ReadJournal message, roughly: its event's JSON size. */
function approximateBytes(entry: JournalEntry): number {
  try {
    return JSON.stringify(entry.event).length + 64;
  } catch {
    return 1024;
  }
}
