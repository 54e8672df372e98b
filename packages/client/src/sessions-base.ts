/**
 * The sessions service's journals, on any platform (the entry point gives the connection, see
 * `connection.ts`): append (made again by itself when another process's line overtook it, as the
 * service asks), read, list, delete, and watch, which resumes by itself when the service ends a
 * watcher that fell behind. Everything else is on `rpc`, the plain Connect client (its errors are
 * BerthClientErrors too).
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type Client } from "@connectrpc/connect";
import type { EventSchema } from "@berth/api/berth/sessions/v1/events_pb";
import {
  ExpectedState,
  FenceRejectedSchema,
  IdempotencyKeyReusedSchema,
  SeqConflictSchema,
  SessionService,
  WatcherLaggedSchema,
  type AppendEventResponse,
  type AppendEventsResponse,
  type DeleteSessionResponse,
  type GetLimitsResponse,
  type GetSnapshotResponse,
  type JournalEntry,
  type SessionChange,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import type { Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import type { ServiceConnection } from "./connection.js";
import type { Endpoint } from "./endpoint.js";
import { BerthClientError, SESSIONS_REASONS, withBerthErrors } from "./errors.js";
import { appendableEvent } from "./journal-events.js";
import { callOptions, delay, durationOfMs, linkedCall, type CallOptions } from "./options.js";
import { callWithRequestId } from "./request-ids.js";
import { followRevisionWatch, type RevisionWatchEvent, type RevisionWatchOptions } from "./revision-watch.js";

export { ExpectedState };

/** The typed details the sessions service sends with its errors. */
export const SESSION_ERROR_DETAILS = [SeqConflictSchema, FenceRejectedSchema, IdempotencyKeyReusedSchema, WatcherLaggedSchema] as const;

/** An event as the journal holds it: `{type, ...keys}` with the seed's keys (`pageUrl`, `count`, …). */
export type JournalEvent = { readonly type: string } & Readonly<Record<string, unknown>>;

/** An event to append: as the journal holds it, or the typed `Event` message (or its init). */
export type EventInput = JournalEvent | MessageInitShape<typeof EventSchema>;

/** Options of {@link SessionsClientBase.append} and {@link SessionsClientBase.appendMany}. */
export interface AppendOptions extends CallOptions {
  /** Append only if this is the session's last seq (ABORTED SEQ_CONFLICT otherwise); 0: only if the session has no entry yet. */
  readonly expectedSeq?: bigint | number | undefined;
  /** Append only if the session is in this state (ABORTED SEQ_CONFLICT otherwise). */
  readonly expectedState?: ExpectedState | undefined;
  /** Makes a retry safe: an append repeated with the same key writes nothing and answers the first one's result (`duplicate`). */
  readonly idempotencyKey?: string | undefined;
  /** Refuse the write unless this fencing token is still current for the lock on `file` (FAILED_PRECONDITION FENCE_REJECTED). */
  readonly fence?: { readonly file: string; readonly fencingToken: bigint | number } | undefined;
  /** What a relative fence file is relative to. Default: the process's working directory at the call in Node; a page has none (give absolute paths or `cwd`). */
  readonly cwd?: string | undefined;
}

/** Options of {@link SessionsClientBase.watch}. */
export interface WatchOptions extends CallOptions {
  /** The first seq to send (default: from the start). */
  readonly fromSeq?: bigint | number | undefined;
  /** Send each live entry's snapshot, and the current one with `caughtUp`. */
  readonly includeSnapshot?: boolean | undefined;
  /** Up to this many live entries in one message from the service when several are waiting. */
  readonly maxBatch?: number | undefined;
  /** A `progress` event whenever this long (at least 100 ms) passes without another. */
  readonly progressIntervalMs?: number | undefined;
  /** Resume by itself when the service ends the watch for falling behind (WATCHER_LAGGED). Default true. */
  readonly resume?: boolean | undefined;
}

