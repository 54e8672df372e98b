/**
 * Every streaming RPC of BudgetService gives the same messages over every wire protocol: gRPC,
 * gRPC-JSON, Connect and Connect JSON, gRPC-Web JSON. The binary reference is gRPC; each other
 * protocol's messages, decoded by its client, must equal it field for field (ids aside: each run
 * makes its own). A response with a field pre-encoded for binary calls (Admit's `queued`) arrived
 * over JSON as `{}` before JSON calls got the real message.
 *
 * Each protocol runs the same conversation on a fresh budget over a real server on loopback, with
 * a manual clock and sampler, so that times, ETAs and deadlines are the same in every run.
 */
import { toJson, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { createClient, type Client } from "@connectrpc/connect";
import { afterEach, describe, expect, it } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import {
  AdmitResponseSchema,
  BudgetService,
  WatchBudgetResponseSchema,
  WatchMachineResponseSchema,
  type AdmitRequestSchema,
  type AdmitResponse,
} from "@berth/api/berth/budget/v1/budget_service_pb";
import { ManualClock } from "@berth/shared/clock";
import { implement, startServer, type RunningServer } from "@berth/shared/server/index";
import { WIRE_PROTOCOLS, connectOver, type WireProtocol } from "@berth/shared/server/testing/wire-protocols";
import type { Budget } from "../index.js";
import { ManualSampler, createBudget, defaultPolicy } from "../index.js";
import { silentLogger } from "@berth/shared/logger";
import { createBudgetHandlers } from "./budget-handlers.js";
import { G, pushable, startItem } from "./testing.js";

const STREAMING = BudgetService.methods.filter((m) => m.methodKind !== "unary").map((m) => m.name);
const covered = new Set<string>();

interface Run {
  client: Client<typeof BudgetService>;
  budget: Budget;
  sampler: ManualSampler;
}

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A fresh 8G / 4 cpu budget on a quiet 64G machine, a server for it, and a client over `protocol`. */
async function serve(protocol: WireProtocol): Promise<Run> {
  const clock = new ManualClock(Date.UTC(2026, 0, 1, 12));
  const sampler = new ManualSampler({ availableBytes: 64 * G, totalBytes: 64 * G, cores: 8, load1: 0 }, clock);
  const policy = { ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }), memoryBytes: 8 * G, cpu: 4, reserveBytes: G };
  const budget = await createBudget({ policy, sampler, clock });
  cleanups.push(() => budget.close());
  const handlers = createBudgetHandlers({ budget, clock, defaultLeaseTtlMs: () => 30_000, maxLeaseTtlMs: () => 3_600_000, sampleIntervalMs: 1000 });
  const server: RunningServer = await startServer({ name: "budget", logger: silentLogger, services: [implement(BudgetService, handlers)] });
  cleanups.push(() => server.close(false));
  const connection = connectOver(protocol, server.url);
  cleanups.push(connection.close);
  return { client: createClient(BudgetService, connection.transport), budget, sampler };
}

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/g;

/** A message as proto3 JSON, ids replaced by their order of appearance (every run makes its own). */
function comparable<S extends DescMessage>(schema: S, messages: readonly MessageShape<S>[]): unknown[] {
  const ids = new Map<string, string>();
  const text = JSON.stringify(messages.map((m) => toJson(schema, m)));
  return JSON.parse(text.replace(UUID, (id) => ids.get(id) ?? (ids.set(id, `id-${ids.size + 1}`), `id-${ids.size}`))) as unknown[];
}

/**
 * Admit, queued second behind a request that does not fit either, admitted once the holder lets
 * go; then build_done, started and release: every kind of message the stream has.
 */
async function admitConversation(protocol: WireProtocol): Promise<unknown[]> {
  covered.add("Admit");
  const { client, budget } = await serve(protocol);
  const holder = await budget.reserve(budget.needOf([{ kind: "start", name: "holder", spec: { memoryBytes: 6 * G, cpu: 1 } }]), "holder", { ttlMs: 60_000 });
  const first = budget.admit(budget.needOf([{ kind: "start", name: "first", spec: { memoryBytes: 3 * G, cpu: 1 } }]), "first");

  const requests = pushable<MessageInitShape<typeof AdmitRequestSchema>>();
  requests.push({
    kind: {
      case: "start",
      value: {
        owner: "web",
        need: {
          items: [{ kind: NeedItemKind.BUILD, name: "web", costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } } }, startItem("web", 1, 0.5)],
        },
      },
    },
  });
  const messages: AdmitResponse[] = [];
  const stream = client.admit(requests)[Symbol.asyncIterator]();
  const next = async () => {
    const result = await stream.next();
    if (result.done === true) throw new Error("the stream ended early");
    messages.push(result.value);
    return result.value;
  };

  expect((await next()).kind.case).toBe("queued");
  budget.release(holder.id);
  budget.release((await first).id);
  while ((await next()).kind.case !== "admitted");
  requests.push({ kind: { case: "buildDone", value: {} } });
  expect((await next()).kind.case).toBe("updated");
  requests.push({ kind: { case: "started", value: { name: "web", pid: process.pid } } });
  expect((await next()).kind.case).toBe("updated");
  requests.push({ kind: { case: "release", value: {} } });
  expect((await next()).kind.case).toBe("released");
  requests.end();
  expect((await stream.next()).done).toBe(true);
  return comparable(AdmitResponseSchema, messages);
}

