import { Code, ConnectError } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { Gate, NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { G, M, buildItem, settle, startItem } from "./testing.js";
import { inMemoryServers, openAdmit, startNeed } from "./handler-fixtures.js";

const { serve, closeAll } = inMemoryServers();
afterEach(closeAll);

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