/**
 * What a watch yields: each entry (the backlog's, then, after `caughtUp`, the live ones), the
 * caught-up marker, `progress` while idle, and `resumed` when it fell behind and started again from
 * where the service said (the backlog from there, then `caughtUp` again, follow).
 */
export type SessionWatchEvent =
  | { readonly kind: "entry"; readonly entry: JournalEntry; readonly snapshot: Snapshot | undefined; readonly live: boolean }
  | { readonly kind: "caughtUp"; readonly lastSeq: bigint; readonly snapshot: Snapshot | undefined }
  | { readonly kind: "progress"; readonly lastSeq: bigint; readonly sendTime: Timestamp | undefined }
  | { readonly kind: "resumed"; readonly fromSeq: bigint; readonly error: BerthClientError };

/** Options of {@link SessionsClientBase.watchSessions}. */
export interface SessionsWatchOptions extends RevisionWatchOptions {
  /** Each change carries the session's snapshot after it. */
  readonly includeSnapshot?: boolean | undefined;
  /** With `includeCurrent`, completed sessions are described too. */
  readonly includeCompleted?: boolean | undefined;
}

/** What `watchSessions` yields: a session's change (or, before `caughtUp`, its current state), the end of the current state, progress, a resume. */
export type SessionsWatchEvent = RevisionWatchEvent<SessionChange>;

/** How many times in all an append is made when another process's line overtook it (nothing of it was kept). */
const OVERTAKEN_ATTEMPTS = 5;
/** The longest wait between two such attempts, whatever RetryInfo says. */
const OVERTAKEN_MAX_DELAY_MS = 1000;

/** A client of the sessions service's journals, on the connection its entry point gives it (`SessionsClient` of each entry). */
export class SessionsClientBase {
  /** The plain Connect client, for every RPC; its errors are BerthClientErrors. */
  readonly rpc: Client<typeof SessionService>;
  /** Where it connects; undefined when it was given a transport. */
  readonly endpoint: Endpoint | undefined;
  readonly #lockPath: ServiceConnection["lockPath"];

  constructor(connection: ServiceConnection) {
    this.endpoint = connection.endpoint;
    this.#lockPath = connection.lockPath;
    this.rpc = withBerthErrors(SessionService, createClient(SessionService, connection.unary), SESSION_ERROR_DETAILS);
  }

