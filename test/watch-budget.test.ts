/**
 * WatchBudget and WatchMachine against a running budget service, over gRPC and Connect: the
 * changes in order with growing revisions, the current state, a resume after a lag with exactly
 * what was missed, a reset for a revision of an earlier run, progress while idle, invalid input,
 * WatchMachine's resume; and the client's watchBudget, whose reader stops reading until the
 * service ends it WATCHER_LAGGED, resuming by itself with every change once. The queue, reservations and
 * tally live in the service's memory on every store (etcd holds only the fleet view), so one
 * store covers them.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { BudgetEventKind, BudgetService, type WatchBudgetResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetClient, createTransport, start, type BudgetWatchEvent } from "@berth/client";
import { afterAll, describe, expect, it } from "vitest";
import { G, startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import { connectClient, stopAll, type ConnectProtocol } from "./harness.js";

afterAll(stopAll);

const need = { items: [{ kind: NeedItemKind.START, name: "web", costSource: { case: "cost" as const, value: { memoryBytes: BigInt(G), cpu: 1 } } }] };

function label(message: WatchBudgetResponse): string {
  if (message.kind.case === "event") return BudgetEventKind[message.kind.value.kind]!;
  if (message.kind.case === "caughtUp") return message.kind.value.reset ? "caughtUp reset" : "caughtUp";
  return message.kind.case ?? "?";
}

function revisionOf(message: WatchBudgetResponse): bigint {
  if (message.kind.case === undefined || message.kind.case === "events") throw new Error(`a message with no revision of its own: ${message.kind.case}`);
  return message.kind.value.revision;
}

describe.each<ConnectProtocol>(["grpc", "connect"])("WatchBudget over %s", (protocol) => {
  let budget: BudgetUnderTest;
  const client = () => connectClient(BudgetService, budget.url, { protocol, defaultTimeoutMs: 60_000 });

  it("starts a service", async () => {
    budget = await startBudget();
  });

  it("tells the current state, then each change in order with growing revisions; resumes exactly; resets a foreign revision", async () => {
    const rpc = client();
    await rpc.registerRunning({ name: "db", costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 0 } } });
    const controller = new AbortController();
    const stream = rpc.watchBudget({ includeCurrent: true, progressInterval: durationFromMs(100) }, { signal: controller.signal })[Symbol.asyncIterator]();
    const next = async () => {
      for (;;) {
        const message = (await stream.next()).value as WatchBudgetResponse;
        if (message.kind.case !== "progress") return message;
      }
    };
    const current = [await next(), await next(), await next()];
    expect(current.map(label)).toEqual(["RUNNING_REGISTERED", "POLICY_CHANGED", "caughtUp"]);
    const caughtUp = revisionOf(current[2]!);
    const reserved = await rpc.reserve({ need, owner: "e2e" });
    await rpc.release({ reservationId: reserved.reservation!.id });
    const changes = [await next(), await next()];
    expect(changes.map(label)).toEqual(["RESERVATION_MADE", "RESERVATION_RELEASED"]);
    expect(changes.map(revisionOf)).toEqual([caughtUp + 1n, caughtUp + 2n]);
    // Idle: progress with the revision it is up to.
    let progress: WatchBudgetResponse;
    do progress = (await stream.next()).value as WatchBudgetResponse;
    while (progress.kind.case !== "progress");
    expect(revisionOf(progress)).toBe(caughtUp + 2n);
    controller.abort();

    // Resumed after the first change: the second only, then caught up.
    const resumed = rpc.watchBudget({ startRevision: caughtUp + 1n })[Symbol.asyncIterator]();
    const replay = [(await resumed.next()).value, (await resumed.next()).value] as WatchBudgetResponse[];
    expect(replay.map((m) => [label(m), revisionOf(m)])).toEqual([
      ["RESERVATION_RELEASED", caughtUp + 2n],
      ["caughtUp", caughtUp + 2n],
    ]);
    await resumed.return?.();

    // A revision of an earlier run (below this run's base): the current state, reset.
    const reset = rpc.watchBudget({ startRevision: 5n })[Symbol.asyncIterator]();
    const described: string[] = [];
    for (;;) {
      const message = (await reset.next()).value as WatchBudgetResponse;
      described.push(label(message));
      if (message.kind.case === "caughtUp") break;
    }
    expect(described).toEqual(["RUNNING_REGISTERED", "POLICY_CHANGED", "caughtUp reset"]);
    await reset.return?.();
  });

  it("refuses invalid input INVALID_ARGUMENT naming the field", async () => {
    const error = await (async () => {
      for await (const _ of client().watchBudget({ progressInterval: durationFromMs(10) })) return undefined;
    })().catch((e: unknown) => ConnectError.from(e));
    expect(error?.code).toBe(Code.InvalidArgument);
    expect(error?.rawMessage).toMatch(/^progress_interval: /);
  });

  it("WatchMachine: samples carry growing revisions and a resume continues after the one given", async () => {
    const rpc = client();
    const live = rpc.watchMachine({})[Symbol.asyncIterator]();
    const first = (await live.next()).value!;
    const second = (await live.next()).value!;
    expect(second.revision).toBeGreaterThan(first.revision);
    await live.return?.();
    const resumed = rpc.watchMachine({ startRevision: first.revision })[Symbol.asyncIterator]();
    const next = (await resumed.next()).value!;
    expect(next.revision).toBe(first.revision + 1n);
    expect(next.reset).toBe(false);
    await resumed.return?.();
  });
});

describe("BudgetClient.watchBudget of a reader that stops reading", () => {
  it("is ended WATCHER_LAGGED and resumes by itself from the revision named: every change once, in order, no gap", { timeout: 120_000 }, async () => {
    const count = 300;
    const slow = await startBudget({ args: ["--watch-buffer", "4"] });
    const writer = new BudgetClient({ url: slow.url });
    // Over gRPC, what the reader does not read is bounded by HTTP/2 flow control (here it lagged
    // from about 100 reservations made and released); over Connect on HTTP/1.1, the client's default
    // for server streams, 1,500 of them went unread here without the service ending the watcher.
    const reader = new BudgetClient({ transport: createTransport({ url: slow.url, token: undefined }, { protocol: "grpc" }) });
    const stop = new AbortController();
    const watch = reader.watchBudget({ includeCurrent: true, signal: stop.signal })[Symbol.asyncIterator]();
    const take = async (): Promise<BudgetWatchEvent> => {
      const step = await watch.next();
      if (step.done) throw new Error("the watch ended");
      return step.value;
    };
    while ((await take()).kind !== "caughtUp");
    // Owners as long as the service takes, so that fewer changes fill what the transport buffers.
    const owners = Array.from({ length: count }, (_, n) => `ts-lag-${String(n).padStart(3, "0")}-`.padEnd(256, "o"));
    for (const owner of owners) {
      const { reservation } = await writer.reserve([start("lag", { memory: "1M", cpu: 0 })], { owner });
      await writer.release(reservation!.id);
    }
    const seen: Array<[string, string, bigint]> = [];
    const resumed: bigint[] = [];
    let reset = false;
    while (seen.at(-1)?.[0] !== "RESERVATION_RELEASED" || seen.at(-1)?.[1] !== owners.at(-1)) {
      const item = await take();
      if (item.kind === "resumed") resumed.push(item.revision);
      else if (item.kind === "caughtUp") reset ||= item.reset;
      else if (item.kind === "event" && item.event.subject.case === "reservation")
        seen.push([BudgetEventKind[item.event.kind]!, item.event.subject.value.owner, item.event.revision]);
    }
    stop.abort();
    expect(resumed).toHaveLength(1);
    expect(reset).toBe(false);
    expect(seen.map(([kind, owner]) => [kind, owner])).toEqual(
      owners.flatMap((owner) => [
        ["RESERVATION_MADE", owner],
        ["RESERVATION_RELEASED", owner],
      ]),
    );
    expect(seen.every(([, , revision], i) => i === 0 || revision === seen[i - 1]![2] + 1n)).toBe(true);
    await slow.service.stop();
  });
});
