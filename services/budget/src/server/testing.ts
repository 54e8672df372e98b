/**
 * For the server's tests: the handlers over a budget with a manual clock and sampler, served in
 * memory (no sockets) through `createRouterTransport` with the server's observer and error
 * mapping, and a request stream the test feeds by hand.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { createClient, createRouterTransport } from "@connectrpc/connect";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { ManualClock } from "@berth/shared/clock";
import { createErrorInterceptor, createObserverInterceptor, ServerMetrics } from "@berth/shared/server/index";
import type { Budget, MachineSample, Policy } from "../index.js";
import { ManualSampler, createBudget, defaultPolicy } from "../index.js";
import { createBudgetHandlers } from "./budget-handlers.js";

export const G = 1024 ** 3;
export const M = 1024 ** 2;

/** A budget served in memory, and the knobs a test turns. */
export interface InMemoryBudget {
  client: Client<typeof BudgetService>;
  budget: Budget;
  clock: ManualClock;
  sampler: ManualSampler;
  stateDir: string;
  /** The server's metrics, with its open streams. */
  metrics: ServerMetrics;
  close(): Promise<void>;
}

/** Options of {@link serveInMemory}. */
export interface InMemoryOptions {
  policy?: Partial<Policy>;
  sample?: Partial<MachineSample>;
  leaseTtlMs?: number;
  maxLeaseTtlMs?: number;
  stateDir?: string;
  clock?: ManualClock;
  idempotencyWindowMs?: number;
  admitResumeGraceMs?: number;
}

/** An 8G / 4 cpu budget on a quiet 64G machine, served in memory. */
export async function serveInMemory(options: InMemoryOptions = {}): Promise<InMemoryBudget> {
  const clock = options.clock ?? new ManualClock();
  const sampler = new ManualSampler({ availableBytes: 64 * G, totalBytes: 64 * G, cores: 8, load1: 0, ...options.sample }, clock);
  const ownDir = options.stateDir === undefined ? mkdtempSync(path.join(tmpdir(), "berth-budget-server-")) : undefined;
  const stateDir = options.stateDir ?? ownDir!;
  const policy: Policy = {
    ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }),
    memoryBytes: 8 * G,
    cpu: 4,
    reserveBytes: G,
    heartbeatMs: 5000,
    ...options.policy,
  };
  const budget = await createBudget({
    policy,
    sampler,
    clock,
    stateDir,
    idempotencyWindowMs: options.idempotencyWindowMs,
    admitResumeGraceMs: options.admitResumeGraceMs,
  });
  const leaseTtlMs = options.leaseTtlMs ?? 30_000;
  const metrics = new ServerMetrics("budget");
  const quiet = { debug() {}, info() {}, warn() {}, error() {} };
  const transport = createRouterTransport(
    (router) =>
      router.service(
        BudgetService,
        createBudgetHandlers({
          budget,
          clock,
          defaultLeaseTtlMs: () => leaseTtlMs,
          maxLeaseTtlMs: () => options.maxLeaseTtlMs ?? 3_600_000,
          sampleIntervalMs: 1000,
        }),
      ),
    // As the server has them: the observer (which keeps the open streams) outermost.
    { router: { interceptors: [createObserverInterceptor({ logger: quiet, metrics }), createErrorInterceptor()] } },
  );
  return {
    client: createClient(BudgetService, transport),
    budget,
    clock,
    sampler,
    stateDir,
    metrics,
    async close() {
      await budget.close();
      if (ownDir !== undefined) rmSync(ownDir, { recursive: true, force: true });
    },
  };
}

/** A stream of requests a test writes into by hand. */
export interface Pushable<T> extends AsyncIterable<T> {
  push(value: T): void;
  end(): void;
}

/** Creates a {@link Pushable}. */
export function pushable<T>(): Pushable<T> {
  const items: T[] = [];
  let ended = false;
  let wake: (() => void) | undefined;
  const poke = () => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  return {
    push(value) {
      items.push(value);
      poke();
    },
    end() {
      ended = true;
      poke();
    },
    async *[Symbol.asyncIterator]() {
      for (;;) {
        while (items.length === 0 && !ended) await new Promise<void>((resolve) => (wake = resolve));
        if (items.length === 0) return;
        yield items.shift()!;
      }
    },
  };
}

type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;

/** A start item of `memoryGb` and `cpu`, in bytes and cores. */
export function startItem(name: string, memoryGb: number, cpu: number): NeedItemInit {
  return { kind: NeedItemKind.START, name, costSource: { case: "cost", value: { memoryBytes: BigInt(Math.round(memoryGb * G)), cpu } } };
}

/** A build item of `memoryGb` and `cpu` (in wave `wave`, when given). */
export function buildItem(name: string, memoryGb: number, cpu: number, wave?: number): NeedItemInit {
  return { kind: NeedItemKind.BUILD, name, wave, costSource: { case: "cost", value: { memoryBytes: BigInt(Math.round(memoryGb * G)), cpu } } };
}

/** Lets pending promise callbacks and setImmediate work run. */
export function settle(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