/** WatchMachine: the latest sample, then a new one. */
async function watchMachineConversation(protocol: WireProtocol): Promise<unknown[]> {
  covered.add("WatchMachine");
  const { client, sampler } = await serve(protocol);
  const controller = new AbortController();
  const stream = client.watchMachine({}, { signal: controller.signal })[Symbol.asyncIterator]();
  const messages = [(await stream.next()).value];
  sampler.set({ availableBytes: 20 * G, load1: 2.5, pressure: { cpu: { avg10: 12.5, avg60: 3, avg300: 1, total: 42_000, scope: "host" } } });
  messages.push((await stream.next()).value);
  controller.abort();
  return comparable(WatchMachineResponseSchema, messages);
}

/** WatchBudget: the current state, caught up, then a reservation made and released. */
async function watchBudgetConversation(protocol: WireProtocol): Promise<unknown[]> {
  covered.add("WatchBudget");
  const { client, budget } = await serve(protocol);
  await budget.registerRunning("db", { memoryBytes: G, cpu: 0.5 });
  const controller = new AbortController();
  const stream = client.watchBudget({ includeCurrent: true }, { signal: controller.signal })[Symbol.asyncIterator]();
  const messages = [];
  for (let i = 0; i < 3; i++) messages.push((await stream.next()).value);
  const reservation = await budget.reserve({ items: [], start: { memoryBytes: G, cpu: 1 }, build: { memoryBytes: 0, cpu: 0 } }, "web", { ttlMs: 30_000 });
  budget.release(reservation.id);
  for (let i = 0; i < 2; i++) messages.push((await stream.next()).value);
  controller.abort();
  // Each run's revisions start at its clock's start, the same manual time in every run.
  return comparable(WatchBudgetResponseSchema, messages as MessageShape<typeof WatchBudgetResponseSchema>[]);
}

describe.each(WIRE_PROTOCOLS.slice(1))("BudgetService streams over $name equal gRPC's", (protocol) => {
  it("Admit: queued (position, ETA, reasons, the request ahead, when its wait expires), admitted, updated, released", async () => {
    const reference = await admitConversation(WIRE_PROTOCOLS[0]!);
    // The reference itself has every field the test is about.
    expect(reference[0]).toMatchObject({
      queued: {
        position: 2,
        eta: expect.any(String),
        waitForText: expect.stringContaining("1 request(s) ahead"),
        ahead: [{ owner: "first", position: 1 }],
        waitExpireTime: expect.any(String),
      },
    });
    expect((reference[0] as { queued: { waitFor: unknown[] } }).queued.waitFor).toHaveLength(2);
    expect(await admitConversation(protocol)).toEqual(reference);
  });

  it("WatchBudget: the current state, caught up, then each change", async () => {
    const reference = await watchBudgetConversation(WIRE_PROTOCOLS[0]!);
    expect(reference.map((m) => Object.keys(m as object)[0])).toEqual(["event", "event", "caughtUp", "event", "event"]);
    const base = BigInt(Date.UTC(2026, 0, 1, 12)) * 1000n;
    expect(reference[2]).toMatchObject({ caughtUp: { revision: String(base + 1n) } });
    expect(reference[3]).toMatchObject({ event: { kind: "BUDGET_EVENT_KIND_RESERVATION_MADE", revision: String(base + 2n), reservation: { owner: "web" } } });
    expect(await watchBudgetConversation(protocol)).toEqual(reference);
  });

  it("WatchMachine: every sample", async () => {
    const reference = await watchMachineConversation(WIRE_PROTOCOLS[0]!);
    expect(reference[1]).toMatchObject({ machine: { availableBytes: String(20 * G), load1: 2.5 } });
    expect(await watchMachineConversation(protocol)).toEqual(reference);
  });
});

it("covers every streaming RPC of BudgetService", () => {
  expect([...covered].sort()).toEqual([...STREAMING].sort());
});
