/** WatchBudget and WatchMachine over the RPC layer: events, caught_up, resume, progress on the manual clock, invalid input, the budget closing. */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { BudgetEventKind, type WatchBudgetResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { afterEach, describe, expect, it } from "vitest";
import { G, serveInMemory, type InMemoryBudget } from "./testing.js";

const open: InMemoryBudget[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((b) => b.close()));
});

async function serve(): Promise<InMemoryBudget> {
  const served = await serveInMemory();
  open.push(served);
  return served;
}

const oneG = { items: [], start: { memoryBytes: G, cpu: 0 }, build: { memoryBytes: 0, cpu: 0 } };

/** Waits (turn by turn of the event loop) until `condition` holds. */
async function when(condition: () => boolean): Promise<void> {
  for (let i = 0; i < 10_000 && !condition(); i++) await new Promise<void>((resolve) => setImmediate(resolve));
  expect(condition()).toBe(true);
}

function describeMessage(message: WatchBudgetResponse): string {
  switch (message.kind.case) {
    case "event":
      return `${BudgetEventKind[message.kind.value.kind]}@${message.kind.value.revision}`;
    case "caughtUp":
      return `caughtUp@${message.kind.value.revision}${message.kind.value.reset ? " reset" : ""}`;
    case "progress":
      return `progress@${message.kind.value.revision}`;
    case "events":
      return `[${message.kind.value.events.map((event) => `${BudgetEventKind[event.kind]}@${event.revision}`).join(" ")}]`;
    default:
      return "?";
  }
}

