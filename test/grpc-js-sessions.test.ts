/**
 * The whole RPC surface of berth through @grpc/grpc-js, a gRPC implementation that shares nothing
 * with the server's connect-node. Every RPC of SessionService, LockService and
 * BudgetService is called here, each stream carried through to its meaningful messages; then what
 * only a real gRPC client exercises: a client cancelling mid-stream (the server must free what the
 * stream held), call deadlines the server cannot meet (nothing may be left behind), and HTTP/2
 * keepalive pings over a stream idle for longer than the ping interval (the stream still delivers).
 *
 * The set of RPCs called is checked against the generated service descriptors at the end, so an
 * RPC added to a .proto without a test here fails this file. Other files go deeper into each
 * service's semantics (sessions, locks, budget .test.ts); this one proves the surface.
 *
 * The budget runs on the fixture machine of budget-e2e.ts (a quiet 16G box, a 4G / 4 cpu budget),
 * so no verdict depends on how busy this machine is.
 */
import { mkdirSync } from "node:fs";
import * as net from "node:net";
import * as path from "node:path";
import { anyUnpack, durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { createRegistry, fromBinary, type MessageInitShape } from "@bufbuild/protobuf";
import type * as grpc from "@grpc/grpc-js";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NeedItemKind, RefusalKind, RefusalSchema, type NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { HolderKind, LockEventKind, LockHeldSchema, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import {
  ExpectedState,
  FenceRejectedSchema,
  IdempotencyKeyReusedSchema,
  SeqConflictSchema,
  SessionService,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { StatusSchema } from "@berth/api/google/rpc/status_pb";
import { G, startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import {
  curl,
  grpcCodeName,
  grpcErrorInfo,
  grpcJsClient,
  grpcStatusDetails,
  isGrpcError,
  makeTempDir,
  startService,
  stopAll,
  type GrpcJsClient,
  type StartedService,
} from "./harness.js";

afterAll(stopAll);

// ---------------------------------------------------------------------------------------------
// Which RPCs the tests called, against what the descriptors declare.

const SERVICES = [SessionService, LockService, BudgetService];
const called = new Set<string>();

/** `berth.sessions.v1.SessionService/AppendEvent` for a method descriptor. */
const rpcName = (method: { parent: { typeName: string }; name: string }) => `${method.parent.typeName}/${method.name}`;

/** A grpc-js client that notes every RPC it is asked to call. */
function recording(client: GrpcJsClient): GrpcJsClient {
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
interface CallEnd {
  code: number;
  name: string;
  details: string;
  metadata: grpc.Metadata;
}

/** A grpc-js stream whose messages are read in order, each wait bounded. */
interface Reader<T> {
  /** Every message received so far, in order. */
  readonly received: T[];
  /** The next message not yet taken; rejects after `timeoutMs` naming `what`. */
  next(what: string, timeoutMs?: number): Promise<T>;
  /** Settles with the call's final status (OK included). */
  readonly ended: Promise<CallEnd>;
  /** True once the status arrived. */
  readonly isEnded: boolean;
}

function reader<T>(call: grpc.ClientReadableStream<T> | grpc.ClientDuplexStream<never, T>): Reader<T> {
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
async function expectKind<T extends { kind: { case: string | undefined; value?: unknown } }, K extends NonNullable<T["kind"]["case"]>>(
  stream: Reader<T>,
  kind: K,
  timeoutMs?: number,
): Promise<Extract<T["kind"], { case: K }>["value"]> {
  const message = await stream.next(`a '${kind}' message`, timeoutMs);
  expect(message.kind.case, `expected '${kind}'`).toBe(kind);
  return (message.kind as Extract<T["kind"], { case: K }>).value;
}

/** The gRPC status a unary call failed with (fails the test if it succeeded). */
async function failure(call: Promise<unknown>): Promise<{ name: string; details: string; metadata: grpc.Metadata }> {
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
function statusDetails(metadata: grpc.Metadata) {
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
async function eventually<T>(what: string, read: () => Promise<T>, predicate: (value: T) => boolean, timeoutMs = 10_000): Promise<T> {
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
async function gauge(url: string, name: string): Promise<number> {
  const { status, body } = await curl(url, "/metrics");
  expect(status).toBe(200);
  const line = body.split("\n").find((l) => l.startsWith(`${name} `));
  if (line === undefined) throw new Error(`no gauge ${name} in /metrics`);
  return Number(line.slice(name.length + 1));
}

// ---------------------------------------------------------------------------------------------
// The services under test.

type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;

/** A start of `memoryGb` and `cpu` (a declared cost, so the fixture's 4G budget decides). */
const start = (name: string, memoryGb: number, cpu = 1): NeedItemInit => ({
  kind: NeedItemKind.START,
  name,
  costSource: { case: "cost", value: { memoryBytes: BigInt(Math.round(memoryGb * G)), cpu } },
});

const generate = { kind: { case: "generate" as const, value: { pageUrl: "http://localhost:3000/", count: 3 } } };
const phase = (name: string) => ({ kind: { case: "agentPhase" as const, value: { phase: name } } });
const atSeq = (seq: bigint) => ({ case: "expectedSeq" as const, value: seq });
const noSession = { case: "expectedState" as const, value: ExpectedState.NO_SESSION };
const seconds = (s: number) => ({ seconds: BigInt(s), nanos: 0 });

let sessions: StartedService;
let sessionsUrl: string;
let projectRoot: string;
let budget: BudgetUnderTest;
/** grpc-js clients whose calls count towards the surface (one connection each). */
let rpc: GrpcJsClient;
let budgetRpc: GrpcJsClient;

beforeAll(async () => {
  projectRoot = path.join(makeTempDir("berth-grpc-js-"), "project");
  mkdirSync(projectRoot, { recursive: true });
  [sessions, budget] = await Promise.all([startService("sessions"), startBudget()]);
  sessionsUrl = sessions.url("sessions");
  rpc = recording(grpcJsClient(sessionsUrl));
  budgetRpc = recording(grpcJsClient(budget.url));
});

// ---------------------------------------------------------------------------------------------

describe("SessionService over grpc-js", () => {
  /** The gRPC status name and ErrorInfo reason a unary call failed with. */
  const refusal = async (call: Promise<unknown>) => {
    const { name, details, metadata } = await failure(call);
    const info = grpcErrorInfo(metadata);
    expect(info?.domain, `${name}: ${details}`).toBe("berth.sessions");
    return { name, reason: info?.reason, details, metadata, typed: grpcStatusDetails(metadata) };
  };

  it("unary RPCs: append one and a batch (expected seq and state, an idempotency key), snapshot, list (paged), flush, delete, limits", async () => {
    const id = "surface-unary";
    const missing = await refusal(rpc.unary(SessionService.method.getSnapshot, { sessionId: id }));
    expect([missing.name, missing.reason]).toEqual(["NOT_FOUND", "SESSION_NOT_FOUND"]);
    expect(missing.details).toMatch(/^session surface-unary has no journal/);

    const first = await rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: generate, expected: noSession, idempotencyKey: "k1" });
    expect(first.seq).toBe(1n);
    expect(first.duplicate).toBe(false);
    expect(first.snapshot?.phase).toBe("generate_requested");
    expect(first.snapshot?.expectedVariants).toBe(3);
    const retried = await rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: generate, idempotencyKey: "k1" });
    expect([retried.seq, retried.duplicate]).toEqual([1n, true]);

    const batch = await rpc.unary(SessionService.method.appendEvents, {
      sessionId: id,
      expected: atSeq(1n),
      events: [phase("planning"), { kind: { case: "variantsReady", value: { sourceFile: "src/App.tsx" } } }],
    });
    expect([batch.firstSeq, batch.lastSeq, batch.duplicate]).toEqual([2n, 3n, false]);
    expect(batch.snapshot?.phase).toBe("variants_ready");

    const snapshot = await rpc.unary(SessionService.method.getSnapshot, { sessionId: id });
    expect([snapshot.lastSeq, snapshot.snapshot?.phase, snapshot.snapshot?.sourceFile]).toEqual([3n, "variants_ready", "src/App.tsx"]);
    await rpc.unary(SessionService.method.appendEvent, { sessionId: `${id}-2`, event: generate });
    const listed = await rpc.unary(SessionService.method.listSessions, {});
    expect(listed.sessions.map((s) => s.id)).toEqual(expect.arrayContaining([id, `${id}-2`]));
    expect(listed.nextPageToken).toBe("");
    const page = await rpc.unary(SessionService.method.listSessions, { pageSize: 1 });
    expect(page.sessions).toHaveLength(1);
    expect(page.nextPageToken).not.toBe("");
    const rest = await rpc.unary(SessionService.method.listSessions, { pageSize: 1000, pageToken: page.nextPageToken });
    expect(rest.nextPageToken).toBe("");
    expect([...page.sessions, ...rest.sessions].map((s) => s.id)).toEqual(listed.sessions.map((s) => s.id));

    const flushed = await rpc.unary(SessionService.method.flushSnapshot, { sessionId: id });
    expect([flushed.lastSeq, flushed.snapshot?.phase]).toEqual([3n, "variants_ready"]);

    const limits = await rpc.unary(SessionService.method.getLimits, {});
    expect(limits).toMatchObject({
      maxEventBytes: 1024n * 1024n,
      maxEventsPerAppend: 10_000,
      maxMessageBytes: 4n * 1024n * 1024n,
      watchBuffer: 1000,
      maxIdempotencyKeyLength: 128,
      maxPageSize: 1000,
    });
    expect(limits.completedRetention).toBeUndefined();

    expect(await rpc.unary(SessionService.method.deleteSession, { sessionId: id, expectedSeq: 3n })).toMatchObject({ lastSeq: 3n });
    expect((await refusal(rpc.unary(SessionService.method.getSnapshot, { sessionId: id }))).reason).toBe("SESSION_NOT_FOUND");
  });

  it("each unary refusal carries its code and ErrorInfo reason (and its typed detail)", async () => {
    const id = "surface-refusals";
    await rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: generate, idempotencyKey: "k" });

    // AppendEvent
    const badId = await refusal(rpc.unary(SessionService.method.appendEvent, { sessionId: "../x", event: generate }));
    expect([badId.name, badId.reason]).toEqual(["INVALID_ARGUMENT", "INVALID_FIELD"]);
    expect(badId.typed?.find(BadRequestSchema)?.fieldViolations[0]?.field).toBe("session_id");
    const tooLarge = await refusal(
      rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: { kind: { case: "steer", value: { pageUrl: "x".repeat(1024 * 1024 + 10) } } } }),
    );
    expect([tooLarge.name, tooLarge.reason]).toEqual(["INVALID_ARGUMENT", "EVENT_TOO_LARGE"]);
    const stale = await refusal(rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: phase("late"), expected: atSeq(7n) }));
    expect([stale.name, stale.reason]).toEqual(["ABORTED", "SEQ_CONFLICT"]);
    // The status text reads as the service wrote it (grpc-message decoded by grpc-js, not "%3A").
    expect(stale.details).toMatch(/^session surface-refusals: expected seq 7\b/);
    expect(stale.typed?.find(SeqConflictSchema)).toMatchObject({ expectedSeq: 7n, currentSeq: 1n });
    expect(JSON.parse(String(stale.metadata.get("berth-error-details")[0]))).toMatchObject({ reason: "SEQ_CONFLICT", currentSeq: 1 });
    const exists = await refusal(rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: phase("x"), expected: noSession }));
    expect([exists.name, exists.reason]).toEqual(["ABORTED", "SEQ_CONFLICT"]);
    const reused = await refusal(rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: phase("other"), idempotencyKey: "k" }));
    expect([reused.name, reused.reason]).toEqual(["ALREADY_EXISTS", "IDEMPOTENCY_KEY_REUSED"]);
    expect(reused.typed?.find(IdempotencyKeyReusedSchema)).toMatchObject({ idempotencyKey: "k", firstSeq: 1n, lastSeq: 1n });
    const file = path.join(projectRoot, "src/fenced.ts");
    const { lease } = await rpc.unary(LockService.method.acquire, { file, owner: "writer" });
    await rpc.unary(LockService.method.release, { leaseToken: lease!.leaseToken });
    const fenced = await refusal(
      rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: phase("fenced"), fence: { file, fencingToken: lease!.fencingToken } }),
    );
    expect([fenced.name, fenced.reason]).toEqual(["FAILED_PRECONDITION", "FENCE_REJECTED"]);
    expect(fenced.typed?.find(FenceRejectedSchema)).toMatchObject({ file, fencingToken: lease!.fencingToken, currentToken: 0n });

    // AppendEvents
    const tooMany = await refusal(rpc.unary(SessionService.method.appendEvents, { sessionId: id, events: Array.from({ length: 10_001 }, () => phase("p")) }));
    expect([tooMany.name, tooMany.reason]).toEqual(["INVALID_ARGUMENT", "TOO_MANY_EVENTS"]);
    const batchStale = await refusal(
      rpc.unary(SessionService.method.appendEvents, {
        sessionId: id,
        events: [phase("a")],
        expected: { case: "expectedState", value: ExpectedState.NO_SESSION },
      }),
    );
    expect([batchStale.name, batchStale.reason]).toEqual(["ABORTED", "SEQ_CONFLICT"]);
    const batchReused = await refusal(rpc.unary(SessionService.method.appendEvents, { sessionId: id, events: [generate, phase("b")], idempotencyKey: "k" }));
    expect([batchReused.name, batchReused.reason]).toEqual(["ALREADY_EXISTS", "IDEMPOTENCY_KEY_REUSED"]);

    // GetSnapshot, ListSessions, FlushSnapshot, DeleteSession
    expect((await refusal(rpc.unary(SessionService.method.getSnapshot, { sessionId: "a b" }))).reason).toBe("INVALID_FIELD");
    const token = await refusal(rpc.unary(SessionService.method.listSessions, { pageToken: "nonsense!" }));
    expect([token.name, token.reason]).toEqual(["INVALID_ARGUMENT", "INVALID_FIELD"]);
    const unflushed = await refusal(rpc.unary(SessionService.method.flushSnapshot, { sessionId: "surface-never" }));
    expect([unflushed.name, unflushed.reason]).toEqual(["NOT_FOUND", "SESSION_NOT_FOUND"]);
    const deleteStale = await refusal(rpc.unary(SessionService.method.deleteSession, { sessionId: id, expectedSeq: 9n }));
    expect([deleteStale.name, deleteStale.reason]).toEqual(["ABORTED", "SEQ_CONFLICT"]);
    const deleteMissing = await refusal(rpc.unary(SessionService.method.deleteSession, { sessionId: "surface-never" }));
    expect([deleteMissing.name, deleteMissing.reason]).toEqual(["NOT_FOUND", "SESSION_NOT_FOUND"]);
  });

  it("ReadJournal streams entries from a seq up to a limit, its last message says where it ended; NOT_FOUND and OUT_OF_RANGE", async () => {
    const id = "surface-read";
    await rpc.unary(SessionService.method.appendEvents, { sessionId: id, events: [generate, phase("a"), phase("b"), phase("c")] });
    const readAll = async (request: { fromSeq?: bigint; limit?: number }) => {
      const stream = reader(rpc.serverStream(SessionService.method.readJournal, { sessionId: id, ...request }, { deadlineMs: 10_000 }));
      const end = await stream.ended;
      expect(end.name).toBe("OK");
      return { entries: stream.received.flatMap((batch) => batch.entries), end: stream.received.at(-1)?.end };
    };
    const all = await readAll({});
    expect(all.entries.map((e) => [e.seq, e.type])).toEqual([
      [1n, "generate"],
      [2n, "agent_phase"],
      [3n, "agent_phase"],
      [4n, "agent_phase"],
    ]);
    expect(all.entries[1]?.event?.kind).toEqual({ case: "agentPhase", value: expect.objectContaining({ phase: "a" }) });
    expect(all.end).toMatchObject({ lastSeq: 4n, nextSeq: 5n, more: false });
    const part = await readAll({ fromSeq: 2n, limit: 2 });
    expect(part.entries.map((e) => e.seq)).toEqual([2n, 3n]);
    expect(part.end).toMatchObject({ lastSeq: 4n, nextSeq: 4n, more: true });
    expect(await readAll({ fromSeq: 5n })).toMatchObject({ entries: [], end: { lastSeq: 4n, nextSeq: 5n, more: false } });

    const ending = async (request: { sessionId: string; fromSeq?: bigint; limit?: number }) => {
      const end = await reader(rpc.serverStream(SessionService.method.readJournal, request, { deadlineMs: 10_000 })).ended;
      return [end.name, grpcErrorInfo(end.metadata)?.reason];
    };
    expect(await ending({ sessionId: "surface-none" })).toEqual(["NOT_FOUND", "SESSION_NOT_FOUND"]);
    expect(await ending({ sessionId: id, fromSeq: 6n })).toEqual(["OUT_OF_RANGE", "SEQ_OUT_OF_RANGE"]);
    expect(await ending({ sessionId: id, limit: -1 })).toEqual(["INVALID_ARGUMENT", "INVALID_FIELD"]);
  });

  it("WatchSession: the backlog, caught_up with the snapshot, then live entries each with its snapshot; a cancelled watcher is dropped", async () => {
    const id = "surface-watch";
    await rpc.unary(SessionService.method.appendEvents, { sessionId: id, events: [generate, phase("a"), phase("b")] });
    const call = rpc.serverStream(SessionService.method.watchSession, { sessionId: id, fromSeq: 2n, includeSnapshot: true });
    const watch = reader(call);

    const backlog = await expectKind(watch, "entries");
    expect(backlog.entries.map((e) => e.entry?.seq)).toEqual([2n, 3n]);
    // Backlog entries never carry a snapshot.
    expect(backlog.entries.map((e) => e.snapshot)).toEqual([undefined, undefined]);
    const caughtUp = await expectKind(watch, "caughtUp");
    expect(caughtUp.lastSeq).toBe(3n);
    expect(caughtUp.snapshot?.generationPhase).toBe("b");

    await rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: phase("live-1") });
    await rpc.unary(SessionService.method.appendEvents, { sessionId: id, events: [phase("live-2"), phase("live-3")] });
    for (const [seq, name] of [
      [4n, "live-1"],
      [5n, "live-2"],
      [6n, "live-3"],
    ] as const) {
      const [live] = (await expectKind(watch, "entries")).entries;
      expect(live?.entry?.seq).toBe(seq);
      expect(live?.snapshot?.generationPhase).toBe(name);
    }

    // A session without a journal is watched from its first append.
    const freshCall = rpc.serverStream(SessionService.method.watchSession, { sessionId: "surface-watch-new" });
    const fresh = reader(freshCall);
    expect((await expectKind(fresh, "caughtUp")).lastSeq).toBe(0n);
    await rpc.unary(SessionService.method.appendEvent, { sessionId: "surface-watch-new", event: generate });
    expect((await expectKind(fresh, "entries")).entries[0]?.entry?.seq).toBe(1n);

    expect(await gauge(sessionsUrl, "berth_sessions_watchers")).toBe(2);
    call.cancel();
    expect((await watch.ended).name).toBe("CANCELLED");
    await eventually(
      "one watcher left after the cancel",
      () => gauge(sessionsUrl, "berth_sessions_watchers"),
      (n) => n === 1,
    );
    // The other watcher is untouched by its neighbour's cancel.
    await rpc.unary(SessionService.method.appendEvent, { sessionId: "surface-watch-new", event: phase("after") });
    expect((await expectKind(fresh, "entries")).entries[0]?.entry?.seq).toBe(2n);
    // Deleting the session ends its watcher: NOT_FOUND SESSION_DELETED.
    await rpc.unary(SessionService.method.deleteSession, { sessionId: "surface-watch-new" });
    const deleted = await fresh.ended;
    expect([deleted.name, grpcErrorInfo(deleted.metadata)?.reason]).toEqual(["NOT_FOUND", "SESSION_DELETED"]);

    // An idle watch with a progress interval hears progress, with the last seq it was sent.
    const idle = reader(
      rpc.serverStream(SessionService.method.watchSession, { sessionId: id, fromSeq: 7n, progressInterval: { seconds: 0n, nanos: 100_000_000 } }),
    );
    expect((await expectKind(idle, "caughtUp")).lastSeq).toBe(6n);
    expect(await expectKind(idle, "progress")).toMatchObject({ lastSeq: 6n });
    const tooOften = await reader(rpc.serverStream(SessionService.method.watchSession, { sessionId: id, progressInterval: { seconds: 0n, nanos: 50_000_000 } }))
      .ended;
    expect([tooOften.name, grpcErrorInfo(tooOften.metadata)?.reason]).toEqual(["INVALID_ARGUMENT", "INVALID_FIELD"]);
  });

  it("WatchSessions: the current state of each session, caught_up, then live changes (a batch is one change), deletions; resumed, only what changed", async () => {
    await rpc.unary(SessionService.method.appendEvent, { sessionId: "surface-all-a", event: generate });
    await rpc.unary(SessionService.method.appendEvent, { sessionId: "surface-all-b", event: { kind: { case: "complete", value: {} } } });
    const current = (await rpc.unary(SessionService.method.listSessions, { includeCompleted: true })).sessions.length;

    const call = rpc.serverStream(SessionService.method.watchSessions, { includeCurrent: true, includeCompleted: true, includeSnapshot: true });
    const watch = reader(call);
    const described = new Map<string, bigint>();
    for (;;) {
      const message = await watch.next("a current session or caught_up");
      if (message.kind.case === "caughtUp") {
        expect(message.kind.value.sessions).toBe(current);
        break;
      }
      expect(message.kind.case).toBe("change");
      if (message.kind.case === "change") described.set(message.kind.value.sessionId, message.kind.value.lastSeq);
    }
    expect(described.size).toBe(current);
    expect(described.get("surface-all-a")).toBe(1n);
    // A completed session is described too when asked (include_completed).
    expect(described.get("surface-all-b")).toBe(1n);

    await rpc.unary(SessionService.method.appendEvents, { sessionId: "surface-all-a", events: [phase("x"), phase("y")] });
    const change = await expectKind(watch, "change");
    expect([change.sessionId, change.firstSeq, change.lastSeq, change.type, change.snapshot?.generationPhase, change.deleted]).toEqual([
      "surface-all-a",
      2n,
      3n,
      "agent_phase",
      "y",
      false,
    ]);
    expect(change.appendTime === undefined ? 0 : timestampMs(change.appendTime)).toBeGreaterThan(0);
    await rpc.unary(SessionService.method.deleteSession, { sessionId: "surface-all-b" });
    expect(await expectKind(watch, "change")).toMatchObject({ sessionId: "surface-all-b", lastSeq: 1n, deleted: true });
    call.cancel();
    expect((await watch.ended).name).toBe("CANCELLED");

    // Resumed with the last seqs it saw: only "surface-all-a" moved, "surface-all-b" is gone.
    const resumed = reader(
      rpc.serverStream(SessionService.method.watchSessions, {
        resumeFrom: Object.fromEntries(described),
        progressInterval: { seconds: 0n, nanos: 100_000_000 },
      }),
    );
    const again: string[] = [];
    for (;;) {
      const message = await resumed.next("a changed session or caught_up");
      if (message.kind.case === "change") again.push(message.kind.value.sessionId);
      if (message.kind.case === "caughtUp") {
        expect(message.kind.value.deleted).toEqual(["surface-all-b"]);
        break;
      }
    }
    expect(again).toContain("surface-all-a");
    expect(again).not.toContain("surface-all-b");
    expect(again.filter((sessionId) => described.has(sessionId) && sessionId !== "surface-all-a")).toEqual([]);
    expect(await expectKind(resumed, "progress")).toMatchObject({ lastSeq: 0n });
  });
});

