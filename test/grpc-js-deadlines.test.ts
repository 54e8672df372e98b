/**
 * Call deadlines the server cannot meet, through @grpc/grpc-js (grpc-js-surface.ts): a wait for a
 * lock, a watch and a queued admission each end by their deadline, and nothing is left behind
 * (no waiter, no watcher, no queued request).
 */
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { eventually, expectKind, failure, gauge, reader, seconds, start, startBudgetSurface, startSessionsSurface } from "./grpc-js-surface.js";
import { stopAll, type GrpcJsClient } from "./harness.js";

afterAll(stopAll);

let sessionsUrl: string;
let projectRoot: string;
let rpc: GrpcJsClient;
let budgetRpc: GrpcJsClient;

beforeAll(async () => {
  [{ sessionsUrl, projectRoot, rpc }, { budgetRpc }] = await Promise.all([startSessionsSurface(), startBudgetSurface()]);
});

describe("deadlines the server cannot meet", () => {
  it("Acquire and Hold waiting on a held lock end by their deadline (WAIT_EXHAUSTED just before it, or DEADLINE_EXCEEDED) and leave no waiter", async () => {
    const file = path.join(projectRoot, "src/deadline.ts");
    const holder = (await rpc.unary(LockService.method.acquire, { file, owner: "keeper", ttl: seconds(30) })).lease!;

    const began = Date.now();
    const acquire = await failure(rpc.unary(LockService.method.acquire, { file, owner: "impatient" }, { deadlineMs: 600 }));
    // The service bounds the wait by the call's deadline and answers a little before it, with the
    // holder (the documented answer); a slow machine may let the client's own deadline fire first.
    expect(["RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"]).toContain(acquire.name);
    if (acquire.name === "RESOURCE_EXHAUSTED") expect(acquire.details).toMatch(/^source locked: \/.*\/src\/deadline\.ts is held by keeper since /);
    expect(Date.now() - began).toBeLessThan(10_000);

    const holdCall = rpc.serverStream(LockService.method.hold, { file, owner: "impatient-stream" }, { deadlineMs: 2_000 });
    const hold = reader(holdCall);
    expect((await expectKind(hold, "waiting")).holder?.owner).toBe("keeper");
    expect(["RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"]).toContain((await hold.ended).name);

    const left = await eventually(
      "no waiter left behind",
      () => rpc.unary(LockService.method.inspect, { file }),
      (s) => s.waiters.length === 0,
    );
    expect(left.holder?.owner).toBe("keeper");
    expect(await gauge(sessionsUrl, "berth_locks_waiting")).toBe(0);
    await rpc.unary(LockService.method.release, { leaseToken: holder.leaseToken });
  });

  it("a WatchSession with a deadline ends DEADLINE_EXCEEDED and its watcher is dropped", async () => {
    const watchers = await gauge(sessionsUrl, "berth_sessions_watchers");
    const watch = reader(rpc.serverStream(SessionService.method.watchSession, { sessionId: "surface-deadline" }, { deadlineMs: 2_000 }));
    await expectKind(watch, "caughtUp");
    expect((await watch.ended).name).toBe("DEADLINE_EXCEEDED");
    await eventually(
      "the watcher dropped",
      () => gauge(sessionsUrl, "berth_sessions_watchers"),
      (n) => n === watchers,
    );
  });

  it("an Admit and a Reserve that stay queued past their deadline end DEADLINE_EXCEEDED, dropped from the queue", async () => {
    const state = () => budgetRpc.unary(BudgetService.method.getState, {});
    const holderCall = budgetRpc.bidi(BudgetService.method.admit);
    const holder = reader(holderCall);
    holderCall.write({ kind: { case: "start", value: { owner: "holder", need: { items: [start("a", 3)] } } } });
    await expectKind(holder, "admitted");

    const admitCall = budgetRpc.bidi(BudgetService.method.admit, { deadlineMs: 2_000 });
    const admit = reader(admitCall);
    admitCall.write({ kind: { case: "start", value: { owner: "late-admit", need: { items: [start("b", 2)] }, maxWait: seconds(60) } } });
    await expectKind(admit, "queued");
    const reserve = failure(
      budgetRpc.unary(BudgetService.method.reserve, { owner: "late-reserve", need: { items: [start("c", 2)] }, maxWait: seconds(60) }, { deadlineMs: 2_000 }),
    );

    expect((await admit.ended).name).toBe("DEADLINE_EXCEEDED");
    expect((await reserve).name).toBe("DEADLINE_EXCEEDED");
    const after = await eventually("both late requests dropped", state, (s) => s.queue.length === 0);
    expect(after.reservations.map((r) => r.owner)).toEqual(["holder"]);

    holderCall.write({ kind: { case: "release", value: {} } });
    await expectKind(holder, "released");
    expect((await holder.ended).name).toBe("OK");
  });
});
