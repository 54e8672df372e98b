/**
 * The budget service's Admit stream, as a process (budget-requests.ts): its queue and refusals, a
 * resume on a new connection, a client killed with SIGKILL while queued and while admitted, lease
 * expiry, and shutdown.
 * The service runs on a fixture machine (`--proc-root`), so nothing here depends on this box's
 * load.
 */
import { Code } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { Gate, NeedItemKind, RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { G, spawnBerth, startBudget, until } from "./budget-e2e.js";
import { admit, queueLength, reservations, start } from "./budget-requests.js";
import { connectClient, cuttableProxy, stopAll } from "./harness.js";

afterAll(stopAll);

describe("budget service: Admit", () => {
  it("queues with positions, and a release admits the first waiter at once", async () => {
    // The machine is read once an hour here: an admission can only come from the release itself.
    const budget = await startBudget({ args: ["--sample-interval=1h"] });
    const first = admit(budget, "first", [start("a", 3, 1)]);
    expect(await until(() => first.has("admitted"))).toBe(true);
    const second = admit(budget, "second", [start("b", 2, 1)]);
    const third = admit(budget, "third", [start("c", 3, 1)]);
    expect(await until(() => second.has("queued") && third.received.some((r) => r.kind.case === "queued" && r.kind.value.position === 2))).toBe(true);

    first.send({ kind: { case: "release", value: {} } });
    // No polling anywhere: with no sample due for an hour, the release alone admits the first waiter.
    expect(await until(() => second.has("admitted"))).toBe(true);
    // The third (3G) is the first waiter now, still waiting for memory: 2G of 4G are held.
    expect(await until(() => third.received.some((r) => r.kind.case === "queued" && r.kind.value.position === 1))).toBe(true);
    const last = third.received.filter((r) => r.kind.case === "queued").at(-1)!.kind;
    expect(last.case === "queued" && last.value.waitFor.map((w) => w.gate)).toEqual([Gate.MEMORY_BUDGET]);
    second.cancel();
    third.cancel();
    await Promise.all([first.done, second.done, third.done]);
  });

  it("refuses impossible, queue full and wait exhausted with the Refusal detail", async () => {
    const budget = await startBudget({ args: ["--max-queue=1"] });
    const impossible = admit(budget, "huge", [start("x", 5, 1)]);
    await impossible.done;
    expect(impossible.failure?.code).toBe(Code.FailedPrecondition);
    expect(impossible.failure?.findDetails(RefusalSchema)[0]?.kind).toBe(RefusalKind.IMPOSSIBLE);

    const holder = admit(budget, "holder", [start("a", 3, 1)]);
    expect(await until(() => holder.has("admitted"))).toBe(true);
    // The queue's one place stays taken however long the next call takes to arrive.
    const waiting = admit(budget, "waiting", [start("b", 2, 1)], 60_000);
    expect(await until(() => waiting.has("queued"))).toBe(true);
    const full = admit(budget, "full", [start("c", 2, 1)]);
    await full.done;
    expect(full.failure?.code).toBe(Code.ResourceExhausted);
    const [queueFull] = full.failure!.findDetails(RefusalSchema);
    expect(queueFull?.kind).toBe(RefusalKind.QUEUE_FULL);
    expect(queueFull?.retryAfter).toBeDefined();
    waiting.cancel();
    await waiting.done;

    const shortWait = admit(budget, "short-wait", [start("b", 2, 1)], 300);
    await shortWait.done;
    expect(shortWait.failure?.code).toBe(Code.ResourceExhausted);
    const [exhausted] = shortWait.failure!.findDetails(RefusalSchema);
    expect(exhausted?.kind).toBe(RefusalKind.WAIT_EXHAUSTED);
    expect(exhausted?.message).toContain("still does not fit");
    holder.cancel();
    await holder.done;
  });

  it("build_done and started move the shares; the stream's end releases the rest", async () => {
    const budget = await startBudget();
    const stream = admit(budget, "up web", [
      start("web", 1, 1),
      { kind: NeedItemKind.BUILD, name: "web", costSource: { case: "cost", value: { memoryBytes: BigInt(2 * G), cpu: 2 } } },
    ]);
    expect(await until(() => stream.has("admitted"))).toBe(true);
    expect((await budget.client.getState({})).committed?.memoryBytes).toBe(BigInt(3 * G));
    stream.send({ kind: { case: "buildDone", value: {} } });
    expect(await until(() => stream.received.filter((r) => r.kind.case === "updated").length === 1)).toBe(true);
    expect((await budget.client.getState({})).committed?.memoryBytes).toBe(BigInt(G));
    stream.send({ kind: { case: "started", value: { name: "web", pid: process.pid } } });
    expect(await until(() => stream.received.filter((r) => r.kind.case === "updated").length === 2)).toBe(true);
    const state = await budget.client.getState({});
    // The undeclared start took the default run cost (512M): the reservation keeps the other 512M.
    expect(state.running.map((r) => [r.name, r.pid])).toEqual([["web", process.pid]]);
    stream.cancel();
    await stream.done;
    expect(await until(async () => (await reservations(budget)) === 0)).toBe(true);
    expect((await budget.client.getState({})).running).toHaveLength(1);
  });

  it("an Admit with a request_id whose connection breaks keeps its place: a resume on a new connection is told its place and admitted in its turn", async () => {
    const budget = await startBudget();
    const proxy = await cuttableProxy(budget.url);
    const throughProxy = connectClient(BudgetService, proxy.url, { protocol: "grpc", defaultTimeoutMs: 60_000 });
    const holder = admit(budget, "holder", [start("a", 3, 1)]);
    expect(await until(() => holder.has("admitted"))).toBe(true);
    const first = admit(budget, "job", [start("b", 2, 1)], undefined, { requestId: "job-1", client: throughProxy });
    expect(await until(() => first.has("queued"))).toBe(true);
    const behind = admit(budget, "behind", [start("c", 3, 1)]);
    expect(await until(() => behind.has("queued"))).toBe(true);
    proxy.cut();
    await first.done;
    expect(first.failure).toBeDefined();
    // The service saw the stream end; the place stays.
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect((await budget.client.getState({})).queue.map((q) => q.owner)).toEqual(["job", "behind"]);
    const resumed = admit(budget, "job", [start("b", 2, 1)], undefined, { requestId: "job-1" });
    expect(await until(() => resumed.received.length > 0)).toBe(true);
    expect(resumed.received[0]).toMatchObject({ kind: { case: "queued", value: { position: 1 } } });
    holder.send({ kind: { case: "release", value: {} } });
    expect(await until(() => resumed.has("admitted"))).toBe(true);
    expect(behind.has("admitted")).toBe(false);
    resumed.send({ kind: { case: "release", value: {} } });
    expect(await until(() => behind.has("admitted"))).toBe(true);
    behind.cancel();
    await Promise.all([holder.done, resumed.done, behind.done]);
  });

  it("an Admit with a request_id not resumed within the grace is dropped; one cancelled by its client is dropped at once; admitted while away, it is held, then released", async () => {
    const budget = await startBudget({ args: ["--admit-resume-grace=1s"] });
    const proxy = await cuttableProxy(budget.url);
    const throughProxy = connectClient(BudgetService, proxy.url, { protocol: "grpc", defaultTimeoutMs: 60_000 });
    const holder = admit(budget, "holder", [start("a", 3, 1)]);
    expect(await until(() => holder.has("admitted"))).toBe(true);
    const broken = admit(budget, "broken", [start("b", 2, 1)], undefined, { requestId: "job-2", client: throughProxy });
    expect(await until(() => broken.has("queued"))).toBe(true);
    proxy.cut();
    await broken.done;
    expect(await until(async () => (await budget.client.getState({})).queueSize === 0)).toBe(true);
    // A cancel by its client is no break: dropped at once, though this service's grace is a minute.
    const patient = await startBudget({ args: ["--admit-resume-grace=60s"] });
    const blocker = admit(patient, "holder", [start("a", 3, 1)]);
    expect(await until(() => blocker.has("admitted"))).toBe(true);
    const cancelled = admit(patient, "cancelled", [start("b", 2, 1)], undefined, { requestId: "job-3" });
    expect(await until(() => cancelled.has("queued"))).toBe(true);
    cancelled.cancel();
    expect(await until(async () => (await patient.client.getState({})).queueSize === 0)).toBe(true);
    blocker.cancel();

    const away = admit(budget, "away", [start("b", 1, 1)], undefined, { requestId: "job-4", client: throughProxy });
    expect(await until(() => away.has("admitted"))).toBe(true);
    proxy.cut();
    await away.done;
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect((await budget.client.getState({})).reservations.map((r) => r.owner).sort()).toEqual(["away", "holder"]);
    expect(await until(async () => (await budget.client.getState({})).reservationCount === 1)).toBe(true);
    holder.cancel();
    await holder.done;
  });

  it("a client killed with SIGKILL while queued leaves nothing queued (once the resume grace of its admission ran out)", async () => {
    // berth admit gives its admission a request id, so that a broken connection is resumed: the
    // service cannot tell a client killed from a connection lost, and keeps its place for the grace.
    const budget = await startBudget({ args: ["--admit-resume-grace=1s"] });
    const { reservation } = await budget.client.reserve({ owner: "holder", need: { items: [start("a", 3, 1)] } });
    const client = spawnBerth(budget.url, ["admit", "--memory", "2G", "--json", "--", "true"]);
    await client.event("queued");
    expect(await queueLength(budget)).toBe(1);
    client.child.kill("SIGKILL");
    await client.exited;
    expect(await until(async () => (await queueLength(budget)) === 0)).toBe(true);
    await budget.client.release({ reservationId: reservation!.id });
  });

  it("a client killed with SIGKILL while admitted releases its reservation (once the resume grace ran out); its command's entry goes with the command", async () => {
    const budget = await startBudget({ args: ["--admit-resume-grace=1s"] });
    const client = spawnBerth(budget.url, ["admit", "--memory", "2G", "--json", "--", process.execPath, "-e", "setTimeout(() => {}, 30000)"]);
    const started = await client.event("started");
    const commandPid = started.pid as number;
    expect(await reservations(budget)).toBe(1);
    client.child.kill("SIGKILL");
    await client.exited;
    expect(await until(async () => (await reservations(budget)) === 0)).toBe(true);
    // The command itself still runs, so it is still counted.
    expect((await budget.client.getState({})).running.map((r) => r.pid)).toEqual([commandPid]);
    process.kill(commandPid, "SIGKILL");
    expect(await until(async () => (await budget.client.getState({})).running.length === 0)).toBe(true);
  });

  it("a leased reservation that is not renewed is released", async () => {
    const budget = await startBudget();
    await budget.client.reserve({ owner: "short", need: { items: [start("a", 1, 1)] }, ttl: { seconds: 0n, nanos: 300_000_000 } });
    expect(await reservations(budget)).toBe(1);
    expect(await until(async () => (await reservations(budget)) === 0, 3000)).toBe(true);
  });

  it("shutdown ends a queued stream with UNAVAILABLE", async () => {
    const budget = await startBudget();
    const holder = admit(budget, "holder", [start("a", 3, 1)]);
    expect(await until(() => holder.has("admitted"))).toBe(true);
    const waiting = admit(budget, "waiting", [start("b", 2, 1)]);
    expect(await until(() => waiting.has("queued"))).toBe(true);
    const stopping = Date.now();
    expect(await budget.service.stop()).toEqual({ code: 0, signal: null });
    // Every stream ended on the shutdown signal: nothing waited for the drain timeout.
    expect(Date.now() - stopping).toBeLessThan(4000);
    await Promise.all([holder.done, waiting.done]);
    expect(waiting.failure?.code).toBe(Code.Unavailable);
  });
});
