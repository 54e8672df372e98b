/** The Admit stream: queueing, admission, its exchanges and its release, and its resume after a break. */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterEach, describe, expect, it, vi } from "vitest";
import { Gate, NeedItemKind, RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema, AdmitResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { G, M, buildItem, settle, startItem } from "./testing.js";
import { errorInfo, inMemoryServers, openAdmit, startNeed } from "./handler-fixtures.js";

type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;

const { serve, closeAll } = inMemoryServers();
afterEach(closeAll);

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

  it("queues with positions at once, and a release admits the first waiter at once and moves the others up", async () => {
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
    // The third is now the first waiter, still waiting for memory: it hears its new position.
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