  /**
   * Appends one event and answers its seq and the snapshot after it (or, for a repeated idempotency
   * key, the first append's). An event as the journal holds it is checked as the API checks typed
   * JSON: a key of a typed field with a value of another type (`count: "abc"`) is refused with
   * InvalidEventError naming the field, before anything is sent.
   */
  async append(sessionId: string, event: EventInput, options: AppendOptions = {}): Promise<AppendEventResponse> {
    const request = { sessionId, event: toEvent(event, "event"), ...appendConditions(options, this.#lockPath) };
    return retryOvertaken(() => this.rpc.appendEvent(request, callOptions(options)), options.signal);
  }

  /** Appends events atomically, with consecutive seqs: all of them or none. Each event is checked as {@link append} checks it. */
  async appendMany(sessionId: string, events: readonly EventInput[], options: AppendOptions = {}): Promise<AppendEventsResponse> {
    const request = { sessionId, events: events.map((event, i) => toEvent(event, `events[${i}]`)), ...appendConditions(options, this.#lockPath) };
    return retryOvertaken(() => this.rpc.appendEvents(request, callOptions(options)), options.signal);
  }

  /** The session's snapshot and last seq. NOT_FOUND SESSION_NOT_FOUND for a session without a journal. */
  snapshot(sessionId: string, options?: CallOptions): Promise<GetSnapshotResponse> {
    return this.rpc.getSnapshot({ sessionId }, callOptions(options));
  }

  /** Every session's snapshot, sorted by id, the service's pages fetched one after another; active ones only unless `includeCompleted`. */
  async *list(options: CallOptions & { readonly includeCompleted?: boolean; readonly pageSize?: number } = {}): AsyncGenerator<Snapshot> {
    let pageToken = "";
    do {
      const page = await this.rpc.listSessions(
        { includeCompleted: options.includeCompleted ?? false, pageSize: options.pageSize ?? 0, pageToken },
        callOptions(options),
      );
      yield* page.sessions;
      pageToken = page.nextPageToken;
    } while (pageToken !== "");
  }

  /**
   * Deletes the session (journal and snapshot files; a session created again under the id continues
   * its seqs); with `expectedSeq`, only if that is still its last seq. Made with an idempotency key
   * (`idempotencyKey`, or a new UUID) and made again with it while it fails on the way: a deletion
   * whose answer was lost is answered (`duplicate`), never done twice.
   */
  delete(
    sessionId: string,
    options: CallOptions & { readonly expectedSeq?: bigint | number; readonly idempotencyKey?: string | undefined } = {},
  ): Promise<DeleteSessionResponse> {
    const expectedSeq = options.expectedSeq === undefined ? {} : { expectedSeq: BigInt(options.expectedSeq) };
    return callWithRequestId((idempotencyKey) => this.rpc.deleteSession({ sessionId, ...expectedSeq, idempotencyKey }, callOptions(options)), {
      requestId: options.idempotencyKey,
      signal: options.signal,
    });
  }

  /** The journal's entries from `fromSeq` (default: the start), at most `limit` (default: all), up to its current end. */
  async *journal(sessionId: string, options: CallOptions & { readonly fromSeq?: bigint | number; readonly limit?: number } = {}): AsyncGenerator<JournalEntry> {
    for await (const batch of this.rpc.readJournal({ sessionId, fromSeq: BigInt(options.fromSeq ?? 0), limit: options.limit ?? 0 }, callOptions(options))) {
      yield* batch.entries;
    }
  }

  /**
   * Follows a session: its journal from `fromSeq` (the backlog), `caughtUp`, then every new entry
   * as it is appended, until the loop breaks or the signal aborts (which throws CANCELED). A watch
   * the service ends for falling behind resumes from where the service says, after a `resumed`
   * event: no entry is missed, none repeated. A deleted session ends it with NOT_FOUND
   * SESSION_DELETED.
   */
  async *watch(sessionId: string, options: WatchOptions = {}): AsyncGenerator<SessionWatchEvent> {
    let fromSeq = BigInt(options.fromSeq ?? 0);
    const progressInterval = durationOfMs(options.progressIntervalMs);
    // One deadline for the whole watch, however often it resumes; the stream ends with the loop.
    const call = linkedCall(options);
    try {
      for (;;) {
        const request = { sessionId, fromSeq, includeSnapshot: options.includeSnapshot ?? false, maxBatch: options.maxBatch ?? 0, progressInterval };
        let live = false;
        try {
          for await (const message of this.rpc.watchSession(request, { signal: call.controller.signal })) {
            const kind = message.kind;
            if (kind.case === "entries") {
              for (const { entry, snapshot } of kind.value.entries) {
                if (entry === undefined) continue;
                fromSeq = entry.seq + 1n;
                yield { kind: "entry", entry, snapshot, live };
              }
            } else if (kind.case === "caughtUp") {
              live = true;
              if (kind.value.lastSeq + 1n > fromSeq) fromSeq = kind.value.lastSeq + 1n;
              yield { kind: "caughtUp", lastSeq: kind.value.lastSeq, snapshot: kind.value.snapshot };
            } else if (kind.case === "progress") {
              yield { kind: "progress", lastSeq: kind.value.lastSeq, sendTime: kind.value.sendTime };
            }
          }
          return;
        } catch (error) {
          const lagged = error instanceof BerthClientError && error.code === Code.ResourceExhausted ? error.watcherLagged : undefined;
          if (lagged === undefined || options.resume === false || call.controller.signal.aborted) throw error;
          fromSeq = lagged.resumeFromSeq;
          yield { kind: "resumed", fromSeq, error: error as BerthClientError };
        }
      }
    } finally {
      call.dispose();
      call.controller.abort();
    }
  }

  /**
   * Follows every session (WatchSessions): with `includeCurrent`, each session's current state
   * then `caughtUp`; then each change (an append call's entries, a deletion) as it happens, until
   * the loop breaks or the signal aborts. A watch the service ends for falling behind resumes from
   * the revision it names, after a `resumed` event: nothing missed, nothing repeated (or, once the
   * service no longer holds what was missed, the current state again and a `caughtUp` with `reset`:
   * it replaces the caller's view). A resume that lags again at once from the same revision throws.
   */
  async *watchSessions(options: SessionsWatchOptions = {}): AsyncGenerator<SessionsWatchEvent> {
    const progressInterval = durationOfMs(options.progressIntervalMs);
    const { includeSnapshot = false, includeCompleted = false } = options;
    const rpc = this.rpc;
    yield* followRevisionWatch<SessionChange>(
      {
        async *open(start, signal) {
          for await (const message of rpc.watchSessions({ ...start, includeSnapshot, includeCompleted, progressInterval }, { signal })) {
            const kind = message.kind;
            // The same stream as the other revision watches, its events named `change`.
            yield kind.case === "change" ? { kind: { case: "event", value: kind.value } } : { kind };
          }
        },
        resumeRevision: (error) => error.watcherLagged?.resumeFromRevision,
      },
      options,
    );
  }

  /** The limits the service enforces (event size, events per append, watch buffer, …). */
  limits(options?: CallOptions): Promise<GetLimitsResponse> {
    return this.rpc.getLimits({}, callOptions(options));
  }
}

/** An event to send: a journal event through the journal codec, a typed one as it is. */
function toEvent(event: EventInput, field: string): MessageInitShape<typeof EventSchema> {
  const type = (event as { type?: unknown }).type;
  return typeof type === "string" ? appendableEvent(event as Record<string, unknown>, field) : (event as MessageInitShape<typeof EventSchema>);
}

function appendConditions(options: AppendOptions, lockPath: ServiceConnection["lockPath"]) {
  if (options.expectedSeq !== undefined && options.expectedState !== undefined) throw new TypeError("give expectedSeq or expectedState, not both");
  const expectedSeq = options.expectedSeq === undefined ? undefined : BigInt(options.expectedSeq);
  const expected =
    expectedSeq === 0n
      ? // The service's expected_seq is a seq; "no entry yet" is an expected state.
        { case: "expectedState" as const, value: ExpectedState.NO_SESSION }
      : expectedSeq !== undefined
        ? { case: "expectedSeq" as const, value: expectedSeq }
        : options.expectedState !== undefined
          ? { case: "expectedState" as const, value: options.expectedState }
          : { case: undefined };
  const fence = options.fence === undefined ? undefined : { file: lockPath(options.fence.file, options.cwd), fencingToken: BigInt(options.fence.fencingToken) };
  return { expected, idempotencyKey: options.idempotencyKey ?? "", ...(fence === undefined ? {} : { fence }) };
}

/**
 * `call`, made again when the service refused it as overtaken (UNAVAILABLE APPEND_OVERTAKEN: another
 * process's line got in front of it, and nothing of it was kept), after the delay its RetryInfo
 * asks, up to {@link OVERTAKEN_ATTEMPTS} times in all.
 */
async function retryOvertaken<T>(call: () => Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (error) {
      const overtaken = error instanceof BerthClientError && error.code === Code.Unavailable && error.reason === SESSIONS_REASONS.APPEND_OVERTAKEN;
      if (!overtaken || attempt >= OVERTAKEN_ATTEMPTS) throw error;
      await delay(Math.min(OVERTAKEN_MAX_DELAY_MS, error.retryAfterMs ?? 10), signal).catch((aborted: unknown) => {
        throw BerthClientError.from(aborted);
      });
    }
  }
}
