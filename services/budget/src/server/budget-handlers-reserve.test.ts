/** The keyed unary calls: Reserve, KeepAlive, Release, RegisterRunning, StopRunning, their request ids and lease limits. */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, createHandlerContext } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService, ReserveRequestSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { ReserveResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { AnswerDelivery, answerDeliveryKey } from "@berth/shared/server/index";
import { createBudgetHandlers } from "./budget-handlers.js";
import type { InMemoryBudget } from "./testing.js";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { G, M, buildItem, settle, startItem } from "./testing.js";
import { errorInfo, inMemoryServers, startNeed } from "./handler-fixtures.js";

const { serve, closeAll } = inMemoryServers();
afterEach(closeAll);

describe("Reserve, KeepAlive, Release", () => {
  it("reserves with a lease that runs out unless renewed", async () => {
    const server = await serve({ leaseTtlMs: 10_000 });
    const { reservation } = await server.client.reserve({ owner: "ci", need: { items: startNeed("a", 1, 1) }, ttl: { seconds: 5n, nanos: 0 } });
    expect(reservation?.expireTime).toBeDefined();
    server.clock.advance(4000);
    const { renewals } = await server.client.keepAlive({ ids: [reservation!.id, "unknown-id"] });
    expect(renewals.map((r) => [r.id, r.alive])).toEqual([
      [reservation!.id, true],
      ["unknown-id", false],
    ]);
    server.clock.advance(4000);
    expect(server.budget.state().reservations).toHaveLength(1);
    server.clock.advance(1000);
    expect(server.budget.state().reservations).toHaveLength(0);
    const { released } = await server.client.release({ reservationId: reservation!.id });
    expect(released).toBe(false);
  });

  it("uses the default lease without a ttl, and waits in the queue until there is room", async () => {
    const server = await serve({ leaseTtlMs: 10_000 });
    const big = await server.client.reserve({ owner: "big", need: { items: startNeed("a", 6, 1) } });
    expect(big.reservation?.expireTime?.seconds).toBe(BigInt(Math.floor((server.clock.now() + 10_000) / 1000)));
    const waiting = server.client.reserve({ owner: "next", need: { items: startNeed("b", 4, 1) } });
    await settle();
    expect(server.budget.state().queue.map((q) => q.owner)).toEqual(["next"]);
    expect((await server.client.release({ reservationId: big.reservation!.id })).released).toBe(true);
    const next = await waiting;
    expect(next.reservation?.owner).toBe("next");
  });

  it("a Reserve whose caller goes away leaves nothing queued", async () => {
    const server = await serve();
    await server.client.reserve({ owner: "big", need: { items: startNeed("a", 6, 1) } });
    const controller = new AbortController();
    const waiting = server.client
      .reserve({ owner: "next", need: { items: startNeed("b", 4, 1) } }, { signal: controller.signal })
      .catch((e: unknown) => ConnectError.from(e));
    await settle();
    expect(server.budget.state().queue).toHaveLength(1);
    controller.abort();
    expect(((await waiting) as ConnectError).code).toBe(Code.Canceled);
    await settle();
    expect(server.budget.state().queue).toHaveLength(0);
  });

  it("refuses a wait that runs out with the Refusal detail", async () => {
    const server = await serve();
    await server.client.reserve({ owner: "big", need: { items: startNeed("a", 6, 1) } });
    const waiting = server.client
      .reserve({ owner: "next", need: { items: startNeed("b", 4, 1) }, maxWait: { seconds: 1n, nanos: 0 } })
      .catch((e: unknown) => ConnectError.from(e));
    await settle();
    server.clock.advance(1000);
    const error = (await waiting) as ConnectError;
    expect(error.code).toBe(Code.ResourceExhausted);
    expect(error.findDetails(RefusalSchema)[0]?.kind).toBe(RefusalKind.WAIT_EXHAUSTED);
  });

  it("release_build gives the build share back; NOT_FOUND once released", async () => {
    const server = await serve();
    const { reservation } = await server.client.reserve({ owner: "b", need: { items: [buildItem("a", 2, 1), startItem("a", 1, 1)] } });
    const after = await server.client.releaseBuild({ reservationId: reservation!.id });
    expect(after.reservation?.build?.memoryBytes).toBe(0n);
    expect(after.reservation?.start?.memoryBytes).toBe(BigInt(G));
    await server.client.release({ reservationId: reservation!.id });
    const error = await server.client.releaseBuild({ reservationId: reservation!.id }).catch((e: unknown) => ConnectError.from(e));
    expect((error as ConnectError).code).toBe(Code.NotFound);
  });

  it.each([
    ["reserve without an owner", (s: InMemoryBudget) => s.client.reserve({ owner: "" }), "owner"],
    ["reserve with a ttl over the maximum", (s: InMemoryBudget) => s.client.reserve({ owner: "x", ttl: { seconds: 3601n, nanos: 0 } }), "ttl"],
    ["reserve with a malformed request id", (s: InMemoryBudget) => s.client.reserve({ owner: "x", requestId: "a b" }), "request_id"],
    ["reserve with a request id too long", (s: InMemoryBudget) => s.client.reserve({ owner: "x", requestId: "a".repeat(129) }), "request_id"],
    ["register_running with a malformed request id", (s: InMemoryBudget) => s.client.registerRunning({ name: "x", requestId: "é" }), "request_id"],
    ["register_running with a ttl over the maximum", (s: InMemoryBudget) => s.client.registerRunning({ name: "x", ttl: { seconds: 7200n, nanos: 0 } }), "ttl"],
    ["get_state with a negative page size", (s: InMemoryBudget) => s.client.getState({ pageSize: -1 }), "page_size"],
    ["list_queue with a token it never issued", (s: InMemoryBudget) => s.client.listQueue({ pageToken: "eyJsIjoicXVldWUiLCJhIjoxLCJpIjoieCJ9" }), "page_token"],
    ["list_reservations with a malformed token", (s: InMemoryBudget) => s.client.listReservations({ pageToken: "not a token" }), "page_token"],
    ["list_running with a negative page size", (s: InMemoryBudget) => s.client.listRunning({ pageSize: -5 }), "page_size"],
    ["release without an id", (s: InMemoryBudget) => s.client.release({ reservationId: "" }), "reservation_id"],
    ["release_build with a bad id", (s: InMemoryBudget) => s.client.releaseBuild({ reservationId: "a b" }), "reservation_id"],
    ["keep_alive with an empty id", (s: InMemoryBudget) => s.client.keepAlive({ ids: ["ok", ""] }), "ids[1]"],
    ["stop_running without an id", (s: InMemoryBudget) => s.client.stopRunning({ id: "" }), "id"],
    ["register_running without a name", (s: InMemoryBudget) => s.client.registerRunning({ name: "" }), "name"],
    ["register_running with pid 0", (s: InMemoryBudget) => s.client.registerRunning({ name: "x", pid: 0 }), "pid"],
    [
      "register_running with NaN cpu",
      (s: InMemoryBudget) => s.client.registerRunning({ name: "x", costSource: { case: "cost", value: { memoryBytes: 1n, cpu: Number.NaN } } }),
      "cost.cpu",
    ],
    ["costs with a bad size", (s: InMemoryBudget) => s.client.costs({ spec: { build: { memory: "2X" } } }), "spec.build.memory"],
  ] as const)("refuses %s naming the field", async (_name, call, field) => {
    const server = await serve();
    const error = await (call(server) as Promise<unknown>).catch((e: unknown) => ConnectError.from(e));
    expect(error).toBeInstanceOf(ConnectError);
    expect((error as ConnectError).code).toBe(Code.InvalidArgument);
    expect((error as ConnectError).rawMessage.startsWith(`${field}:`)).toBe(true);
  });
});

describe("a Reserve whose answer is not delivered", () => {
  /** Reserve called as the server calls it, its answer's delivery in the test's hands. */
  function reserveWatched(server: InMemoryBudget, request: { owner: string; requestId?: string; memoryGb: number }) {
    const delivery = new AnswerDelivery();
    const context = createHandlerContext({
      service: BudgetService,
      method: BudgetService.method.reserve,
      protocolName: "connect",
      requestMethod: "POST",
      url: "http://127.0.0.1/berth.budget.v1.BudgetService/Reserve",
      contextValues: createContextValues().set(answerDeliveryKey, delivery),
    });
    const handlers = createBudgetHandlers({
      budget: server.budget,
      clock: server.clock,
      defaultLeaseTtlMs: () => 30_000,
      maxLeaseTtlMs: () => 3_600_000,
      sampleIntervalMs: 1000,
    });
    const message = create(ReserveRequestSchema, {
      owner: request.owner,
      requestId: request.requestId ?? "",
      need: { items: startNeed("w", request.memoryGb, 1) },
    });
    const answer = handlers.reserve(message, context) as Promise<ReserveResponse>;
    return { delivery, answer };
  }
  const owners = (server: InMemoryBudget) => server.budget.state().reservations.map((r) => r.owner);

  it("is released at once, and the next waiter admitted, when the call has no request_id", async () => {
    const server = await serve();
    const big = (await server.client.reserve({ owner: "big", need: { items: startNeed("a", 6, 1) } })).reservation!;
    const gone = reserveWatched(server, { owner: "gone", memoryGb: 5 });
    const next = server.client.reserve({ owner: "next", need: { items: startNeed("b", 5, 1) } });
    await settle();
    expect(server.budget.state().queue.map((q) => q.owner)).toEqual(["gone", "next"]);
    await server.client.release({ reservationId: big.id });
    const admitted = (await gone.answer).reservation!;
    expect(owners(server)).toEqual(["gone"]);
    // Its connection closed before the answer was out.
    gone.delivery.lost();
    expect((await next).reservation?.owner).toBe("next");
    expect(owners(server)).toEqual(["next"]);
    expect((await server.client.keepAlive({ ids: [admitted.id] })).renewals[0]?.alive).toBe(false);
  });

  it("is kept for the retry of a call with a request_id, which finds it; and kept when its answer was delivered", async () => {
    const server = await serve();
    const big = (await server.client.reserve({ owner: "big", need: { items: startNeed("a", 6, 1) } })).reservation!;
    const lost = reserveWatched(server, { owner: "retrying", requestId: "r-lost", memoryGb: 1 });
    const admitted = (await lost.answer).reservation!;
    lost.delivery.lost();
    const retried = await server.client.reserve({ owner: "retrying", requestId: "r-lost", need: { items: startNeed("w", 1, 1) } });
    expect(retried.reservation?.id).toBe(admitted.id);
    const delivered = reserveWatched(server, { owner: "delivered", memoryGb: 1 });
    await delivered.answer;
    delivered.delivery.delivered();
    delivered.delivery.lost();
    expect(owners(server).sort()).toEqual(["big", "delivered", "retrying"]);
    await server.client.release({ reservationId: big.id });
  });
});

describe("request ids, lease limits and GetLimits", () => {
  it("GetLimits says the leases, the longest wait, the heartbeat, the queue's size and the longest owner", async () => {
    const server = await serve({ leaseTtlMs: 20_000, maxLeaseTtlMs: 600_000, policy: { maxWaitMs: 120_000, maxQueue: 42, heartbeatMs: 3000 } });
    const limits = await server.client.getLimits({});
    expect([limits.defaultTtl, limits.maxTtl, limits.maxWait, limits.heartbeatInterval].map((d) => durationMs(d!))).toEqual([20_000, 600_000, 120_000, 3000]);
    expect([limits.maxQueue, limits.maxOwnerLength]).toEqual([42, 256]);
    expect([limits.idempotencyWindow, limits.admitResumeGrace].map((d) => durationMs(d!))).toEqual([3_600_000, 15_000]);
    const tuned = await serve({ idempotencyWindowMs: 60_000, admitResumeGraceMs: 5_000 });
    const tunedLimits = await tuned.client.getLimits({});
    expect([tunedLimits.idempotencyWindow, tunedLimits.admitResumeGrace].map((d) => durationMs(d!))).toEqual([60_000, 5_000]);
  });

  it("a Reserve's ttl: unset or zero is the default, up to the maximum is kept, beyond is INVALID_FIELD", async () => {
    const server = await serve({ leaseTtlMs: 20_000, maxLeaseTtlMs: 600_000 });
    const expiry = (r: { reservation?: { expireTime?: { seconds: bigint; nanos: number } } }) =>
      durationMs({ seconds: r.reservation!.expireTime!.seconds, nanos: r.reservation!.expireTime!.nanos } as never) - server.clock.now();
    expect(expiry(await server.client.reserve({ owner: "a" }))).toBe(20_000);
    expect(expiry(await server.client.reserve({ owner: "a", ttl: { seconds: 0n, nanos: 0 } }))).toBe(20_000);
    expect(expiry(await server.client.reserve({ owner: "a", ttl: { seconds: 600n, nanos: 0 } }))).toBe(600_000);
    const error = await server.client.reserve({ owner: "a", ttl: { seconds: 600n, nanos: 1_000_000 } }).catch((e: unknown) => ConnectError.from(e));
    expect([(error as ConnectError).code, errorInfo(error as ConnectError).reason, (error as ConnectError).rawMessage]).toEqual([
      Code.InvalidArgument,
      "INVALID_FIELD",
      "ttl: must be at most 10m (the longest lease, BERTH_BUDGET_MAX_LEASE_TTL); got 10m 0.001s",
    ]);
  });

  it("Reserve with a request id: a repeat answers the reservation; repeats while it waits hold one place and get the same reservation", async () => {
    const server = await serve();
    const first = await server.client.reserve({ owner: "ci", need: { items: startNeed("a", 6, 1) }, requestId: "job-1" });
    server.clock.advance(1000);
    const again = await server.client.reserve({ owner: "ci", need: { items: startNeed("a", 6, 1) }, requestId: "job-1" });
    // The first answer, identical: expire_time included.
    expect(again).toEqual(first);
    const reused = await server.client
      .reserve({ owner: "ci", need: { items: startNeed("b", 1, 1) }, requestId: "job-1" })
      .catch((e: unknown) => ConnectError.from(e));
    expect([(reused as ConnectError).code, errorInfo(reused as ConnectError).reason]).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);
    expect((reused as ConnectError).findDetails(ErrorInfoSchema)[0]?.metadata).toEqual({
      requestId: "job-1",
      rpc: "Reserve",
      owner: "ci",
      reservationId: first.reservation!.id,
    });

    const waits = [1, 2, 3].map(() => server.client.reserve({ owner: "next", need: { items: startNeed("b", 4, 1) }, requestId: "job-2" }));
    await settle();
    const state = await server.client.getState({});
    expect([state.queueSize, state.queue.map((q) => q.owner)]).toEqual([1, ["next"]]);
    server.clock.advance(1500);
    await server.client.release({ reservationId: first.reservation!.id });
    const answers = await Promise.all(waits);
    expect(new Set(answers.map((a) => a.reservation!.id)).size).toBe(1);
    expect(answers.map((a) => durationMs(a.waited!))).toEqual([1500, 1500, 1500]);
    expect((await server.client.getState({})).reservationCount).toBe(1);
  });

  it("RegisterRunning with a request id counts once, however often it is repeated", async () => {
    const server = await serve();
    const { reservation } = await server.client.reserve({ owner: "up", need: { items: startNeed("web", 2, 1) } });
    const register = () => server.client.registerRunning({ name: "web", reservationId: reservation!.id, pid: process.pid, requestId: "web-started" });
    const answers = await Promise.all([register(), register(), register()]);
    expect(new Set(answers.map((a) => a.running!.id)).size).toBe(1);
    expect(answers.every((a) => a.reservation?.runningIds.length === 1)).toBe(true);
    const state = await server.client.getState({});
    expect([state.runningCount, state.committed?.memoryBytes, state.reservations[0]?.start?.memoryBytes]).toEqual([1, BigInt(2 * G), 0n]);
    // Answered the first answer still once the reservation is gone.
    await server.client.release({ reservationId: reservation!.id });
    expect(await register()).toEqual(answers[0]);
    const unknown = await server.client
      .registerRunning({ name: "web", reservationId: reservation!.id, requestId: "another" })
      .catch((e: unknown) => ConnectError.from(e));
    expect([(unknown as ConnectError).code, errorInfo(unknown as ConnectError).reason]).toEqual([Code.NotFound, "RESERVATION_NOT_FOUND"]);
  });
});