describe("WatchBudget over RPC", () => {
  it("replays what a resumed watcher missed, then caught_up, then the live changes", async () => {
    const { client, budget } = await serve();
    const first = budget.revision;
    const a = await budget.reserve(oneG, "a", { ttlMs: 30_000 });
    budget.release(a.id);
    const controller = new AbortController();
    const stream = client.watchBudget({ startRevision: BigInt(first + 1) }, { signal: controller.signal })[Symbol.asyncIterator]();
    const seen: string[] = [];
    for (let i = 0; i < 2; i++) seen.push(describeMessage((await stream.next()).value));
    await budget.registerRunning("db", { memoryBytes: G, cpu: 0 });
    seen.push(describeMessage((await stream.next()).value));
    expect(seen).toEqual([`RESERVATION_RELEASED@${first + 2}`, `caughtUp@${first + 2}`, `RUNNING_REGISTERED@${first + 3}`]);
    controller.abort();
  });

  it("answers a revision of an earlier run with the current state and caught_up reset", async () => {
    const { client, budget } = await serve();
    await budget.registerRunning("db", { memoryBytes: G, cpu: 0 });
    const controller = new AbortController();
    const stream = client.watchBudget({ startRevision: BigInt(budget.revision - 1_000_000) }, { signal: controller.signal })[Symbol.asyncIterator]();
    const seen: string[] = [];
    for (let i = 0; i < 3; i++) seen.push(describeMessage((await stream.next()).value));
    expect(seen).toEqual([`RUNNING_REGISTERED@${budget.revision}`, `POLICY_CHANGED@${budget.revision}`, `caughtUp@${budget.revision} reset`]);
    controller.abort();
  });

  it("describes the current state in events messages of up to max_batch, then one event a change", async () => {
    const { client, budget } = await serve();
    for (const name of ["a", "b", "c", "d"]) await budget.registerRunning(name, { memoryBytes: G, cpu: 0 });
    const at = budget.revision;
    const controller = new AbortController();
    const stream = client.watchBudget({ includeCurrent: true, maxBatch: 2 }, { signal: controller.signal })[Symbol.asyncIterator]();
    const seen: string[] = [];
    for (let i = 0; i < 4; i++) seen.push(describeMessage((await stream.next()).value));
    await budget.registerRunning("e", { memoryBytes: G, cpu: 0 });
    seen.push(describeMessage((await stream.next()).value));
    const running = `RUNNING_REGISTERED@${at}`;
    expect(seen).toEqual([`[${running} ${running}]`, `[${running} ${running}]`, `[POLICY_CHANGED@${at}]`, `caughtUp@${at}`, `RUNNING_REGISTERED@${at + 1}`]);
    controller.abort();
  });

  it("describes the front of the queue up to queue_limit, and caught_up says how many wait", async () => {
    const { client, budget } = await serve();
    await budget.reserve({ ...oneG, start: { memoryBytes: 8 * G, cpu: 0 } }, "holder", { ttlMs: 30_000 });
    for (const name of ["a", "b", "c"]) void budget.reserve(oneG, name, { ttlMs: 30_000 }).catch(() => undefined);
    await when(() => budget.state().queue.length === 3);
    const controller = new AbortController();
    const messages: WatchBudgetResponse[] = [];
    for await (const message of client.watchBudget({ includeCurrent: true, queueLimit: 1 }, { signal: controller.signal })) {
      messages.push(message);
      if (message.kind.case === "caughtUp") break;
    }
    const owners = messages.flatMap((m) => (m.kind.case === "event" && m.kind.value.subject.case === "request" ? [m.kind.value.subject.value.owner] : []));
    expect(owners).toEqual(["a"]);
    expect(messages.at(-1)?.kind.case === "caughtUp" && messages.at(-1)?.kind.value).toMatchObject({ queueSize: 3, reset: false });
    controller.abort();
  });

  it("sends progress with the revision it is up to when nothing changed for progress_interval", async () => {
    const { client, budget, clock } = await serve();
    const controller = new AbortController();
    const stream = client.watchBudget({ includeCurrent: true, progressInterval: durationFromMs(1000) }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(describeMessage((await stream.next()).value)).toBe(`POLICY_CHANGED@${budget.revision}`);
    expect(describeMessage((await stream.next()).value)).toBe(`caughtUp@${budget.revision}`);
    const next = stream.next();
    await when(() => clock.pendingTimers() > 0);
    clock.advance(1000);
    const progress = (await next).value;
    expect(describeMessage(progress)).toBe(`progress@${budget.revision}`);
    controller.abort();
  });

  it("refuses invalid input INVALID_ARGUMENT naming the field", async () => {
    const { client } = await serve();
    for (const [request, field] of [
      [{ startRevision: -1n }, "start_revision"],
      [{ progressInterval: durationFromMs(50) }, "progress_interval"],
      [{ progressInterval: durationFromMs(-5) }, "progress_interval"],
      [{ includeCurrent: true, maxBatch: 10_001 }, "max_batch"],
    ] as const) {
      const error = await (async () => {
        for await (const _ of client.watchBudget(request)) return undefined;
      })().catch((e: unknown) => ConnectError.from(e));
      expect(error?.code).toBe(Code.InvalidArgument);
      expect(error?.rawMessage).toMatch(new RegExp(`^${field}: `));
      expect(error?.findDetails(ErrorInfoSchema)[0]?.reason).toBe("INVALID_FIELD");
    }
    const machine = await (async () => {
      for await (const _ of client.watchMachine({ startRevision: -2n })) return undefined;
    })().catch((e: unknown) => ConnectError.from(e));
    expect(machine?.rawMessage).toMatch(/^start_revision: /);
  });

  it("ends UNAVAILABLE SHUTTING_DOWN when the budget closes", async () => {
    const { client, budget } = await serve();
    const stream = client.watchBudget({ includeCurrent: true })[Symbol.asyncIterator]();
    expect(describeMessage((await stream.next()).value)).toMatch(/^POLICY_CHANGED@/);
    expect(describeMessage((await stream.next()).value)).toMatch(/^caughtUp@/);
    const ended = stream.next();
    await budget.close();
    const error = await ended.then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(error?.code).toBe(Code.Unavailable);
  });
});

describe("WatchMachine over RPC", () => {
  it("carries revisions, resumes after a sample without repeating it, and sends progress when the sampler stalls", async () => {
    const { client, sampler, clock } = await serve();
    const controller = new AbortController();
    const live = client.watchMachine({}, { signal: controller.signal })[Symbol.asyncIterator]();
    const first = (await live.next()).value;
    expect(first.reset).toBe(false);
    sampler.set({ availableBytes: 32 * G });
    const second = (await live.next()).value;
    expect(second.revision).toBe(first.revision + 1n);
    const resumed = client
      .watchMachine({ startRevision: first.revision, progressInterval: durationFromMs(500) }, { signal: controller.signal })
      [Symbol.asyncIterator]();
    const again = (await resumed.next()).value;
    expect([again.revision, again.machine?.availableBytes]).toEqual([second.revision, BigInt(32 * G)]);
    const stalled = resumed.next();
    await when(() => clock.pendingTimers() > 0);
    clock.advance(500);
    const progress = (await stalled).value;
    expect(progress.machine).toBeUndefined();
    expect(progress.progress?.revision).toBe(second.revision);
    expect(progress.revision).toBe(second.revision);
    controller.abort();
  });

  it("a request that sets neither field gets the current sample first, as before", async () => {
    const { client, budget } = await serve();
    const controller = new AbortController();
    const stream = client.watchMachine({}, { signal: controller.signal })[Symbol.asyncIterator]();
    const first = (await stream.next()).value;
    expect(first.machine?.availableBytes).toBe(BigInt(budget.machine()!.availableBytes!));
    expect(first.progress).toBeUndefined();
    controller.abort();
  });
});
