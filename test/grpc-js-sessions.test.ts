/**
 * SessionService through @grpc/grpc-js, a gRPC implementation that shares nothing with the server's
 * connect-node (grpc-js-surface.ts): every RPC, each stream carried through to its meaningful
 * messages, a client cancelling mid-stream (the server must free what the stream held). The set of
 * RPCs called is checked against the generated service descriptors at the end, so an RPC added to
 * the .proto without a test here fails this file. The locks (grpc-js-locks), the budget
 * (grpc-js-budget), deadlines the server cannot meet (grpc-js-deadlines) and HTTP/2 keepalive
 * (grpc-js-keepalive) have their own files; sessions.test.ts goes deeper into the semantics, this
 * one proves the surface.
 */
import * as path from "node:path";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import {
  ExpectedState,
  FenceRejectedSchema,
  IdempotencyKeyReusedSchema,
  SeqConflictSchema,
  SessionService,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { BadRequestSchema } from "@berth/api/google/rpc/error_details_pb";
import {
  atSeq,
  eventually,
  expectEveryRpcCalled,
  expectKind,
  failure,
  gauge,
  generate,
  noSession,
  phase,
  reader,
  startSessionsSurface,
} from "./grpc-js-surface.js";
import { grpcErrorInfo, grpcStatusDetails, stopAll, type GrpcJsClient } from "./harness.js";

afterAll(stopAll);

let sessionsUrl: string;
let projectRoot: string;
let rpc: GrpcJsClient;

beforeAll(async () => {
  ({ sessionsUrl, projectRoot, rpc } = await startSessionsSurface());
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

describe("the surface", () => {
  it("every RPC of SessionService was called above (checked against the generated descriptors)", () => {
    expectEveryRpcCalled(SessionService);
  });
});
