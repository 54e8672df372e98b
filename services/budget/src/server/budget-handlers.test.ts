import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createContextValues, createHandlerContext } from "@connectrpc/connect";
import { afterEach, describe, expect, it, vi } from "vitest";
import { Gate, NeedItemKind, RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService, ReserveRequestSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { AdmitRequestSchema, AdmitResponse, ReserveResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { AnswerDelivery, answerDeliveryKey } from "@berth/shared/server/index";
import { createBudgetHandlers } from "./budget-handlers.js";
import type { InMemoryBudget, InMemoryOptions } from "./testing.js";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { G, M, buildItem, pushable, serveInMemory, settle, startItem } from "./testing.js";

type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;
type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;

const servers: InMemoryBudget[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

async function serve(options: InMemoryOptions = {}) {
  const server = await serveInMemory(options);
  servers.push(server);
  return server;
}

/** An Admit stream driven by the test: `send` a message, `next` the answer. */
function openAdmit(
  server: InMemoryBudget,
  owner: string,
  items: NeedItemInit[] = [],
  options: { maxWaitMs?: number; start?: boolean; requestId?: string } = {},
) {
  const requests = pushable<AdmitRequestInit>();
  const controller = new AbortController();
  if (options.start !== false) {
    requests.push({
      kind: {
        case: "start",
        value: {
          owner,
          need: { items },
          requestId: options.requestId ?? "",
          maxWait:
            options.maxWaitMs === undefined ? undefined : { seconds: BigInt(Math.floor(options.maxWaitMs / 1000)), nanos: (options.maxWaitMs % 1000) * 1e6 },
        },
      },
    });
  }
  const responses = server.client.admit(requests, { signal: controller.signal })[Symbol.asyncIterator]();
  const received: AdmitResponse[] = [];
  let failure: ConnectError | undefined;
  let ended = false;
  // Read continuously, as a real client does; tests look at what arrived.
  const reading = (async () => {
    try {
      for (;;) {
        const result = await responses.next();
        if (result.done) break;
        received.push(result.value);
      }
    } catch (error) {
      failure = ConnectError.from(error);
    } finally {
      ended = true;
    }
  })();
  return {
    requests,
    received,
    send: (request: AdmitRequestInit) => requests.push(request),
    /** Ends the call from the client's side: a cancel by default (over a real connection, RST_STREAM CANCEL). */
    cancel: (reason: unknown = new ConnectError("cancelled by the client", Code.Canceled)) => controller.abort(reason),
    /** The connection breaks under the stream (the service sees no reason, as Node gives it). */
    breakConnection: () => controller.abort(new Error("socket hang up")),
    get failure() {
      return failure;
    },
    get ended() {
      return ended;
    },
    /** Waits until `predicate` holds for what arrived (or the stream ended). */
    async until(predicate: () => boolean) {
      const end = Date.now() + 5000;
      while (!predicate() && !ended && Date.now() < end) await new Promise((resolve) => setTimeout(resolve, 2));
      return predicate();
    },
    last: () => received[received.length - 1],
    done: reading,
  };
}

const startNeed = (name: string, memoryGb: number, cpu: number) => [startItem(name, memoryGb, cpu)];

/** The error's ErrorInfo (reason, domain) and RetryInfo delay in ms (undefined without one). */
function errorInfo(error: ConnectError | undefined) {
  const [info] = error?.findDetails(ErrorInfoSchema) ?? [];
  const [retry] = error?.findDetails(RetryInfoSchema) ?? [];
  return { reason: info?.reason, domain: info?.domain, retryAfterMs: retry?.retryDelay === undefined ? undefined : durationMs(retry.retryDelay) };
}

describe("Check", () => {
  it("says a need fits, with its parts, the committed list, the machine and the policy", async () => {
    const { client } = await serve();
    const { verdict } = await client.check({ need: { items: [startItem("web", 1, 1), buildItem("web", 2, 1, 0), buildItem("api", 1, 1, 0)] } });
    expect(verdict?.fits).toBe(true);
    expect(verdict?.need?.start?.memoryBytes).toBe(BigInt(G));
    expect(verdict?.need?.build?.memoryBytes).toBe(BigInt(3 * G));
    expect(verdict?.need?.total?.cpu).toBe(3);
    expect(verdict?.policy?.memoryBytes).toBe(BigInt(8 * G));
    expect(verdict?.policy?.sampleInterval?.seconds).toBe(1n);
    expect(verdict?.policy?.defaultLeaseTtl?.seconds).toBe(30n);
    expect(verdict?.machine?.availableBytes).toBe(BigInt(64 * G));
    expect(verdict?.waitFor).toEqual([]);
  });

  it("names the gate, its figures and what holds the budget when a need would wait", async () => {
    const server = await serve();
    await server.budget.admit({ items: [], start: { memoryBytes: 6 * G, cpu: 1 }, build: { memoryBytes: 0, cpu: 0 } }, "big one");
    const { verdict } = await server.client.check({ need: { items: startNeed("web", 4, 1) } });
    expect(verdict?.fits).toBe(false);
    const reason = verdict!.waitFor[0]!;
    expect(reason.gate).toBe(Gate.MEMORY_BUDGET);
    expect(reason.needed).toBe(4 * G);
    expect(reason.available).toBe(2 * G);
    expect(reason.limit).toBe(8 * G);
    expect(reason.observed).toBe(6 * G);
    expect(reason.setting).toBe("BERTH_BUDGET_MEMORY");
    expect(reason.holders.map((h) => h.what)).toEqual(["in flight: big one"]);
    expect(verdict?.waitForText).toContain("memory: needs 4G");
    expect(verdict?.committed?.items.map((i) => i.what)).toEqual(["in flight: big one"]);
  });

  it("says when a need can never fit", async () => {
    const { client } = await serve();
    const { verdict } = await client.check({ need: { items: startNeed("huge", 9, 1) } });
    expect(verdict?.fits).toBe(false);
    expect(verdict?.impossible).toContain("whole budget is 8G");
    expect(verdict?.impossibleReason?.gate).toBe(Gate.MEMORY_BUDGET);
    expect(verdict?.impossibleReason?.available).toBe(8 * G);
    expect(verdict?.waitFor).toEqual([]);
  });

  it("reports the cpu gate's observed pressure as min(avg10, avg60), and skip_load_gate skips it", async () => {
    const { client } = await serve({ sample: { pressure: { cpu: { avg10: 95, avg60: 85, avg300: 50, total: 1, scope: "host" } } } });
    const { verdict } = await client.check({ need: { items: startNeed("web", 1, 1) } });
    expect(verdict?.waitFor.map((r) => [r.gate, r.observed])).toEqual([[Gate.CPU_PRESSURE, 85]]);
    const skipped = await client.check({ need: { items: startNeed("web", 1, 1) }, skipLoadGate: true });
    expect(skipped.verdict?.fits).toBe(true);
  });

  it("defaults undeclared items from the policy and a spec's build part for a build", async () => {
    const { client } = await serve();
    const { verdict } = await client.check({
      need: {
        items: [
          { kind: NeedItemKind.START, name: "web" },
          { kind: NeedItemKind.BUILD, name: "web", costSource: { case: "spec", value: { memory: "64G", build: { memory: "1G", cpu: 0.5 } } } },
          { kind: NeedItemKind.BUILD, name: "skipped", skipped: "unchanged" },
        ],
      },
    });
    expect(verdict?.need?.start).toMatchObject({ memoryBytes: BigInt(512 * M), cpu: 0.5 });
    expect(verdict?.need?.build).toMatchObject({ memoryBytes: BigInt(G), cpu: 0.5 });
  });

  it.each([
    [{ kind: 7, name: "x" }, "need.items[0].kind"],
    [{ kind: NeedItemKind.UNSPECIFIED, name: "x" }, "need.items[0].kind"],
    [{ kind: NeedItemKind.START, name: "" }, "need.items[0].name"],
    [{ kind: NeedItemKind.START, name: "   " }, "need.items[0].name"],
    [{ kind: NeedItemKind.START, name: "x".repeat(257) }, "need.items[0].name"],
    [{ kind: NeedItemKind.START, name: "x", costSource: { case: "spec", value: { memory: "12Q" } } }, "need.items[0].spec.memory"],
    [{ kind: NeedItemKind.START, name: "x", costSource: { case: "spec", value: { memory: "-1G" } } }, "need.items[0].spec.memory"],
    [{ kind: NeedItemKind.START, name: "x", costSource: { case: "spec", value: { cpu: Number.NaN } } }, "need.items[0].spec.cpu"],
    [{ kind: NeedItemKind.START, name: "x", costSource: { case: "spec", value: { cpu: -1 } } }, "need.items[0].spec.cpu"],
    [{ kind: NeedItemKind.START, name: "x", costSource: { case: "spec", value: { build: { memory: "lots" } } } }, "need.items[0].spec.build.memory"],
    [
      { kind: NeedItemKind.BUILD, name: "x", costSource: { case: "spec", value: { build: { cpu: Number.POSITIVE_INFINITY } } } },
      "need.items[0].spec.build.cpu",
    ],
    [{ kind: NeedItemKind.START, name: "x", costSource: { case: "cost", value: { memoryBytes: 2n ** 60n, cpu: 1 } } }, "need.items[0].cost.memory_bytes"],
    [{ kind: NeedItemKind.START, name: "x", costSource: { case: "cost", value: { memoryBytes: 1n, cpu: Number.NaN } } }, "need.items[0].cost.cpu"],
  ])("refuses a malformed item %# naming %s", async (item, field) => {
    const { client } = await serve();
    const error = await client.check({ need: { items: [item as never] } }).catch((e: unknown) => ConnectError.from(e));
    expect(error).toBeInstanceOf(ConnectError);
    expect((error as ConnectError).code).toBe(Code.InvalidArgument);
    expect((error as ConnectError).rawMessage.startsWith(`${field}:`)).toBe(true);
  });
});

describe("Admit", () => {
  it("admits at once when the need fits, and releases on request", async () => {
    const server = await serve();
    const stream = openAdmit(server, "up web", startNeed("web", 2, 1));
    expect(await stream.until(() => stream.received.length === 1)).toBe(true);
    const admitted = stream.received[0]!.kind;
    expect(admitted.case).toBe("admitted");
    if (admitted.case !== "admitted") return;
    expect(admitted.value.reservation?.owner).toBe("up web");
    expect(admitted.value.reservation?.start?.memoryBytes).toBe(BigInt(2 * G));
    expect(admitted.value.reservation?.expireTime).toBeUndefined();
    expect(server.budget.state().reservations).toHaveLength(1);

    stream.send({ kind: { case: "release", value: {} } });
    await stream.done;
    expect(stream.failure).toBeUndefined();
    expect(stream.last()?.kind).toMatchObject({ case: "released", value: { reservationId: admitted.value.reservation?.id } });
    expect(server.budget.state().reservations).toHaveLength(0);
  });

  it("queues with positions at once, and a release admits the head at once and moves the others up", async () => {
    const server = await serve();
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1));
    const third = openAdmit(server, "third", startNeed("c", 5, 1));
    await second.until(() => second.received.length === 1);
    await third.until(() => third.received.length === 1);

    const q2 = second.received[0]!.kind;
    const q3 = third.received[0]!.kind;
    expect(q2.case).toBe("queued");
    expect(q3.case).toBe("queued");
    if (q2.case !== "queued" || q3.case !== "queued") return;
    expect(q2.value.position).toBe(1);
    expect(q2.value.waitFor.map((r) => r.gate)).toEqual([Gate.MEMORY_BUDGET]);
    expect(q2.value.waitFor[0]?.holders.map((h) => h.what)).toEqual(["in flight: first"]);
    expect(q3.value.position).toBe(2);
    expect(q3.value.waitFor.map((r) => [r.gate, r.observed])).toEqual([
      [Gate.QUEUE, 1],
      [Gate.MEMORY_BUDGET, 6 * G],
    ]);
    expect(q3.value.ahead.map((a) => [a.owner, a.position])).toEqual([["second", 1]]);
    expect(q3.value.waitForText).toBe(`1 request(s) ahead in the queue; ${q2.value.waitForText}`);
    expect(q3.value.waitExpireTime).toBeDefined();
    // 'first' holds the budget with no lease and no past runs: nothing predicts when it ends.
    expect(q3.value.eta).toBeUndefined();
    expect(q3.value.etaBasis).toMatch(/^unknown: /);

    first.send({ kind: { case: "release", value: {} } });
    expect(await second.until(() => second.last()?.kind.case === "admitted")).toBe(true);
    // The third is now the head, still waiting for memory: it hears its new position.
    expect(await third.until(() => third.received.length === 2)).toBe(true);
    expect(third.last()?.kind).toMatchObject({ case: "queued", value: { position: 1 } });
    second.cancel();
    third.cancel();
  });

  it("says what it holds, for /debug/streams: its place in the queue, then its reservation", async () => {
    const server = await serve();
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1));
    await second.until(() => second.received.length === 1);
    const holds = () => server.metrics.streams.list().map((s) => s.holds);
    const firstId = server.budget.state().reservations[0]?.id;
    expect(holds()).toEqual([`reservation ${firstId} for "first"`, 'a place in the admission queue for "second"']);
    first.cancel();
    expect(await second.until(() => second.last()?.kind.case === "admitted")).toBe(true);
    const secondId = server.budget.state().reservations[0]?.id;
    expect(holds()).toEqual([`reservation ${secondId} for "second"`]);
    second.cancel();
    await second.done;
    await vi.waitFor(() => expect(server.metrics.streams.size).toBe(0));
  });

  it("a queued waiter hears a heartbeat when nothing changes", async () => {
    const server = await serve();
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1));
    await second.until(() => second.received.length === 1);
    server.clock.advance(5000);
    expect(await second.until(() => second.received.length === 2)).toBe(true);
    expect(second.last()?.kind).toMatchObject({ case: "queued", value: { position: 1 } });
    first.cancel();
    second.cancel();
  });

  it("a queued waiter's deadline is shown in the wall time of each message, across a wall-clock step", async () => {
    const server = await serve({ policy: { maxWaitMs: 600_000 } });
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1));
    await second.until(() => second.received.length === 1);
    const deadlineOf = (message: AdmitResponse | undefined) => {
      const kind = message?.kind;
      return kind?.case === "queued" ? Number(kind.value.waitExpireTime!.seconds) * 1000 + kind.value.waitExpireTime!.nanos / 1e6 : NaN;
    };
    expect(deadlineOf(second.last())).toBe(server.clock.now() + 600_000);
    server.clock.stepWall(-3_600_000);
    server.clock.advance(5000);
    expect(await second.until(() => second.received.length === 2)).toBe(true);
    expect(deadlineOf(second.last())).toBe(server.clock.now() + 595_000);
    first.cancel();
    second.cancel();
  });

  it("build_done gives the build share back and started moves the start share to the tally", async () => {
    const server = await serve();
    const stream = openAdmit(server, "up web", [startItem("web", 2, 1), buildItem("web", 3, 2)]);
    await stream.until(() => stream.received.length === 1);
    expect(server.budget.state().committed.memoryBytes).toBe(5 * G);

    stream.send({ kind: { case: "buildDone", value: {} } });
    expect(await stream.until(() => stream.received.length === 2)).toBe(true);
    expect(stream.last()?.kind).toMatchObject({ case: "updated" });
    expect(server.budget.state().committed.memoryBytes).toBe(2 * G);

    stream.send({
      kind: {
        case: "started",
        value: { name: "web", costSource: { case: "cost", value: { memoryBytes: BigInt(2 * G), cpu: 1 } }, pid: process.pid, ttl: { seconds: 60n, nanos: 0 } },
      },
    });
    expect(await stream.until(() => stream.received.length === 3)).toBe(true);
    const updated = stream.last()!.kind;
    expect(updated.case).toBe("updated");
    if (updated.case !== "updated") return;
    expect(updated.value.running?.name).toBe("web");
    expect(updated.value.running?.pid).toBe(process.pid);
    expect(updated.value.running?.expireTime).toBeDefined();
    expect(updated.value.reservation?.start?.memoryBytes).toBe(0n);
    expect(updated.value.reservation?.runningIds).toEqual([updated.value.running?.id]);
    const state = await server.client.getState({});
    expect(state.running.map((r) => r.name)).toEqual(["web"]);
    expect(state.committed?.memoryBytes).toBe(BigInt(2 * G));

    stream.send({ kind: { case: "release", value: {} } });
    await stream.done;
    // The running entry outlives the stream.
    expect(server.budget.state().running).toHaveLength(1);
    expect(server.budget.state().reservations).toHaveLength(0);
  });

  it("started without a cost takes what its item was admitted with; the policy's default only for a name the need lacks", async () => {
    const server = await serve();
    const stream = openAdmit(server, "up web", [startItem("web", 0.25, 0.25), startItem("db", 1, 1)]);
    await stream.until(() => stream.received.length === 1);
    const running = async (value: AdmitRequestInit["kind"] & { case: "started" }) => {
      const before = stream.received.length;
      stream.send({ kind: value });
      expect(await stream.until(() => stream.received.length === before + 1)).toBe(true);
      const updated = stream.last()!.kind;
      if (updated.case !== "updated") throw new Error(`got ${updated.case}`);
      return updated.value;
    };

    const web = await running({ case: "started", value: { name: "web", pid: process.pid } });
    expect(web.running?.cost).toMatchObject({ memoryBytes: BigInt(256 * M), cpu: 0.25 });
    expect(web.reservation?.start).toMatchObject({ memoryBytes: BigInt(G), cpu: 1 });
    expect(server.budget.state().committed).toMatchObject({ memoryBytes: 1.25 * G, cpu: 1.25 });
    // A spec that gives only the memory takes the rest from the item too.
    const db = await running({ case: "started", value: { name: "db", pid: process.pid, costSource: { case: "spec", value: { memory: "512M" } } } });
    expect(db.running?.cost).toMatchObject({ memoryBytes: BigInt(512 * M), cpu: 1 });
    // A name the need does not have: the policy's default run cost (512M, 0.5 cpu).
    const other = await running({ case: "started", value: { name: "other", pid: process.pid } });
    expect(other.running?.cost).toMatchObject({ memoryBytes: BigInt(512 * M), cpu: 0.5 });
    stream.send({ kind: { case: "release", value: {} } });
    await stream.done;
  });

  it("refuses an impossible need with FAILED_PRECONDITION and a Refusal naming the setting", async () => {
    const server = await serve();
    const stream = openAdmit(server, "huge", startNeed("x", 9, 1));
    await stream.done;
    expect(stream.failure?.code).toBe(Code.FailedPrecondition);
    const [refusal] = stream.failure!.findDetails(RefusalSchema);
    expect(refusal?.kind).toBe(RefusalKind.IMPOSSIBLE);
    expect(refusal?.settings).toEqual(["BERTH_BUDGET_MEMORY"]);
    expect(refusal?.reasons[0]?.gate).toBe(Gate.MEMORY_BUDGET);
    expect(refusal?.message).toContain("can never admit 'huge'");
    expect(refusal?.waited?.seconds ?? 0n).toBe(0n);
    expect(refusal?.retryAfter).toBeUndefined();
    expect(errorInfo(stream.failure)).toEqual({ reason: "IMPOSSIBLE", domain: "berth.budget", retryAfterMs: undefined });
  });

  it("refuses when the queue is full with RESOURCE_EXHAUSTED, QUEUE_FULL and a retry_after", async () => {
    const server = await serve({ policy: { maxQueue: 1 } });
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1));
    await second.until(() => second.received.length === 1);
    const third = openAdmit(server, "third", startNeed("c", 4, 1));
    await third.done;
    expect(third.failure?.code).toBe(Code.ResourceExhausted);
    const [refusal] = third.failure!.findDetails(RefusalSchema);
    expect(refusal?.kind).toBe(RefusalKind.QUEUE_FULL);
    expect(refusal?.settings).toEqual(["BERTH_BUDGET_MAX_QUEUE"]);
    expect(refusal?.retryAfter?.seconds).toBeGreaterThan(0n);
    expect(errorInfo(third.failure)).toEqual({ reason: "QUEUE_FULL", domain: "berth.budget", retryAfterMs: durationMs(refusal!.retryAfter!) });
    first.cancel();
    second.cancel();
  });

  it("refuses with WAIT_EXHAUSTED (RESOURCE_EXHAUSTED, not DEADLINE_EXCEEDED) when its wait runs out", async () => {
    const server = await serve();
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1), { maxWaitMs: 3000 });
    await second.until(() => second.received.length === 1);
    server.clock.advance(3000);
    await second.done;
    expect(second.failure?.code).toBe(Code.ResourceExhausted);
    const [refusal] = second.failure!.findDetails(RefusalSchema);
    expect(refusal?.kind).toBe(RefusalKind.WAIT_EXHAUSTED);
    expect(refusal?.waited?.seconds).toBe(3n);
    expect(refusal?.reasons.map((r) => r.gate)).toEqual([Gate.MEMORY_BUDGET]);
    expect(refusal?.settings).toContain("BERTH_BUDGET_WAIT");
    expect(refusal?.retryAfter).toBeDefined();
    expect(errorInfo(second.failure)).toEqual({ reason: "WAIT_EXHAUSTED", domain: "berth.budget", retryAfterMs: durationMs(refusal!.retryAfter!) });
    expect(server.budget.state().queue).toHaveLength(0);
    first.cancel();
  });

  it("a max_wait of zero is admitted at once or refused at once with WAIT_EXHAUSTED, never queued", async () => {
    const server = await serve();
    const fits = openAdmit(server, "fits", startNeed("a", 6, 1), { maxWaitMs: 0 });
    await fits.until(() => fits.received.length === 1);
    expect(fits.last()?.kind.case).toBe("admitted");
    const refused = openAdmit(server, "no-wait", startNeed("b", 4, 1), { maxWaitMs: 0 });
    await refused.done;
    expect(refused.received).toEqual([]);
    expect(refused.failure?.code).toBe(Code.ResourceExhausted);
    expect(errorInfo(refused.failure).reason).toBe("WAIT_EXHAUSTED");
    const [refusal] = refused.failure!.findDetails(RefusalSchema);
    expect([refusal?.kind, refusal?.waited?.seconds ?? 0n, refusal?.reasons.map((r) => r.gate)]).toEqual([
      RefusalKind.WAIT_EXHAUSTED,
      0n,
      [Gate.MEMORY_BUDGET],
    ]);
    expect(server.budget.state().queueSize).toBe(0);
    fits.cancel();
  });

  it("messages out of turn are INVALID_ARGUMENT OUT_OF_TURN; a malformed start is INVALID_FIELD", async () => {
    const server = await serve();
    const early = openAdmit(server, "early", [], { start: false });
    early.send({ kind: { case: "buildDone", value: {} } });
    await early.done;
    expect([early.failure?.code, errorInfo(early.failure).reason, errorInfo(early.failure).domain]).toEqual([
      Code.InvalidArgument,
      "OUT_OF_TURN",
      "berth.budget",
    ]);

    const holder = openAdmit(server, "holder", startNeed("a", 6, 1));
    await holder.until(() => holder.received.length === 1);
    const queued = openAdmit(server, "queued", startNeed("b", 4, 1));
    await queued.until(() => queued.received.length === 1);
    queued.send({ kind: { case: "started", value: { name: "b" } } });
    await queued.done;
    expect([queued.failure?.rawMessage, errorInfo(queued.failure).reason]).toEqual([
      "started: sent before admitted: wait for the admitted message",
      "OUT_OF_TURN",
    ]);
    holder.send({ kind: { case: "start", value: { owner: "again" } } });
    await holder.done;
    expect(errorInfo(holder.failure).reason).toBe("OUT_OF_TURN");

    const noOwner = openAdmit(server, "", startNeed("a", 1, 1));
    await noOwner.done;
    expect([noOwner.failure?.rawMessage.startsWith("start.owner:"), errorInfo(noOwner.failure).reason]).toEqual([true, "INVALID_FIELD"]);
  });

  it("caps a max_wait longer than the policy's", async () => {
    const server = await serve({ policy: { maxWaitMs: 2000 } });
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1), { maxWaitMs: 60_000 });
    await second.until(() => second.received.length === 1);
    server.clock.advance(2000);
    await second.done;
    expect(second.failure?.findDetails(RefusalSchema)[0]?.kind).toBe(RefusalKind.WAIT_EXHAUSTED);
    first.cancel();
  });

  it("a cancelled stream drops its queued request and releases its reservation", async () => {
    const server = await serve();
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1));
    await second.until(() => second.received.length === 1);
    expect(server.budget.state().queue).toHaveLength(1);

    second.cancel();
    await second.done;
    await settle();
    expect(server.budget.state().queue).toHaveLength(0);

    first.cancel();
    await first.done;
    await settle();
    expect(server.budget.state().reservations).toHaveLength(0);
  });

  it("the client closing its side ends the admission", async () => {
    const server = await serve();
    const stream = openAdmit(server, "first", startNeed("a", 1, 1));
    await stream.until(() => stream.received.length === 1);
    stream.requests.end();
    await stream.done;
    await settle();
    expect(stream.failure).toBeUndefined();
    expect(server.budget.state().reservations).toHaveLength(0);
  });

  it("a release while queued withdraws the request", async () => {
    const server = await serve();
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1));
    await second.until(() => second.received.length === 1);
    second.send({ kind: { case: "release", value: {} } });
    await second.done;
    expect(second.last()?.kind).toMatchObject({ case: "released", value: { reservationId: "" } });
    await settle();
    expect(server.budget.state().queue).toHaveLength(0);
    first.cancel();
  });

  it.each([
    ["a first message other than start", [{ kind: { case: "buildDone", value: {} } }], "kind"],
    ["an empty first message", [{ kind: { case: undefined } }], "kind"],
  ] as const)("refuses %s", async (_name, messages, field) => {
    const server = await serve();
    const stream = openAdmit(server, "x", [], { start: false });
    for (const m of messages) stream.send(m as AdmitRequestInit);
    await stream.done;
    expect(stream.failure?.code).toBe(Code.InvalidArgument);
    expect(stream.failure?.rawMessage.startsWith(`${field}:`)).toBe(true);
  });

  it("refuses messages out of turn and releases what the stream held", async () => {
    const server = await serve();
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const queued = openAdmit(server, "queued", startNeed("b", 4, 1));
    await queued.until(() => queued.received.length === 1);
    queued.send({ kind: { case: "started", value: { name: "b" } } });
    await queued.done;
    expect(queued.failure?.code).toBe(Code.InvalidArgument);
    expect(queued.failure?.rawMessage).toMatch(/^started: sent before admitted/);

    first.send({ kind: { case: "start", value: { owner: "again" } } });
    await first.done;
    expect(first.failure?.code).toBe(Code.InvalidArgument);
    await settle();
    expect(server.budget.state().reservations).toHaveLength(0);
    expect(server.budget.state().queue).toHaveLength(0);
  });

  it.each([
    [{ owner: "" }, "start.owner"],
    [{ owner: "x", maxWait: { seconds: -1n, nanos: 0 } }, "start.max_wait"],
    [{ owner: "x", maxWait: { seconds: 1n, nanos: 2_000_000_000 } }, "start.max_wait"],
    [{ owner: "x", maxWait: { seconds: 10n ** 12n, nanos: 0 } }, "start.max_wait"],
    [
      { owner: "x", need: { items: [{ kind: NeedItemKind.START, name: "a", costSource: { case: "spec", value: { memory: "2 gigs" } } }] } },
      "start.need.items[0].spec.memory",
    ],
  ] as const)("refuses a malformed start %# naming %s", async (start, field) => {
    const server = await serve();
    const stream = openAdmit(server, "x", [], { start: false });
    stream.send({ kind: { case: "start", value: start as never } });
    await stream.done;
    expect(stream.failure?.code).toBe(Code.InvalidArgument);
    expect(stream.failure?.rawMessage.startsWith(`${field}:`)).toBe(true);
  });

  it("refuses a malformed started message and keeps serving", async () => {
    const server = await serve();
    const stream = openAdmit(server, "x", startNeed("a", 1, 1));
    await stream.until(() => stream.received.length === 1);
    stream.send({ kind: { case: "started", value: { name: "a", pid: -5 } } });
    await stream.done;
    expect(stream.failure?.rawMessage).toMatch(/^started\.pid:/);
    const again = await server.client.check({ need: { items: startNeed("a", 1, 1) } });
    expect(again.verdict?.fits).toBe(true);
  });
});

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