describe("RegisterRunning, StopRunning", () => {
  it("counts running work until stopped, and renews its lease", async () => {
    const server = await serve();
    const { running } = await server.client.registerRunning({
      name: "db",
      costSource: { case: "spec", value: { memory: "1G" } },
      ttl: { seconds: 10n, nanos: 0 },
    });
    expect(running?.cost).toMatchObject({ memoryBytes: BigInt(G), cpu: 0.5 });
    expect(running?.expireTime).toBeDefined();
    server.clock.advance(9000);
    const { renewals } = await server.client.keepAlive({ ids: [running!.id] });
    expect(renewals[0]?.alive).toBe(true);
    server.clock.advance(9000);
    expect(server.budget.state().running).toHaveLength(1);
    expect((await server.client.stopRunning({ id: running!.id })).stopped).toBe(true);
    expect((await server.client.stopRunning({ id: running!.id })).stopped).toBe(false);
  });

  it("an entry with no lease is alive for KeepAlive, with no expiry", async () => {
    const server = await serve();
    const { running } = await server.client.registerRunning({ name: "db" });
    const { renewals } = await server.client.keepAlive({ ids: [running!.id] });
    expect(renewals[0]).toMatchObject({ alive: true });
    expect(renewals[0]?.expireTime).toBeUndefined();
  });

  it("moves a reservation's share to the tally (consume), NOT_FOUND for a gone reservation", async () => {
    const server = await serve();
    const { reservation } = await server.client.reserve({ owner: "up", need: { items: startNeed("web", 2, 1) } });
    const result = await server.client.registerRunning({
      name: "web",
      reservationId: reservation!.id,
      pid: process.pid,
      costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } },
    });
    expect(result.reservation?.start?.memoryBytes).toBe(BigInt(G));
    expect(result.reservation?.runningIds).toEqual([result.running?.id]);
    expect(result.running?.reservationId).toBe(reservation!.id);
    expect(result.running?.pidStartTime).toBeDefined();
    const error = await server.client.registerRunning({ name: "web", reservationId: "gone" }).catch((e: unknown) => ConnectError.from(e));
    expect((error as ConnectError).code).toBe(Code.NotFound);
  });

  it("registers running work without a cost at what its reservation's item was admitted with, else the policy's default", async () => {
    const server = await serve();
    const { reservation } = await server.client.reserve({ owner: "up", need: { items: startNeed("web", 0.25, 0.25) } });
    const inside = await server.client.registerRunning({ name: "web", reservationId: reservation!.id, pid: process.pid });
    expect(inside.running?.cost).toMatchObject({ memoryBytes: BigInt(256 * M), cpu: 0.25 });
    expect(inside.reservation?.start).toMatchObject({ memoryBytes: 0n, cpu: 0 });
    const outside = await server.client.registerRunning({ name: "web", pid: process.pid });
    expect(outside.running?.cost).toMatchObject({ memoryBytes: BigInt(512 * M), cpu: 0.5 });
  });
});
