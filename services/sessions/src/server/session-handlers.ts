/**
 * The RPC layer of `berth.sessions.v1.SessionService`: each RPC checks its request, delegates to
 * the session store, and maps the result onto the proto (session_service.proto's comments are the
 * contract). Domain refusals are the store's BerthErrors, each naming its reason (the proto's
 * error table); where the proto defines a typed error detail (SeqConflict, FenceRejected,
 * IdempotencyKeyReused, WatcherLagged) the error is turned into a ConnectError carrying it (typed-refusals.ts),
 * beside the ErrorInfo, Struct detail and header every BerthError gets.
 *
 * Per-append work is kept small (the journal should hide behind the RPC's own cost): one codec
 * pass over the event, the store's append, and a snapshot encoded once however many watchers
 * receive it (see wire-cache.ts).
 */
import { durationFromMs } from "@berth/wire/time";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import type { Event } from "@berth/api/berth/sessions/v1/events_pb";
import {
  AppendEventResponseSchema,
  AppendEventsResponseSchema,
  ExpectedState,
  ReadEndSchema,
  ReadJournalResponseSchema,
  SessionsCaughtUpSchema,
  type AppendEventResponse,
  type AppendEventsResponse,
  type Fence,
  type JournalEntry as JournalEntryMessage,
  type ReadJournalResponse,
  type SessionChange as SessionChangeMessage,
  type SessionService,
  type WatchSessionResponse,
  type WatchSessionsResponse,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { systemClock, type Clock } from "@berth/shared/clock";
import { BerthError, invalidArgument, isBerthError } from "@berth/shared/errors";
import { checkSessionId } from "@berth/shared/safe-id";
import { abortError, DEFAULT_MAX_MESSAGE_BYTES, endOnAbort, PROGRESS, ProgressPuller, progressIntervalMs, streamHolds } from "@berth/shared/server/index";
import { sendsBinary } from "@berth/shared/server/pre-encoded";
import type { JournalEntry, SessionSnapshot } from "../reducer.js";
import { sessionNotFound, type AppendOptions, type ExpectedState as StoreExpectedState } from "../session-store.js";
import type { SessionStoreApi, SessionView } from "../session-store-api.js";
import { isCompletedPhase } from "../vocabulary.js";
import type { WatchEntry } from "../session-store-api.js";
import {
  caughtUpResponse,
  entryFacts,
  progressOf,
  SESSION_CHANGE,
  sessionChange,
  WATCH_SESSION_RESPONSE,
  WATCH_SESSIONS_RESPONSE,
  watchEntries,
  watchSessionsChange,
} from "./watch-messages.js";
import { appendOrExplain, explainKeyReused, explainSeqConflict, fenceChecker, lagged, type FenceCheck } from "./typed-refusals.js";
import { eventToJournal, journalEntryToProto } from "./event-codec.js";
import { isoToTimestamp } from "./timestamps.js";
import { encodedSnapshotField, snapshotMessage } from "./wire-cache.js";

/** Options of {@link createSessionHandlers}. */
export interface SessionHandlerOptions {
  readonly store: SessionStoreApi;
  /** Checks an append's fence; without one, a fenced append is refused (it cannot be verified). */
  readonly fenceCheck?: FenceCheck | undefined;
  /** Entries per ReadJournal message at most (default {@link READ_BATCH_MAX_ENTRIES}). */
  readonly readBatchEntries?: number;
  /** Approximate bytes per ReadJournal message at most (default {@link READ_BATCH_MAX_BYTES}). */
  readonly readBatchBytes?: number;
  /** The clock of progress messages (default: the system's). */
  readonly clock?: Clock;
  /** The server's message size limit, as GetLimits reports it (default: the server's default). */
  readonly maxMessageBytes?: number;
}

/** Entries per ReadJournal message at most. */
export const READ_BATCH_MAX_ENTRIES = 256;
/**
 * A ReadJournal (or watch backlog) message is closed once its entries' journal JSON reaches this
 * many bytes: well under the default 4 MiB message limit even with one maximal (1 MiB) event on top.
 */
export const READ_BATCH_MAX_BYTES = 256 * 1024;
/** Backlog entries in one WatchSession message at most. */
export const WATCH_BACKLOG_BATCH = 100;
/** Most live entries one WatchSession message carries, whatever `max_batch` asks. */
export const MAX_WATCH_BATCH = 1000;
/** ListSessions' page when `page_size` is 0, and its largest. */
export const DEFAULT_PAGE_SIZE = 100;
export const MAX_PAGE_SIZE = 1000;

// The type names and field numbers the handlers write by hand, from the generated descriptors.
const APPEND_EVENT_RESPONSE = AppendEventResponseSchema.typeName;
const APPEND_EVENTS_RESPONSE = AppendEventsResponseSchema.typeName;
const SESSIONS_CAUGHT_UP = SessionsCaughtUpSchema.typeName;
const READ_JOURNAL_RESPONSE = ReadJournalResponseSchema.typeName;
const READ_END = ReadEndSchema.typeName;

// The fields sent pre-encoded (see wire-cache.ts).
const APPEND_EVENT_SNAPSHOT_FIELD = AppendEventResponseSchema.field.snapshot.number;
const APPEND_EVENTS_SNAPSHOT_FIELD = AppendEventsResponseSchema.field.snapshot.number;

export { SESSIONS_ERROR_DOMAIN, type FenceCheck } from "./typed-refusals.js";

/** The SessionService implementation over `options.store`. */
export function createSessionHandlers(options: SessionHandlerOptions): ServiceImpl<typeof SessionService> {
  const { store, fenceCheck } = options;
  const clock = options.clock ?? systemClock;
  const batchEntries = options.readBatchEntries ?? READ_BATCH_MAX_ENTRIES;
  const batchBytes = options.readBatchBytes ?? READ_BATCH_MAX_BYTES;

  /** The store's append options for a request's concurrency fields, every one checked. */
  function appendOptions(req: {
    expected: { case: "expectedSeq"; value: bigint } | { case: "expectedState"; value: ExpectedState } | { case: undefined; value?: undefined };
    idempotencyKey: string;
    fence?: Fence | undefined;
  }): AppendOptions {
    const out: AppendOptions = {};
    if (req.expected.case === "expectedSeq") {
      if (req.expected.value <= 0n) {
        throw invalidArgument(
          "expected_seq",
          "must be positive (the session's last seq you saw); for a session with no entry yet set expected_state = NO_SESSION",
        );
      }
      out.expectedSeq = safeSeq(req.expected.value, "expected_seq");
    } else if (req.expected.case === "expectedState") {
      const state = storeExpectedState(req.expected.value);
      if (state !== "any") out.expectedState = state;
    }
    if (req.idempotencyKey !== "") out.idempotencyKey = req.idempotencyKey;
    if (req.fence !== undefined) {
      out.fenceCheck = fenceChecker(req.fence, fenceCheck);
      out.fence = { file: req.fence.file, token: req.fence.fencingToken };
    }
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

    async getSnapshot(req) {
      const sessionId = checkSessionId(req.sessionId);
      const view = await store.getSnapshot(sessionId, { includeCompleted: true });
      if (view === null || !view.exists) throw sessionNotFound(sessionId);
      return { snapshot: snapshotMessage(view.snapshot), lastSeq: BigInt(view.lastSeq) };
    },

    async listSessions(req) {
      if (req.pageSize < 0) throw invalidArgument("page_size", `must be 0 (the default, ${DEFAULT_PAGE_SIZE}) or positive`);
      const pageSize = req.pageSize === 0 ? DEFAULT_PAGE_SIZE : Math.min(req.pageSize, MAX_PAGE_SIZE);
      const after = req.pageToken === "" ? undefined : decodePageToken(req.pageToken, req.includeCompleted);
      // One more than the page: whether another page follows, without an empty last page.
      const views = await store.list({ includeCompleted: req.includeCompleted, limit: pageSize + 1, ...(after !== undefined ? { after } : {}) });
      const page = views.slice(0, pageSize);
      const last = page[page.length - 1];
      return {
        sessions: page.map((view) => snapshotMessage(view.snapshot)),
        nextPageToken: views.length > pageSize && last !== undefined ? encodePageToken(last.sessionId, req.includeCompleted) : "",
      };
    },

    async flushSnapshot(req) {
      const sessionId = checkSessionId(req.sessionId);
      const view = await store.flush(sessionId);
      if (!view.exists) throw sessionNotFound(sessionId);
      return { snapshot: snapshotMessage(view.snapshot), lastSeq: BigInt(view.lastSeq) };
    },

    async deleteSession(req) {
      const sessionId = checkSessionId(req.sessionId);
      const expectedSeq = req.expectedSeq === undefined ? undefined : nonNegativeSeq(req.expectedSeq, "expected_seq");
      try {
        const { lastSeq, duplicate } = await store.delete(sessionId, {
          ...(expectedSeq === undefined ? {} : { expectedSeq }),
          ...(req.idempotencyKey === "" ? {} : { idempotencyKey: req.idempotencyKey }),
        });
        return { lastSeq: BigInt(lastSeq), duplicate };
      } catch (error) {
        if (isBerthError(error) && error.reason === "IDEMPOTENCY_KEY_REUSED") throw explainKeyReused(error, sessionId, req.idempotencyKey);
        throw explainSeqConflict(error, sessionId, expectedSeq, undefined);
      }
    },

    async *readJournal(req, context) {
      const sessionId = checkSessionId(req.sessionId);
      const fromSeq = Math.max(1, nonNegativeSeq(req.fromSeq, "from_seq"));
      if (req.limit < 0) throw invalidArgument("limit", "must be 0 (no limit) or positive");
      // The last seq and the entries as of one moment: the read ends where its last seq is.
      const reading = await store.read(sessionId, fromSeq, req.limit);
      if (reading === null) throw sessionNotFound(sessionId);
      const { lastSeq, entries } = reading;
      if (fromSeq > lastSeq + 1) {
        throw new BerthError(
          "out_of_range",
          `from_seq: ${fromSeq} is past the end of session ${sessionId}, whose last seq is ${lastSeq}; read from at most ${lastSeq + 1}`,
          { sessionId, fromSeq, lastSeq },
          { reason: "SEQ_OUT_OF_RANGE" },
        );
      }
      let batch: JournalEntryMessage[] = [];
      let bytes = 0;
      let sent = 0;
      let nextSeq = fromSeq;
      try {
        for await (const stored of entries) {
          if (context.signal.aborted) throw abortError(context.signal);
          batch.push(journalEntryToProto(stored.entry as unknown as Record<string, unknown>, entryFacts(stored)));
          bytes += approximateBytes(stored.entry);
          sent++;
          nextSeq = Math.max(nextSeq, stored.entry.seq + 1);
          if (batch.length >= batchEntries || bytes >= batchBytes) {
            yield { $typeName: READ_JOURNAL_RESPONSE, entries: batch };
            batch = [];
            bytes = 0;
          }
        }
      } finally {
        await entries.return?.();
      }
      const more = req.limit > 0 && sent >= req.limit && nextSeq <= lastSeq;
      const last: ReadJournalResponse = {
        $typeName: READ_JOURNAL_RESPONSE,
        entries: batch,
        end: { $typeName: READ_END, lastSeq: BigInt(lastSeq), nextSeq: BigInt(nextSeq), more },
      };
      yield last;
    },

    async *watchSession(req, context) {
      const sessionId = checkSessionId(req.sessionId);
      const fromSeq = Math.max(1, nonNegativeSeq(req.fromSeq, "from_seq"));
      if (req.maxBatch < 0) throw invalidArgument("max_batch", "must be 0 or positive");
      const maxBatch = Math.min(req.maxBatch, MAX_WATCH_BATCH);
      const progressMs = progressIntervalMs(req.progressInterval);
      const binary = sendsBinary(context);
      const watcher = store.watch(sessionId, fromSeq, { includeSnapshot: req.includeSnapshot });
      streamHolds(context, `a watcher of ${sessionId} from seq ${fromSeq}`);
      const stop = endOnAbort(watcher, context.signal);
      const puller = new ProgressPuller(watcher, clock);
      // Backlog entries handed over by the store but not sent yet: sent before any error, since
      // the error's resume point counts them as delivered.
      let backlog: WatchEntry[] = [];
      let backlogBytes = 0;
      let live = false;
      let lastSeq = fromSeq - 1;
      try {
        for (;;) {
          const step = await puller.next(live ? progressMs : undefined);
          if (step === PROGRESS) {
            yield { $typeName: WATCH_SESSION_RESPONSE, kind: { case: "progress", value: progressOf(lastSeq, clock) } } satisfies WatchSessionResponse;
            continue;
          }
          if (step.done) break;
          const event = step.value;
          if (!live && event.kind === "entry") {
            backlog.push(event);
            backlogBytes += approximateBytes(event.entry);
            if (backlog.length >= WATCH_BACKLOG_BATCH || backlogBytes >= batchBytes) {
              yield watchEntries(backlog, binary);
              backlog = [];
              backlogBytes = 0;
            }
            continue;
          }
          if (backlog.length > 0) {
            yield watchEntries(backlog, binary);
            backlog = [];
          }
          if (event.kind === "caught_up") {
            live = true;
            lastSeq = Math.max(lastSeq, event.lastSeq);
            yield caughtUpResponse(event.lastSeq, event.snapshot);
            continue;
          }
          // Entries that piled up while the previous message was on its way go together in this one.
          const more = maxBatch > 1 ? (watcher.takeBuffered(maxBatch - 1) as WatchEntry[]) : [];
          const sending = [event, ...more];
          lastSeq = Math.max(lastSeq, sending[sending.length - 1]!.entry.seq);
          yield watchEntries(sending, binary);
        }
        if (context.signal.aborted) throw abortError(context.signal);
      } catch (error) {
        if (backlog.length > 0 && !context.signal.aborted) yield watchEntries(backlog, binary);
        throw lagged(error, sessionId);
      } finally {
        stop();
        await watcher.return?.();
      }
    },

    async *watchSessions(req, context) {
      const progressMs = progressIntervalMs(req.progressInterval);
      const resumeFrom = new Map<string, number>();
      for (const [id, seq] of Object.entries(req.resumeFrom)) {
        resumeFrom.set(checkSessionId(id, "resume_from"), nonNegativeSeq(seq, `resume_from[${id}]`));
      }
      if (req.startRevision < 0n) throw invalidArgument("start_revision", "must not be negative");
      // Beyond any revision the service gives: ahead of the current one, so a reset like any other.
      const startRevision = req.startRevision > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(req.startRevision);
      // Subscribed before the current state is read, so no change falls between the two; changes
      // already described by the current state are skipped below.
      const watcher = store.watchAll({ includeSnapshot: req.includeSnapshot, ...(startRevision > 0 ? { startRevision } : {}) });
      streamHolds(context, "a watcher of every session");
      const stop = endOnAbort(watcher, context.signal);
      const described = new Map<string, number>();
      try {
        const start = await watcher.started;
        const describeCurrent = startRevision > 0 ? start.reset : req.includeCurrent || resumeFrom.size > 0;
        if (startRevision > 0 && !start.reset) {
          // The replay: every held change after `start_revision`, up to the revision at subscription.
          while (start.caughtUpAt > watcher.progressRevision()) {
            const step = await watcher.next();
            if (step.done) break;
            yield watchSessionsChange(sessionChange(step.value));
          }
          yield {
            $typeName: WATCH_SESSIONS_RESPONSE,
            kind: { case: "caughtUp", value: { $typeName: SESSIONS_CAUGHT_UP, sessions: 0, deleted: [], revision: BigInt(start.caughtUpAt), reset: false } },
          };
        }
        if (describeCurrent) {
          const existing = new Set<string>();
          let count = 0;
          // Page by page, each page's last entries read before the next page is: a thousand
          // sessions read at once would hold the service's event loop (every other call, the
          // preflights of a page opening its watches) for as long. A session changed meanwhile is
          // described as it stands when its page is read, and its live changes after that.
          for await (const views of store.pages({ includeCompleted: true, pageSize: LAST_ENTRY_READS })) {
            const told: SessionView[] = [];
            for (const view of views) {
              existing.add(view.sessionId);
              const known = resumeFrom.get(view.sessionId);
              // A session the watcher knows is described when it moved, whatever its phase (a live
              // change that completed it would have reached the watcher); one it does not know, as
              // `include_completed` says. Changes up to what the watcher has (told now, or known)
              // are not sent again; those of a session left out here are (one may complete it).
              if (known !== undefined && known === view.lastSeq) {
                described.set(view.sessionId, view.lastSeq);
                continue;
              }
              if (known === undefined && !req.includeCompleted && isCompletedPhase(view.snapshot.phase)) continue;
              described.set(view.sessionId, view.lastSeq);
              told.push(view);
            }
            for await (const [view, last] of withLastEntries(store, told, context.signal)) {
              const change: SessionChangeMessage = {
                $typeName: SESSION_CHANGE,
                sessionId: view.sessionId,
                lastSeq: BigInt(view.lastSeq),
                firstSeq: BigInt(view.lastSeq),
                type: typeof last?.type === "string" ? last.type : "",
                deleted: false,
                revision: BigInt(start.after),
              };
              const appendTime = isoToTimestamp(last?.ts ?? view.snapshot.updatedAt);
              if (appendTime !== undefined) change.appendTime = appendTime;
              if (req.includeSnapshot) change.snapshot = snapshotMessage(view.snapshot);
              count++;
              yield watchSessionsChange(change);
            }
          }
          const deleted = [...resumeFrom.keys()].filter((id) => !existing.has(id)).sort();
          yield {
            $typeName: WATCH_SESSIONS_RESPONSE,
            kind: {
              case: "caughtUp",
              value: { $typeName: SESSIONS_CAUGHT_UP, sessions: count, deleted, revision: BigInt(start.after), reset: start.reset },
            },
          };
        }
        const puller = new ProgressPuller(watcher, clock);
        for (;;) {
          const step = await puller.next(progressMs);
          if (step === PROGRESS) {
            const progress = progressOf(0, clock, watcher.progressRevision());
            yield { $typeName: WATCH_SESSIONS_RESPONSE, kind: { case: "progress", value: progress } } satisfies WatchSessionsResponse;
            continue;
          }
          if (step.done) break;
          const change = step.value;
          const seen = described.get(change.sessionId);
          if (seen !== undefined) {
            // A deletion (or, after one, a new session under the id) is news whatever its seq.
            if (!change.deleted && change.lastSeq <= seen) continue;
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

    getLimits() {
      const limits = store.limits();
      return {
        maxEventBytes: BigInt(limits.maxEventBytes),
        maxEventsPerAppend: limits.maxEventsPerAppend,
        maxMessageBytes: BigInt(options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES),
        watchBuffer: limits.maxBuffered,
        maxIdempotencyKeyLength: limits.maxIdempotencyKeyLength,
        maxPageSize: MAX_PAGE_SIZE,
        ...(limits.completedRetentionMs !== undefined ? { completedRetention: durationFromMs(limits.completedRetentionMs) } : {}),
        idempotencyWindow: durationFromMs(limits.idempotencyWindowMs),
      };
    },
  };
}

// --------------------------------------------------------------------------- appends

/** The store's expectation for a request's `expected_state`. */
function storeExpectedState(state: ExpectedState): StoreExpectedState {
  switch (state) {
    case ExpectedState.UNSPECIFIED:
    case ExpectedState.ANY:
      return "any";
    case ExpectedState.NO_SESSION:
      return "no_session";
    case ExpectedState.EXISTS:
      return "exists";
    default:
      throw invalidArgument("expected_state", `must be ANY, NO_SESSION or EXISTS, got ${state as number}`);
  }
}

/** Puts the snapshot in a response: pre-encoded for binary calls, as a message for the others. */
function attachSnapshot(response: AppendEventResponse | AppendEventsResponse, field: number, snapshot: SessionSnapshot, context: HandlerContext): void {
  if (sendsBinary(context)) response.$unknown = [encodedSnapshotField(field, snapshot)];
  else response.snapshot = snapshotMessage(snapshot);
}

// --------------------------------------------------------------------------- pages

/**
 * ListSessions' page token: the last id of the page and the `include_completed` it was asked with,
 * base64url. Opaque to clients; positions never enter it, so sessions created or deleted while a
 * client pages cannot shift a page.
 */
function encodePageToken(lastId: string, includeCompleted: boolean): string {
  return Buffer.from(`${includeCompleted ? "c" : "a"}:${lastId}`, "utf8").toString("base64url");
}

function decodePageToken(token: string, includeCompleted: boolean): string {
  const text = /^[A-Za-z0-9_-]+$/.test(token) ? Buffer.from(token, "base64url").toString("utf8") : "";
  const match = /^([ac]):([A-Za-z0-9_-]{1,128})$/.exec(text);
  if (match === null)
    throw invalidArgument("page_token", "is not a token this service gave: pass next_page_token as it was returned, or nothing for the first page");
  if ((match[1] === "c") !== includeCompleted) {
    throw invalidArgument("page_token", `was given for include_completed=${!includeCompleted}: page with the same include_completed, or start again`);
  }
  return match[2]!;
}

/**
 * How many sessions a description of every session lists, and reads the last entries of, at once:
 * each is a read of the journal (a file, or a call to etcd), and one after the other they would
 * add up to the latency of a thousand reads, which a busy machine stretches far beyond their work.
 */
const LAST_ENTRY_READS = 64;

/** Each view with its session's last entry, in order, read at once. */
async function* withLastEntries(
  store: SessionStoreApi,
  views: readonly SessionView[],
  signal: AbortSignal,
): AsyncGenerator<[SessionView, JournalEntry | undefined]> {
  if (signal.aborted) throw abortError(signal);
  const entries = await Promise.all(views.map((view) => lastEntry(store, view.sessionId, view.lastSeq)));
  for (let i = 0; i < views.length; i++) yield [views[i]!, entries[i]];
}

/** The session's entry at `seq` (its last), read from the journal; undefined when it has none. */
async function lastEntry(store: SessionStoreApi, sessionId: string, seq: number): Promise<JournalEntry | undefined> {
  if (seq < 1) return undefined;
  const entries = (await store.read(sessionId, seq, 1))?.entries;
  if (entries === undefined) return undefined;
  try {
    const step = await entries.next();
    return step.done ? undefined : step.value.entry;
  } finally {
    await entries.return?.();
  }
}

// --------------------------------------------------------------------------- helpers

/** An int64 request field as a number, refusing values no seq can reach. */
function safeSeq(value: bigint, field: string): number {
  if (value > BigInt(Number.MAX_SAFE_INTEGER)) throw invalidArgument(field, `must be at most ${Number.MAX_SAFE_INTEGER}`);
  return Number(value);
}

/** An int64 seq field that may be 0 but not negative. */
function nonNegativeSeq(value: bigint, field: string): number {
  if (value < 0n) throw invalidArgument(field, "must not be negative");
  return safeSeq(value, field);
}

/** The size a journal entry adds to a message, roughly: its event's JSON size. */
function approximateBytes(entry: JournalEntry): number {
  try {
    return JSON.stringify(entry.event).length + 64;
  } catch {
    return 1024;
  }
}
