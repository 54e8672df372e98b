/**
 * The sessions client against an in-memory service (Connect's router transport: the real protocol,
 * no network), so that the service's answers (an overtaken append, a lagged watcher) are whatever
 * the test says, when it says.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createRouterTransport, type ServiceImpl } from "@connectrpc/connect";
import {
  ExpectedState,
  SeqConflictSchema,
  SessionService,
  WatcherLaggedSchema,
  type AppendEventRequest,
  type WatchSessionRequest,
  type WatchSessionResponseSchema,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { describe, expect, it } from "vitest";
import { BerthClientError } from "./errors.js";
import { SessionsClient, type SessionWatchEvent } from "./sessions.js";

function client(impl: Partial<ServiceImpl<typeof SessionService>>): SessionsClient {
  return new SessionsClient({ transport: createRouterTransport((router) => router.service(SessionService, impl)) });
}

function overtaken(retryMs: number): ConnectError {
  return new ConnectError("another process appended first", Code.Unavailable, undefined, [
    { desc: ErrorInfoSchema, value: { reason: "APPEND_OVERTAKEN", domain: "berth.sessions" } },
    { desc: RetryInfoSchema, value: { retryDelay: { seconds: 0n, nanos: retryMs * 1_000_000 } } },
  ]);
}

type WatchInit = MessageInitShape<typeof WatchSessionResponseSchema>;
const entry = (seq: number): WatchInit => ({ kind: { case: "entries", value: { entries: [{ entry: { seq: BigInt(seq), sessionId: "s", type: "steer" } }] } } });
const caughtUp = (lastSeq: number): WatchInit => ({ kind: { case: "caughtUp", value: { lastSeq: BigInt(lastSeq) } } });

describe("append", () => {
  it("sends a journal event as the typed event, and the conditions as the service names them", async () => {
    const seen: AppendEventRequest[] = [];
    const sessions = client({
      appendEvent(request) {
        seen.push(request);
        return { seq: 1n };
      },
    });
    await sessions.append(
      "s",
      { type: "generate", pageUrl: "/p", count: 3, prompt: "bolder" },
      { expectedSeq: 0, idempotencyKey: "k", fence: { file: "a.css", fencingToken: 7 }, cwd: "/proj" },
    );
    await sessions.append("s", { kind: { case: "steer", value: {} } }, { expectedSeq: 4n });
    await sessions.append("s", { type: "resume" }, { expectedState: ExpectedState.EXISTS });
    expect(seen[0]!.event?.kind).toMatchObject({ case: "generate", value: { pageUrl: "/p", count: 3, extra: { prompt: "bolder" } } });
    expect(seen[0]!.expected).toEqual({ case: "expectedState", value: ExpectedState.NO_SESSION });
    expect(seen[0]!.idempotencyKey).toBe("k");
    expect(seen[0]!.fence).toMatchObject({ file: "/proj/a.css", fencingToken: 7n });
    expect(seen[1]!.event?.kind.case).toBe("steer");
    expect(seen[1]!.expected).toEqual({ case: "expectedSeq", value: 4n });
    expect(seen[2]!.event?.kind).toMatchObject({ case: "other", value: { type: "resume" } });
    expect(seen[2]!.expected).toEqual({ case: "expectedState", value: ExpectedState.EXISTS });
  });

  it("refuses a journal event whose typed key holds another type, as the API does, before sending anything", async () => {
    let calls = 0;
    const sessions = client({
      appendEvent: () => (calls++, { seq: 1n }),
      appendEvents: () => (calls++, { firstSeq: 1n, lastSeq: 2n }),
    });
    await expect(sessions.append("s", { type: "generate", count: "abc" })).rejects.toMatchObject({
      name: "InvalidEventError",
      field: "event.generate.count",
      message: 'event.generate.count: the event\'s "count" must be a whole number from 0 to 4294967295, got "abc"',
    });
    await expect(sessions.appendMany("s", [{ type: "steer" }, { type: "generate", pageUrl: 5 }])).rejects.toMatchObject({
      field: "events[1].generate.page_url",
    });
    expect(calls).toBe(0);
  });

  it("makes an overtaken append again after the delay its RetryInfo asks, and answers the attempt that landed", async () => {
    const attempts: number[] = [];
    const sessions = client({
      appendEvent() {
        attempts.push(performance.now());
        if (attempts.length < 3) throw overtaken(40);
        return { seq: 9n };
      },
    });
    const res = await sessions.append("s", { type: "steer" });
    expect(res.seq).toBe(9n);
    expect(attempts).toHaveLength(3);
    // Never sooner than the service asked (a lower bound only: a busy machine may be later).
    expect(attempts[1]! - attempts[0]!).toBeGreaterThanOrEqual(38);
    expect(attempts[2]! - attempts[1]!).toBeGreaterThanOrEqual(38);
  });

  it("gives up after five attempts in all, with the service's error", async () => {
    let attempts = 0;
    const sessions = client({
      appendEvents() {
        attempts++;
        throw overtaken(1);
      },
    });
    const error = await sessions.appendMany("s", [{ type: "steer" }, { type: "steer" }]).catch((e: unknown) => e);
    expect(attempts).toBe(5);
    expect(error).toBeInstanceOf(BerthClientError);
    expect(error).toMatchObject({ code: Code.Unavailable, reason: "APPEND_OVERTAKEN", retryAfterMs: 1 });
  });

  it("does not retry any other refusal, and its error carries the typed detail", async () => {
    let attempts = 0;
    const sessions = client({
      appendEvent() {
        attempts++;
        throw new ConnectError("expected seq 3, the last is 5", Code.Aborted, undefined, [
          { desc: ErrorInfoSchema, value: { reason: "SEQ_CONFLICT" } },
          { desc: SeqConflictSchema, value: { sessionId: "s", expectedSeq: 3n, currentSeq: 5n } },
        ]);
      },
    });
    const error = (await sessions.append("s", { type: "steer" }, { expectedSeq: 3 }).catch((e: unknown) => e)) as BerthClientError;
    expect(attempts).toBe(1);
    expect(error.reason).toBe("SEQ_CONFLICT");
    expect(error.seqConflict).toEqual(create(SeqConflictSchema, { sessionId: "s", expectedSeq: 3n, currentSeq: 5n }));
  });
});

describe("watch", () => {
  it("yields the backlog, caughtUp and live entries, and resumes where WATCHER_LAGGED says without repeating an entry", async () => {
    const requests: WatchSessionRequest[] = [];
    const sessions = client({
      async *watchSession(request) {
        requests.push(request);
        if (requests.length === 1) {
          yield entry(1);
          yield entry(2);
          yield caughtUp(2);
          yield entry(3);
          throw new ConnectError("the watcher fell behind", Code.ResourceExhausted, undefined, [
            { desc: ErrorInfoSchema, value: { reason: "WATCHER_LAGGED" } },
            { desc: WatcherLaggedSchema, value: { sessionId: "s", resumeFromSeq: 4n } },
          ]);
        }
        yield entry(4);
        yield caughtUp(4);
        yield entry(5);
      },
    });
    const seen: string[] = [];
    for await (const event of sessions.watch("s", { includeSnapshot: true, progressIntervalMs: 500 })) seen.push(label(event));
    expect(seen).toEqual(["entry 1", "entry 2", "caughtUp 2", "live 3", "resumed 4", "entry 4", "caughtUp 4", "live 5"]);
    expect(requests.map((r) => r.fromSeq)).toEqual([0n, 4n]);
    expect(requests[0]!.includeSnapshot).toBe(true);
    expect(requests[0]!.progressInterval).toMatchObject({ seconds: 0n, nanos: 500_000_000 });
  });

  it("passes another error on, and with resume: false a lag too", async () => {
    const lagged = client({
      async *watchSession() {
        throw new ConnectError("lagged", Code.ResourceExhausted, undefined, [{ desc: WatcherLaggedSchema, value: { resumeFromSeq: 2n } }]);
      },
    });
    await expect(drain(lagged.watch("s", { resume: false }))).rejects.toMatchObject({ code: Code.ResourceExhausted, watcherLagged: { resumeFromSeq: 2n } });
    const deleted = client({
      async *watchSession() {
        throw new ConnectError("deleted", Code.NotFound, undefined, [{ desc: ErrorInfoSchema, value: { reason: "SESSION_DELETED" } }]);
      },
    });
    await expect(drain(deleted.watch("s"))).rejects.toMatchObject({ code: Code.NotFound, reason: "SESSION_DELETED" });
  });

  it("ends with CANCELED when its signal aborts, and ends the service's stream", async () => {
    let ended: (() => void) | undefined;
    const streamEnded = new Promise<void>((resolve) => (ended = resolve));
    const sessions = client({
      async *watchSession(_request, context) {
        context.signal.addEventListener("abort", () => ended!());
        yield caughtUp(0);
        await new Promise(() => {});
      },
    });
    const stop = new AbortController();
    const events: string[] = [];
    const error = await (async () => {
      for await (const event of sessions.watch("s", { signal: stop.signal })) {
        events.push(label(event));
        stop.abort();
      }
    })().catch((e: unknown) => e);
    expect(events).toEqual(["caughtUp 0"]);
    expect(error).toBeInstanceOf(BerthClientError);
    expect(error).toMatchObject({ code: Code.Canceled });
    await streamEnded;
  });
});

describe("watch, left early", () => {
  it("ends the service's stream as soon as the loop breaks, deadline or not (nothing of it outlives the loop)", async () => {
    let ended: (() => void) | undefined;
    const streamEnded = new Promise<void>((resolve) => (ended = resolve));
    const sessions = client({
      async *watchSession(_request, context) {
        context.signal.addEventListener("abort", () => ended!());
        yield caughtUp(0);
        await new Promise(() => {});
      },
    });
    for await (const event of sessions.watch("s", { timeoutMs: 60_000 })) {
      expect(event.kind).toBe("caughtUp");
      break;
    }
    await streamEnded;
  });
});

describe("list", () => {
  it("fetches every page", async () => {
    const sessions = client({
      listSessions(request) {
        const page = request.pageToken === "" ? 0 : Number(request.pageToken);
        return { sessions: [{ id: `s${page}` }], nextPageToken: page < 2 ? String(page + 1) : "" };
      },
    });
    const ids: string[] = [];
    for await (const snapshot of sessions.list()) ids.push(snapshot.id);
    expect(ids).toEqual(["s0", "s1", "s2"]);
  });
});

function label(event: SessionWatchEvent): string {
  switch (event.kind) {
    case "entry":
      return `${event.live ? "live" : "entry"} ${event.entry.seq}`;
    case "caughtUp":
      return `caughtUp ${event.lastSeq}`;
    case "progress":
      return `progress ${event.lastSeq}`;
    case "resumed":
      return `resumed ${event.fromSeq}`;
  }
}

async function drain(events: AsyncIterable<unknown>): Promise<void> {
  for await (const _ of events);
}