describe("GetState and the lists", () => {
  it("GetState gives the first page_size of each list with counts and tokens; the List RPCs continue them", async () => {
    const server = await serve({ policy: { memoryBytes: 64 * G, cpu: 64 } });
    for (let i = 0; i < 5; i++) await server.client.reserve({ owner: `r${i}`, need: { items: startNeed("a", 1, 0.1) } });
    for (let i = 0; i < 3; i++)
      await server.client.registerRunning({ name: `s${i}`, costSource: { case: "cost", value: { memoryBytes: BigInt((i + 2) * G), cpu: 0 } } });
    await server.client.reserve({ owner: "big", need: { items: startNeed("a", 49, 1) } });
    const queued = [0, 1, 2].map((i) => server.client.reserve({ owner: `q${i}`, need: { items: startNeed("a", 2, 1) } }).catch(() => undefined));
    await settle();

    const state = await server.client.getState({ pageSize: 2 });
    expect([state.queueSize, state.reservationCount, state.runningCount]).toEqual([3, 6, 3]);
    expect(state.queue.map((q) => [q.owner, q.position])).toEqual([
      ["q0", 1],
      ["q1", 2],
    ]);
    expect(state.reservations.map((r) => r.owner)).toEqual(["r0", "r1"]);
    expect(state.running.map((r) => r.name)).toEqual(["s0", "s1"]);
    // Committed: the largest first, with how many there are.
    expect(state.committed?.items.map((i) => i.what)).toEqual(["in flight: big", "running: s2"]);
    expect(state.committed?.itemCount).toBe(9);

    const queue = await server.client.listQueue({ pageToken: state.queueNextPageToken });
    expect([queue.queue.map((q) => [q.owner, q.position]), queue.nextPageToken]).toEqual([[["q2", 3]], ""]);
    const reservations = await server.client.listReservations({ pageToken: state.reservationsNextPageToken, pageSize: 3 });
    expect(reservations.reservations.map((r) => r.owner)).toEqual(["r2", "r3", "r4"]);
    const last = await server.client.listReservations({ pageToken: reservations.nextPageToken, pageSize: 3 });
    expect([last.reservations.map((r) => r.owner), last.nextPageToken]).toEqual([["big"], ""]);
    const running = await server.client.listRunning({ pageToken: state.runningNextPageToken });
    expect([running.running.map((r) => r.name), running.nextPageToken]).toEqual([["s2"], ""]);
    // All of it on one page: no tokens.
    const whole = await server.client.getState({});
    expect([whole.queueNextPageToken, whole.reservationsNextPageToken, whole.runningNextPageToken]).toEqual(["", "", ""]);
    // A token of one list is refused by another.
    const crossed = await server.client.listRunning({ pageToken: state.queueNextPageToken }).catch((e: unknown) => ConnectError.from(e));
    expect([(crossed as ConnectError).code, (crossed as ConnectError).rawMessage]).toEqual([
      Code.InvalidArgument,
      "page_token: is a token of another list (queue), not of running",
    ]);
    // The page size is capped, not refused.
    expect((await server.client.listReservations({ pageSize: 5000 })).reservations).toHaveLength(6);
    for (const r of (await server.client.listReservations({})).reservations) await server.client.release({ reservationId: r.id });
    await Promise.all(queued);
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

describe("GetState, GetMachine, WatchMachine, Costs", () => {
  it("shows the queue with positions and reasons, reservations, running, policy and machine", async () => {
    const server = await serve();
    const first = openAdmit(server, "first", startNeed("a", 6, 1));
    await first.until(() => first.received.length === 1);
    const second = openAdmit(server, "second", startNeed("b", 4, 1));
    const third = openAdmit(server, "third", startNeed("c", 3, 1));
    await second.until(() => second.received.length === 1);
    await third.until(() => third.received.length === 1);
    await server.client.registerRunning({ name: "db", costSource: { case: "cost", value: { memoryBytes: BigInt(M), cpu: 0 } } });

    const state = await server.client.getState({});
    expect(state.queue.map((q) => [q.owner, q.position])).toEqual([
      ["second", 1],
      ["third", 2],
    ]);
    expect(state.queue[1]?.waitFor.map((r) => r.gate)).toEqual([Gate.QUEUE, Gate.MEMORY_BUDGET]);
    expect(state.queue[1]?.need?.total?.memoryBytes).toBe(BigInt(3 * G));
    expect(state.reservations.map((r) => r.owner)).toEqual(["first"]);
    expect(state.running.map((r) => r.name)).toEqual(["db"]);
    expect(state.committed?.items.map((i) => i.what).sort()).toEqual(["in flight: first", "running: db"]);
    expect(state.policy?.maxQueue).toBe(1000);
    expect(state.machine?.cores).toBe(8);
    first.cancel();
    second.cancel();
    third.cancel();
  });

  it("answers the last sample, and watches every new one", async () => {
    const server = await serve();
    const { machine } = await server.client.getMachine({});
    expect(machine?.availableBytes).toBe(BigInt(64 * G));
    expect(machine?.load1).toBe(0);

    const controller = new AbortController();
    const watch = server.client.watchMachine({}, { signal: controller.signal })[Symbol.asyncIterator]();
    expect((await watch.next()).value?.machine?.availableBytes).toBe(BigInt(64 * G));
    server.sampler.set({ availableBytes: 10 * G, pressure: { cpu: { avg10: 1, avg60: 2, avg300: 3, total: 4_000_000, scope: "host" } } });
    const next = (await watch.next()).value;
    expect(next?.machine?.availableBytes).toBe(BigInt(10 * G));
    expect(next?.machine?.cpuPressure?.some?.avg60).toBe(2);
    expect(next?.machine?.cpuPressure?.some?.total?.seconds).toBe(4n);
    controller.abort();
    await expect(watch.next()).rejects.toThrow();
  });

  it("costs a spec: declared parts and the policy's defaults", async () => {
    const server = await serve();
    const declared = await server.client.costs({ spec: { memory: "1.5GiB", cpu: 2, build: { memory: "3G", cpu: 1 } } });
    expect(declared.run).toMatchObject({ memoryBytes: BigInt(1.5 * G), cpu: 2, declared: true });
    expect(declared.build).toMatchObject({ memoryBytes: BigInt(3 * G), cpu: 1, declared: true });
    const defaulted = await server.client.costs({});
    expect(defaulted.run).toMatchObject({ memoryBytes: BigInt(512 * M), cpu: 0.5, declared: false });
    expect(defaulted.build).toMatchObject({ memoryBytes: BigInt(2 * G), cpu: 1, declared: false });
  });
});

describe("Admit with a request_id: resumed after its stream broke", () => {
  const kinds = (stream: { received: AdmitResponse[] }) => stream.received.map((r) => r.kind.case);

  it("a broken stream keeps its place for the grace: a resume is told its place and is admitted in its turn", async () => {
    const server = await serve({ admitResumeGraceMs: 10_000 });
    const holder = await server.budget.admit({ items: [], start: { memoryBytes: 6 * G, cpu: 1 }, build: { memoryBytes: 0, cpu: 0 } }, "holder");
    const first = openAdmit(server, "job", startNeed("web", 4, 1), { requestId: "admit-1" });
    expect(await first.until(() => first.received.length > 0)).toBe(true);
    const behind = openAdmit(server, "behind", startNeed("api", 4, 1));
    await behind.until(() => behind.received.length > 0);
    first.breakConnection();
    await first.done;
    server.clock.advance(9_000);
    await settle();
    // Still first in line, though its stream is gone.
    expect((await server.client.getState({})).queue.map((q) => q.owner)).toEqual(["job", "behind"]);
    const resumed = openAdmit(server, "job", startNeed("web", 4, 1), { requestId: "admit-1" });
    expect(await resumed.until(() => resumed.received.length > 0)).toBe(true);
    expect(resumed.received[0]).toMatchObject({ kind: { case: "queued", value: { position: 1 } } });
    // The grace of the break does not end it now that it is resumed.
    server.clock.advance(5_000);
    await settle();
    expect((await server.client.getState({})).queueSize).toBe(2);
    server.budget.release(holder.id);
    expect(await resumed.until(() => resumed.last()?.kind.case === "admitted")).toBe(true);
    resumed.send({ kind: { case: "release", value: {} } });
    expect(await resumed.until(() => resumed.ended)).toBe(true);
    expect(kinds(resumed).slice(-2)).toEqual(["admitted", "released"]);
    expect(await behind.until(() => behind.last()?.kind.case === "admitted")).toBe(true);
    behind.cancel();
  });

  it("admitted while detached: the reservation is held, not handed; a resume gets it, and one that never comes releases it at the grace's end", async () => {
    const server = await serve({ admitResumeGraceMs: 10_000 });
    const hold = () => server.budget.admit({ items: [], start: { memoryBytes: 6 * G, cpu: 1 }, build: { memoryBytes: 0, cpu: 0 } }, "holder");
    for (const resume of [true, false]) {
      const holder = await hold();
      const id = `admit-${resume}`;
      const first = openAdmit(server, "job", startNeed("web", 4, 1), { requestId: id });
      await first.until(() => first.received.length > 0);
      first.breakConnection();
      await first.done;
      server.budget.release(holder.id);
      await settle();
      const state = await server.client.getState({});
      expect([state.queueSize, state.reservations.map((r) => r.owner)]).toEqual([0, ["job"]]);
      const held = state.reservations[0]!;
      if (resume) {
        server.clock.advance(9_999);
        const resumed = openAdmit(server, "job", startNeed("web", 4, 1), { requestId: id });
        expect(await resumed.until(() => resumed.received.length > 0)).toBe(true);
        expect(resumed.received[0]).toMatchObject({ kind: { case: "admitted", value: { reservation: { id: held.id } } } });
        resumed.send({ kind: { case: "buildDone", value: {} } });
        expect(await resumed.until(() => resumed.last()?.kind.case === "updated")).toBe(true);
        server.clock.advance(60_000);
        await settle();
        expect((await server.client.getState({})).reservationCount).toBe(1);
        resumed.send({ kind: { case: "release", value: {} } });
        expect(await resumed.until(() => resumed.ended)).toBe(true);
        expect((await server.client.getState({})).reservationCount).toBe(0);
      } else {
        server.clock.advance(10_000);
        await settle();
        expect((await server.client.getState({})).reservationCount).toBe(0);
      }
    }
  });

  it("a waiter not resumed within the grace is dropped, and its id runs anew; a clean cancel or a release ends it at once", async () => {
    const server = await serve({ admitResumeGraceMs: 10_000 });
    await server.budget.admit({ items: [], start: { memoryBytes: 6 * G, cpu: 1 }, build: { memoryBytes: 0, cpu: 0 } }, "holder");
    const first = openAdmit(server, "job", startNeed("web", 4, 1), { requestId: "admit-2" });
    await first.until(() => first.received.length > 0);
    first.breakConnection();
    await first.done;
    server.clock.advance(10_000);
    await settle();
    expect((await server.client.getState({})).queueSize).toBe(0);
    // Dropped unanswered: nothing was recorded, the id may even ask for something else now.
    const anew = openAdmit(server, "job", startNeed("web", 3, 1), { requestId: "admit-2" });
    await anew.until(() => anew.received.length > 0);
    expect((await server.client.getState({})).queue.map((q) => q.need?.total?.memoryBytes)).toEqual([BigInt(3 * G)]);
    // A cancel by the client is no break: dropped at once.
    anew.cancel();
    await anew.done;
    await settle();
    expect((await server.client.getState({})).queueSize).toBe(0);
    const released = openAdmit(server, "job", startNeed("web", 3, 1), { requestId: "admit-3" });
    await released.until(() => released.received.length > 0);
    released.send({ kind: { case: "release", value: {} } });
    await released.done;
    expect((await server.client.getState({})).queueSize).toBe(0);
  });

  it("a resume while the first stream still looks open takes over: the first ends ABORTED ADMIT_RESUMED, releasing nothing", async () => {
    const server = await serve();
    const first = openAdmit(server, "job", startNeed("web", 2, 1), { requestId: "admit-4" });
    expect(await first.until(() => first.last()?.kind.case === "admitted")).toBe(true);
    const reservationId = (first.last()!.kind.value as { reservation: { id: string } }).reservation.id;
    const second = openAdmit(server, "job", startNeed("web", 2, 1), { requestId: "admit-4" });
    expect(await second.until(() => second.received.length > 0)).toBe(true);
    expect(second.received[0]).toMatchObject({ kind: { case: "admitted", value: { reservation: { id: reservationId } } } });
    await first.done;
    expect([first.failure?.code, errorInfo(first.failure).reason]).toEqual([Code.Aborted, "ADMIT_RESUMED"]);
    expect((await server.client.getState({})).reservations.map((r) => r.id)).toEqual([reservationId]);
    second.send({ kind: { case: "release", value: {} } });
    await second.done;
    expect((await server.client.getState({})).reservationCount).toBe(0);
  });

  it("after the admission ended a repeat is answered admitted as first sent, then released; the id for another request is ALREADY_EXISTS", async () => {
    const server = await serve({ idempotencyWindowMs: 60_000 });
    const first = openAdmit(server, "job", startNeed("web", 2, 1), { requestId: "admit-5" });
    expect(await first.until(() => first.last()?.kind.case === "admitted")).toBe(true);
    const admitted = first.last()!;
    first.send({ kind: { case: "release", value: {} } });
    await first.done;
    const repeat = openAdmit(server, "job", startNeed("web", 2, 1), { requestId: "admit-5" });
    await repeat.done;
    expect(repeat.failure).toBeUndefined();
    expect(repeat.received[0]).toEqual(admitted);
    expect(repeat.received.slice(1)).toMatchObject([
      { kind: { case: "released", value: { reservationId: (admitted.kind.value as { reservation: { id: string } }).reservation.id } } },
    ]);
    expect((await server.client.getState({})).reservationCount).toBe(0);
    const other = openAdmit(server, "job", startNeed("web", 3, 1), { requestId: "admit-5" });
    await other.done;
    expect([other.failure?.code, errorInfo(other.failure).reason]).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);
    const reserve = await server.client
      .reserve({ owner: "job", need: { items: startNeed("web", 2, 1) }, requestId: "admit-5" })
      .catch((e: unknown) => ConnectError.from(e));
    expect(errorInfo(reserve as ConnectError).reason).toBe("IDEMPOTENCY_KEY_REUSED");
    server.clock.advance(60_000);
    const anew = openAdmit(server, "job", startNeed("web", 3, 1), { requestId: "admit-5" });
    expect(await anew.until(() => anew.last()?.kind.case === "admitted")).toBe(true);
    anew.cancel();
  });

  it("a started sent again with its request_id (after a resume, say) counts once and answers the first answer", async () => {
    const server = await serve();
    const stream = openAdmit(server, "job", startNeed("web", 2, 1), { requestId: "admit-6" });
    expect(await stream.until(() => stream.last()?.kind.case === "admitted")).toBe(true);
    const started = { kind: { case: "started" as const, value: { name: "web", requestId: "web-started" } } };
    stream.send(started);
    expect(await stream.until(() => stream.last()?.kind.case === "updated")).toBe(true);
    const firstAnswer = stream.last()!;
    stream.breakConnection();
    await stream.done;
    const resumed = openAdmit(server, "job", startNeed("web", 2, 1), { requestId: "admit-6" });
    await resumed.until(() => resumed.received.length > 0);
    resumed.send(started);
    expect(await resumed.until(() => resumed.last()?.kind.case === "updated")).toBe(true);
    expect(resumed.last()).toEqual(firstAnswer);
    expect((await server.client.getState({})).runningCount).toBe(1);
    resumed.cancel();
  });
});
