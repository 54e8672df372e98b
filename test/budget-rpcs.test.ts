/**
 * The budget service as a process: every RPC through real clients (Connect gRPC, grpc-js, curl),
 * request ids repeated, malformed input refused, its gauges on /metrics (budget-requests.ts).
 * The service runs on a fixture machine (`--proc-root`), so nothing here depends on this box's
 * load.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { G, startBudget } from "./budget-e2e.js";
import { start } from "./budget-requests.js";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { curl, curlJson, grpcJsClient, stopAll } from "./harness.js";

afterAll(stopAll);

describe("budget service: RPCs", () => {
  it("answers every unary RPC and streams the machine", async () => {
    const budget = await startBudget();
    const { client } = budget;

    const check = await client.check({ need: { items: [start("web", 1, 1)] } });
    expect(check.verdict?.fits).toBe(true);
    expect(check.verdict?.machine?.totalBytes).toBe(BigInt(16 * G));
    expect(check.verdict?.policy?.memoryBytes).toBe(BigInt(4 * G));

    const costs = await client.costs({ spec: { memory: "1G", cpu: 1 } });
    expect(costs.run?.declared).toBe(true);

    const { machine } = await client.getMachine({});
    expect(machine?.availableBytes).toBe(BigInt(16_000_000 * 1024));

    const { reservation } = await client.reserve({
      owner: "ci",
      need: { items: [start("a", 1, 1), { kind: NeedItemKind.BUILD, name: "a" }] },
      ttl: { seconds: 60n, nanos: 0 },
    });
    expect((await client.keepAlive({ ids: [reservation!.id] })).renewals[0]?.alive).toBe(true);
    expect((await client.releaseBuild({ reservationId: reservation!.id })).reservation?.build?.memoryBytes).toBe(0n);
    const { running } = await client.registerRunning({ name: "a", reservationId: reservation!.id, pid: process.pid });
    expect((await client.getState({})).running.map((r) => r.id)).toEqual([running!.id]);
    expect((await client.stopRunning({ id: running!.id })).stopped).toBe(true);
    expect((await client.release({ reservationId: reservation!.id })).released).toBe(true);

    const controller = new AbortController();
    for await (const sample of client.watchMachine({}, { signal: controller.signal })) {
      expect(sample.machine?.cores).toBeGreaterThan(0);
      break;
    }
  });

  it("request ids: every keyed RPC repeated with the same request answers the first answer, with another request ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED", async () => {
    const budget = await startBudget();
    const { client } = budget;
    const reuseOf = async (call: Promise<unknown>) => {
      const error = ConnectError.from(
        await call.then(
          () => new Error("expected a refusal"),
          (e: unknown) => e,
        ),
      );
      expect(error.code).toBe(Code.AlreadyExists);
      const [info] = error.findDetails(ErrorInfoSchema);
      expect([info?.reason, info?.domain]).toEqual(["IDEMPOTENCY_KEY_REUSED", "berth.budget"]);
      return info!.metadata;
    };
    const asked = {
      owner: "ci",
      need: { items: [start("a", 1, 1), { kind: NeedItemKind.BUILD, name: "a" }] },
      ttl: { seconds: 60n, nanos: 0 },
      requestId: "res-1",
    };
    const first = await client.reserve(asked);
    expect(await client.reserve({ ...asked, maxWait: { seconds: 0n, nanos: 0 } })).toEqual(first);
    const id = first.reservation!.id;
    expect(await reuseOf(client.reserve({ ...asked, ttl: { seconds: 30n, nanos: 0 } }))).toEqual({
      requestId: "res-1",
      rpc: "Reserve",
      owner: "ci",
      reservationId: id,
    });
    expect(await reuseOf(client.reserve({ ...asked, skipLoadGate: true }))).toMatchObject({ rpc: "Reserve" });
    expect(await reuseOf(client.release({ reservationId: id, requestId: "res-1" }))).toMatchObject({ rpc: "Reserve" });

    const built = await client.releaseBuild({ reservationId: id, requestId: "build-1" });
    expect(await client.releaseBuild({ reservationId: id, requestId: "build-1" })).toEqual(built);
    const registered = await client.registerRunning({ name: "a", reservationId: id, pid: process.pid, requestId: "run-1" });
    expect(await client.registerRunning({ name: "a", reservationId: id, pid: process.pid, requestId: "run-1" })).toEqual(registered);
    expect(await reuseOf(client.registerRunning({ name: "a", reservationId: id, requestId: "run-1" }))).toMatchObject({
      rpc: "RegisterRunning",
      runningId: registered.running!.id,
    });
    expect((await client.getState({})).runningCount).toBe(1);
    expect((await client.stopRunning({ id: registered.running!.id, requestId: "stop-1" })).stopped).toBe(true);
    expect((await client.stopRunning({ id: registered.running!.id, requestId: "stop-1" })).stopped).toBe(true);
    expect((await client.release({ reservationId: id, requestId: "rel-1" })).released).toBe(true);
    expect((await client.release({ reservationId: id, requestId: "rel-1" })).released).toBe(true);
    // Ended: the first answers still, granting nothing; the renewal finds them gone.
    expect(await client.reserve(asked)).toEqual(first);
    expect(await client.registerRunning({ name: "a", reservationId: id, pid: process.pid, requestId: "run-1" })).toEqual(registered);
    expect((await client.keepAlive({ ids: [id] })).renewals.map((r) => r.alive)).toEqual([false]);
    expect((await client.getState({})).reservationCount).toBe(0);
    const limits = await client.getLimits({});
    expect([limits.idempotencyWindow?.seconds, limits.admitResumeGrace?.seconds]).toEqual([3600n, 15n]);
  });

  it("refuses malformed input with INVALID_ARGUMENT naming the field, over gRPC and Connect JSON, and keeps serving", async () => {
    const budget = await startBudget();
    const error = await budget.client
      .check({ need: { items: [{ kind: NeedItemKind.START, name: "x", costSource: { case: "spec", value: { memory: "12Q" } } }] } })
      .catch((e: unknown) => ConnectError.from(e));
    expect((error as ConnectError).code).toBe(Code.InvalidArgument);
    expect((error as ConnectError).rawMessage).toMatch(/^need\.items\[0\]\.spec\.memory: "12Q"/);

    const viaCurl = await curlJson(budget.url, "/berth.budget.v1.BudgetService/Check", {
      need: { items: [{ kind: "NEED_ITEM_KIND_START", name: "x", spec: { cpu: -2 } }] },
    });
    expect(viaCurl.status).toBe(400);
    expect(String((viaCurl.json as { message?: string }).message)).toMatch(/^need\.items\[0\]\.spec\.cpu:/);

    const noKind = await curlJson(budget.url, "/berth.budget.v1.BudgetService/Check", { need: { items: [{ name: "x" }] } });
    expect(String((noKind.json as { message?: string }).message)).toMatch(/^need\.items\[0\]\.kind:/);

    const grpcJs = grpcJsClient(budget.url);
    const state = await grpcJs.unary(BudgetService.method.getState, {});
    expect(state.policy?.cpu).toBe(4);
    grpcJs.close();
  });

  it("exports its gauges on /metrics", async () => {
    const budget = await startBudget();
    await budget.client.reserve({ owner: "held", need: { items: [start("a", 1, 1)] } });
    const metrics = await curl(budget.url, "/metrics");
    expect(metrics.body).toMatch(/berth_budget_reservations 1/);
    expect(metrics.body).toMatch(new RegExp(`berth_budget_committed_memory_bytes ${G}`));
  });
});