// ---------------------------------------------------------------------------------------------

describe("LockService over grpc-js", () => {
  it("Acquire, Inspect, CheckToken, GetLimits, KeepAlive (unary, several leases, in order), Release", async () => {
    const file = path.join(projectRoot, "src/surface.ts");
    const { lease } = await rpc.unary(LockService.method.acquire, { file, owner: "alice", ttl: seconds(5) });
    expect(lease?.file).toBe(file);
    expect(lease?.ttl?.seconds).toBe(5n);
    const token = lease!.leaseToken;
    const fencing = lease!.fencingToken;

    const held = await rpc.unary(LockService.method.inspect, { file });
    expect([held.holder?.owner, held.holder?.kind, held.holder?.fencingToken, held.lastFencingToken, held.waiters]).toEqual([
      "alice",
      HolderKind.LEASE,
      fencing,
      fencing,
      [],
    ]);
    expect(await rpc.unary(LockService.method.checkToken, { file: `${projectRoot}/src/../src/surface.ts`, fencingToken: fencing })).toMatchObject({
      current: true,
      file,
    });
    expect(await rpc.unary(LockService.method.getLimits, {})).toMatchObject({
      defaultTtl: seconds(30),
      maxTtl: seconds(3600),
      maxWait: seconds(600),
      heartbeatInterval: seconds(5),
      maxWaitersPerFile: 10_000,
      maxOwnerLength: 256,
    });

    const { renewals } = await rpc.unary(LockService.method.keepAlive, { leaseTokens: [token, "not-a-lease"] });
    expect(renewals.map((r) => [r.leaseToken, r.alive])).toEqual([
      [token, true],
      ["not-a-lease", false],
    ]);
    expect(timestampMs(renewals[0]!.expireTime!)).toBeGreaterThanOrEqual(timestampMs(lease!.expireTime!));
    expect(renewals[1]!.expireTime).toBeUndefined();

    expect((await rpc.unary(LockService.method.release, { leaseToken: token })).released).toBe(true);
    expect((await rpc.unary(LockService.method.keepAlive, { leaseTokens: [token] })).renewals).toMatchObject([{ leaseToken: token, alive: false }]);
    // A repeated release changes nothing; the token is no longer current.
    expect((await rpc.unary(LockService.method.release, { leaseToken: token })).released).toBe(false);
    expect(await rpc.unary(LockService.method.checkToken, { file, fencingToken: fencing })).toMatchObject({ current: false, currentToken: 0n });
    expect((await rpc.unary(LockService.method.inspect, { file })).holder).toBeUndefined();
  });

  it("KeepAliveStream: one answer per request, in order, on a bidi stream", async () => {
    const file = path.join(projectRoot, "src/surface-stream.ts");
    const { lease } = await rpc.unary(LockService.method.acquire, { file, owner: "alice", ttl: seconds(5) });
    const token = lease!.leaseToken;
    const call = rpc.bidi(LockService.method.keepAliveStream);
    const renewals = reader(call);
    call.write({ leaseToken: token });
    call.write({ leaseToken: "not-a-lease" });
    const renewed = (await renewals.next("the renewal of the live lease")).renewal!;
    expect([renewed.leaseToken, renewed.alive]).toEqual([token, true]);
    expect(timestampMs(renewed.expireTime!)).toBeGreaterThanOrEqual(timestampMs(lease!.expireTime!));
    const unknown = (await renewals.next("the answer for an unknown lease")).renewal!;
    expect([unknown.leaseToken, unknown.alive, unknown.expireTime]).toEqual(["not-a-lease", false, undefined]);

    expect((await rpc.unary(LockService.method.release, { leaseToken: token })).released).toBe(true);
    call.write({ leaseToken: token });
    expect((await renewals.next("the answer after the release")).renewal?.alive).toBe(false);
    call.end();
    expect((await renewals.ended).name).toBe("OK");
  });

  it("Acquire with a request_id: a repeat while the first waits joins it, and both get the same lease; a repeat while the grant lives answers it", async () => {
    const file = path.join(projectRoot, "src/retried.ts");
    const holder = (await rpc.unary(LockService.method.acquire, { file, owner: "holder" })).lease!;
    const requestId = "6b0e3c2a-0f9d-4a51-9d6e-2b7c1f0e8a44";
    // Deadlines longer than the waits: a call's deadline bounds its wait too.
    const first = rpc.unary(LockService.method.acquire, { file, owner: "retrier", maxWait: seconds(30), requestId }, { deadlineMs: 60_000 });
    await eventually(
      "the first call queued",
      () => rpc.unary(LockService.method.inspect, { file }),
      (s) => s.waiters.length === 1,
    );
    // The retry of a call whose answer the client lost (here: still waiting) waits on the same place.
    const repeat = rpc.unary(LockService.method.acquire, { file, owner: "retrier", maxWait: seconds(60), requestId }, { deadlineMs: 120_000 });
    const joined = await eventually(
      "the repeat joined the first call's place",
      () => rpc.unary(LockService.method.inspect, { file }),
      (s) => s.waiters.length === 1 && timestampMs(s.waiters[0]!.waitExpireTime!) - timestampMs(s.waiters[0]!.waitStartTime!) >= 59_000,
    );
    expect(joined.waiters.map((w) => w.owner)).toEqual(["retrier"]);
    await rpc.unary(LockService.method.release, { leaseToken: holder.leaseToken });
    const [a, b] = await Promise.all([first, repeat]);
    expect(b.lease).toEqual(a.lease);
    const again = await rpc.unary(LockService.method.acquire, { file: `${projectRoot}/src/./retried.ts`, owner: "retrier", maxWait: seconds(0), requestId });
    expect(again.lease).toEqual(a.lease);
    await rpc.unary(LockService.method.release, { leaseToken: a.lease!.leaseToken });
  });

  it("each refusal with its code, ErrorInfo reason (domain berth.locks) and typed details in grpc-status-details-bin", async () => {
    const file = path.join(projectRoot, "src/refusals.ts");
    const holder = (await rpc.unary(LockService.method.acquire, { file, owner: "holder" })).lease!;

    // A wait that runs out: RESOURCE_EXHAUSTED WAIT_EXHAUSTED, LockHeld naming the holder, RetryInfo.
    const waited = await failure(rpc.unary(LockService.method.acquire, { file, owner: "late", maxWait: { seconds: 0n, nanos: 200_000_000 } }));
    expect(waited.name).toBe("RESOURCE_EXHAUSTED");
    const exhausted = statusDetails(waited.metadata);
    expect(exhausted).toMatchObject({ reason: "WAIT_EXHAUSTED", domain: "berth.locks", retryAfterMs: 1_000 });
    expect(exhausted.lockHeld).toMatchObject({ file, owner: "holder", fencingToken: holder.fencingToken, kind: HolderKind.LEASE });
    expect(durationMs(exhausted.lockHeld!.waited!)).toBe(200);
    expect(JSON.parse(String(waited.metadata.get("berth-error-details")[0]))).toMatchObject({ reason: "WAIT_EXHAUSTED", owner: "holder", waitedMs: 200 });

    // A malformed field: INVALID_ARGUMENT INVALID_FIELD with a BadRequest naming it.
    const invalid = await failure(rpc.unary(LockService.method.acquire, { file, owner: "x", requestId: "not valid" }));
    expect(invalid.name).toBe("INVALID_ARGUMENT");
    expect(statusDetails(invalid.metadata)).toMatchObject({ reason: "INVALID_FIELD", domain: "berth.locks", fields: ["request_id"] });
    const noTokens = await failure(rpc.unary(LockService.method.keepAlive, { leaseTokens: [] }));
    expect(statusDetails(noTokens.metadata)).toMatchObject({ reason: "INVALID_FIELD", fields: ["lease_tokens"] });

    // A Hold whose lease its owner releases through Release: the stream ends OK.
    const other = path.join(projectRoot, "src/released.ts");
    const hold = reader(rpc.serverStream(LockService.method.hold, { file: other, owner: "streamer" }));
    const acquired = await expectKind(hold, "acquired");
    expect((await rpc.unary(LockService.method.release, { leaseToken: acquired.leaseToken })).released).toBe(true);
    expect((await hold.ended).name).toBe("OK");

    // A full queue: RESOURCE_EXHAUSTED TOO_MANY_WAITERS with a RetryInfo (a service with room for one waiter).
    const small = await startService("sessions", { args: ["--lock-max-waiters", "1"] });
    const smallRpc = grpcJsClient(small.url("sessions"));
    try {
      const first = (await smallRpc.unary(LockService.method.acquire, { file, owner: "holder" })).lease!;
      const queued = smallRpc.unary(LockService.method.acquire, { file, owner: "waiter", maxWait: seconds(30) });
      await eventually(
        "the waiter queued",
        () => smallRpc.unary(LockService.method.inspect, { file }),
        (s) => s.waiters.length === 1,
      );
      const crowded = await failure(smallRpc.unary(LockService.method.acquire, { file, owner: "one-too-many", maxWait: seconds(30) }));
      expect(crowded.name).toBe("RESOURCE_EXHAUSTED");
      expect(statusDetails(crowded.metadata)).toMatchObject({ reason: "TOO_MANY_WAITERS", domain: "berth.locks", retryAfterMs: 1_000, lockHeld: undefined });
      await smallRpc.unary(LockService.method.release, { leaseToken: first.leaseToken });
      await smallRpc.unary(LockService.method.release, { leaseToken: (await queued).lease!.leaseToken });
    } finally {
      smallRpc.close();
      await small.stop();
    }
    await rpc.unary(LockService.method.release, { leaseToken: holder.leaseToken });
  });

  it("WatchLocks: the current holder of one file, caught_up, then its release, until the client cancels", async () => {
    const file = path.join(projectRoot, "src/watched.ts");
    const { lease } = await rpc.unary(LockService.method.acquire, { file, owner: "watched" });
    const call = rpc.serverStream(LockService.method.watchLocks, { file, includeCurrent: true });
    const watch = reader(call);
    const current = await watch.next("the current holder");
    expect(current.kind.case === "event" && [current.kind.value.kind, current.kind.value.owner]).toEqual([LockEventKind.CURRENT_HOLDER, "watched"]);
    expect((await watch.next("caught_up")).kind.case).toBe("caughtUp");
    await rpc.unary(LockService.method.release, { leaseToken: lease!.leaseToken });
    const released = await watch.next("the release");
    expect(released.kind.case === "event" && released.kind.value.kind).toBe(LockEventKind.RELEASED);
    call.cancel();
    expect((await watch.ended).name).toBe("CANCELLED");
  });

  it("Hold: waiting (position, holder) while held, acquired on release, then held until the client cancels; a cancelled waiter leaves the queue", async () => {
    const file = path.join(projectRoot, "src/hold.ts");
    const first = (await rpc.unary(LockService.method.acquire, { file, owner: "lease-holder" })).lease!;

    const holdCall = rpc.serverStream(LockService.method.hold, { file, owner: "streamer", maxWait: seconds(30) });
    const hold = reader(holdCall);
    const waiting = await expectKind(hold, "waiting");
    expect([waiting.position, waiting.holder?.owner, waiting.holder?.kind]).toEqual([1, "lease-holder", HolderKind.LEASE]);

    // A second Hold queues behind it, then its client cancels: it leaves the queue, never granted.
    const quitterCall = rpc.serverStream(LockService.method.hold, { file, owner: "quitter", maxWait: seconds(30) });
    const quitter = reader(quitterCall);
    expect((await expectKind(quitter, "waiting")).position).toBe(2);
    const queued = await rpc.unary(LockService.method.inspect, { file });
    expect(queued.waiters.map((w) => [w.owner, w.kind])).toEqual([
      ["streamer", HolderKind.STREAM],
      ["quitter", HolderKind.STREAM],
    ]);
    quitterCall.cancel();
    expect((await quitter.ended).name).toBe("CANCELLED");
    await eventually(
      "the cancelled waiter gone",
      () => rpc.unary(LockService.method.inspect, { file }),
      (s) => s.waiters.length === 1,
    );

    await rpc.unary(LockService.method.release, { leaseToken: first.leaseToken });
    const acquired = await expectKind(hold, "acquired");
    expect(acquired.fencingToken).toBeGreaterThan(first.fencingToken);
    expect([acquired.owner, acquired.expireTime, acquired.ttl]).toEqual(["streamer", undefined, undefined]);
    const streamHeld = await rpc.unary(LockService.method.inspect, { file });
    expect([streamHeld.holder?.owner, streamHeld.holder?.kind, streamHeld.waiters]).toEqual(["streamer", HolderKind.STREAM, []]);

    // The client cancels mid-stream: the lock is free for the next Acquire at once (try once, no wait).
    holdCall.cancel();
    expect((await hold.ended).name).toBe("CANCELLED");
    const next = await eventually(
      "an Acquire granted after the Hold was cancelled",
      () =>
        rpc
          .unary(LockService.method.acquire, { file, owner: "next", maxWait: seconds(0) })
          .catch((error: unknown) => (isGrpcError(error) ? undefined : Promise.reject(error))),
      (granted) => granted !== undefined,
    );
    expect(next!.lease!.fencingToken).toBeGreaterThan(acquired.fencingToken);
    await rpc.unary(LockService.method.release, { leaseToken: next!.lease!.leaseToken });
  });
});

