/**
 * BudgetService through @grpc/grpc-js (grpc-js-surface.ts): every RPC, each stream carried through
 * to its meaningful messages, each error code with its typed details, a client cancelling an Admit
 * mid-stream (its reservation must be released). The set of RPCs called is checked against the
 * generated service descriptors at the end; budget-rpcs and budget-admit .test.ts go deeper into
 * the semantics.
 *
 * The budget runs on the fixture machine of budget-e2e.ts (a quiet 16G box, a 4G / 4 cpu budget),
 * so no verdict depends on how busy this machine is.
 */
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NeedItemKind, RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { G, startBudget } from "./budget-e2e.js";
import { eventually, expectEveryRpcCalled, expectKind, failure, reader, seconds, start, startBudgetSurface, statusDetails } from "./grpc-js-surface.js";
import { grpcJsClient, grpcStatusDetails, stopAll, type GrpcJsClient } from "./harness.js";

afterAll(stopAll);

let budgetRpc: GrpcJsClient;

beforeAll(async () => {
  ({ budgetRpc } = await startBudgetSurface());
});

// ---------------------------------------------------------------------------------------------

describe("BudgetService over grpc-js", () => {
  const state = () => budgetRpc.unary(BudgetService.method.getState, {});

  it("unary RPCs: Check, Costs, GetMachine, GetState, and a leased reservation through KeepAlive, ReleaseBuild, RegisterRunning, StopRunning, Release", async () => {
    const check = await budgetRpc.unary(BudgetService.method.check, { need: { items: [start("web", 1)] } });
    expect(check.verdict?.fits).toBe(true);
    expect(check.verdict?.policy?.memoryBytes).toBe(BigInt(4 * G));
    const tooBig = await budgetRpc.unary(BudgetService.method.check, { need: { items: [start("huge", 5)] } });
    expect(tooBig.verdict?.fits).toBe(false);
    expect(tooBig.verdict?.impossible).toBeTruthy();

    const costs = await budgetRpc.unary(BudgetService.method.costs, { spec: { memory: "1G", cpu: 2, build: { memory: "2G" } } });
    expect([costs.run?.memoryBytes, costs.run?.cpu, costs.run?.declared, costs.build?.memoryBytes]).toEqual([BigInt(G), 2, true, BigInt(2 * G)]);

    const { machine } = await budgetRpc.unary(BudgetService.method.getMachine, {});
    expect([machine?.totalBytes, machine?.availableBytes]).toEqual([BigInt(16 * G), BigInt(16_000_000 * 1024)]);

    const { reservation } = await budgetRpc.unary(BudgetService.method.reserve, {
      owner: "surface",
      need: { items: [start("api", 1), { kind: NeedItemKind.BUILD, name: "api", costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } } }] },
      ttl: seconds(60),
    });
    const id = reservation!.id;
    expect(reservation?.expireTime).toBeDefined();
    expect((await state()).reservations.map((r) => r.id)).toEqual([id]);

    const { renewals } = await budgetRpc.unary(BudgetService.method.keepAlive, { ids: [id, "gone"] });
    expect(renewals.map((r) => [r.id, r.alive])).toEqual([
      [id, true],
      ["gone", false],
    ]);
    expect((await budgetRpc.unary(BudgetService.method.releaseBuild, { reservationId: id })).reservation?.build?.memoryBytes).toBe(0n);

    const registered = await budgetRpc.unary(BudgetService.method.registerRunning, { name: "api", reservationId: id, pid: process.pid });
    expect(registered.running?.reservationId).toBe(id);
    expect(registered.reservation?.runningIds).toEqual([registered.running!.id]);
    expect((await state()).running.map((r) => [r.name, r.pid])).toEqual([["api", process.pid]]);
    expect((await budgetRpc.unary(BudgetService.method.stopRunning, { id: registered.running!.id })).stopped).toBe(true);
    expect((await budgetRpc.unary(BudgetService.method.stopRunning, { id: registered.running!.id })).stopped).toBe(false);

    expect((await budgetRpc.unary(BudgetService.method.release, { reservationId: id })).released).toBe(true);
    expect((await budgetRpc.unary(BudgetService.method.release, { reservationId: id })).released).toBe(false);
    const after = await state();
    expect([after.reservations, after.running, after.queue, after.committed?.memoryBytes]).toEqual([[], [], [], 0n]);
  });

  it("GetLimits, a Reserve repeated with its request id, and GetState's first pages continued by ListQueue, ListReservations and ListRunning", async () => {
    // On the file store the fleet view is refused, saying what to change (budget-fleet.test.ts calls it on etcd).
    const fleet = await failure(budgetRpc.unary(BudgetService.method.getFleet, {}));
    expect(fleet.name).toBe("FAILED_PRECONDITION");
    expect(statusDetails(fleet.metadata).reason).toBe("FLEET_NEEDS_ETCD");
    const limits = await budgetRpc.unary(BudgetService.method.getLimits, {});
    expect([limits.defaultTtl?.seconds, limits.maxTtl?.seconds, limits.maxWait?.seconds, limits.maxQueue, limits.maxOwnerLength]).toEqual([
      30n,
      3600n,
      600n,
      1000,
      256,
    ]);

    const nothing = { case: "cost" as const, value: { memoryBytes: 0n, cpu: 0 } };
    const ask = { owner: "paged", need: { items: [start("p", 0.25, 0.25)] }, requestId: "surface-paged-0" };
    const first = (await budgetRpc.unary(BudgetService.method.reserve, ask)).reservation!;
    expect((await budgetRpc.unary(BudgetService.method.reserve, ask)).reservation?.id).toBe(first.id);
    const ids = [first.id];
    for (let i = 1; i < 5; i++)
      ids.push((await budgetRpc.unary(BudgetService.method.reserve, { ...ask, owner: `paged-${i}`, requestId: `surface-paged-${i}` })).reservation!.id);
    const registered = [];
    for (let i = 0; i < 3; i++)
      registered.push(
        (await budgetRpc.unary(BudgetService.method.registerRunning, { name: `svc-${i}`, requestId: `surface-svc-${i}`, costSource: nothing })).running!.id,
      );
    expect((await budgetRpc.unary(BudgetService.method.registerRunning, { name: "svc-0", requestId: "surface-svc-0", costSource: nothing })).running?.id).toBe(
      registered[0],
    );
    // The queue: one waiter behind a holder of the rest of the memory.
    const holder = (await budgetRpc.unary(BudgetService.method.reserve, { owner: "queue-holder", need: { items: [start("h", 2)] } })).reservation!;
    const waiting = budgetRpc.unary(BudgetService.method.reserve, { owner: "queued", need: { items: [start("w", 1)] } });
    await eventually("a waiter queued", state, (s) => s.queueSize === 1);

    const page = await budgetRpc.unary(BudgetService.method.getState, { pageSize: 2 });
    expect([page.queueSize, page.reservationCount, page.runningCount]).toEqual([1, 6, 3]);
    expect(page.reservations.map((r) => r.id)).toEqual(ids.slice(0, 2));
    expect(page.queueNextPageToken).toBe("");
    expect((await budgetRpc.unary(BudgetService.method.listQueue, {})).queue.map((q) => [q.owner, q.position])).toEqual([["queued", 1]]);
    const rest = await budgetRpc.unary(BudgetService.method.listReservations, { pageToken: page.reservationsNextPageToken, pageSize: 10 });
    expect(rest.reservations.map((r) => r.id)).toEqual([...ids.slice(2), holder.id]);
    const running = await budgetRpc.unary(BudgetService.method.listRunning, { pageToken: page.runningNextPageToken });
    expect([running.running.map((r) => r.id), running.nextPageToken]).toEqual([[registered[2]], ""]);

    await budgetRpc.unary(BudgetService.method.release, { reservationId: holder.id });
    await budgetRpc.unary(BudgetService.method.release, { reservationId: (await waiting).reservation!.id });
    for (const id of ids) await budgetRpc.unary(BudgetService.method.release, { reservationId: id });
    for (const id of registered) await budgetRpc.unary(BudgetService.method.stopRunning, { id });
  });

  it("each error code with its ErrorInfo reason (domain berth.budget) in grpc-status-details-bin, and RetryInfo where a retry can succeed", async () => {
    const full = await startBudget({ args: ["--max-queue=0"] });
    const client = grpcJsClient(full.url);
    try {
      const details = async (call: Promise<unknown>) => {
        const { name, metadata } = await failure(call);
        const status = grpcStatusDetails(metadata);
        return {
          code: name,
          reason: status?.reason,
          domain: status?.domain,
          retry: status?.retryDelayMs !== undefined,
          refusal: status?.find(RefusalSchema)?.kind,
        };
      };
      expect(await details(client.unary(BudgetService.method.reserve, { owner: "huge", need: { items: [start("x", 5)] } }))).toEqual({
        code: "FAILED_PRECONDITION",
        reason: "IMPOSSIBLE",
        domain: "berth.budget",
        retry: false,
        refusal: RefusalKind.IMPOSSIBLE,
      });
      const held = (await client.unary(BudgetService.method.reserve, { owner: "holder", need: { items: [start("a", 3)] } })).reservation!;
      expect(await details(client.unary(BudgetService.method.reserve, { owner: "late", need: { items: [start("b", 2)] } }))).toEqual({
        code: "RESOURCE_EXHAUSTED",
        reason: "QUEUE_FULL",
        domain: "berth.budget",
        retry: true,
        refusal: RefusalKind.QUEUE_FULL,
      });
      expect(await details(client.unary(BudgetService.method.reserve, { owner: "now", need: { items: [start("b", 2)] }, maxWait: seconds(0) }))).toEqual({
        code: "RESOURCE_EXHAUSTED",
        reason: "WAIT_EXHAUSTED",
        domain: "berth.budget",
        retry: true,
        refusal: RefusalKind.WAIT_EXHAUSTED,
      });
      await client.unary(BudgetService.method.release, { reservationId: held.id });
      expect(await details(client.unary(BudgetService.method.releaseBuild, { reservationId: held.id }))).toMatchObject({
        code: "NOT_FOUND",
        reason: "RESERVATION_NOT_FOUND",
        domain: "berth.budget",
      });
      expect(await details(client.unary(BudgetService.method.registerRunning, { name: "w", reservationId: held.id }))).toMatchObject({
        code: "NOT_FOUND",
        reason: "RESERVATION_NOT_FOUND",
      });
      expect(await details(client.unary(BudgetService.method.reserve, { owner: "x", ttl: seconds(3601) }))).toMatchObject({
        code: "INVALID_ARGUMENT",
        reason: "INVALID_FIELD",
        domain: "berth.budget",
      });
      expect(await details(client.unary(BudgetService.method.listRunning, { pageToken: "x" }))).toMatchObject({
        code: "INVALID_ARGUMENT",
        reason: "INVALID_FIELD",
      });

      // Out of turn on the Admit stream: build_done before admitted.
      const call = client.bidi(BudgetService.method.admit);
      const stream = reader(call);
      call.write({ kind: { case: "buildDone", value: {} } });
      const end = await stream.ended;
      const status = grpcStatusDetails(end.metadata);
      expect([end.name, status?.reason, status?.domain]).toEqual(["INVALID_ARGUMENT", "OUT_OF_TURN", "berth.budget"]);
    } finally {
      client.close();
      await full.service.stop();
    }
  });

  it("WatchMachine: the current sample at once, then newer ones, until the client cancels", async () => {
    const call = budgetRpc.serverStream(BudgetService.method.watchMachine, {});
    const watch = reader(call);
    const first = await watch.next("the current sample");
    expect(first.machine?.totalBytes).toBe(BigInt(16 * G));
    // The fixture is sampled every 200 ms.
    const second = await watch.next("a newer sample");
    expect(timestampMs(second.machine!.sampleTime!)).toBeGreaterThan(timestampMs(first.machine!.sampleTime!));
    call.cancel();
    expect((await watch.ended).name).toBe("CANCELLED");
  });

  it("WatchBudget: the current state (the policy), caught_up at its revision, until the client cancels", async () => {
    const call = budgetRpc.serverStream(BudgetService.method.watchBudget, { includeCurrent: true });
    const watch = reader(call);
    let message = await watch.next("the current state");
    while (message.kind.case === "event" && message.kind.value.subject.case !== "policy") message = await watch.next("the policy");
    const policy = message;
    const caughtUp = await watch.next("caught_up");
    expect(caughtUp.kind.case).toBe("caughtUp");
    expect(caughtUp.kind.case === "caughtUp" && caughtUp.kind.value.revision).toBe(policy.kind.case === "event" && policy.kind.value.revision);
    call.cancel();
    expect((await watch.ended).name).toBe("CANCELLED");
  });

  it("Admit: admitted; a second one queued (position, reason) → admitted when the first releases; build_done, started, release → released and OK", async () => {
    const firstCall = budgetRpc.bidi(BudgetService.method.admit);
    const first = reader(firstCall);
    firstCall.write({ kind: { case: "start", value: { owner: "first", need: { items: [start("a", 3)] } } } });
    const admittedFirst = await expectKind(first, "admitted");
    expect(admittedFirst.reservation?.owner).toBe("first");

    const secondCall = budgetRpc.bidi(BudgetService.method.admit);
    const second = reader(secondCall);
    secondCall.write({
      kind: {
        case: "start",
        value: {
          owner: "second",
          need: {
            items: [start("web", 1), { kind: NeedItemKind.BUILD, name: "web", costSource: { case: "cost", value: { memoryBytes: BigInt(2 * G), cpu: 1 } } }],
          },
        },
      },
    });
    const queued = await expectKind(second, "queued");
    expect(queued.position).toBe(1);
    expect(queued.waitFor.length).toBeGreaterThan(0);
    expect(queued.waitForText).not.toBe("");
    expect(queued.waitExpireTime).toBeDefined();
    expect((await state()).queue.map((q) => [q.owner, q.position])).toEqual([["second", 1]]);

    firstCall.write({ kind: { case: "release", value: {} } });
    expect((await expectKind(first, "released")).reservationId).toBe(admittedFirst.reservation!.id);
    expect((await first.ended).name).toBe("OK");

    // Heartbeats may come before the admission.
    let message = await second.next("the admission");
    while (message.kind.case === "queued") message = await second.next("the admission");
    expect(message.kind.case).toBe("admitted");
    const reservation = message.kind.case === "admitted" ? message.kind.value.reservation! : undefined;
    expect((await state()).committed?.memoryBytes).toBe(BigInt(3 * G));

    secondCall.write({ kind: { case: "buildDone", value: {} } });
    expect((await expectKind(second, "updated")).reservation?.build?.memoryBytes).toBe(0n);
    expect((await state()).committed?.memoryBytes).toBe(BigInt(G));
    secondCall.write({
      kind: { case: "started", value: { name: "web", pid: process.pid, costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } } } },
    });
    const started = await expectKind(second, "updated");
    expect([started.running?.name, started.running?.pid, started.running?.reservationId]).toEqual(["web", process.pid, reservation!.id]);
    secondCall.write({ kind: { case: "release", value: {} } });
    expect((await expectKind(second, "released")).reservationId).toBe(reservation!.id);
    expect((await second.ended).name).toBe("OK");

    // The running entry outlives the stream; the reservation does not.
    const after = await state();
    expect([after.reservations, after.running.map((r) => r.name)]).toEqual([[], ["web"]]);
    await budgetRpc.unary(BudgetService.method.stopRunning, { id: started.running!.id });
  });

  it("Admit cancelled mid-stream: an admitted stream's reservation is released, a queued one is dropped", async () => {
    const holderCall = budgetRpc.bidi(BudgetService.method.admit);
    const holder = reader(holderCall);
    holderCall.write({ kind: { case: "start", value: { owner: "holder", need: { items: [start("a", 3)] } } } });
    await expectKind(holder, "admitted");
    const waiterCall = budgetRpc.bidi(BudgetService.method.admit);
    const waiter = reader(waiterCall);
    waiterCall.write({ kind: { case: "start", value: { owner: "waiter", need: { items: [start("b", 2)] } } } });
    await expectKind(waiter, "queued");
    const before = await state();
    expect([before.reservations.map((r) => r.owner), before.queue.map((q) => q.owner)]).toEqual([["holder"], ["waiter"]]);

    waiterCall.cancel();
    expect((await waiter.ended).name).toBe("CANCELLED");
    await eventually("the cancelled request dropped from the queue", state, (s) => s.queue.length === 0);
    expect((await state()).reservations.map((r) => r.owner)).toEqual(["holder"]);

    holderCall.cancel();
    expect((await holder.ended).name).toBe("CANCELLED");
    const after = await eventually("the cancelled admission's reservation released", state, (s) => s.reservations.length === 0);
    expect(after.committed?.memoryBytes).toBe(0n);
  });
});

// ---------------------------------------------------------------------------------------------

describe("the surface", () => {
  it("every RPC of BudgetService was called above (checked against the generated descriptors)", () => {
    expectEveryRpcCalled(BudgetService);
  });
});
