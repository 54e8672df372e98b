/**
 * What the grpc-js surface tests share (grpc-js-sessions, -locks, -budget, -deadlines and
 * -keepalive .test.ts): berth's whole RPC surface through @grpc/grpc-js, a gRPC implementation that
 * shares nothing with the server's connect-node. Clients that note every RPC they call, so that each
 * service's file can check the set against the generated descriptors (an RPC added to a .proto
 * without a test fails it); streams read as queues of messages; call outcomes and their typed
 * details; and the services under test.
 *
 * The budget runs on the fixture machine of budget-e2e.ts (a quiet 16G box, a 4G / 4 cpu budget),
 * so no verdict depends on how busy this machine is.
 */
import { mkdirSync } from "node:fs";
import * as path from "node:path";
import { anyUnpack, durationMs } from "@bufbuild/protobuf/wkt";
import { createRegistry, fromBinary, type DescService, type MessageInitShape } from "@bufbuild/protobuf";
import type * as grpc from "@grpc/grpc-js";
import { expect } from "vitest";
import { NeedItemKind, type NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { LockHeldSchema } from "@berth/api/berth/locks/v1/lock_service_pb";
import { ExpectedState } from "@berth/api/berth/sessions/v1/session_service_pb";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { StatusSchema } from "@berth/api/google/rpc/status_pb";
import { G, startBudget } from "./budget-e2e.js";
import { curl, grpcCodeName, grpcJsClient, isGrpcError, makeTempDir, startService, type GrpcJsClient } from "./harness.js";

// ---------------------------------------------------------------------------------------------
// Which RPCs the tests called, against what the descriptors declare.

/** The RPCs this test file's {@link recording} clients were asked to call. */
const called = new Set<string>();

/** `berth.sessions.v1.SessionService/AppendEvent` for a method descriptor. */
const rpcName = (method: { parent: { typeName: string }; name: string }) => `${method.parent.typeName}/${method.name}`;

/** A grpc-js client that notes every RPC it is asked to call. */
export function recording(client: GrpcJsClient): GrpcJsClient {
  return {
    unary(method, request, options) {
      called.add(rpcName(method));
      return client.unary(method, request, options);
    },
    serverStream(method, request, options) {
      called.add(rpcName(method));
      return client.serverStream(method, request, options);
    },
    bidi(method, options) {
      called.add(rpcName(method));
      return client.bidi(method, options);
    },
    close: () => client.close(),
  };
}

// ---------------------------------------------------------------------------------------------
// Streams read as queues of messages, and call outcomes.

/** How a grpc-js call ended. */
export interface CallEnd {
  code: number;
  name: string;
  details: string;
  metadata: grpc.Metadata;
}

/** A grpc-js stream whose messages are read in order, each wait bounded. */
export interface Reader<T> {
  /** Every message received so far, in order. */
  readonly received: T[];
  /** The next message not yet taken; rejects after `timeoutMs` naming `what`. */
  next(what: string, timeoutMs?: number): Promise<T>;
  /** Settles with the call's final status (OK included). */
  readonly ended: Promise<CallEnd>;
  /** True once the status arrived. */
  readonly isEnded: boolean;
}

export function reader<T>(call: grpc.ClientReadableStream<T> | grpc.ClientDuplexStream<never, T>): Reader<T> {
  const received: T[] = [];
  let taken = 0;
  let wake: (() => void) | undefined;
  let end: CallEnd | undefined;
  const ended = new Promise<CallEnd>((resolve) => {
    call.on("status", (status: grpc.StatusObject) => {
      end = { code: status.code, name: grpcCodeName(status.code), details: status.details, metadata: status.metadata };
      resolve(end);
      wake?.();
    });
  });
  call.on("data", (message: T) => {
    received.push(message);
    wake?.();
  });
  // A non-OK status is also an 'error' event; the status above is what the tests look at.
  call.on("error", () => {});
  return {
    received,
    ended,
    get isEnded() {
      return end !== undefined;
    },
    async next(what, timeoutMs = 10_000) {
      const deadline = Date.now() + timeoutMs;
      while (taken >= received.length) {
        if (end !== undefined) throw new Error(`stream ended (${end.name}: ${end.details}) before ${what}; received ${JSON.stringify(received.map(kindOf))}`);
        const left = deadline - Date.now();
        if (left <= 0) throw new Error(`no ${what} within ${timeoutMs} ms; received ${JSON.stringify(received.map(kindOf))}`);
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, left);
          wake = () => {
            clearTimeout(timer);
            wake = undefined;
            resolve();
          };
        });
      }
      return received[taken++]!;
    },
  };
}

/** The oneof case of a response (`kind`), for failure messages. */
function kindOf(message: unknown): string {
  const kind = (message as { kind?: { case?: string } }).kind;
  return kind?.case ?? "message";
}

/** The next message, which must be of oneof case `kind`; returns its value. */
export async function expectKind<T extends { kind: { case: string | undefined; value?: unknown } }, K extends NonNullable<T["kind"]["case"]>>(
  stream: Reader<T>,
  kind: K,
  timeoutMs?: number,
): Promise<Extract<T["kind"], { case: K }>["value"]> {
  const message = await stream.next(`a '${kind}' message`, timeoutMs);
  expect(message.kind.case, `expected '${kind}'`).toBe(kind);
  return (message.kind as Extract<T["kind"], { case: K }>).value;
}