// ---------------------------------------------------------------------------------------------

describe("BudgetService over grpc-js", () => {
  const state = () => budgetRpc.unary(BudgetService.method.getState, {});

  it("unary RPCs: Check, Costs, GetMachine, GetState, and a leased reservation through KeepAlive, ReleaseBuild, RegisterRunning, StopRunning, Release", async () => {
    const check = await budgetRpc.unary(BudgetService.method.check, { need: { items: [start("web", 1)] } });
    expect(check.verdict?.fits).toBe(true);
    expect(check.verdict?.policy?.memoryBytes).toBe(BigInt(4 * G));
    const tooBig = await budgetRpc.unary(BudgetService.method.check, { need: { items: [start("huge", 5)] } });
    expect(tooBig.verdict?.fits).toBe(false);
    expect(tooBig.verdict?.impossible).toBeTruthy();

    const costs = await budgetRpc.unary(BudgetService.method.costs, { spec: { memory: "1G", cpu: 2, build: { memory: "2G" } } });
    expect([costs.run?.memoryBytes, costs.run?.cpu, costs.run?.declared, costs.build?.memoryBytes]).toEqual([BigInt(G), 2, true, BigInt(2 * G)]);

    const { machine } = await budgetRpc.unary(BudgetService.method.getMachine, {});
    expect([machine?.totalBytes, machine?.availableBytes]).toEqual([BigInt(16 * G), BigInt(16_000_000 * 1024)]);

    const { reservation } = await budgetRpc.unary(BudgetService.method.reserve, {
      owner: "surface",
      need: { items: [start("api", 1), { kind: NeedItemKind.BUILD, name: "api", costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } } }] },
      ttl: seconds(60),
    });
    const id = reservation!.id;
    expect(reservation?.expireTime).toBeDefined();
    expect((await state()).reservations.map((r) => r.id)).toEqual([id]);

    const { renewals } = await budgetRpc.unary(BudgetService.method.keepAlive, { ids: [id, "gone"] });
    expect(renewals.map((r) => [r.id, r.alive])).toEqual([
      [id, true],
      ["gone", false],
    ]);
    expect((await budgetRpc.unary(BudgetService.method.releaseBuild, { reservationId: id })).reservation?.build?.memoryBytes).toBe(0n);

    const registered = await budgetRpc.unary(BudgetService.method.registerRunning, { name: "api", reservationId: id, pid: process.pid });
    expect(registered.running?.reservationId).toBe(id);
    expect(registered.reservation?.runningIds).toEqual([registered.running!.id]);
    expect((await state()).running.map((r) => [r.name, r.pid])).toEqual([["api", process.pid]]);
    expect((await budgetRpc.unary(BudgetService.method.stopRunning, { id: registered.running!.id })).stopped).toBe(true);
    expect((await budgetRpc.unary(BudgetService.method.stopRunning, { id: registered.running!.id })).stopped).toBe(false);

    expect((await budgetRpc.unary(BudgetService.method.release, { reservationId: id })).released).toBe(true);
    expect((await budgetRpc.unary(BudgetService.method.release, { reservationId: id })).released).toBe(false);
    const after = await state();
    expect([after.reservations, after.running, after.queue, after.committed?.memoryBytes]).toEqual([[], [], [], 0n]);
  });

  it("GetLimits, a Reserve repeated with its request id, and GetState's first pages continued by ListQueue, ListReservations and ListRunning", async () => {
    // On the file store the fleet view is refused, saying what to change (budget-fleet.test.ts calls it on etcd).
    const fleet = await failure(budgetRpc.unary(BudgetService.method.getFleet, {}));
    expect(fleet.name).toBe("FAILED_PRECONDITION");
    expect(statusDetails(fleet.metadata).reason).toBe("FLEET_NEEDS_ETCD");
    const limits = await budgetRpc.unary(BudgetService.method.getLimits, {});
    expect([limits.defaultTtl?.seconds, limits.maxTtl?.seconds, limits.maxWait?.seconds, limits.maxQueue, limits.maxOwnerLength]).toEqual([
      30n,
      3600n,
      600n,
      1000,
      256,
    ]);

    const nothing = { case: "cost" as const, value: { memoryBytes: 0n, cpu: 0 } };
    const ask = { owner: "paged", need: { items: [start("p", 0.25, 0.25)] }, requestId: "surface-paged-0" };
    const first = (await budgetRpc.unary(BudgetService.method.reserve, ask)).reservation!;
    expect((await budgetRpc.unary(BudgetService.method.reserve, ask)).reservation?.id).toBe(first.id);
    const ids = [first.id];
    for (let i = 1; i < 5; i++)
      ids.push((await budgetRpc.unary(BudgetService.method.reserve, { ...ask, owner: `paged-${i}`, requestId: `surface-paged-${i}` })).reservation!.id);
    const registered = [];
    for (let i = 0; i < 3; i++)
      registered.push(
        (await budgetRpc.unary(BudgetService.method.registerRunning, { name: `svc-${i}`, requestId: `surface-svc-${i}`, costSource: nothing })).running!.id,
      );
    expect((await budgetRpc.unary(BudgetService.method.registerRunning, { name: "svc-0", requestId: "surface-svc-0", costSource: nothing })).running?.id).toBe(
      registered[0],
    );
    // The queue: one waiter behind a holder of the rest of the memory.
    const holder = (await budgetRpc.unary(BudgetService.method.reserve, { owner: "queue-holder", need: { items: [start("h", 2)] } })).reservation!;
    const waiting = budgetRpc.unary(BudgetService.method.reserve, { owner: "queued", need: { items: [start("w", 1)] } });
    await eventually("a waiter queued", state, (s) => s.queueSize === 1);

    const page = await budgetRpc.unary(BudgetService.method.getState, { pageSize: 2 });
    expect([page.queueSize, page.reservationCount, page.runningCount]).toEqual([1, 6, 3]);
    expect(page.reservations.map((r) => r.id)).toEqual(ids.slice(0, 2));
    expect(page.queueNextPageToken).toBe("");
    expect((await budgetRpc.unary(BudgetService.method.listQueue, {})).queue.map((q) => [q.owner, q.position])).toEqual([["queued", 1]]);
    const rest = await budgetRpc.unary(BudgetService.method.listReservations, { pageToken: page.reservationsNextPageToken, pageSize: 10 });
    expect(rest.reservations.map((r) => r.id)).toEqual([...ids.slice(2), holder.id]);
    const running = await budgetRpc.unary(BudgetService.method.listRunning, { pageToken: page.runningNextPageToken });
    expect([running.running.map((r) => r.id), running.nextPageToken]).toEqual([[registered[2]], ""]);

    await budgetRpc.unary(BudgetService.method.release, { reservationId: holder.id });
    await budgetRpc.unary(BudgetService.method.release, { reservationId: (await waiting).reservation!.id });
    for (const id of ids) await budgetRpc.unary(BudgetService.method.release, { reservationId: id });
    for (const id of registered) await budgetRpc.unary(BudgetService.method.stopRunning, { id });
  });

  it("each error code with its ErrorInfo reason (domain berth.budget) in grpc-status-details-bin, and RetryInfo where a retry can succeed", async () => {
    const full = await startBudget({ args: ["--max-queue=0"] });
    const client = grpcJsClient(full.url);
    try {
      const details = async (call: Promise<unknown>) => {
        const { name, metadata } = await failure(call);
        const status = grpcStatusDetails(metadata);
        return {
          code: name,
          reason: status?.reason,
          domain: status?.domain,
          retry: status?.retryDelayMs !== undefined,
          refusal: status?.find(RefusalSchema)?.kind,
        };
      };
      expect(await details(client.unary(BudgetService.method.reserve, { owner: "huge", need: { items: [start("x", 5)] } }))).toEqual({
        code: "FAILED_PRECONDITION",
        reason: "IMPOSSIBLE",
        domain: "berth.budget",
        retry: false,
        refusal: RefusalKind.IMPOSSIBLE,
      });
      const held = (await client.unary(BudgetService.method.reserve, { owner: "holder", need: { items: [start("a", 3)] } })).reservation!;
      expect(await details(client.unary(BudgetService.method.reserve, { owner: "late", need: { items: [start("b", 2)] } }))).toEqual({
        code: "RESOURCE_EXHAUSTED",
        reason: "QUEUE_FULL",
        domain: "berth.budget",
        retry: true,
        refusal: RefusalKind.QUEUE_FULL,
      });
      expect(await details(client.unary(BudgetService.method.reserve, { owner: "now", need: { items: [start("b", 2)] }, maxWait: seconds(0) }))).toEqual({
        code: "RESOURCE_EXHAUSTED",
        reason: "WAIT_EXHAUSTED",
        domain: "berth.budget",
        retry: true,
        refusal: RefusalKind.WAIT_EXHAUSTED,
      });
      await client.unary(BudgetService.method.release, { reservationId: held.id });
      expect(await details(client.unary(BudgetService.method.releaseBuild, { reservationId: held.id }))).toMatchObject({
        code: "NOT_FOUND",
        reason: "RESERVATION_NOT_FOUND",
        domain: "berth.budget",
      });
      expect(await details(client.unary(BudgetService.method.registerRunning, { name: "w", reservationId: held.id }))).toMatchObject({
        code: "NOT_FOUND",
        reason: "RESERVATION_NOT_FOUND",
      });
      expect(await details(client.unary(BudgetService.method.reserve, { owner: "x", ttl: seconds(3601) }))).toMatchObject({
        code: "INVALID_ARGUMENT",
        reason: "INVALID_FIELD",
        domain: "berth.budget",
      });
      expect(await details(client.unary(BudgetService.method.listRunning, { pageToken: "x" }))).toMatchObject({
        code: "INVALID_ARGUMENT",
        reason: "INVALID_FIELD",
      });

      // Out of turn on the Admit stream: build_done before admitted.
      const call = client.bidi(BudgetService.method.admit);
      const stream = reader(call);
      call.write({ kind: { case: "buildDone", value: {} } });
      const end = await stream.ended;
      const status = grpcStatusDetails(end.metadata);
      expect([end.name, status?.reason, status?.domain]).toEqual(["INVALID_ARGUMENT", "OUT_OF_TURN", "berth.budget"]);
    } finally {
      client.close();
      await full.service.stop();
    }
  });

  it("WatchMachine: the current sample at once, then newer ones, until the client cancels", async () => {
    const call = budgetRpc.serverStream(BudgetService.method.watchMachine, {});
    const watch = reader(call);
    const first = await watch.next("the current sample");
    expect(first.machine?.totalBytes).toBe(BigInt(16 * G));
    // The fixture is sampled every 200 ms.
    const second = await watch.next("a newer sample");
    expect(timestampMs(second.machine!.sampleTime!)).toBeGreaterThan(timestampMs(first.machine!.sampleTime!));
    call.cancel();
    expect((await watch.ended).name).toBe("CANCELLED");
  });

  it("WatchBudget: the current state (the policy), caught_up at its revision, until the client cancels", async () => {
    const call = budgetRpc.serverStream(BudgetService.method.watchBudget, { includeCurrent: true });
    const watch = reader(call);
    let message = await watch.next("the current state");
    while (message.kind.case === "event" && message.kind.value.subject.case !== "policy") message = await watch.next("the policy");
    const policy = message;
    const caughtUp = await watch.next("caught_up");
    expect(caughtUp.kind.case).toBe("caughtUp");
    expect(caughtUp.kind.case === "caughtUp" && caughtUp.kind.value.revision).toBe(policy.kind.case === "event" && policy.kind.value.revision);
    call.cancel();
    expect((await watch.ended).name).toBe("CANCELLED");
  });

  it("Admit: admitted; a second one queued (position, reason) → admitted when the first releases; build_done, started, release → released and OK", async () => {
    const firstCall = budgetRpc.bidi(BudgetService.method.admit);
    const first = reader(firstCall);
    firstCall.write({ kind: { case: "start", value: { owner: "first", need: { items: [start("a", 3)] } } } });
    const admittedFirst = await expectKind(first, "admitted");
    expect(admittedFirst.reservation?.owner).toBe("first");

    const secondCall = budgetRpc.bidi(BudgetService.method.admit);
    const second = reader(secondCall);
    secondCall.write({
      kind: {
        case: "start",
        value: {
          owner: "second",
          need: {
            items: [start("web", 1), { kind: NeedItemKind.BUILD, name: "web", costSource: { case: "cost", value: { memoryBytes: BigInt(2 * G), cpu: 1 } } }],
          },
        },
      },
    });
    const queued = await expectKind(second, "queued");
    expect(queued.position).toBe(1);
    expect(queued.waitFor.length).toBeGreaterThan(0);
    expect(queued.waitForText).not.toBe("");
    expect(queued.waitExpireTime).toBeDefined();
    expect((await state()).queue.map((q) => [q.owner, q.position])).toEqual([["second", 1]]);

    firstCall.write({ kind: { case: "release", value: {} } });
    expect((await expectKind(first, "released")).reservationId).toBe(admittedFirst.reservation!.id);
    expect((await first.ended).name).toBe("OK");

    // Heartbeats may come before the admission.
    let message = await second.next("the admission");
    while (message.kind.case === "queued") message = await second.next("the admission");
    expect(message.kind.case).toBe("admitted");
    const reservation = message.kind.case === "admitted" ? message.kind.value.reservation! : undefined;
    expect((await state()).committed?.memoryBytes).toBe(BigInt(3 * G));

    secondCall.write({ kind: { case: "buildDone", value: {} } });
    expect((await expectKind(second, "updated")).reservation?.build?.memoryBytes).toBe(0n);
    expect((await state()).committed?.memoryBytes).toBe(BigInt(G));
    secondCall.write({
      kind: { case: "started", value: { name: "web", pid: process.pid, costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } } } },
    });
    const started = await expectKind(second, "updated");
    expect([started.running?.name, started.running?.pid, started.running?.reservationId]).toEqual(["web", process.pid, reservation!.id]);
    secondCall.write({ kind: { case: "release", value: {} } });
    expect((await expectKind(second, "released")).reservationId).toBe(reservation!.id);
    expect((await second.ended).name).toBe("OK");

    // The running entry outlives the stream; the reservation does not.
    const after = await state();
    expect([after.reservations, after.running.map((r) => r.name)]).toEqual([[], ["web"]]);
    await budgetRpc.unary(BudgetService.method.stopRunning, { id: started.running!.id });
  });

  it("Admit cancelled mid-stream: an admitted stream's reservation is released, a queued one is dropped", async () => {
    const holderCall = budgetRpc.bidi(BudgetService.method.admit);
    const holder = reader(holderCall);
    holderCall.write({ kind: { case: "start", value: { owner: "holder", need: { items: [start("a", 3)] } } } });
    await expectKind(holder, "admitted");
    const waiterCall = budgetRpc.bidi(BudgetService.method.admit);
    const waiter = reader(waiterCall);
    waiterCall.write({ kind: { case: "start", value: { owner: "waiter", need: { items: [start("b", 2)] } } } });
    await expectKind(waiter, "queued");
    const before = await state();
    expect([before.reservations.map((r) => r.owner), before.queue.map((q) => q.owner)]).toEqual([["holder"], ["waiter"]]);

    waiterCall.cancel();
    expect((await waiter.ended).name).toBe("CANCELLED");
    await eventually("the cancelled request dropped from the queue", state, (s) => s.queue.length === 0);
    expect((await state()).reservations.map((r) => r.owner)).toEqual(["holder"]);

    holderCall.cancel();
    expect((await holder.ended).name).toBe("CANCELLED");
    const after = await eventually("the cancelled admission's reservation released", state, (s) => s.reservations.length === 0);
    expect(after.committed?.memoryBytes).toBe(0n);
  });
});

