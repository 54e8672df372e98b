import * as fs from "node:fs";
import * as path from "node:path";
import { StructSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import {
  ExpectedState,
  FenceRejectedSchema,
  IdempotencyKeyReusedSchema,
  SeqConflictSchema,
  type WatchSessionResponse,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { BerthError } from "@berth/shared/errors";
import { ERROR_DETAILS_HEADER } from "@berth/shared/server/index";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { FenceCheck } from "./session-handlers.js";
import {
  big,
  clientFor,
  closeStores,
  codeAndReason,
  dir,
  event,
  failure,
  generate,
  journalLines,
  openStore,
  phase,
  seqsOf,
  setUpStores,
  watchersAt,
} from "./session-handler-fixtures.js";

beforeEach(setUpStores);
afterEach(closeStores);

describe("AppendEvent", () => {
  it("refuses a stale expected_seq with ABORTED SEQ_CONFLICT and a SeqConflict detail, writing nothing", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "s", event: generate(), expected: { case: "expectedState", value: ExpectedState.NO_SESSION } });
    await client.appendEvent({ sessionId: "s", event: phase("a"), expected: { case: "expectedSeq", value: 1n } });
    const error = await failure(client.appendEvent({ sessionId: "s", event: phase("b"), expected: { case: "expectedSeq", value: 1n } }));
    expect(codeAndReason(error)).toEqual([Code.Aborted, "SEQ_CONFLICT"]);
    expect(error.rawMessage).toMatch(/expected seq 1 but the session is at seq 2/);
    const [conflict] = error.findDetails(SeqConflictSchema);
    expect(conflict).toMatchObject({ sessionId: "s", expectedSeq: 1n, currentSeq: 2n, expectedState: ExpectedState.UNSPECIFIED });
    // The generic forms every BerthError has are still there, and no retry is suggested.
    expect(error.findDetails(StructSchema)).toHaveLength(1);
    expect(error.findDetails(RetryInfoSchema)).toEqual([]);
    expect(JSON.parse(error.metadata.get(ERROR_DETAILS_HEADER)!)).toMatchObject({ reason: "SEQ_CONFLICT", currentSeq: 2 });
    expect(journalLines("s")).toHaveLength(2);
    // An expected state that does not hold is the same conflict.
    const fresh = await failure(
      client.appendEvent({ sessionId: "s", event: phase("c"), expected: { case: "expectedState", value: ExpectedState.NO_SESSION } }),
    );
    expect(codeAndReason(fresh)).toEqual([Code.Aborted, "SEQ_CONFLICT"]);
    expect(fresh.findDetails(SeqConflictSchema)[0]).toMatchObject({ expectedSeq: 0n, currentSeq: 2n, expectedState: ExpectedState.NO_SESSION });
    const missing = await failure(client.appendEvent({ sessionId: "t", event: phase("c"), expected: { case: "expectedState", value: ExpectedState.EXISTS } }));
    expect(missing.findDetails(SeqConflictSchema)[0]).toMatchObject({ sessionId: "t", currentSeq: 0n, expectedState: ExpectedState.EXISTS });
    expect(store.has("t")).toBe(false);
    expect((await client.appendEvent({ sessionId: "s", event: phase("d"), expected: { case: "expectedState", value: ExpectedState.EXISTS } })).seq).toBe(3n);
    expect((await client.appendEvent({ sessionId: "s", event: phase("e"), expected: { case: "expectedState", value: ExpectedState.ANY } })).seq).toBe(4n);
    // expected_seq is positive: "no entry yet" is an expected state.
    const zero = await failure(client.appendEvent({ sessionId: "s", event: phase("f"), expected: { case: "expectedSeq", value: 0n } }));
    expect(codeAndReason(zero)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
    expect(zero.rawMessage).toMatch(/^expected_seq: must be positive.*NO_SESSION/);
  });

  it("answers a retried idempotency key with the original result; the key with another event is ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED", async () => {
    const store = openStore();
    const client = clientFor(store);
    const first = await client.appendEvent({ sessionId: "s", event: generate(), idempotencyKey: "req-1" });
    await client.appendEvent({ sessionId: "s", event: phase("a") });
    const retry = await client.appendEvent({ sessionId: "s", event: generate(), idempotencyKey: "req-1" });
    expect(retry.duplicate).toBe(true);
    expect(retry.seq).toBe(first.seq);
    expect(retry.snapshot).toEqual(first.snapshot);
    const reused = await failure(client.appendEvent({ sessionId: "s", event: generate(4), idempotencyKey: "req-1" }));
    expect(codeAndReason(reused)).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);
    expect(reused.findDetails(IdempotencyKeyReusedSchema)[0]).toMatchObject({ sessionId: "s", idempotencyKey: "req-1", firstSeq: 1n, lastSeq: 1n });
    const batch = await failure(client.appendEvents({ sessionId: "s", events: [generate(), phase("a")], idempotencyKey: "req-1" }));
    expect(codeAndReason(batch)).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);
    expect(journalLines("s")).toHaveLength(2);
  });

  it("checks a fence right before sequencing and refuses a stale token with FAILED_PRECONDITION FENCE_REJECTED and FenceRejected", async () => {
    const store = openStore();
    const calls: Array<[string, bigint]> = [];
    let current = 7n;
    // Shaped as the lock service's check (lock-handlers.ts createFenceCheck): prepared with the
    // request, run right before sequencing.
    const fenceCheck: FenceCheck = (file, token) => () => {
      calls.push([file, token]);
      if (token === current) return;
      throw new BerthError("aborted", `fence rejected: token ${token} is stale`, {
        reason: "FENCE_REJECTED",
        file: `/abs${file}`,
        fencingToken: Number(token),
        currentToken: Number(current),
      });
    };
    const client = clientFor(store, { fenceCheck });
    const ok = await client.appendEvent({ sessionId: "s", event: generate(), fence: { file: "/p/src/a.css", fencingToken: 7n } });
    expect(ok.seq).toBe(1n);
    current = 8n;
    const error = await failure(client.appendEvent({ sessionId: "s", event: phase("x"), fence: { file: "/p/src/a.css", fencingToken: 7n } }));
    expect(codeAndReason(error)).toEqual([Code.FailedPrecondition, "FENCE_REJECTED"]);
    expect(error.findDetails(FenceRejectedSchema)[0]).toMatchObject({ file: "/abs/p/src/a.css", fencingToken: 7n, currentToken: 8n });
    expect(error.findDetails(RetryInfoSchema)).toEqual([]);
    expect(JSON.parse(error.metadata.get(ERROR_DETAILS_HEADER)!)).toMatchObject({ reason: "FENCE_REJECTED", file: "/abs/p/src/a.css", currentToken: 8 });
    expect(calls).toEqual([
      ["/p/src/a.css", 7n],
      ["/p/src/a.css", 7n],
    ]);
    expect(journalLines("s")).toHaveLength(1);
    // A batch is fenced once, as a whole.
    const batch = await failure(client.appendEvents({ sessionId: "s", events: [phase("x"), phase("y")], fence: { file: "/p/src/a.css", fencingToken: 7n } }));
    expect(codeAndReason(batch)).toEqual([Code.FailedPrecondition, "FENCE_REJECTED"]);
    expect(journalLines("s")).toHaveLength(1);
  });

  it("refuses a fence it cannot check, and a malformed fence, before anything is written", async () => {
    const store = openStore();
    const unchecked = clientFor(store);
    const error = await failure(unchecked.appendEvent({ sessionId: "s", event: generate(), fence: { file: "a", fencingToken: 1n } }));
    expect(codeAndReason(error)).toEqual([Code.FailedPrecondition, "FENCE_REJECTED"]);
    const client = clientFor(store, { fenceCheck: () => () => {} });
    for (const fencingToken of [0n, -3n]) {
      const noToken = await failure(client.appendEvent({ sessionId: "s", event: generate(), fence: { file: "a", fencingToken } }));
      expect(codeAndReason(noToken)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
      expect(noToken.rawMessage).toMatch(/^fence\.fencing_token: /);
    }
    const noFile = await failure(client.appendEvent({ sessionId: "s", event: generate(), fence: { file: "", fencingToken: 3n } }));
    expect(noFile.rawMessage).toMatch(/^fence\.file: /);
    const nul = await failure(client.appendEvent({ sessionId: "s", event: generate(), fence: { file: "a\0b", fencingToken: 3n } }));
    expect(nul.rawMessage).toMatch(/^fence\.file: .*NUL/);
    expect(store.has("s")).toBe(false);
  });

  it("passes a fence check's other errors through unchanged, and refuses its input before anything is written", async () => {
    const store = openStore();
    let checked = 0;
    const client = clientFor(store, {
      fenceCheck: () => {
        throw new BerthError("invalid_argument", "fence.file: must be an absolute path", { field: "fence.file" });
      },
    });
    const error = await failure(client.appendEvent({ sessionId: "s", event: generate(), fence: { file: "../x", fencingToken: 1n } }));
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toBe("fence.file: must be an absolute path");
    expect(error.findDetails(FenceRejectedSchema)).toEqual([]);
    expect(store.has("s")).toBe(false);
    const failing = clientFor(store, {
      fenceCheck: () => () => {
        checked++;
        throw new BerthError("unavailable", "lock service is shutting down");
      },
    });
    expect((await failure(failing.appendEvent({ sessionId: "s", event: generate(), fence: { file: "/x", fencingToken: 1n } }))).code).toBe(Code.Unavailable);
    expect(checked).toBe(1);
    expect(store.has("s")).toBe(false);
  });

  it("validates every field, naming it and the rule, and writes nothing on a refusal", async () => {
    const store = openStore({ maxEventBytes: 2048 });
    const client = clientFor(store);
    const cases: Array<[() => Promise<unknown>, Code, RegExp, string?]> = [
      [() => client.appendEvent({ sessionId: "", event: generate() }), Code.InvalidArgument, /^session_id: is required/],
      [() => client.appendEvent({ sessionId: "../etc", event: generate() }), Code.InvalidArgument, /^session_id: must match/],
      [() => client.appendEvent({ sessionId: "a/b", event: generate() }), Code.InvalidArgument, /^session_id: must match/],
      [() => client.appendEvent({ sessionId: "x".repeat(129), event: generate() }), Code.InvalidArgument, /^session_id: must match/],
      [() => client.appendEvent({ sessionId: "s" }), Code.InvalidArgument, /^event: is required/],
      [() => client.appendEvent({ sessionId: "s", event: {} }), Code.InvalidArgument, /^event: must set one event type/],
      [
        () => client.appendEvent({ sessionId: "s", event: event({ case: "generate", value: { count: 2, extra: { count: 3 } } }) }),
        Code.InvalidArgument,
        /^event\.generate\.extra/,
      ],
      [() => client.appendEvent({ sessionId: "s", event: event({ case: "other", value: { type: "generate" } }) }), Code.InvalidArgument, /^event\.other\.type/],
      [() => client.appendEvent({ sessionId: "s", event: generate(), idempotencyKey: "k".repeat(129) }), Code.InvalidArgument, /^idempotency_key: /],
      [
        () => client.appendEvent({ sessionId: "s", event: generate(), expected: { case: "expectedSeq", value: 2n ** 60n } }),
        Code.InvalidArgument,
        /^expected_seq: must be at most/,
      ],
      [
        () => client.appendEvent({ sessionId: "s", event: generate(), expected: { case: "expectedSeq", value: -1n } }),
        Code.InvalidArgument,
        /^expected_seq: must be positive/,
      ],
      [
        () => client.appendEvent({ sessionId: "s", event: generate(), expected: { case: "expectedState", value: 9 as ExpectedState } }),
        Code.InvalidArgument,
        /^expected_state: /,
      ],
      [() => client.appendEvent({ sessionId: "s", event: big(4000) }), Code.InvalidArgument, /over the limit of 2048 bytes/, "EVENT_TOO_LARGE"],
    ];
    for (const [i, [call, code, message, reason]] of cases.entries()) {
      const error = await failure(call()).catch((e: Error) => new ConnectError(`case ${i}: ${e.message}`));
      expect({ i, code: error.code, message: error.rawMessage }).toEqual({ i, code, message: expect.stringMatching(message) });
      expect(codeAndReason(error)[1]).toBe(reason ?? "INVALID_FIELD");
    }
    expect(store.has("s")).toBe(false);
    expect(fs.readdirSync(path.join(dir, "sessions")).filter((f) => f.endsWith(".jsonl"))).toEqual([]);
  });
});