/** The gRPC status a unary call failed with (fails the test if it succeeded). */
export async function failure(call: Promise<unknown>): Promise<{ name: string; details: string; metadata: grpc.Metadata }> {
  try {
    await call;
  } catch (error) {
    if (!isGrpcError(error)) throw error;
    return { name: grpcCodeName(error.code), details: error.details, metadata: error.metadata };
  }
  throw new Error("expected the call to fail");
}

/** The typed details grpc-js leaves undecoded: the google.rpc.Status of `grpc-status-details-bin`. */
const DETAIL_TYPES = createRegistry(ErrorInfoSchema, RetryInfoSchema, BadRequestSchema, LockHeldSchema);

/** The ErrorInfo, RetryInfo (ms), BadRequest fields and LockHeld of a failed call's `grpc-status-details-bin`. */
export function statusDetails(metadata: grpc.Metadata) {
  const [raw] = metadata.get("grpc-status-details-bin");
  if (!(raw instanceof Buffer)) throw new Error("no grpc-status-details-bin in the trailers");
  const details = fromBinary(StatusSchema, raw).details.map((any) => anyUnpack(any, DETAIL_TYPES));
  const find = <T extends { $typeName: string }>(typeName: string) => details.find((d): d is T => d?.$typeName === typeName);
  const info = find<{ $typeName: string; reason: string; domain: string }>(ErrorInfoSchema.typeName);
  const retry = find<{ $typeName: string; retryDelay?: Parameters<typeof durationMs>[0] }>(RetryInfoSchema.typeName);
  const badRequest = find<{ $typeName: string; fieldViolations: Array<{ field: string }> }>(BadRequestSchema.typeName);
  return {
    reason: info?.reason,
    domain: info?.domain,
    retryAfterMs: retry?.retryDelay === undefined ? undefined : durationMs(retry.retryDelay),
    fields: badRequest?.fieldViolations.map((v) => v.field),
    lockHeld: find<ReturnType<typeof fromBinary<typeof LockHeldSchema>>>(LockHeldSchema.typeName),
  };
}

/** Polls `read` (every 20 ms, at most `timeoutMs`) until `predicate` holds on its value; returns that value. */
export async function eventually<T>(what: string, read: () => Promise<T>, predicate: (value: T) => boolean, timeoutMs = 10_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (predicate(value)) return value;
    if (Date.now() > deadline)
      throw new Error(
        `${what} never held within ${timeoutMs} ms; last: ${JSON.stringify(value, (_, v: unknown) => (typeof v === "bigint" ? v.toString() : v))}`,
      );
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** A gauge of the service's /metrics (over curl, a third client). */
export async function gauge(url: string, name: string): Promise<number> {
  const { status, body } = await curl(url, "/metrics");
  expect(status).toBe(200);
  const line = body.split("\n").find((l) => l.startsWith(`${name} `));
  if (line === undefined) throw new Error(`no gauge ${name} in /metrics`);
  return Number(line.slice(name.length + 1));
}

// ---------------------------------------------------------------------------------------------
// The services under test.

export type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;

/** A start of `memoryGb` and `cpu` (a declared cost, so the fixture's 4G budget decides). */
export const start = (name: string, memoryGb: number, cpu = 1): NeedItemInit => ({
  kind: NeedItemKind.START,
  name,
  costSource: { case: "cost", value: { memoryBytes: BigInt(Math.round(memoryGb * G)), cpu } },
});

export const generate = { kind: { case: "generate" as const, value: { pageUrl: "http://localhost:3000/", count: 3 } } };
export const phase = (name: string) => ({ kind: { case: "agentPhase" as const, value: { phase: name } } });
export const atSeq = (seq: bigint) => ({ case: "expectedSeq" as const, value: seq });
export const noSession = { case: "expectedState" as const, value: ExpectedState.NO_SESSION };
export const seconds = (s: number) => ({ seconds: BigInt(s), nanos: 0 });

/** Checks that every RPC `service` declares was called in this test file through a {@link recording} client. */
export function expectEveryRpcCalled(service: DescService): void {
  expect(service.methods.length, service.typeName).toBeGreaterThan(0);
  const calledOfService = [...called].filter((name) => name.startsWith(`${service.typeName}/`));
  expect(calledOfService.sort()).toEqual(service.methods.map(rpcName).sort());
}

/** A sessions service (which serves the locks too), a grpc-js client of it whose calls count towards the surface, and a project root for the locked files. */
export interface SessionsSurface {
  sessionsUrl: string;
  projectRoot: string;
  rpc: GrpcJsClient;
}

export async function startSessionsSurface(): Promise<SessionsSurface> {
  const projectRoot = path.join(makeTempDir("berth-grpc-js-"), "project");
  mkdirSync(projectRoot, { recursive: true });
  const sessions = await startService("sessions");
  const sessionsUrl = sessions.url("sessions");
  return { sessionsUrl, projectRoot, rpc: recording(grpcJsClient(sessionsUrl)) };
}

/** A budget on the fixture machine and a grpc-js client of it whose calls count towards the surface (one connection). */
export interface BudgetSurface {
  budgetRpc: GrpcJsClient;
}

export async function startBudgetSurface(): Promise<BudgetSurface> {
  const budget = await startBudget();
  return { budgetRpc: recording(grpcJsClient(budget.url)) };
}
