/**
 * The Connect protocol with JSON over HTTP/1.1, spoken by the real `curl` (connect-json.ts): every
 * unary RPC of SessionService, LockService and BudgetService answers a representative request in
 * proto3 JSON (the set of RPCs called is checked against the generated descriptors, so a unary RPC
 * added later without a call here fails this file), and the reads answer Connect GET as they answer
 * POST. Refusals are connect-json-errors.test.ts's.
 *
 * The budget runs on the fixture machine of budget-e2e.ts, so no verdict depends on this machine.
 */
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { MethodOptions_IdempotencyLevel } from "@bufbuild/protobuf/wkt";
import { G, type BudgetUnderTest } from "./budget-e2e.js";
import { call, called, ok, refusalOf, SERVICES, startConnectJsonServices, startItem, type Json } from "./connect-json.js";
import { curl, curlJson, stopAll, type CurlResponse } from "./harness.js";

afterAll(stopAll);

let sessionsUrl: string;
let projectRoot: string;
let budget: BudgetUnderTest;

beforeAll(async () => {
  ({ sessionsUrl, projectRoot, budget } = await startConnectJsonServices());
});

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