describe("AppendEvents", () => {
  it("appends a batch with consecutive seqs and answers the snapshot after the whole batch", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "b", event: generate() });
    const res = await client.appendEvents({
      sessionId: "b",
      events: [phase("a"), phase("b"), phase("c")],
      expected: { case: "expectedSeq", value: 1n },
      idempotencyKey: "batch-1",
    });
    expect(res).toMatchObject({ firstSeq: 2n, lastSeq: 4n, duplicate: false });
    expect(res.snapshot?.generationPhase).toBe("c");
    const retry = await client.appendEvents({ sessionId: "b", events: [phase("a"), phase("b"), phase("c")], idempotencyKey: "batch-1" });
    expect(retry).toMatchObject({ firstSeq: 2n, lastSeq: 4n, duplicate: true });
    expect(journalLines("b")).toHaveLength(4);
  });

  it("is all or nothing: one bad event refuses the batch, naming its index", async () => {
    const store = openStore({ maxEventsPerAppend: 3 });
    const client = clientFor(store);
    const bad = await failure(client.appendEvents({ sessionId: "b", events: [phase("a"), {}, phase("c")] }));
    expect(bad.code).toBe(Code.InvalidArgument);
    expect(bad.rawMessage).toMatch(/^events\[1\]: /);
    const empty = await failure(client.appendEvents({ sessionId: "b", events: [] }));
    expect(empty.rawMessage).toMatch(/^events: must hold at least one event/);
    const many = await failure(client.appendEvents({ sessionId: "b", events: [phase("a"), phase("b"), phase("c"), phase("d")] }));
    expect(codeAndReason(many)).toEqual([Code.InvalidArgument, "TOO_MANY_EVENTS"]);
    expect(many.rawMessage).toMatch(/^events: 4 events in one append, over the limit of 3/);
    const conflict = await failure(client.appendEvents({ sessionId: "b", events: [phase("a")], expected: { case: "expectedSeq", value: 5n } }));
    expect(codeAndReason(conflict)).toEqual([Code.Aborted, "SEQ_CONFLICT"]);
    expect(conflict.findDetails(SeqConflictSchema)[0]).toMatchObject({ sessionId: "b", expectedSeq: 5n, currentSeq: 0n });
    expect(store.has("b")).toBe(false);
  });
});

