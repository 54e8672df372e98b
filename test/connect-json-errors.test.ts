/**
 * Errors over the Connect protocol with JSON over HTTP/1.1, spoken by the real `curl`
 * (connect-json.ts): they come back as Connect's error JSON, `{"code", "message", "details":
 * [{"type", "value", "debug"}]}`, with the HTTP status Connect maps the code to, and a
 * `google.rpc.ErrorInfo` naming the case (every SessionService refusal, unary or at the end of a
 * server stream posted as Connect's enveloped JSON); and the protocol's own refusals (an unknown
 * method, a body that is not JSON or not the message, a streaming RPC posted as unary, another
 * content type) are answered, not hung. What succeeds is connect-json-unary.test.ts's.
 *
 * The budget runs on the fixture machine of budget-e2e.ts, so no verdict depends on this machine.
 */
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { HolderKind, LockHeldSchema, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { FenceRejectedSchema, IdempotencyKeyReusedSchema, SeqConflictSchema, SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import {
  connectError,
  curlServerStream,
  detail,
  expectInvalidArgument,
  refusalOf,
  startConnectJsonServices,
  startItem,
  streamRefusal,
  type Json,
} from "./connect-json.js";
import { closeClient, connectClient, curl, curlJson, startService, stopAll, type CurlJsonResponse } from "./harness.js";

afterAll(stopAll);

let sessionsUrl: string;
let projectRoot: string;
let budget: BudgetUnderTest;

beforeAll(async () => {
  ({ sessionsUrl, projectRoot, budget } = await startConnectJsonServices());
});

describe("errors as Connect's error JSON", () => {
  it("a bad request is HTTP 400 invalid_argument naming the field, with {field, rule} as a decodable detail (several RPCs)", async () => {
    expect(
      await expectInvalidArgument(sessionsUrl, SessionService, "AppendEvent", { sessionId: "no spaces allowed", event: { agentPhase: {} } }, "session_id"),
    ).toMatch(/no spaces allowed/);
    await expectInvalidArgument(sessionsUrl, SessionService, "AppendEvent", { sessionId: "json-bad" }, "event");
    await expectInvalidArgument(sessionsUrl, SessionService, "GetSnapshot", { sessionId: "" }, "session_id");
    await expectInvalidArgument(sessionsUrl, LockService, "Acquire", { file: "", owner: "curl" }, "file");
    await expectInvalidArgument(sessionsUrl, LockService, "Acquire", { file: "/src/a.ts", owner: "" }, "owner");
    await expectInvalidArgument(sessionsUrl, LockService, "Release", { leaseToken: "" }, "lease_token");
    await expectInvalidArgument(sessionsUrl, LockService, "Acquire", { file: "/src/a.ts", owner: "curl", requestId: "not/an/id" }, "request_id");
    await expectInvalidArgument(sessionsUrl, LockService, "KeepAlive", { leaseTokens: [] }, "lease_tokens");
    await expectInvalidArgument(sessionsUrl, LockService, "KeepAlive", { leaseTokens: ["ok", ""] }, "lease_tokens[1]");
    await expectInvalidArgument(
      budget.url,
      BudgetService,
      "Check",
      { need: { items: [{ kind: "NEED_ITEM_KIND_START", name: "x", spec: { memory: "12Q" } }] } },
      "need.items[0].spec.memory",
    );
    await expectInvalidArgument(budget.url, BudgetService, "Reserve", { owner: "", need: { items: [startItem("x", 1)] } }, "owner");
    await expectInvalidArgument(budget.url, BudgetService, "Release", { reservationId: "" }, "reservation_id");
    // Nothing was written by any of them.
    expect((await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/GetSnapshot", { sessionId: "json-bad" })).status).toBe(404);
  });

  it("every SessionService refusal carries its HTTP status, code and ErrorInfo reason, with its typed detail", async () => {
    const id = "json-refusals";
    const post = (method: string, body: unknown) => curlJson(sessionsUrl, `/berth.sessions.v1.SessionService/${method}`, body);
    await post("AppendEvent", { sessionId: id, idempotencyKey: "k", event: { generate: { count: 1 } } });

    // AppendEvent
    expect(refusalOf(await post("AppendEvent", { sessionId: "a b", event: { steer: {} } }))).toEqual([400, "invalid_argument", "INVALID_FIELD"]);
    expect(refusalOf(await post("AppendEvent", { sessionId: id, event: { steer: { pageUrl: "x".repeat(1024 * 1024) } } }))).toEqual([
      400,
      "invalid_argument",
      "EVENT_TOO_LARGE",
    ]);
    const stale = await post("AppendEvent", { sessionId: id, expectedSeq: "4", event: { steer: {} } });
    expect(refusalOf(stale)).toEqual([409, "aborted", "SEQ_CONFLICT"]);
    expect(detail(connectError(stale).details, SeqConflictSchema)).toMatchObject({ sessionId: id, expectedSeq: 4n, currentSeq: 1n });
    expect(JSON.parse(stale.headers["berth-error-details"] ?? "{}")).toMatchObject({ reason: "SEQ_CONFLICT", currentSeq: 1 });
    expect(refusalOf(await post("AppendEvent", { sessionId: id, expectedState: "EXPECTED_STATE_NO_SESSION", event: { steer: {} } }))).toEqual([
      409,
      "aborted",
      "SEQ_CONFLICT",
    ]);
    const reused = await post("AppendEvent", { sessionId: id, idempotencyKey: "k", event: { generate: { count: 2 } } });
    expect(refusalOf(reused)).toEqual([409, "already_exists", "IDEMPOTENCY_KEY_REUSED"]);
    expect(detail(connectError(reused).details, IdempotencyKeyReusedSchema)).toMatchObject({ idempotencyKey: "k", firstSeq: 1n, lastSeq: 1n });
    const file = path.join(projectRoot, "src/json-fenced.ts");
    const { lease } = (await curlJson(sessionsUrl, "/berth.locks.v1.LockService/Acquire", { file, owner: "curl" })).json as { lease: Json };
    await curlJson(sessionsUrl, "/berth.locks.v1.LockService/Release", { leaseToken: lease["leaseToken"] });
    const fenced = await post("AppendEvent", { sessionId: id, event: { steer: {} }, fence: { file, fencingToken: lease["fencingToken"] } });
    expect(refusalOf(fenced)).toEqual([400, "failed_precondition", "FENCE_REJECTED"]);
    expect(detail(connectError(fenced).details, FenceRejectedSchema)).toMatchObject({ file, currentToken: 0n });
    expect(connectError(fenced).details.map((d) => d.type)).not.toContain(RetryInfoSchema.typeName);

    // AppendEvents
    const tooMany = JSON.stringify({ sessionId: id, events: Array.from({ length: 10_001 }, () => ({ steer: {} })) });
    expect(refusalOf(await post("AppendEvents", tooMany))).toEqual([400, "invalid_argument", "TOO_MANY_EVENTS"]);
    expect(refusalOf(await post("AppendEvents", { sessionId: id, expectedSeq: "9", events: [{ steer: {} }] }))).toEqual([409, "aborted", "SEQ_CONFLICT"]);
    expect(refusalOf(await post("AppendEvents", { sessionId: id, idempotencyKey: "k", events: [{ steer: {} }] }))).toEqual([
      409,
      "already_exists",
      "IDEMPOTENCY_KEY_REUSED",
    ]);

    // GetSnapshot, ListSessions, FlushSnapshot, DeleteSession
    expect(refusalOf(await post("GetSnapshot", { sessionId: "json-never" }))).toEqual([404, "not_found", "SESSION_NOT_FOUND"]);
    expect(refusalOf(await post("ListSessions", { pageToken: "not-one" }))).toEqual([400, "invalid_argument", "INVALID_FIELD"]);
    expect(refusalOf(await post("ListSessions", { pageSize: -1 }))).toEqual([400, "invalid_argument", "INVALID_FIELD"]);
    expect(refusalOf(await post("FlushSnapshot", { sessionId: "json-never" }))).toEqual([404, "not_found", "SESSION_NOT_FOUND"]);
    expect(refusalOf(await post("DeleteSession", { sessionId: id, expectedSeq: "3" }))).toEqual([409, "aborted", "SEQ_CONFLICT"]);
    expect(refusalOf(await post("DeleteSession", { sessionId: "json-never" }))).toEqual([404, "not_found", "SESSION_NOT_FOUND"]);
    // Nothing of it was written.
    expect((await post("GetSnapshot", { sessionId: id })).json).toMatchObject({ lastSeq: "1" });
  });

  it("server streams over Connect's streaming JSON: ReadJournal's end, its NOT_FOUND and OUT_OF_RANGE, a watch ended by a deletion", async () => {
    const S = SessionService;
    const id = "json-stream";
    await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/AppendEvents", { sessionId: id, events: [{ generate: {} }, { steer: {} }, { steer: {} }] });
    const read = await curlServerStream(sessionsUrl, S, "ReadJournal", { sessionId: id, fromSeq: "2", limit: 1 });
    expect(read.messages).toMatchObject([{ entries: [{ seq: "2", type: "steer" }], end: { lastSeq: "3", nextSeq: "3", more: true } }]);
    expect(read.end).toEqual({});
    expect((await curlServerStream(sessionsUrl, S, "ReadJournal", { sessionId: id, fromSeq: "4" })).messages).toEqual([
      { end: { lastSeq: "3", nextSeq: "4" } },
    ]);
    expect(streamRefusal((await curlServerStream(sessionsUrl, S, "ReadJournal", { sessionId: id, fromSeq: "5" })).end)).toEqual([
      "out_of_range",
      "SEQ_OUT_OF_RANGE",
    ]);
    expect(streamRefusal((await curlServerStream(sessionsUrl, S, "ReadJournal", { sessionId: "json-none" })).end)).toEqual(["not_found", "SESSION_NOT_FOUND"]);
    expect(streamRefusal((await curlServerStream(sessionsUrl, S, "WatchSession", { sessionId: id, maxBatch: -1 })).end)).toEqual([
      "invalid_argument",
      "INVALID_FIELD",
    ]);
    expect(streamRefusal((await curlServerStream(sessionsUrl, S, "WatchSessions", { resumeFrom: { "a b": "1" } })).end)).toEqual([
      "invalid_argument",
      "INVALID_FIELD",
    ]);

    // A watch that a deletion ends: the backlog, caught_up, then NOT_FOUND SESSION_DELETED.
    const watchers = () => curl(sessionsUrl, "/metrics").then((r) => Number(/^berth_sessions_watchers (\d+)$/m.exec(r.body)?.[1]));
    const before = await watchers();
    const watching = curlServerStream(sessionsUrl, S, "WatchSession", { sessionId: id });
    for (let turn = 0; (await watchers()) <= before; turn++) if (turn > 500) throw new Error("the watch never started");
    await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/DeleteSession", { sessionId: id });
    const watched = await watching;
    expect(watched.messages).toMatchObject([
      { entries: { entries: [{ entry: { seq: "1" } }, { entry: { seq: "2" } }, { entry: { seq: "3" } }] } },
      { caughtUp: { lastSeq: "3" } },
    ]);
    expect(streamRefusal(watched.end)).toEqual(["not_found", "SESSION_DELETED"]);
  });

  it("an idle watch hears progress over Connect JSON, and WatchSessions its deletions", async () => {
    const client = connectClient(SessionService, sessionsUrl, { protocol: "connect", useBinaryFormat: false, defaultTimeoutMs: 30_000 });
    const controller = new AbortController();
    const one = client
      .watchSession({ sessionId: "json-idle", progressInterval: { seconds: 0n, nanos: 100_000_000 } }, { signal: controller.signal })
      [Symbol.asyncIterator]();
    expect((await one.next()).value!.kind).toMatchObject({ case: "caughtUp", value: { lastSeq: 0n } });
    expect((await one.next()).value!.kind).toMatchObject({ case: "progress", value: { lastSeq: 0n } });
    const all = client.watchSessions({ progressInterval: { seconds: 0n, nanos: 100_000_000 } }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect((await all.next()).value!.kind.case).toBe("progress");
    await client.appendEvent({ sessionId: "json-idle", event: { kind: { case: "steer", value: {} } } });
    await client.deleteSession({ sessionId: "json-idle" });
    const seen: Array<[string | undefined, boolean | undefined]> = [];
    while (seen.length < 2) {
      const kind = (await all.next()).value!.kind;
      if (kind.case === "change") seen.push([kind.value.sessionId, kind.value.deleted]);
    }
    expect(seen).toEqual([
      ["json-idle", false],
      ["json-idle", true],
    ]);
    controller.abort();
    closeClient(client);
  });

  it("other codes carry Connect's HTTP status and their typed details: not_found 404, resource_exhausted 429 (LockHeld), failed_precondition 400 (Refusal)", async () => {
    const missing = await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/FlushSnapshot", { sessionId: "json-never" });
    expect(missing.status).toBe(404);
    expect(connectError(missing).code).toBe("not_found");

    const file = path.join(projectRoot, "src/held.ts");
    const held = (await curlJson(sessionsUrl, "/berth.locks.v1.LockService/Acquire", { file, owner: "first" })).json as { lease: Json };
    const refused = await curlJson(sessionsUrl, "/berth.locks.v1.LockService/Acquire", { file, owner: "second", maxWait: "0.2s" });
    expect(refused.status).toBe(429);
    const exhausted = connectError(refused);
    expect(exhausted.code).toBe("resource_exhausted");
    expect(exhausted.message).toMatch(/^source locked: .*held\.ts is held by first .*; it stayed locked for the whole wait of 200ms/);
    expect(detail(exhausted.details, ErrorInfoSchema)).toMatchObject({ reason: "WAIT_EXHAUSTED", domain: "berth.locks" });
    expect(detail(exhausted.details, RetryInfoSchema).retryDelay).toMatchObject({ seconds: 1n, nanos: 0 });
    expect(detail(exhausted.details, LockHeldSchema)).toMatchObject({
      owner: "first",
      fencingToken: BigInt(String(held.lease["fencingToken"])),
      kind: HolderKind.LEASE,
      waited: { seconds: 0n, nanos: 200_000_000 },
    });
    expect(JSON.parse(refused.headers["berth-error-details"] ?? "{}")).toMatchObject({ reason: "WAIT_EXHAUSTED", owner: "first", waitedMs: 200 });
    await curlJson(sessionsUrl, "/berth.locks.v1.LockService/Release", { leaseToken: held.lease["leaseToken"] });

    const impossible = await curlJson(budget.url, "/berth.budget.v1.BudgetService/Reserve", { owner: "huge", need: { items: [startItem("huge", 5)] } });
    expect(impossible.status).toBe(400);
    const precondition = connectError(impossible);
    expect(precondition.code).toBe("failed_precondition");
    expect(detail(precondition.details, RefusalSchema).kind).toBe(RefusalKind.IMPOSSIBLE);
  });

  it("a full lock queue is resource_exhausted 429 TOO_MANY_WAITERS with a RetryInfo", async () => {
    const small = await startService("sessions", { args: ["--lock-max-waiters", "1"] });
    try {
      const url = small.url("sessions");
      const file = path.join(projectRoot, "src/crowded.ts");
      const held = (await curlJson(url, "/berth.locks.v1.LockService/Acquire", { file, owner: "first" })).json as { lease: Json };
      // One waiter fills the queue (a Connect client: curl would block on it).
      const locks = connectClient(LockService, url, { protocol: "connect", useBinaryFormat: false, defaultTimeoutMs: 30_000 });
      const queued = locks.acquire({ file, owner: "waiter", maxWait: { seconds: 20n } });
      for (
        const deadline = Date.now() + 10_000;
        ((await curlJson(url, "/berth.locks.v1.LockService/Inspect", { file })).json as { waiters?: unknown[] }).waiters === undefined;
      ) {
        if (Date.now() > deadline) throw new Error("the waiter never queued");
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const refused = await curlJson(url, "/berth.locks.v1.LockService/Acquire", { file, owner: "third", maxWait: "20s" });
      expect(refused.status).toBe(429);
      const error = connectError(refused);
      expect(error.code).toBe("resource_exhausted");
      expect(detail(error.details, ErrorInfoSchema)).toMatchObject({ reason: "TOO_MANY_WAITERS", domain: "berth.locks" });
      expect(detail(error.details, RetryInfoSchema).retryDelay).toMatchObject({ seconds: 1n });
      expect(error.details.map((d) => d.type)).not.toContain(LockHeldSchema.typeName);
      await curlJson(url, "/berth.locks.v1.LockService/Release", { leaseToken: held.lease["leaseToken"] });
      await locks.release({ leaseToken: (await queued).lease!.leaseToken });
    } finally {
      await small.stop();
    }
  });

  it("a Hold released through Release by its owner ends OK, and /metrics counts it ok (a Connect JSON stream over HTTP/1.1)", async () => {
    const locks = connectClient(LockService, sessionsUrl, { protocol: "connect", useBinaryFormat: false, httpVersion: "1.1", defaultTimeoutMs: 30_000 });
    const file = path.join(projectRoot, "src/released.ts");
    const holds = async (code: string) => {
      const line = new RegExp(`^berth_rpc_requests_total\\{method="/berth\\.locks\\.v1\\.LockService/Hold",code="${code}"\\} (\\d+)$`, "m");
      return Number(line.exec((await curl(sessionsUrl, "/metrics")).body)?.[1] ?? 0);
    };
    const [okBefore, failedBefore] = [await holds("ok"), await holds("failed_precondition")];
    const kinds: string[] = [];
    for await (const message of locks.hold({ file, owner: "json-stream" })) {
      kinds.push(message.kind.case ?? "");
      if (message.kind.case !== "acquired") continue;
      const released = await curlJson(sessionsUrl, "/berth.locks.v1.LockService/Release", { leaseToken: message.kind.value.leaseToken });
      expect(released.json).toEqual({ released: true });
    }
    // The loop ended without an error: the stream ended OK, right after the Release.
    expect(kinds).toEqual(["acquired"]);
    await vi.waitFor(async () => expect(await holds("ok")).toBe(okBefore + 1));
    expect(await holds("failed_precondition")).toBe(failedBefore);
  });

  it("the budget's errors carry an ErrorInfo naming the case, and a RetryInfo where a retry can succeed", async () => {
    const full = await startBudget({ args: ["--max-queue=0", "--max-lease-ttl=10m"] });
    const post = (method: string, body: unknown) => curlJson(full.url, `/berth.budget.v1.BudgetService/${method}`, body);
    /** The error's code, its ErrorInfo reason and domain, its RetryInfo delay (ms), and the berth-error-details header's reason. */
    const errorOf = async (response: CurlJsonResponse) => {
      const error = connectError(response);
      const info = detail(error.details, ErrorInfoSchema);
      const retry = error.details.some((d) => d.type === RetryInfoSchema.typeName) ? detail(error.details, RetryInfoSchema).retryDelay : undefined;
      const header = JSON.parse(response.headers["berth-error-details"] ?? "{}") as Json;
      return {
        code: error.code,
        reason: info.reason,
        domain: info.domain,
        retryMs: retry === undefined ? undefined : Number(retry.seconds) * 1000 + retry.nanos / 1e6,
        header: header["reason"],
        details: error.details,
      };
    };

    expect(await errorOf(await post("Reserve", { owner: "huge", need: { items: [startItem("huge", 5)] } }))).toMatchObject({
      code: "failed_precondition",
      reason: "IMPOSSIBLE",
      domain: "berth.budget",
      retryMs: undefined,
      header: "IMPOSSIBLE",
    });
    const held = ((await post("Reserve", { owner: "holder", need: { items: [startItem("a", 3)] } })).json as { reservation: Json }).reservation;
    const queueFull = await errorOf(await post("Reserve", { owner: "late", need: { items: [startItem("b", 2)] } }));
    expect(queueFull).toMatchObject({ code: "resource_exhausted", reason: "QUEUE_FULL", domain: "berth.budget", header: "QUEUE_FULL" });
    expect(queueFull.retryMs).toBeGreaterThan(0);
    expect(detail(queueFull.details, RefusalSchema).kind).toBe(RefusalKind.QUEUE_FULL);
    const noWait = await errorOf(await post("Reserve", { owner: "now", need: { items: [startItem("b", 2)] }, maxWait: "0s" }));
    expect(noWait).toMatchObject({ code: "resource_exhausted", reason: "WAIT_EXHAUSTED", domain: "berth.budget", header: "WAIT_EXHAUSTED" });
    expect(noWait.retryMs).toBeGreaterThan(0);
    expect(detail(noWait.details, RefusalSchema).kind).toBe(RefusalKind.WAIT_EXHAUSTED);

    await post("Release", { reservationId: held["id"] });
    const gone = await post("ReleaseBuild", { reservationId: held["id"] });
    expect(gone.status).toBe(404);
    expect(await errorOf(gone)).toMatchObject({ code: "not_found", reason: "RESERVATION_NOT_FOUND", domain: "berth.budget", header: "RESERVATION_NOT_FOUND" });
    expect(await errorOf(await post("RegisterRunning", { name: "web", reservationId: held["id"] }))).toMatchObject({
      code: "not_found",
      reason: "RESERVATION_NOT_FOUND",
    });
    for (const [method, body, field] of [
      ["Reserve", { owner: "x", ttl: "601s" }, "ttl"],
      ["Reserve", { owner: "x", requestId: "not/ok" }, "request_id"],
      ["GetState", { pageSize: -1 }, "page_size"],
      ["ListQueue", { pageToken: "bm9wZQ" }, "page_token"],
    ] as const) {
      expect(await errorOf(await post(method, body)), `${method} ${field}`).toMatchObject({
        code: "invalid_argument",
        reason: "INVALID_FIELD",
        domain: "berth.budget",
      });
      await expectInvalidArgument(full.url, BudgetService, method, body, field);
    }
    await full.service.stop();
  });

  it("a relative lock path is 400 invalid_argument naming file and saying what to send, in every lock RPC and a fence", async () => {
    const relative = "../project/src/app.css";
    const rule = `must be an absolute path; resolve it against your working directory before sending, got ${JSON.stringify(relative)}`;
    expect(await expectInvalidArgument(sessionsUrl, LockService, "Acquire", { file: relative, owner: "curl" }, "file")).toBe(`file: ${rule}`);
    expect(await expectInvalidArgument(sessionsUrl, LockService, "Inspect", { file: relative }, "file")).toBe(`file: ${rule}`);
    expect(await expectInvalidArgument(sessionsUrl, LockService, "CheckToken", { file: relative, fencingToken: "1" }, "file")).toBe(`file: ${rule}`);
    const fenced = { sessionId: "json-fence", event: { agentPhase: { phase: "x" } }, fence: { file: relative, fencingToken: "1" } };
    expect(await expectInvalidArgument(sessionsUrl, SessionService, "AppendEvent", fenced, "fence.file")).toBe(`fence.file: ${rule}`);
    // The same facts in the trailer-like header every error carries for JSON clients.
    const response = await curlJson(sessionsUrl, "/berth.locks.v1.LockService/Acquire", { file: "src/app.css", owner: "curl" });
    expect(JSON.parse(response.headers["berth-error-details"] ?? "{}")).toMatchObject({ field: "file" });
    expect((await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/GetSnapshot", { sessionId: "json-fence" })).status).toBe(404);
  });

  it("a body that is not JSON, or not the message, is 400 invalid_argument MALFORMED_REQUEST", async () => {
    for (const body of ['{"sessionId":', "[]", '{"sessionId": 5}', "not json at all"]) {
      const response = await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/GetSnapshot", body);
      expect(refusalOf(response), body).toEqual([400, "invalid_argument", "MALFORMED_REQUEST"]);
      expect(connectError(response).message).toMatch(/^the request did not decode: cannot decode (message|field) berth\.sessions\.v1\.GetSnapshotRequest/);
    }
    const badInt = await curlJson(sessionsUrl, "/berth.locks.v1.LockService/CheckToken", { file: "a", fencingToken: "twelve" });
    expect(refusalOf(badInt, "berth.locks")).toEqual([400, "invalid_argument", "MALFORMED_REQUEST"]);
    const badEnum = await curlJson(budget.url, "/berth.budget.v1.BudgetService/Check", { need: { items: [{ kind: "NEED_ITEM_KIND_NOPE", name: "x" }] } });
    expect(refusalOf(badEnum, "berth.budget")).toEqual([400, "invalid_argument", "MALFORMED_REQUEST"]);
  });

  it("a misspelled field is refused, naming it, and writes nothing (it would have turned a check off)", async () => {
    const session = "misspelled-field";
    const response = await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/AppendEvent", {
      sessionId: session,
      expectedSequence: 7,
      event: { generate: { count: 1 } },
    });
    expect(refusalOf(response)).toEqual([400, "invalid_argument", "UNKNOWN_FIELD"]);
    expect(connectError(response).message).toMatch(/^expectedSequence: no such field in berth\.sessions\.v1\.AppendEventRequest/);
    const has = await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/GetSnapshot", { sessionId: session });
    expect(has.status).toBe(404);
  });

  it("an unknown method or service is 404; a server stream posted as unary JSON, or another content type, is 415; a bidi stream over HTTP/1.1 is 505", async () => {
    // A session of three entries written before the refusals, read back after them.
    const seeded = await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/AppendEvents", {
      sessionId: "json-tour",
      events: [
        { generate: { pageUrl: "http://localhost:3000/", count: 2 } },
        { agentPhase: { phase: "planning" } },
        { variantsReady: { sourceFile: "src/App.tsx" } },
      ],
    });
    expect(seeded.status, seeded.body).toBe(200);
    for (const route of [
      "/berth.sessions.v1.SessionService/NoSuchMethod",
      "/berth.sessions.v1.NoSuchService/GetSnapshot",
      "/berth.budget.v1.BudgetService/Admitt",
    ]) {
      const url = route.includes("budget") ? budget.url : sessionsUrl;
      expect((await curlJson(url, route, {})).status, route).toBe(404);
    }
    // Server streams speak application/connect+json (enveloped), never plain application/json.
    expect((await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/WatchSession", { sessionId: "x" })).status).toBe(415);
    // A bidi stream needs HTTP/2 whatever the content type: 505 over HTTP/1.1.
    expect((await curlJson(budget.url, "/berth.budget.v1.BudgetService/Admit", {})).status).toBe(505);
    const textPlain = await curl(sessionsUrl, "/berth.sessions.v1.SessionService/GetSnapshot", {
      method: "POST",
      headers: { "content-type": "text/plain" },
      body: '{"sessionId":"x"}',
    });
    expect(textPlain.status).toBe(415);
    // And the service still answers.
    expect((await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/GetSnapshot", { sessionId: "json-tour" })).json).toMatchObject({ lastSeq: "3" });
  });
});
