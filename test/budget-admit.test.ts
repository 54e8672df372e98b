/**
 * The budget service as a process: every RPC through real clients (Connect gRPC, grpc-js,
 * curl), the Admit stream's queue and refusals, a client killed with SIGKILL while queued and while
 * admitted, lease expiry, the running tally across a restart, SIGHUP reload and shutdown. The
 * service runs on a fixture machine (`--proc-root`), so nothing here depends on this box's load.
 */
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import * as path from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { Gate, NeedItemKind, RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema, AdmitResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { pushable } from "@berth/budget/server/testing";
import { G, spawnBerth, startBudget, until, type BudgetUnderTest } from "./budget-e2e.js";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { connectClient, curl, curlJson, cuttableProxy, grpcJsClient, makeTempDir, stopAll } from "./harness.js";

afterAll(stopAll);

type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;
type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;

const start = (name: string, memoryGb: number, cpu: number): NeedItemInit => ({
  kind: NeedItemKind.START,
  name,
  costSource: { case: "cost", value: { memoryBytes: BigInt(Math.round(memoryGb * G)), cpu } },
});

/** An Admit stream over the service's gRPC port (or through `client`), read continuously. */
function admit(
  budget: BudgetUnderTest,
  owner: string,
  items: NeedItemInit[],
  maxWaitMs?: number,
  options: { requestId?: string; client?: BudgetUnderTest["client"] } = {},
) {
  const requests = pushable<AdmitRequestInit>();
  const controller = new AbortController();
  requests.push({
    kind: {
      case: "start",
      value: {
        owner,
        need: { items },
        requestId: options.requestId ?? "",
        maxWait: maxWaitMs === undefined ? undefined : { seconds: BigInt(Math.floor(maxWaitMs / 1000)), nanos: (maxWaitMs % 1000) * 1e6 },
      },
    },
  });
  const received: Array<AdmitResponse & { at: number }> = [];
  let failure: ConnectError | undefined;
  const done = (async () => {
    try {
      for await (const response of (options.client ?? budget.client).admit(requests, { signal: controller.signal }))
        received.push(Object.assign(response, { at: performance.now() }));
    } catch (error) {
      failure = ConnectError.from(error);
    } finally {
      // connect-node keeps its side of the HTTP/2 stream open while our request iterable waits:
      // end it, as a finished client would, so the server's graceful shutdown does not wait on it.
      requests.end();
    }
  })();
  return {
    received,
    done,
    get failure() {
      return failure;
    },
    send: (r: AdmitRequestInit) => requests.push(r),
    cancel: () => controller.abort(),
    has: (kind: string) => received.some((r) => r.kind.case === kind),
  };
}

const queueLength = async (budget: BudgetUnderTest) => (await budget.client.getState({})).queue.length;
const reservations = async (budget: BudgetUnderTest) => (await budget.client.getState({})).reservations.length;

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

describe("budget service: Admit", () => {
  it("queues with positions, and a release admits the head at once", async () => {
    // The machine is read once an hour here: an admission can only come from the release itself.
    const budget = await startBudget({ args: ["--sample-interval=1h"] });
    const first = admit(budget, "first", [start("a", 3, 1)]);
    expect(await until(() => first.has("admitted"))).toBe(true);
    const second = admit(budget, "second", [start("b", 2, 1)]);
    const third = admit(budget, "third", [start("c", 3, 1)]);
    expect(await until(() => second.has("queued") && third.received.some((r) => r.kind.case === "queued" && r.kind.value.position === 2))).toBe(true);

    first.send({ kind: { case: "release", value: {} } });
    // No polling anywhere: with no sample due for an hour, the release alone admits the head.
    expect(await until(() => second.has("admitted"))).toBe(true);
    // The third (3G) is the head now, still waiting for memory: 2G of 4G are held.
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

describe("budget service: state across restarts and reloads", () => {
  it("the running tally survives a restart, without the work that ended meanwhile", async () => {
    const stateDir = path.join(makeTempDir(), "state");
    const first = await startBudget({ stateDir });
    const sleeper = spawn(process.execPath, ["-e", "setTimeout(() => {}, 30000)"], { stdio: "ignore" });
    const short = spawn(process.execPath, ["-e", "setTimeout(() => {}, 30000)"], { stdio: "ignore" });
    try {
      const kept = await first.client.registerRunning({ name: "kept", pid: sleeper.pid! });
      await first.client.registerRunning({ name: "ends", pid: short.pid! });
      await first.client.registerRunning({ name: "no pid", costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } } });
      expect(await first.service.stop()).toEqual({ code: 0, signal: null });
      short.kill("SIGKILL");
      await new Promise((resolve) => short.once("exit", resolve));

      const second = await startBudget({ stateDir });
      const { running, committed } = await second.client.getState({});
      expect(running.map((r) => r.name).sort()).toEqual(["kept", "no pid"]);
      expect(running.find((r) => r.name === "kept")?.id).toBe(kept.running?.id);
      expect(committed?.memoryBytes).toBe(BigInt(G + 512 * 1024 ** 2));
    } finally {
      sleeper.kill("SIGKILL");
      short.kill("SIGKILL");
    }
  });

  it("SIGHUP reloads the policy from the config file and re-checks the queue; flags still win; a bad file keeps the policy in force", async () => {
    const config = path.join(makeTempDir(), "budget.json");
    writeFileSync(config, JSON.stringify({ memory: "3G", cpu: 1 }));
    // The budget comes from the file (no --memory), except cpu, which a flag sets.
    const budget = await startBudget({ budgetFlags: false, args: [`--config=${config}`, "--cpu=4"] });
    expect((await budget.client.getState({})).policy).toMatchObject({ memoryBytes: BigInt(3 * G), cpu: 4 });
    const holder = admit(budget, "holder", [start("a", 2, 1)]);
    expect(await until(() => holder.has("admitted"))).toBe(true);
    const waiting = admit(budget, "waiting", [start("b", 2, 1)]);
    expect(await until(() => waiting.has("queued"))).toBe(true);

    writeFileSync(config, JSON.stringify({ memory: "5G", cpu: 1, "max-queue": 3, "lease-ttl": "2m" }));
    process.kill(budget.service.pid, "SIGHUP");
    expect(await until(() => waiting.has("admitted"))).toBe(true);
    const policy = (await budget.client.getState({})).policy!;
    expect(policy).toMatchObject({ memoryBytes: BigInt(5 * G), cpu: 4, maxQueue: 3 });
    expect(policy.defaultLeaseTtl?.seconds).toBe(120n);

    writeFileSync(config, JSON.stringify({ "max-queue": "many" }));
    process.kill(budget.service.pid, "SIGHUP");
    await budget.service.waitForLog((entry) => String(entry.msg).includes("the policy was not reloaded"));
    expect((await budget.client.getState({})).policy).toMatchObject({ memoryBytes: BigInt(5 * G), maxQueue: 3 });
    holder.cancel();
    waiting.cancel();
    await Promise.all([holder.done, waiting.done]);
    expect(await budget.service.stop()).toEqual({ code: 0, signal: null });
  });
});

describe("budget service: pages under load", () => {
  /** A start of `cpu` cores and no memory: thousands of them fit the fixture's memory, the cpu budget decides. */
  const cores = (cpu: number): NeedItemInit => ({ kind: NeedItemKind.START, name: "w", costSource: { case: "cost", value: { memoryBytes: 0n, cpu } } });

  /**
   * Pages through a list with `list` while `churn` admits, drops and adds entries at the same time,
   * then checks: no entry appears twice, and every entry there from before the first page to after
   * the last (`stayed`) appears exactly once.
   */
  async function pageWhileChurning(
    list: (token: string) => Promise<{ names: string[]; next: string }>,
    churn: () => Promise<void>,
    present: () => Promise<Set<string>>,
  ) {
    const before = await present();
    let stop = false;
    const churning = (async () => {
      while (!stop) await churn();
    })();
    const seen: string[] = [];
    let pages = 0;
    let token = "";
    do {
      const page = await list(token);
      seen.push(...page.names);
      token = page.next;
      pages++;
    } while (token !== "");
    stop = true;
    await churning;
    const after = await present();
    const stayed = [...before].filter((name) => after.has(name));
    const counts = new Map<string, number>();
    for (const name of seen) counts.set(name, (counts.get(name) ?? 0) + 1);
    expect(
      [...counts].filter(([, n]) => n > 1),
      "entries repeated",
    ).toEqual([]);
    expect(
      stayed.filter((name) => !counts.has(name)),
      "entries lost",
    ).toEqual([]);
    expect(pages).toBeGreaterThan(10);
    return { seen, stayed };
  }

  it("ListReservations, ListRunning and ListQueue page through hundreds of entries while others are admitted, released and queued: none lost or repeated", async () => {
    /** Which entry the churn picks: spread over the list, the same in every run. */
    let picks = 0;
    const pick = (length: number) => (picks++ * 7919) % length;
    const budget = await startBudget({ args: ["--cpu=1000", "--max-queue=2000", "--lease-ttl=10m"] });
    const { client } = budget;
    let n = 0;

    // Reservations: 400, released and reserved afresh while paging 7 at a time.
    const reserved: string[] = [];
    for (let i = 0; i < 400; i++) reserved.push((await client.reserve({ owner: `r${n++}`, need: { items: [cores(1)] } })).reservation!.id);
    const names = async () => {
      const owners = new Set<string>();
      for (let token = "", first = true; first || token !== ""; first = false) {
        const page = await client.listReservations({ pageToken: token, pageSize: 1000 });
        for (const r of page.reservations) owners.add(r.owner);
        token = page.nextPageToken;
      }
      return owners;
    };
    const reservations = await pageWhileChurning(
      async (token) => {
        const page = await client.listReservations({ pageToken: token, pageSize: 7 });
        return { names: page.reservations.map((r) => r.owner), next: page.nextPageToken };
      },
      async () => {
        const gone = reserved.splice(pick(reserved.length), 1)[0]!;
        await client.release({ reservationId: gone });
        reserved.push((await client.reserve({ owner: `r${n++}`, need: { items: [cores(1)] } })).reservation!.id);
      },
      names,
    );
    expect(reservations.stayed.length).toBeGreaterThan(100);

    // The running tally: 400 entries, stopped and registered afresh while paging.
    const running: string[] = [];
    for (let i = 0; i < 400; i++)
      running.push((await client.registerRunning({ name: `s${n++}`, costSource: { case: "cost", value: { memoryBytes: 0n, cpu: 0 } } })).running!.id);
    const runningNames = async () => new Set((await client.listRunning({ pageSize: 1000 })).running.map((r) => r.name));
    await pageWhileChurning(
      async (token) => {
        const page = await client.listRunning({ pageToken: token, pageSize: 9 });
        return { names: page.running.map((r) => r.name), next: page.nextPageToken };
      },
      async () => {
        const gone = running.splice(pick(running.length), 1)[0]!;
        await client.stopRunning({ id: gone });
        running.push((await client.registerRunning({ name: `s${n++}`, costSource: { case: "cost", value: { memoryBytes: 0n, cpu: 0 } } })).running!.id);
      },
      runningNames,
    );

    // The queue: the cpu budget held but for what small holders release, 300 waiters; while paging,
    // a release admits the head, a waiter's call ends, a newcomer joins.
    for (const id of reserved.splice(0)) await client.release({ reservationId: id });
    const small: string[] = [];
    await client.reserve({ owner: "holder", need: { items: [cores(1000 - 200)] } });
    for (let i = 0; i < 200; i++) small.push((await client.reserve({ owner: `small${i}`, need: { items: [cores(1)] } })).reservation!.id);
    const waiters = new Map<string, AbortController>();
    const waits: Array<Promise<unknown>> = [];
    const wait = (owner: string) => {
      const controller = new AbortController();
      waiters.set(owner, controller);
      waits.push(
        client.reserve({ owner, need: { items: [cores(1)] }, maxWait: { seconds: 600n, nanos: 0 } }, { signal: controller.signal }).catch(() => undefined),
      );
    };
    for (let i = 0; i < 300; i++) wait(`q${n++}`);
    expect(await until(async () => (await client.getState({ pageSize: 1 })).queueSize === 300, 30_000)).toBe(true);
    const queued = async () => {
      const owners = new Set<string>();
      for (let token = "", first = true; first || token !== ""; first = false) {
        const page = await client.listQueue({ pageToken: token, pageSize: 1000 });
        for (const q of page.queue) owners.add(q.owner);
        token = page.nextPageToken;
      }
      return owners;
    };
    let turn = 0;
    const queue = await pageWhileChurning(
      async (token) => {
        const page = await client.listQueue({ pageToken: token, pageSize: 5 });
        // Positions count from the head as it is now: increasing within a page.
        const positions = page.queue.map((q) => q.position);
        expect(positions).toEqual([...positions].sort((a, b) => a - b));
        return { names: page.queue.map((q) => q.owner), next: page.nextPageToken };
      },
      async () => {
        switch (turn++ % 3) {
          case 0: {
            const id = small.pop();
            if (id !== undefined) await client.release({ reservationId: id });
            break;
          }
          case 1: {
            const [owner, controller] = [...waiters][pick(waiters.size)]!;
            waiters.delete(owner);
            controller.abort();
            break;
          }
          default:
            wait(`q${n++}`);
        }
        // Let the service see the change before the next one.
        await client.getState({ pageSize: 1 });
      },
      queued,
    );
    expect(queue.stayed.length).toBeGreaterThan(100);
    for (const controller of waiters.values()) controller.abort();
    await Promise.all(waits);
  }, 120_000);
});
