/**
 * The Connect protocol with JSON over HTTP/1.1, spoken by the real `curl`: every
 * unary RPC of SessionService, LockService and BudgetService answers a representative request in
 * proto3 JSON (the set of RPCs called is checked against the generated descriptors, so a unary
 * RPC added later without a call here fails this file); errors come back as Connect's error JSON,
 * `{"code", "message", "details": [{"type", "value", "debug"}]}`, with the HTTP status Connect maps
 * the code to, and a `google.rpc.ErrorInfo` naming the case (every SessionService refusal, unary
 * or at the end of a server stream posted as Connect's enveloped JSON); and the protocol's own
 * refusals (an unknown method, a body that is not JSON or not the message, a streaming RPC posted
 * as unary, another content type) are answered, not hung.
 *
 * The budget runs on the fixture machine of budget-e2e.ts, so no verdict depends on this machine.
 */
import { mkdirSync } from "node:fs";
import * as path from "node:path";
import { fromBinary, toJson, type DescMessage } from "@bufbuild/protobuf";
import { StructSchema } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { HolderKind, LockHeldSchema, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { FenceRejectedSchema, IdempotencyKeyReusedSchema, SeqConflictSchema, SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { MethodOptions_IdempotencyLevel } from "@bufbuild/protobuf/wkt";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { G, startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import { closeClient, connectClient, curl, curlJson, makeTempDir, startService, stopAll, type CurlJsonResponse, type CurlResponse } from "./harness.js";

afterAll(stopAll);

type Json = Record<string, unknown>;

const SERVICES = [SessionService, LockService, BudgetService];
const called = new Set<string>();

let sessionsUrl: string;
let projectRoot: string;
let budget: BudgetUnderTest;

beforeAll(async () => {
  projectRoot = path.join(makeTempDir("berth-connect-json-"), "project");
  mkdirSync(projectRoot, { recursive: true });
  const [sessions, started] = await Promise.all([startService("sessions"), startBudget()]);
  sessionsUrl = sessions.url("sessions");
  budget = started;
});

/** POSTs `body` as JSON to `/<service>/<method>` with curl, noting the RPC as called. */
async function call(url: string, service: { typeName: string }, method: string, body: unknown): Promise<CurlJsonResponse> {
  called.add(`${service.typeName}/${method}`);
  return curlJson(url, `/${service.typeName}/${method}`, body);
}

/** A successful unary answer: 200, JSON, the message as an object. */
async function ok(url: string, service: { typeName: string }, method: string, body: unknown): Promise<Json> {
  const response = await call(url, service, method, body);
  expect(response.status, `${method}: ${response.body}`).toBe(200);
  expect(response.headers["content-type"]).toMatch(/^application\/json/);
  expect(typeof response.json).toBe("object");
  return response.json as Json;
}

/** One entry of a Connect error's `details`. */
interface ErrorDetail {
  type: string;
  value: string;
  debug?: unknown;
}

/** Connect's error JSON, checked for its shape: a code, a message, and details (when any) that decode. */
function connectError(response: CurlJsonResponse): { code: string; message: string; details: ErrorDetail[] } {
  expect(response.headers["content-type"]).toMatch(/^application\/json/);
  const json = response.json as { code?: unknown; message?: unknown; details?: unknown };
  expect(typeof json.code, response.body).toBe("string");
  expect(typeof json.message).toBe("string");
  expect(
    Object.keys(json).every((key) => ["code", "message", "details"].includes(key)),
    `unexpected keys in ${response.body}`,
  ).toBe(true);
  const details = (json.details ?? []) as ErrorDetail[];
  expect(Array.isArray(details)).toBe(true);
  for (const detail of details) {
    expect(typeof detail.type).toBe("string");
    // base64 (padding optional, as Connect allows).
    expect(detail.value).toMatch(/^[A-Za-z0-9+/_-]*={0,2}$/);
  }
  return { code: json.code as string, message: json.message as string, details };
}

/** The detail of `type` decoded from its base64 `value` (not from `debug`, which clients may not get). */
function detail<S extends DescMessage>(details: ErrorDetail[], schema: S) {
  const found = details.find((d) => d.type === schema.typeName);
  if (found === undefined) throw new Error(`no ${schema.typeName} detail in ${JSON.stringify(details.map((d) => d.type))}`);
  return fromBinary(schema, Buffer.from(found.value, "base64"));
}

/** A unary refusal's HTTP status, code and ErrorInfo reason (the ErrorInfo decoded from its base64 value, its domain checked). */
function refusalOf(response: CurlJsonResponse, domain = "berth.sessions"): [number, string, string] {
  const error = connectError(response);
  const info = detail(error.details, ErrorInfoSchema);
  expect(info.domain).toBe(domain);
  return [response.status, error.code, info.reason];
}

/**
 * A server-streaming call as Connect's streaming JSON over HTTP/1.1 with curl: the request in one
 * envelope (flags, 4-byte length, JSON), the answer as its envelopes (the last one, flagged
 * end-stream, holds `error` when the stream failed). Requests are kept under 128 bytes, so their
 * length prefix is plain ASCII on the way in.
 */
async function curlServerStream(url: string, service: { typeName: string }, method: string, body: unknown): Promise<{ messages: Json[]; end: Json }> {
  const json = JSON.stringify(body);
  expect(json.length).toBeLessThan(128);
  const response = await curl(url, `/${service.typeName}/${method}`, {
    method: "POST",
    headers: { "content-type": "application/connect+json" },
    body: `\u0000\u0000\u0000\u0000${String.fromCharCode(json.length)}${json}`,
  });
  expect(response.status, response.body).toBe(200);
  expect(response.headers["content-type"]).toMatch(/^application\/connect\+json/);
  return streamFrames(response);
}

/**
 * The envelopes of a streamed answer. curl's output arrives as text: each 5-byte prefix stays 5
 * characters (a byte that is not UTF-8 becomes one U+FFFD), and each message is one JSON object,
 * whose end is found by matching its braces outside strings.
 */
function streamFrames(response: CurlResponse): { messages: Json[]; end: Json } {
  const text = response.body;
  const messages: Json[] = [];
  let at = 0;
  while (at < text.length) {
    const flags = text.charCodeAt(at);
    const start = at + 5;
    let depth = 0;
    let inString = false;
    let stop = start;
    for (; stop < text.length; stop++) {
      const c = text[stop];
      if (inString) {
        if (c === "\\") stop++;
        else if (c === '"') inString = false;
      } else if (c === '"') inString = true;
      else if (c === "{") depth++;
      else if (c === "}" && --depth === 0) break;
    }
    const message = JSON.parse(text.slice(start, stop + 1)) as Json;
    if ((flags & 0x02) !== 0) return { messages, end: message };
    messages.push(message);
    at = stop + 1;
  }
  throw new Error(`no end-stream message in ${JSON.stringify(text)}`);
}

/** The code and ErrorInfo reason a streamed answer ended with. */
function streamRefusal(end: Json): [string, string] {
  const error = end["error"] as { code: string; details?: ErrorDetail[] };
  const info = detail(error.details ?? [], ErrorInfoSchema);
  expect(info.domain).toBe("berth.sessions");
  return [error.code, info.reason];
}

/** A refusal of a malformed request: HTTP 400, `invalid_argument`, the message naming the field, `{field, rule}` as a Struct detail. */
async function expectInvalidArgument(url: string, service: { typeName: string }, method: string, body: unknown, field: string): Promise<string> {
  const response = await curlJson(url, `/${service.typeName}/${method}`, body);
  expect(response.status, `${method}: ${response.body}`).toBe(400);
  const error = connectError(response);
  expect(error.code).toBe("invalid_argument");
  expect(error.message.startsWith(`${field}: `), `${method}: "${error.message}" should start with "${field}: "`).toBe(true);
  const struct = toJson(StructSchema, detail(error.details, StructSchema)) as Json;
  expect(struct["field"]).toBe(field);
  expect(error.message).toBe(`${field}: ${String(struct["rule"])}`);
  return error.message;
}

const startItem = (name: string, memoryGb: number) => ({ kind: "NEED_ITEM_KIND_START", name, cost: { memoryBytes: String(memoryGb * G), cpu: 1 } });

describe("every unary RPC answers JSON over HTTP/1.1 (curl)", () => {
  it("SessionService: AppendEvent, AppendEvents, GetSnapshot, ListSessions (paged), FlushSnapshot, DeleteSession, GetLimits", async () => {
    const S = SessionService;
    const id = "json-tour";

    const appended = await ok(sessionsUrl, S, "AppendEvent", {
      sessionId: id,
      expectedState: "EXPECTED_STATE_NO_SESSION",
      idempotencyKey: "first",
      event: { generate: { pageUrl: "http://localhost:3000/", count: 2 } },
    });
    // int64 as a JSON string, the snapshot in the journal's own key names.
    expect(appended).toMatchObject({ seq: "1", snapshot: { id, phase: "generate_requested", pageUrl: "http://localhost:3000/", expectedVariants: 2 } });
    // proto3 JSON takes the field's proto name as well as its JSON name.
    const retried = await ok(sessionsUrl, S, "AppendEvent", {
      session_id: id,
      idempotency_key: "first",
      event: { generate: { page_url: "http://localhost:3000/", count: 2 } },
    });
    expect(retried).toMatchObject({ seq: "1", duplicate: true });

    const batch = await ok(sessionsUrl, S, "AppendEvents", {
      sessionId: id,
      expectedSeq: "1",
      events: [{ agentPhase: { phase: "planning" } }, { variantsReady: { sourceFile: "src/App.tsx", extra: { note: "from curl" } } }],
    });
    expect(batch).toMatchObject({ firstSeq: "2", lastSeq: "3", snapshot: { phase: "variants_ready", sourceFile: "src/App.tsx" } });

    const snapshot = await ok(sessionsUrl, S, "GetSnapshot", { sessionId: id });
    expect(snapshot).toMatchObject({ lastSeq: "3", snapshot: { id, phase: "variants_ready" } });
    expect(Date.parse(String((snapshot["snapshot"] as Json)["updatedAt"]))).toBeGreaterThan(0);
    await ok(sessionsUrl, S, "AppendEvent", { sessionId: `${id}-2`, event: { steer: {} } });
    const listed = await ok(sessionsUrl, S, "ListSessions", {});
    expect((listed["sessions"] as Json[]).map((s) => s["id"])).toEqual(expect.arrayContaining([id, `${id}-2`]));
    expect(listed).not.toHaveProperty("nextPageToken");
    const first = await ok(sessionsUrl, S, "ListSessions", { pageSize: 1 });
    expect(first["nextPageToken"]).toMatch(/^[A-Za-z0-9_-]+$/);
    const rest = await ok(sessionsUrl, S, "ListSessions", { pageSize: 1000, pageToken: first["nextPageToken"] });
    expect([...(first["sessions"] as Json[]), ...(rest["sessions"] as Json[])].map((s) => s["id"])).toEqual((listed["sessions"] as Json[]).map((s) => s["id"]));
    expect(await ok(sessionsUrl, S, "FlushSnapshot", { sessionId: id })).toMatchObject({ lastSeq: "3", snapshot: { phase: "variants_ready" } });
    expect(await ok(sessionsUrl, S, "GetLimits", {})).toMatchObject({
      maxEventBytes: String(1024 * 1024),
      maxEventsPerAppend: 10000,
      watchBuffer: 1000,
      maxPageSize: 1000,
      maxIdempotencyKeyLength: 128,
    });
    expect(await ok(sessionsUrl, S, "DeleteSession", { sessionId: `${id}-2`, expectedSeq: "1" })).toEqual({ lastSeq: "1" });
  });

  it("LockService: Acquire (with a request_id), KeepAlive, GetLimits, Inspect, CheckToken, Release", async () => {
    const L = LockService;
    const file = path.join(projectRoot, "src/json.ts");
    const { lease } = (await ok(sessionsUrl, L, "Acquire", { file, owner: "curl", ttl: "20s", requestId: "curl-1" })) as { lease: Json };
    expect(lease).toMatchObject({ file, owner: "curl", fencingToken: "1", ttl: "20s" });
    const expires = Date.parse(String(lease["expireTime"]));
    expect(expires).toBeGreaterThan(Date.parse(String(lease["acquireTime"])));
    // A retried Acquire (its answer lost) answers the same lease, in the proto's field names too.
    expect(await ok(sessionsUrl, L, "Acquire", { file, owner: "curl", ttl: "20s", max_wait: "0s", request_id: "curl-1" })).toEqual({ lease });

    // Renewing a lease needs no HTTP/2: unary KeepAlive, one answer per token in order.
    const renewed = (await ok(sessionsUrl, L, "KeepAlive", { leaseTokens: [lease["leaseToken"], "gone"] })) as { renewals: Json[] };
    expect(renewed.renewals).toEqual([{ leaseToken: lease["leaseToken"], alive: true, expireTime: expect.any(String) }, { leaseToken: "gone" }]);
    expect(Date.parse(String(renewed.renewals[0]!["expireTime"]))).toBeGreaterThanOrEqual(expires);

    expect(await ok(sessionsUrl, L, "GetLimits", {})).toEqual({
      defaultTtl: "30s",
      maxTtl: "3600s",
      maxWait: "600s",
      heartbeatInterval: "5s",
      maxWaitersPerFile: 10000,
      maxOwnerLength: 256,
      idempotencyWindow: "3600s",
      watchHistory: 4000,
    });
    const inspected = await ok(sessionsUrl, L, "Inspect", { file });
    // Enums by name.
    expect(inspected).toMatchObject({ file, lastFencingToken: "1", holder: { owner: "curl", kind: "HOLDER_KIND_LEASE", fencingToken: "1" } });
    expect(await ok(sessionsUrl, L, "CheckToken", { file, fencingToken: "1" })).toEqual({ current: true, currentToken: "1", file });
    expect(await ok(sessionsUrl, L, "Release", { leaseToken: lease["leaseToken"] })).toEqual({ released: true });
    expect(await ok(sessionsUrl, L, "CheckToken", { file, fencingToken: "1" })).toEqual({ file });
    expect(await ok(sessionsUrl, L, "KeepAlive", { leaseTokens: [lease["leaseToken"]] })).toEqual({ renewals: [{ leaseToken: lease["leaseToken"] }] });
  });

  it("BudgetService: Check, Costs, GetMachine, GetLimits, Reserve (and its repeat), KeepAlive, ReleaseBuild, RegisterRunning, GetState, the List RPCs, StopRunning, Release", async () => {
    const B = BudgetService;
    const url = budget.url;
    const check = await ok(url, B, "Check", { need: { items: [startItem("web", 1)] } });
    expect(check).toMatchObject({ verdict: { fits: true, policy: { memoryBytes: String(4 * G), cpu: 4 } } });

    expect(await ok(url, B, "Costs", { spec: { memory: "1G", cpu: 2, build: { memory: "2G" } } })).toMatchObject({
      run: { memoryBytes: String(G), cpu: 2, declared: true },
      build: { memoryBytes: String(2 * G) },
    });
    expect(await ok(url, B, "GetMachine", {})).toMatchObject({ machine: { totalBytes: String(16 * G), source: "SAMPLE_SOURCE_HOST" } });
    expect(await ok(url, B, "GetLimits", {})).toEqual({
      defaultTtl: "30s",
      maxTtl: "3600s",
      maxWait: "600s",
      heartbeatInterval: "5s",
      maxQueue: 1000,
      maxOwnerLength: 256,
      idempotencyWindow: "3600s",
      admitResumeGrace: "15s",
    });

    const asked = {
      owner: "curl",
      need: { items: [startItem("api", 1), { kind: "NEED_ITEM_KIND_BUILD", name: "api", spec: { build: { memory: "1G" } } }] },
      ttl: "60s",
      requestId: "curl-tour-1",
    };
    const { reservation } = (await ok(url, B, "Reserve", asked)) as { reservation: Json };
    const id = String(reservation["id"]);
    expect(reservation).toMatchObject({ owner: "curl", start: { memoryBytes: String(G) }, build: { memoryBytes: String(G) } });
    expect(Date.parse(String(reservation["expireTime"]))).toBeGreaterThan(Date.now());
    // A retry with the same request id answers the same reservation.
    expect(((await ok(url, B, "Reserve", asked)) as { reservation: Json }).reservation["id"]).toBe(id);

    const renewed = (await ok(url, B, "KeepAlive", { ids: [id] })) as { renewals: Json[] };
    expect(renewed.renewals).toMatchObject([{ id, alive: true }]);
    expect(await ok(url, B, "ReleaseBuild", { reservationId: id })).toMatchObject({ reservation: { id, start: { memoryBytes: String(G) } } });

    const registered = (await ok(url, B, "RegisterRunning", {
      name: "api",
      reservationId: id,
      pid: process.pid,
      cost: { memoryBytes: String(G), cpu: 1 },
    })) as { running: Json };
    expect(registered.running).toMatchObject({ name: "api", pid: process.pid, reservationId: id });
    const state = await ok(url, B, "GetState", { pageSize: 1 });
    expect(state).toMatchObject({
      running: [{ name: "api" }],
      reservations: [{ id }],
      policy: { queueMode: "QUEUE_MODE_FIFO" },
      reservationCount: 1,
      runningCount: 1,
    });
    expect(state).not.toHaveProperty("reservationsNextPageToken");
    expect(await ok(url, B, "ListReservations", { pageSize: 10 })).toMatchObject({ reservations: [{ id, owner: "curl" }] });
    expect(await ok(url, B, "ListRunning", {})).toMatchObject({ running: [{ name: "api", reservationId: id }] });
    expect(await ok(url, B, "ListQueue", {})).toEqual({});
    expect(await ok(url, B, "StopRunning", { id: registered.running["id"] })).toEqual({ stopped: true });
    expect(await ok(url, B, "Release", { reservationId: id })).toEqual({ released: true });
    expect(await ok(url, B, "GetState", {})).not.toHaveProperty("reservations");
    // This budget is on the file store: the fleet view is etcd's (budget-fleet.test.ts calls it there).
    expect(refusalOf(await call(url, B, "GetFleet", {}), "berth.budget")).toEqual([400, "failed_precondition", "FLEET_NEEDS_ETCD"]);
  });

  it("covered every unary RPC of the three services (checked against the generated descriptors)", () => {
    const unary = SERVICES.flatMap((service) => service.methods.filter((m) => m.methodKind === "unary").map((m) => `${service.typeName}/${m.name}`));
    expect([...called].sort()).toEqual(unary.sort());
  });
});

describe("reads over Connect GET (NO_SIDE_EFFECTS)", () => {
  /** The unary reads: every unary RPC that only looks (they are the ones a cache or a browser may GET). */
  const READS = new Set([
    "berth.sessions.v1.SessionService/GetSnapshot",
    "berth.sessions.v1.SessionService/ListSessions",
    "berth.sessions.v1.SessionService/GetLimits",
    "berth.locks.v1.LockService/Inspect",
    "berth.locks.v1.LockService/CheckToken",
    "berth.locks.v1.LockService/GetLimits",
    ...["Check", "GetState", "ListQueue", "ListReservations", "ListRunning", "GetMachine", "Costs", "GetLimits", "GetFleet"].map(
      (name) => `berth.budget.v1.BudgetService/${name}`,
    ),
  ]);

  /** GETs `/<service>/<method>?connect=v1&encoding=json&message=…`, as connect-web does with `useHttpGet`. */
  function get(url: string, route: string, message: unknown): Promise<CurlResponse> {
    const query = new URLSearchParams({ connect: "v1", encoding: "json", message: JSON.stringify(message) });
    return curl(url, `/${route}?${query}`, { method: "GET" });
  }

  it("exactly the reads are marked NO_SIDE_EFFECTS, and no unary write is", () => {
    const marked = SERVICES.flatMap((service) =>
      service.methods.filter((m) => m.idempotency === MethodOptions_IdempotencyLevel.NO_SIDE_EFFECTS).map((m) => `${service.typeName}/${m.name}`),
    );
    expect(marked.sort()).toEqual([...READS].sort());
  });

  it("every read answers a GET as it answers a POST, with a cacheable body; a write refuses GET with 405 and changes nothing", async () => {
    await ok(sessionsUrl, SessionService, "AppendEvent", { sessionId: "get-read", event: { generate: { pageUrl: "http://localhost:3000/", count: 1 } } });
    const requests: Record<string, unknown> = {
      "berth.sessions.v1.SessionService/GetSnapshot": { sessionId: "get-read" },
      "berth.locks.v1.LockService/Inspect": { file: path.join(projectRoot, "get-read.txt") },
      "berth.locks.v1.LockService/CheckToken": { file: path.join(projectRoot, "get-read.txt"), fencingToken: "1" },
      "berth.budget.v1.BudgetService/Check": { need: { items: [{ kind: "NEED_ITEM_KIND_BUILD", name: "api" }] } },
    };
    for (const route of READS) {
      const url = route.includes("budget") ? budget.url : sessionsUrl;
      const body = requests[route] ?? {};
      const viaGet = await get(url, route, body);
      const viaPost = await curlJson(url, `/${route}`, body);
      expect(viaGet.status, `${route}: ${viaGet.body}`).toBe(viaPost.status);
      if (route.endsWith("/GetFleet")) continue; // refused on the file store, the same way both ways
      expect(viaGet.status, `${route}: ${viaGet.body}`).toBe(200);
      expect(Object.keys(JSON.parse(viaGet.body) as Json).sort(), route).toEqual(Object.keys(viaPost.json as Json).sort());
    }
    const write = await get(sessionsUrl, "berth.sessions.v1.SessionService/AppendEvent", {
      sessionId: "get-write",
      event: { generate: { pageUrl: "http://localhost:3000/", count: 1 } },
    });
    expect(write.status).toBe(405);
    expect((await curlJson(sessionsUrl, "/berth.sessions.v1.SessionService/GetSnapshot", { sessionId: "get-write" })).status).toBe(404);
  });
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