// ---------------------------------------------------------------------------------------------

describe("deadlines the server cannot meet", () => {
  it("Acquire and Hold waiting on a held lock end by their deadline (WAIT_EXHAUSTED just before it, or DEADLINE_EXCEEDED) and leave no waiter", async () => {
    const file = path.join(projectRoot, "src/deadline.ts");
    const holder = (await rpc.unary(LockService.method.acquire, { file, owner: "keeper", ttl: seconds(30) })).lease!;

    const began = Date.now();
    const acquire = await failure(rpc.unary(LockService.method.acquire, { file, owner: "impatient" }, { deadlineMs: 600 }));
    // The service bounds the wait by the call's deadline and answers a little before it, with the
    // holder (the documented answer); a slow machine may let the client's own deadline fire first.
    expect(["RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"]).toContain(acquire.name);
    if (acquire.name === "RESOURCE_EXHAUSTED") expect(acquire.details).toMatch(/^source locked: \/.*\/src\/deadline\.ts is held by keeper since /);
    expect(Date.now() - began).toBeLessThan(10_000);

    const holdCall = rpc.serverStream(LockService.method.hold, { file, owner: "impatient-stream" }, { deadlineMs: 2_000 });
    const hold = reader(holdCall);
    expect((await expectKind(hold, "waiting")).holder?.owner).toBe("keeper");
    expect(["RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"]).toContain((await hold.ended).name);

    const left = await eventually(
      "no waiter left behind",
      () => rpc.unary(LockService.method.inspect, { file }),
      (s) => s.waiters.length === 0,
    );
    expect(left.holder?.owner).toBe("keeper");
    expect(await gauge(sessionsUrl, "berth_locks_waiting")).toBe(0);
    await rpc.unary(LockService.method.release, { leaseToken: holder.leaseToken });
  });

  it("a WatchSession with a deadline ends DEADLINE_EXCEEDED and its watcher is dropped", async () => {
    const watchers = await gauge(sessionsUrl, "berth_sessions_watchers");
    const watch = reader(rpc.serverStream(SessionService.method.watchSession, { sessionId: "surface-deadline" }, { deadlineMs: 2_000 }));
    await expectKind(watch, "caughtUp");
    expect((await watch.ended).name).toBe("DEADLINE_EXCEEDED");
    await eventually(
      "the watcher dropped",
      () => gauge(sessionsUrl, "berth_sessions_watchers"),
      (n) => n === watchers,
    );
  });

  it("an Admit and a Reserve that stay queued past their deadline end DEADLINE_EXCEEDED, dropped from the queue", async () => {
    const state = () => budgetRpc.unary(BudgetService.method.getState, {});
    const holderCall = budgetRpc.bidi(BudgetService.method.admit);
    const holder = reader(holderCall);
    holderCall.write({ kind: { case: "start", value: { owner: "holder", need: { items: [start("a", 3)] } } } });
    await expectKind(holder, "admitted");

    const admitCall = budgetRpc.bidi(BudgetService.method.admit, { deadlineMs: 2_000 });
    const admit = reader(admitCall);
    admitCall.write({ kind: { case: "start", value: { owner: "late-admit", need: { items: [start("b", 2)] }, maxWait: seconds(60) } } });
    await expectKind(admit, "queued");
    const reserve = failure(
      budgetRpc.unary(BudgetService.method.reserve, { owner: "late-reserve", need: { items: [start("c", 2)] }, maxWait: seconds(60) }, { deadlineMs: 2_000 }),
    );

    expect((await admit.ended).name).toBe("DEADLINE_EXCEEDED");
    expect((await reserve).name).toBe("DEADLINE_EXCEEDED");
    const after = await eventually("both late requests dropped", state, (s) => s.queue.length === 0);
    expect(after.reservations.map((r) => r.owner)).toEqual(["holder"]);

    holderCall.write({ kind: { case: "release", value: {} } });
    await expectKind(holder, "released");
    expect((await holder.ended).name).toBe("OK");
  });
});