describe("DeleteSession", () => {
  it("deletes a watched session: its watchers end NOT_FOUND SESSION_DELETED, WatchSessions gets `deleted`", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvents({ sessionId: "d", events: [generate(), phase("a")] });
    const one = client.watchSession({ sessionId: "d" })[Symbol.asyncIterator]();
    expect(seqsOf((await one.next()).value as WatchSessionResponse)).toEqual([1n, 2n]);
    expect(((await one.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    const controller = new AbortController();
    const all = client.watchSessions({}, { signal: controller.signal })[Symbol.asyncIterator]();
    const change = all.next();
    const ended = one.next();
    await watchersAt(store, 2);
    expect(await client.deleteSession({ sessionId: "d" })).toMatchObject({ lastSeq: 2n });
    const error = await failure(ended);
    expect(codeAndReason(error)).toEqual([Code.NotFound, "SESSION_DELETED"]);
    expect(JSON.parse(error.metadata.get(ERROR_DETAILS_HEADER)!)).toEqual({ reason: "SESSION_DELETED", sessionId: "d", lastSeq: 2 });
    expect((await change).value!.kind.value).toMatchObject({ sessionId: "d", lastSeq: 2n, firstSeq: 2n, type: "", deleted: true });
    expect(journalLines("d")).toEqual([]);
    expect(codeAndReason(await failure(client.getSnapshot({ sessionId: "d" })))).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
    // A later append starts a new session under the id, after the deleted one's seqs; the
    // all-sessions watcher sees it.
    expect((await client.appendEvent({ sessionId: "d", event: generate() })).seq).toBe(3n);
    expect((await all.next()).value!.kind.value).toMatchObject({ sessionId: "d", lastSeq: 3n, deleted: false });
    controller.abort();
  });

  it("with expected_seq only when it is the last seq (ABORTED SEQ_CONFLICT); a missing session is NOT_FOUND", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "d", event: generate() });
    const conflict = await failure(client.deleteSession({ sessionId: "d", expectedSeq: 3n }));
    expect(codeAndReason(conflict)).toEqual([Code.Aborted, "SEQ_CONFLICT"]);
    expect(conflict.findDetails(SeqConflictSchema)[0]).toMatchObject({ sessionId: "d", expectedSeq: 3n, currentSeq: 1n });
    expect(store.has("d")).toBe(true);
    expect(await client.deleteSession({ sessionId: "d", expectedSeq: 1n })).toMatchObject({ lastSeq: 1n });
    expect(codeAndReason(await failure(client.deleteSession({ sessionId: "d" })))).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
    expect(codeAndReason(await failure(client.deleteSession({ sessionId: "../d" })))).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
    expect((await failure(client.deleteSession({ sessionId: "d", expectedSeq: -1n }))).rawMessage).toMatch(/^expected_seq: must not be negative/);
  });
});