// ---------------------------------------------------------------------------------------------

/** HTTP/2 frames seen on connections through a {@link pingCountingProxy}. */
interface FrameCounts {
  /** PING frames the client sent (not ACKs). */
  clientPings: number;
  /** PING ACKs the server sent back. */
  serverPingAcks: number;
  /** PING frames the server sent (its own keepalive, `--keepalive`). */
  serverPings: number;
  /** PING ACKs the client sent back. */
  clientPingAcks: number;
}

/**
 * A TCP proxy in front of `target` that reads the HTTP/2 frame headers going each way and counts
 * PINGs, so the test sees keepalive on the wire rather than trusting the client's own account.
 */
async function pingCountingProxy(target: string): Promise<{ url: string; counts: FrameCounts; close(): void }> {
  const { hostname, port } = new URL(target);
  const counts: FrameCounts = { clientPings: 0, serverPingAcks: 0, serverPings: 0, clientPingAcks: 0 };
  const sockets = new Set<net.Socket>();
  const PING = 0x6;
  const ACK = 0x1;
  /** Feeds bytes to an HTTP/2 frame-header reader that skips `skip` bytes first (the client preface). */
  const frameReader = (skip: number, onFrame: (type: number, flags: number) => void) => {
    let buffered = Buffer.alloc(0);
    let toSkip = skip;
    return (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      if (toSkip > 0) {
        const n = Math.min(toSkip, buffered.length);
        buffered = buffered.subarray(n);
        toSkip -= n;
      }
      while (buffered.length >= 9) {
        const length = buffered.readUIntBE(0, 3);
        if (buffered.length < 9 + length) break;
        onFrame(buffered[3]!, buffered[4]!);
        buffered = buffered.subarray(9 + length);
      }
    };
  };
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(port), hostname);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on("error", () => {});
      socket.on("close", () => {
        sockets.delete(socket);
        client.destroy();
        upstream.destroy();
      });
    }
    const fromClient = frameReader(24, (type, flags) => {
      if (type === PING) counts[(flags & ACK) === 0 ? "clientPings" : "clientPingAcks"]++;
    });
    const fromServer = frameReader(0, (type, flags) => {
      if (type === PING) counts[(flags & ACK) === 0 ? "serverPings" : "serverPingAcks"]++;
    });
    client.on("data", (chunk: Buffer) => {
      fromClient(chunk);
      upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => {
      fromServer(chunk);
      client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address() as net.AddressInfo;
  return {
    url: `http://127.0.0.1:${address.port}`,
    counts,
    close() {
      server.close();
      for (const socket of sockets) socket.destroy();
    },
  };
}

describe("keepalive", () => {
  it("with --keepalive=1s the server pings an idle stream's connection itself, and the stream still delivers", async () => {
    const pinged = await startService("sessions", { args: ["--keepalive", "1s"] });
    const proxy = await pingCountingProxy(pinged.url("sessions"));
    try {
      const quiet = recording(grpcJsClient(proxy.url, {}, { "grpc.use_local_subchannel_pool": 1 }));
      const id = "surface-server-keepalive";
      const watchCall = quiet.serverStream(SessionService.method.watchSession, { sessionId: id });
      const watch = reader(watchCall);
      await expectKind(watch, "caughtUp");
      await eventually(
        "three server pings answered",
        async () => ({ ...proxy.counts }),
        (c) => c.serverPings >= 3 && c.clientPingAcks >= 3,
      );
      expect(proxy.counts.clientPings).toBe(0);
      await grpcJsClient(pinged.url("sessions")).unary(SessionService.method.appendEvent, { sessionId: id, event: generate });
      expect((await expectKind(watch, "entries")).entries[0]?.entry?.seq).toBe(1n);
      watchCall.cancel();
      quiet.close();
    } finally {
      proxy.close();
      await pinged.stop();
    }
  });

  it("pings flow over a WatchSession and a Hold idle for many ping intervals; both still deliver afterwards", async () => {
    // The server pings every 30 s by default, so here the client pings: every 100 ms,
    // each to be answered within 5 s (a busy machine is slow, not dead) or grpc-js drops the connection.
    const proxy = await pingCountingProxy(sessionsUrl);
    try {
      const pinging = recording(
        grpcJsClient(proxy.url, {}, { "grpc.keepalive_time_ms": 100, "grpc.keepalive_timeout_ms": 5_000, "grpc.use_local_subchannel_pool": 1 }),
      );
      const file = path.join(projectRoot, "src/keepalive.ts");
      const holdCall = pinging.serverStream(LockService.method.hold, { file, owner: "idle-holder" });
      const hold = reader(holdCall);
      const acquired = await expectKind(hold, "acquired");
      const id = "surface-keepalive";
      const watchCall = pinging.serverStream(SessionService.method.watchSession, { sessionId: id, includeSnapshot: true });
      const watch = reader(watchCall);
      await expectKind(watch, "caughtUp");

      // Idle: nothing to send on the watch; the next Hold heartbeat is 5 s away.
      const before = { ...proxy.counts };
      const idle = await eventually(
        "five keepalive pings answered",
        async () => ({ ...proxy.counts }),
        (c) => c.clientPings >= before.clientPings + 5 && c.serverPingAcks >= before.serverPingAcks + 5,
      );
      expect(watch.received).toHaveLength(1);
      expect(watch.isEnded || hold.isEnded).toBe(false);

      // A live entry, appended through another connection, reaches the idle watcher.
      await rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: generate });
      const [entry] = (await expectKind(watch, "entries")).entries;
      expect(entry?.entry?.seq).toBe(1n);
      expect(entry?.snapshot?.phase).toBe("generate_requested");

      // The Hold's first heartbeat comes after its 5 s of silence, the lock still held by the stream.
      const heartbeat = await expectKind(hold, "heartbeat", 20_000);
      expect(timestampMs(heartbeat.sendTime!)).toBeGreaterThan(timestampMs(acquired.acquireTime!));
      expect(proxy.counts.clientPings).toBeGreaterThan(idle.clientPings);
      const inspected = await rpc.unary(LockService.method.inspect, { file });
      expect([inspected.holder?.owner, inspected.holder?.fencingToken]).toEqual(["idle-holder", acquired.fencingToken]);

      holdCall.cancel();
      watchCall.cancel();
      expect((await hold.ended).name).toBe("CANCELLED");
      expect((await watch.ended).name).toBe("CANCELLED");
      await eventually(
        "the lock free after the cancel",
        () => rpc.unary(LockService.method.inspect, { file }),
        (s) => s.holder === undefined,
      );
      pinging.close();
    } finally {
      proxy.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------

describe("the surface", () => {
  it("every RPC of the three services was called above (checked against the generated descriptors)", () => {
    const declared = SERVICES.flatMap((service) => service.methods.map(rpcName)).sort();
    for (const service of SERVICES) expect(service.methods.length, service.typeName).toBeGreaterThan(0);
    expect([...called].sort()).toEqual(declared);
  });
});
