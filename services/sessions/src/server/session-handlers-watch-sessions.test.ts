import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs, StructSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, createRouterTransport, type Client } from "@connectrpc/connect";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import {
  EntryIntegrity,
  ExpectedState,
  FenceRejectedSchema,
  IdempotencyKeyReusedSchema,
  SeqConflictSchema,
  SessionService,
  WatcherLaggedSchema,
  type JournalEntry,
  type WatchedEntry,
  type WatchSessionResponse,
  type WatchSessionsResponse,
  type WatchSessionsRequestSchema,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { SnapshotSchema } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { runRevisionBase } from "@berth/shared/revision-history";
import { createErrorInterceptor, ERROR_DETAILS_HEADER } from "@berth/shared/server/index";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { type SessionStoreOptions, createSessionStore } from "../create-session-store.js";
import type { SessionStore } from "../session-store.js";
import { createSessionHandlers, type FenceCheck, type SessionHandlerOptions } from "./session-handlers.js";
import { snapshotToProto } from "./snapshot-codec.js";

let dir: string;
let clock: ManualClock;
const stores: SessionStore[] = [];

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-handlers-"));
  clock = new ManualClock(Date.UTC(2026, 0, 1));
});

afterEach(async () => {
  for (const store of stores.splice(0)) await store.close().catch(() => undefined);
  fs.rmSync(dir, { recursive: true, force: true });
});

function openStore(options: Partial<SessionStoreOptions> = {}): SessionStore {
  const store = createSessionStore({ dir: path.join(dir, "sessions"), clock, fsync: "none", ...options });
  stores.push(store);
  return store;
}

type SessionClient = Client<typeof SessionService>;

/**
 * Resolves once the store has `count` watchers: the server has subscribed the streams a test
 * opened. An append is durable within the same turn under fsync=none, so one made before the
 * server subscribed a watcher is, rightly, not live news to it.
 */
async function watchersAt(store: SessionStore, count: number): Promise<void> {
  for (let turn = 0; store.stats().watchers < count; turn++) {
    if (turn > 100_000) throw new Error(`the store never had ${count} watchers`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** A client over an in-memory transport; `json` switches the Connect protocol to JSON messages. */
function clientFor(store: SessionStore, options: Partial<SessionHandlerOptions> = {}, json = false): SessionClient {
  const transport = createRouterTransport((router) => router.service(SessionService, createSessionHandlers({ store, ...options })), {
    router: { interceptors: [createErrorInterceptor()] },
    transport: { useBinaryFormat: !json },
  });
  return createClient(SessionService, transport);
}

function event(init: MessageInitShape<typeof EventSchema>["kind"]): Event {
  return create(EventSchema, { kind: init });
}

const generate = (count = 3): Event => event({ case: "generate", value: { pageUrl: "http://localhost:3000/", count, token: "t-1" } });
const phase = (name: string): Event => event({ case: "agentPhase", value: { phase: name, durationMs: 10 } });
const complete = (): Event => event({ case: "complete", value: {} });
/** An event whose journal JSON is a little over `bytes` long. */
const big = (bytes: number): Event => event({ case: "steer", value: { pageUrl: "m".repeat(bytes) } });

/** Resolves once `condition` holds, looking once per turn of the event loop. */
async function until(condition: () => boolean): Promise<void> {
  for (let turn = 0; !condition(); turn++) {
    if (turn > 100_000) throw new Error("the condition never held");
    await new Promise((resolve) => setImmediate(resolve));
  }
}

/** The entries a WatchSession message carries (none for caught-up and progress messages). */
function watched(message: WatchSessionResponse): WatchedEntry[] {
  return message.kind.case === "entries" ? message.kind.value.entries : [];
}

function seqsOf(message: WatchSessionResponse): bigint[] {
  return watched(message).map((item) => item.entry!.seq);
}

/** The only entry of a WatchSession message that must hold exactly one. */
function onlyEntry(message: WatchSessionResponse): JournalEntry {
  const entries = watched(message);
  if (entries.length !== 1) throw new Error(`expected one entry, got a ${String(message.kind.case)} message with ${entries.length}`);
  return entries[0]!.entry!;
}

/** The code and ErrorInfo reason of an error; the domain must be this service's. */
function codeAndReason(error: ConnectError): [Code, string | undefined] {
  const [info] = error.findDetails(ErrorInfoSchema);
  expect(info?.domain).toBe("berth.sessions");
  return [error.code, info?.reason];
}

/** The ConnectError a call rejects with. */
async function failure(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("the call succeeded");
}

async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}

function journalLines(id: string): string[] {
  const file = path.join(dir, "sessions", `${id}.jsonl`);
  if (!fs.existsSync(file)) return [];
  return fs.readFileSync(file, "utf8").split("\n").filter(Boolean);
}

describe.each([
  ["binary", false],
  ["JSON", true],
])("SessionService over %s messages", (_name, json) => {
  it("appends events, answering each with its seq and the snapshot it produced", async () => {
    const store = openStore();
    const client = clientFor(store, {}, json);
    const first = await client.appendEvent({ sessionId: "s1", event: generate(2) });
    expect(first.seq).toBe(1n);
    expect(first.duplicate).toBe(false);
    expect(first.snapshot?.phase).toBe("generate_requested");
    expect(first.snapshot?.expectedVariants).toBe(2);
    const second = await client.appendEvent({ sessionId: "s1", event: phase("planning") });
    expect(second.seq).toBe(2n);
    expect(second.snapshot?.generationPhase).toBe("planning");
    // The response's snapshot is the store's, field for field.
    const view = store.getSnapshot("s1")!;
    expect(toBinary(SnapshotSchema, second.snapshot!)).toEqual(toBinary(SnapshotSchema, snapshotToProto(view.snapshot)));
  });

  it("watches a session: backlog, caught-up with the snapshot, then live entries with theirs", async () => {
    const store = openStore();
    const client = clientFor(store, {}, json);
    await client.appendEvent({ sessionId: "w", event: generate() });
    await client.appendEvent({ sessionId: "w", event: phase("planning") });
    const controller = new AbortController();
    const stream = client.watchSession({ sessionId: "w", fromSeq: 2n, includeSnapshot: true }, { signal: controller.signal });
    const it = stream[Symbol.asyncIterator]();
    const backlog = (await it.next()).value as WatchSessionResponse;
    expect(backlog.kind.case).toBe("entries");
    expect(watched(backlog)).toHaveLength(1);
    expect(watched(backlog)[0]!.entry).toMatchObject({ seq: 2n, type: "agent_phase", sessionId: "w" });
    expect(watched(backlog)[0]!.snapshot).toBeUndefined();
    const marker = (await it.next()).value as WatchSessionResponse;
    expect(marker.kind.case).toBe("caughtUp");
    if (marker.kind.case !== "caughtUp") throw new Error("unreachable");
    expect(marker.kind.value.lastSeq).toBe(2n);
    expect(marker.kind.value.snapshot?.generationPhase).toBe("planning");
    const appended = await client.appendEvent({ sessionId: "w", event: phase("writing") });
    const live = watched((await it.next()).value as WatchSessionResponse);
    expect(live).toHaveLength(1);
    expect(live[0]!.entry!.seq).toBe(3n);
    expect(live[0]!.entry!.event?.kind.case).toBe("agentPhase");
    expect(live[0]!.snapshot?.generationPhase).toBe("writing");
    expect(live[0]!.snapshot).toEqual(appended.snapshot);
    controller.abort();
    await expect(it.next()).rejects.toThrow();
  });

  it("with max_batch, live entries that piled up come several to a message, each with its snapshot, none lost", async () => {
    const store = openStore();
    const client = clientFor(store, {}, json);
    await client.appendEvent({ sessionId: "b", event: generate() });
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "b", includeSnapshot: true, maxBatch: 4 }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("entries");
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    // Ten entries land while nobody reads: they wait in the watcher's buffer.
    const snapshots = new Map<bigint, unknown>();
    for (let i = 0; i < 10; i++) {
      const appended = await client.appendEvent({ sessionId: "b", event: phase(`p${i}`) });
      snapshots.set(appended.seq, appended.snapshot);
    }
    const seen: bigint[] = [];
    const sizes: number[] = [];
    while (seen.length < 10) {
      const message = (await it.next()).value as WatchSessionResponse;
      if (message.kind.case !== "entries") throw new Error(`unexpected ${String(message.kind.case)}`);
      sizes.push(message.kind.value.entries.length);
      for (const item of message.kind.value.entries) {
        seen.push(item.entry!.seq);
        expect(item.entry!.sessionId).toBe("b");
        expect(item.snapshot).toEqual(snapshots.get(item.entry!.seq));
      }
    }
    expect(seen).toEqual(Array.from({ length: 10 }, (_, i) => BigInt(i + 2)));
    expect(Math.max(...sizes)).toBe(4);
    expect(sizes.length).toBeLessThan(10);
    // Caught up again: the next live entry comes alone.
    const next = await client.appendEvent({ sessionId: "b", event: phase("last") });
    expect(seqsOf((await it.next()).value as WatchSessionResponse)).toEqual([next.seq]);
    controller.abort();
  });

  it("entries carry the key they were appended with and their checksum verdict, read or watched", async () => {
    // A line the seed's library wrote: no checksum, so nothing can be verified about it.
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    const seedLine = { seq: 1, id: "k", type: "generate", ts: "2026-01-01T00:00:00.000Z", event: { type: "generate", id: "k", count: 1 } };
    fs.writeFileSync(path.join(dir, "sessions", "k.jsonl"), `${JSON.stringify(seedLine)}\n`);
    const store = openStore();
    const client = clientFor(store, {}, json);
    await client.appendEvents({ sessionId: "k", events: [phase("a"), phase("b"), phase("c")], idempotencyKey: "batch-1" });
    await client.appendEvent({ sessionId: "k", event: phase("d"), idempotencyKey: "one" });
    await client.appendEvent({ sessionId: "k", event: phase("e") });
    const expected = [
      [1n, "", EntryIntegrity.UNCHECKED],
      [2n, "batch-1", EntryIntegrity.VERIFIED],
      [3n, "batch-1", EntryIntegrity.VERIFIED],
      [4n, "batch-1", EntryIntegrity.VERIFIED],
      [5n, "one", EntryIntegrity.VERIFIED],
      [6n, "", EntryIntegrity.VERIFIED],
    ];
    const read = (await collect(client.readJournal({ sessionId: "k" }))).flatMap((m) => m.entries);
    expect(read.map((e) => [e.seq, e.idempotencyKey, e.integrity])).toEqual(expected);
    // From the middle of the keyed batch, too.
    const middle = (await collect(client.readJournal({ sessionId: "k", fromSeq: 3n, limit: 1 }))).flatMap((m) => m.entries);
    expect(middle.map((e) => [e.seq, e.idempotencyKey, e.integrity])).toEqual([expected[2]]);

    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "k", fromSeq: 1n }, { signal: controller.signal })[Symbol.asyncIterator]();
    const backlog: unknown[] = [];
    for (;;) {
      const message = (await it.next()).value as WatchSessionResponse;
      if (message.kind.case !== "entries") break;
      for (const { entry } of message.kind.value.entries) backlog.push([entry!.seq, entry!.idempotencyKey, entry!.integrity]);
    }
    expect(backlog).toEqual(expected);
    await client.appendEvents({ sessionId: "k", events: [phase("f"), phase("g")], idempotencyKey: "live" });
    for (const seq of [7n, 8n]) {
      const live = onlyEntry((await it.next()).value as WatchSessionResponse);
      expect([live.seq, live.idempotencyKey, live.integrity]).toEqual([seq, "live", EntryIntegrity.VERIFIED]);
    }
    controller.abort();
    await expect(it.next()).rejects.toThrow();
  });
});

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

describe("reads", () => {
  it("GetSnapshot answers every existing session, completed ones too; a missing one is NOT_FOUND SESSION_NOT_FOUND", async () => {
    const store = openStore();
    const client = clientFor(store);
    const none = await failure(client.getSnapshot({ sessionId: "none" }));
    expect(codeAndReason(none)).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
    expect(JSON.parse(none.metadata.get(ERROR_DETAILS_HEADER)!)).toEqual({ reason: "SESSION_NOT_FOUND", sessionId: "none" });
    expect(store.has("none")).toBe(false);
    await client.appendEvent({ sessionId: "done", event: generate() });
    await client.appendEvent({ sessionId: "done", event: complete() });
    const shown = await client.getSnapshot({ sessionId: "done" });
    expect(shown.lastSeq).toBe(2n);
    expect(shown.snapshot?.phase).toBe("completed");
    const bad = await failure(client.getSnapshot({ sessionId: "a b" }));
    expect(codeAndReason(bad)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
  });

  it("ListSessions sorts by id and hides completed sessions unless asked", async () => {
    const store = openStore();
    const client = clientFor(store);
    for (const id of ["c", "a", "b"]) await client.appendEvent({ sessionId: id, event: generate() });
    await client.appendEvent({ sessionId: "b", event: complete() });
    expect(await client.listSessions({})).toMatchObject({ sessions: [{ id: "a" }, { id: "c" }], nextPageToken: "" });
    expect((await client.listSessions({ includeCompleted: true })).sessions.map((s) => s.id)).toEqual(["a", "b", "c"]);
  });

  it("ListSessions pages by id: every session once, whatever is created or deleted meanwhile", async () => {
    const store = openStore();
    const client = clientFor(store);
    for (let i = 0; i < 10; i++) await client.appendEvent({ sessionId: `s${i}`, event: generate() });
    await client.appendEvent({ sessionId: "s4", event: complete() });
    const first = await client.listSessions({ pageSize: 3 });
    expect(first.sessions.map((s) => s.id)).toEqual(["s0", "s1", "s2"]);
    expect(first.nextPageToken).toMatch(/^[A-Za-z0-9_-]+$/);
    // Created before the page token's id: not in a later page; after it: in one. Deleted: gone.
    await client.appendEvent({ sessionId: "r", event: generate() });
    await client.appendEvent({ sessionId: "s35", event: generate() });
    await client.deleteSession({ sessionId: "s5" });
    const ids: string[] = first.sessions.map((s) => s.id);
    let token = first.nextPageToken;
    while (token !== "") {
      const page = await client.listSessions({ pageSize: 3, pageToken: token });
      expect(page.sessions.length).toBeGreaterThan(0);
      ids.push(...page.sessions.map((s) => s.id));
      token = page.nextPageToken;
    }
    expect(ids).toEqual(["s0", "s1", "s2", "s3", "s35", "s6", "s7", "s8", "s9"]);
    // The last page says so, even when it is full.
    expect((await client.listSessions({ pageSize: 9 })).nextPageToken).not.toBe("");
    expect((await client.listSessions({ pageSize: 10 })).nextPageToken).toBe("");
    expect((await client.listSessions({ pageSize: 5000 })).sessions).toHaveLength(10);
    // A token belongs to its include_completed; anything else is no token.
    for (const [request, message] of [
      [{ pageToken: first.nextPageToken, includeCompleted: true }, /^page_token: was given for include_completed=false/],
      [{ pageToken: "bm90IGEgdG9rZW4" }, /^page_token: is not a token/],
      [{ pageToken: "%%%" }, /^page_token: is not a token/],
      [{ pageSize: -1 }, /^page_size: /],
    ] as const) {
      const error = await failure(client.listSessions(request));
      expect(codeAndReason(error)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
      expect(error.rawMessage).toMatch(message);
    }
  });

  it("FlushSnapshot writes the snapshot file; NOT_FOUND without a journal", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "f", event: generate() });
    const flushed = await client.flushSnapshot({ sessionId: "f" });
    expect(flushed.lastSeq).toBe(1n);
    expect(flushed.snapshot?.phase).toBe("generate_requested");
    const file = JSON.parse(fs.readFileSync(path.join(dir, "sessions", "f.snapshot.json"), "utf8")) as Record<string, unknown>;
    expect(file.__nextSeq).toBe(2);
    const missing = await failure(client.flushSnapshot({ sessionId: "g" }));
    expect(codeAndReason(missing)).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
    expect(store.has("g")).toBe(false);
  });

  it("ReadJournal streams entries in bounded batches from a seq, up to a limit, and says where it ended", async () => {
    const store = openStore();
    const client = clientFor(store, { readBatchEntries: 4 });
    await client.appendEvents({ sessionId: "r", events: Array.from({ length: 10 }, (_, i) => phase(`p${i}`)) });
    const all = await collect(client.readJournal({ sessionId: "r" }));
    expect(all.map((m) => m.entries.length)).toEqual([4, 4, 2]);
    expect(all.map((m) => m.end)).toEqual([undefined, undefined, expect.objectContaining({ lastSeq: 10n, nextSeq: 11n, more: false })]);
    expect(all.flatMap((m) => m.entries.map((e) => e.seq))).toEqual(Array.from({ length: 10 }, (_, i) => BigInt(i + 1)));
    const first = all[0]!.entries[0]!;
    expect(first).toMatchObject({ sessionId: "r", type: "agent_phase" });
    expect(first.appendTime?.seconds).toBe(BigInt(Date.UTC(2026, 0, 1) / 1000));
    const part = await collect(client.readJournal({ sessionId: "r", fromSeq: 3n, limit: 5 }));
    expect(part.flatMap((m) => m.entries.map((e) => Number(e.seq)))).toEqual([3, 4, 5, 6, 7]);
    expect(part.at(-1)!.end).toMatchObject({ lastSeq: 10n, nextSeq: 8n, more: true });
    // A limit that reaches the end exactly: nothing more.
    expect((await collect(client.readJournal({ sessionId: "r", fromSeq: 8n, limit: 3 }))).at(-1)!.end).toMatchObject({ nextSeq: 11n, more: false });
    // last_seq + 1 is an empty read that ends at once; beyond is OUT_OF_RANGE.
    const empty = await collect(client.readJournal({ sessionId: "r", fromSeq: 11n }));
    expect(empty).toHaveLength(1);
    expect(empty[0]).toMatchObject({ entries: [], end: { lastSeq: 10n, nextSeq: 11n, more: false } });
    const past = await failure(collect(client.readJournal({ sessionId: "r", fromSeq: 12n })));
    expect(codeAndReason(past)).toEqual([Code.OutOfRange, "SEQ_OUT_OF_RANGE"]);
    expect(past.rawMessage).toMatch(/^from_seq: 12 is past the end of session r, whose last seq is 10/);
    const missing = await failure(collect(client.readJournal({ sessionId: "nope" })));
    expect(codeAndReason(missing)).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
    for (const [request, message] of [
      [{ sessionId: "r", fromSeq: 2n ** 63n - 1n }, /^from_seq: must be at most/],
      [{ sessionId: "r", fromSeq: -1n }, /^from_seq: must not be negative/],
      [{ sessionId: "r", limit: -1 }, /^limit: /],
    ] as const) {
      const bad = await failure(collect(client.readJournal(request)));
      expect(codeAndReason(bad)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
      expect(bad.rawMessage).toMatch(message);
    }
  });

  it("ReadJournal closes a message once its events reach the byte bound", async () => {
    const store = openStore();
    const client = clientFor(store, { readBatchBytes: 1000 });
    await client.appendEvents({ sessionId: "r", events: Array.from({ length: 6 }, () => big(400)) });
    const batches = await collect(client.readJournal({ sessionId: "r" }));
    expect(batches.map((b) => b.entries.length)).toEqual([2, 2, 2, 0]);
    expect(batches.at(-1)!.end).toMatchObject({ lastSeq: 6n, nextSeq: 7n });
  });
});

describe("WatchSession", () => {
  it("misses nothing across appends racing the switch from backlog to live", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvents({ sessionId: "race", events: Array.from({ length: 50 }, (_, i) => phase(`b${i}`)) });
    const controller = new AbortController();
    const seen: bigint[] = [];
    let caughtUpAt = -1;
    const watching = (async () => {
      try {
        for await (const message of client.watchSession({ sessionId: "race" }, { signal: controller.signal })) {
          if (message.kind.case === "caughtUp") caughtUpAt = seen.length;
          seen.push(...seqsOf(message));
          if (seen.length === 100) return;
        }
      } catch (error) {
        if (!controller.signal.aborted) throw error;
      }
    })();
    await watchersAt(store, 1);
    const appends = Array.from({ length: 50 }, (_, i) => client.appendEvent({ sessionId: "race", event: phase(`l${i}`) }));
    await Promise.all(appends);
    await watching;
    controller.abort();
    expect(seen).toEqual(Array.from({ length: 100 }, (_, i) => BigInt(i + 1)));
    expect(caughtUpAt).toBeGreaterThanOrEqual(50);
  });

  it("ends a watcher that falls behind with RESOURCE_EXHAUSTED and WatcherLagged; a resume misses nothing", async () => {
    const store = openStore({ maxBuffered: 3 });
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "slow", event: generate() });
    const seen: bigint[] = [];
    const stream = client.watchSession({ sessionId: "slow" })[Symbol.asyncIterator]();
    expect(seqsOf((await stream.next()).value as WatchSessionResponse)).toEqual([1n]);
    seen.push(1n);
    expect(((await stream.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    // Nobody reads while ten entries land: the watcher's buffer of three overflows.
    for (let i = 0; i < 10; i++) await client.appendEvent({ sessionId: "slow", event: phase(`p${i}`) });
    let error: ConnectError | undefined;
    for (;;) {
      try {
        const step = await stream.next();
        if (step.done) break;
        seen.push(...seqsOf(step.value as WatchSessionResponse));
      } catch (e) {
        error = ConnectError.from(e);
        break;
      }
    }
    expect(codeAndReason(error!)).toEqual([Code.ResourceExhausted, "WATCHER_LAGGED"]);
    const [lag] = error!.findDetails(WatcherLaggedSchema);
    expect(lag?.sessionId).toBe("slow");
    expect(lag?.resumeFromSeq).toBe(seen[seen.length - 1]! + 1n);
    const controller = new AbortController();
    for await (const message of client.watchSession({ sessionId: "slow", fromSeq: lag!.resumeFromSeq }, { signal: controller.signal })) {
      seen.push(...seqsOf(message));
      if (message.kind.case === "caughtUp") break;
    }
    controller.abort();
    expect(seen).toEqual(Array.from({ length: 11 }, (_, i) => BigInt(i + 1)));
  });

  it("watches a session that has no journal yet from its first append", async () => {
    const store = openStore();
    const client = clientFor(store);
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "later", includeSnapshot: true }, { signal: controller.signal })[Symbol.asyncIterator]();
    const marker = (await it.next()).value as WatchSessionResponse;
    expect(marker.kind.case).toBe("caughtUp");
    if (marker.kind.case !== "caughtUp") throw new Error("unreachable");
    expect(marker.kind.value.lastSeq).toBe(0n);
    expect(marker.kind.value.snapshot).toBeUndefined();
    expect(store.has("later")).toBe(false);
    await client.appendEvent({ sessionId: "later", event: generate() });
    const [first] = watched((await it.next()).value as WatchSessionResponse);
    expect(first?.entry).toMatchObject({ seq: 1n });
    expect(first?.snapshot?.phase).toBe("generate_requested");
    controller.abort();
    expect(store.stats().watchers).toBeLessThanOrEqual(1);
    await expect(it.next()).rejects.toThrow();
  });

  it("ends with UNAVAILABLE when the store closes, and validates its request", async () => {
    const store = openStore();
    const client = clientFor(store);
    const it = client.watchSession({ sessionId: "x" })[Symbol.asyncIterator]();
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    const ended = it.next();
    await store.close();
    const error = await failure(ended);
    expect(codeAndReason(error)).toEqual([Code.Unavailable, "SHUTTING_DOWN"]);
    expect(error.findDetails(RetryInfoSchema)).toHaveLength(1);
    const other = clientFor(openStore({ dir: path.join(dir, "other") }));
    for (const [request, message] of [
      [{ sessionId: "" }, /^session_id: /],
      [{ sessionId: "x", fromSeq: -1n }, /^from_seq: /],
      [{ sessionId: "x", maxBatch: -1 }, /^max_batch: /],
      [{ sessionId: "x", progressInterval: durationFromMs(99) }, /^progress_interval: must be unset, zero or at least 100ms/],
      [{ sessionId: "x", progressInterval: durationFromMs(-5) }, /^progress_interval: /],
    ] as const) {
      const bad = await failure(collect(other.watchSession(request)));
      expect(codeAndReason(bad)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
      expect(bad.rawMessage).toMatch(message);
    }
  });
});

describe("WatchSessions", () => {
  it("describes the current sessions, marks the end, then sends every change", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvents({ sessionId: "a", events: [generate(), phase("x")] });
    await client.appendEvent({ sessionId: "done", event: complete() });
    const controller = new AbortController();
    const it = client.watchSessions({ includeCurrent: true, includeSnapshot: true }, { signal: controller.signal })[Symbol.asyncIterator]();
    const current = (await it.next()).value!;
    expect(current.kind.case).toBe("change");
    expect(current.kind.value).toMatchObject({ sessionId: "a", lastSeq: 2n, firstSeq: 2n, type: "agent_phase" });
    if (current.kind.case !== "change") throw new Error("unreachable");
    expect(current.kind.value.snapshot?.generationPhase).toBe("x");
    expect(current.kind.value.appendTime?.seconds).toBe(BigInt(Date.UTC(2026, 0, 1) / 1000));
    const marker = (await it.next()).value!;
    expect(marker.kind).toMatchObject({ case: "caughtUp", value: { sessions: 1, deleted: [] } });
    await client.appendEvent({ sessionId: "done", event: phase("revived") });
    const live = (await it.next()).value!;
    expect(live.kind.value).toMatchObject({ sessionId: "done", lastSeq: 2n, firstSeq: 2n, type: "agent_phase" });
    // An AppendEvents is one change, first..last, with the snapshot after its last event.
    await client.appendEvents({ sessionId: "a", events: [phase("y"), complete(), phase("z")] });
    const batch = (await it.next()).value!;
    expect(batch.kind.value).toMatchObject({ sessionId: "a", firstSeq: 3n, lastSeq: 5n, type: "agent_phase" });
    if (batch.kind.case !== "change") throw new Error("unreachable");
    expect(batch.kind.value.snapshot?.generationPhase).toBe("z");
    await client.appendEvent({ sessionId: "a", event: phase("after") });
    expect((await it.next()).value!.kind.value).toMatchObject({ sessionId: "a", firstSeq: 6n, lastSeq: 6n });
    controller.abort();
  });

  it("sends the change of a line another process wrote with a type that is no string, as an empty type", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "odd", event: generate() });
    const controller = new AbortController();
    const it = client.watchSessions({}, { signal: controller.signal })[Symbol.asyncIterator]();
    // One change of our own first: once it is here, the watch is live.
    const ours = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "odd", event: phase("ours") });
    expect((await ours).value!.kind.value).toMatchObject({ sessionId: "odd", lastSeq: 2n, type: "agent_phase" });
    const line = { seq: 3, id: "odd", type: { toString: 0 }, ts: "2026-01-01T00:00:01.000Z", event: { type: "agent_phase", phase: { toString: 0 } } };
    fs.appendFileSync(path.join(dir, "sessions", "odd.jsonl"), `${JSON.stringify(line)}\n`);
    expect((await it.next()).value!.kind.value).toMatchObject({ sessionId: "odd", firstSeq: 3n, lastSeq: 3n, type: "" });
    controller.abort();
  });

  it("without include_current sends only new changes, and ends a lagging watcher with WatcherLagged", async () => {
    const store = openStore({ maxBuffered: 2 });
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "old", event: generate() });
    const it = client.watchSessions({})[Symbol.asyncIterator]();
    const first = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "new", event: generate() });
    expect((await first).value!.kind.value).toMatchObject({ sessionId: "new", lastSeq: 1n });
    for (let i = 0; i < 5; i++) await client.appendEvent({ sessionId: "new", event: phase(`p${i}`) });
    let error: ConnectError | undefined;
    try {
      for (;;) if ((await it.next()).done) break;
    } catch (e) {
      error = ConnectError.from(e);
    }
    expect(codeAndReason(error!)).toEqual([Code.ResourceExhausted, "WATCHER_LAGGED"]);
    expect(error!.findDetails(WatcherLaggedSchema)[0]).toMatchObject({ sessionId: "", resumeFromSeq: 0n });
  });
});

describe("WatchSession shape and progress", () => {
  it("sends the backlog up to 100 entries a message, then caught_up", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvents({ sessionId: "long", events: Array.from({ length: 250 }, (_, i) => phase(`p${i}`)) });
    const controller = new AbortController();
    const sizes: number[] = [];
    for await (const message of client.watchSession({ sessionId: "long", fromSeq: 3n }, { signal: controller.signal })) {
      if (message.kind.case === "caughtUp") break;
      sizes.push(watched(message).length);
    }
    controller.abort();
    expect(sizes).toEqual([100, 100, 48]);
  });

  it("sends progress with the last seq sent whenever the interval passes without a message once caught up", async () => {
    const store = openStore();
    const ticks = new ManualClock(Date.UTC(2026, 5, 1));
    const client = clientFor(store, { clock: ticks });
    await client.appendEvent({ sessionId: "idle", event: generate() });
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "idle", progressInterval: durationFromMs(1000) }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(seqsOf((await it.next()).value as WatchSessionResponse)).toEqual([1n]);
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    const pending = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(999);
    ticks.advance(1);
    const progress = (await pending).value as WatchSessionResponse;
    expect(progress.kind).toMatchObject({ case: "progress", value: { lastSeq: 1n, sendTime: { seconds: BigInt(Date.UTC(2026, 5, 1, 0, 0, 1) / 1000) } } });
    // Another interval, another progress; an entry resets the interval and moves last_seq.
    const second = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(1000);
    expect(((await second).value as WatchSessionResponse).kind.case).toBe("progress");
    const live = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(600);
    await client.appendEvent({ sessionId: "idle", event: phase("a") });
    expect(seqsOf((await live).value as WatchSessionResponse)).toEqual([2n]);
    expect(ticks.pendingTimers()).toBe(0);
    const third = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(1000);
    expect(((await third).value as WatchSessionResponse).kind).toMatchObject({ case: "progress", value: { lastSeq: 2n } });
    controller.abort();
    await expect(it.next()).rejects.toThrow();
    expect(ticks.pendingTimers()).toBe(0);
  });

  it("without a progress interval, an idle watch sets no timer", async () => {
    const store = openStore();
    const ticks = new ManualClock();
    const client = clientFor(store, { clock: ticks });
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "quiet" }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    const pending = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "quiet", event: generate() });
    expect(seqsOf((await pending).value as WatchSessionResponse)).toEqual([1n]);
    expect(ticks.pendingTimers()).toBe(0);
    controller.abort();
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

describe("WatchSessions resumed", () => {
  it("describes only the sessions that moved since resume_from, and names the deleted ones", async () => {
    const store = openStore();
    const client = clientFor(store);
    for (const id of ["same", "moved", "gone", "done"]) await client.appendEvent({ sessionId: id, event: generate() });
    const known = { same: 1n, moved: 1n, gone: 1n, done: 1n, never: 4n };
    // While the watcher was away:
    await client.appendEvent({ sessionId: "moved", event: phase("a") });
    await client.appendEvent({ sessionId: "done", event: complete() });
    await client.deleteSession({ sessionId: "gone" });
    await client.appendEvent({ sessionId: "fresh", event: generate() });
    await client.appendEvents({ sessionId: "finished", events: [generate(), complete()] });
    /** The sessions described before caught_up, and caught_up. */
    const resume = async (request: MessageInitShape<typeof WatchSessionsRequestSchema>) => {
      const controller = new AbortController();
      const described: Array<[string, bigint]> = [];
      try {
        for await (const message of client.watchSessions(request, { signal: controller.signal })) {
          if (message.kind.case === "change") described.push([message.kind.value.sessionId, message.kind.value.lastSeq]);
          if (message.kind.case === "caughtUp") return { described, caughtUp: message.kind.value };
        }
      } finally {
        controller.abort();
      }
      throw new Error("the watch ended before caught_up");
    };
    // "done" is described though completed (the watcher knew it); "finished" is not (it did not).
    const resumed = await resume({ resumeFrom: known });
    expect(resumed.described).toEqual([
      ["done", 2n],
      ["fresh", 1n],
      ["moved", 2n],
    ]);
    expect(resumed.caughtUp).toMatchObject({ sessions: 3, deleted: ["gone", "never"] });
    const withCompleted = await resume({ resumeFrom: known, includeCompleted: true });
    expect(withCompleted.described.map(([id]) => id)).toEqual(["done", "finished", "fresh", "moved"]);
    const bad = await failure(collect(client.watchSessions({ resumeFrom: { "a b": 1n } })));
    expect(bad.rawMessage).toMatch(/^resume_from: /);
    const negative = await failure(collect(client.watchSessions({ resumeFrom: { a: -1n } })));
    expect(negative.rawMessage).toMatch(/^resume_from\[a\]: must not be negative/);
  });

  it("sends progress on an idle watch of every session", async () => {
    const store = openStore();
    const ticks = new ManualClock(Date.UTC(2026, 5, 1));
    const client = clientFor(store, { clock: ticks });
    const controller = new AbortController();
    const it = client.watchSessions({ includeCurrent: true, progressInterval: durationFromMs(250) }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect((await it.next()).value!.kind).toMatchObject({ case: "caughtUp", value: { sessions: 0 } });
    const pending = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(250);
    expect((await pending).value!.kind).toMatchObject({ case: "progress", value: { lastSeq: 0n } });
    controller.abort();
  });
});

describe("WatchSessions by revision", () => {
  type Message = WatchSessionsResponse;
  /** Revisions are shown as above the run's base (the store's clock's time). */
  const base = () => BigInt(runRevisionBase(clock));
  /** A message in short: change session@lastSeq#revision (x: deleted), caught_up#revision (reset), progress#revision. */
  const brief = (message: Message): string => {
    switch (message.kind.case) {
      case "change":
        return `${message.kind.value.sessionId}@${message.kind.value.lastSeq}${message.kind.value.deleted ? "x" : ""}#${message.kind.value.revision - base()}`;
      case "caughtUp":
        return `caught_up#${message.kind.value.revision - base()}${message.kind.value.reset ? " reset" : ""}`;
      case "progress":
        return `progress#${message.kind.value.revision - base()}`;
      default:
        return "?";
    }
  };
  const take = async (it: AsyncIterator<Message>, n: number): Promise<string[]> => {
    const got: string[] = [];
    for (let i = 0; i < n; i++) got.push(brief((await it.next()).value!));
    return got;
  };

  it("numbers every change; a watcher resumed with start_revision gets exactly what it missed, a deletion included, then caught_up at the current revision", async () => {
    const store = openStore();
    const client = clientFor(store);
    const first = new AbortController();
    const it = client.watchSessions({}, { signal: first.signal })[Symbol.asyncIterator]();
    const pending = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "a", event: generate() });
    await client.appendEvents({ sessionId: "b", events: [generate(), phase("x")] });
    expect([brief((await pending).value!), ...(await take(it, 1))]).toEqual(["a@1#1", "b@2#2"]);
    first.abort();
    // Away: a deletion and two appends.
    await client.deleteSession({ sessionId: "a" });
    await client.appendEvent({ sessionId: "b", event: phase("y") });
    await client.appendEvent({ sessionId: "a", event: generate() });
    const again = new AbortController();
    const resumed = client.watchSessions({ startRevision: base() + 2n, includeCurrent: true }, { signal: again.signal })[Symbol.asyncIterator]();
    expect(await take(resumed, 4)).toEqual(["a@1x#3", "b@3#4", "a@2#5", "caught_up#5"]);
    await client.appendEvent({ sessionId: "b", event: phase("z") });
    expect(await take(resumed, 1)).toEqual(["b@4#6"]);
    again.abort();
  });

  it("answers a start revision it cannot replay (of an earlier run, or ahead) with the current state and caught_up reset", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "a", event: generate() });
    await client.appendEvents({ sessionId: "b", events: [generate(), complete()] });
    for (const startRevision of [5n, base() - 1n, base() + 200n]) {
      const controller = new AbortController();
      const it = client.watchSessions({ startRevision }, { signal: controller.signal })[Symbol.asyncIterator]();
      // As include_current: the completed session only with include_completed.
      expect(await take(it, 2)).toEqual(["a@1#2", "caught_up#2 reset"]);
      controller.abort();
    }
    const controller = new AbortController();
    const it = client.watchSessions({ startRevision: 1n, includeCompleted: true }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(await take(it, 3)).toEqual(["a@1#2", "b@2#2", "caught_up#2 reset"]);
    controller.abort();
  });

  it("ends a lagging watcher with the revision to resume from, and a resume from it misses nothing", async () => {
    const store = openStore({ maxBuffered: 2 });
    const client = clientFor(store);
    const it = client.watchSessions({})[Symbol.asyncIterator]();
    const first = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "s", event: generate() });
    expect(brief((await first).value!)).toBe("s@1#1");
    for (let i = 0; i < 5; i++) await client.appendEvent({ sessionId: "s", event: phase(`p${i}`) });
    let error: ConnectError | undefined;
    try {
      for (;;) if ((await it.next()).done) break;
    } catch (e) {
      error = ConnectError.from(e);
    }
    expect(codeAndReason(error!)).toEqual([Code.ResourceExhausted, "WATCHER_LAGGED"]);
    const detail = error!.findDetails(WatcherLaggedSchema)[0]!;
    expect(detail).toMatchObject({ sessionId: "", resumeFromSeq: 0n });
    const controller = new AbortController();
    const resumed = client.watchSessions({ startRevision: detail.resumeFromRevision }, { signal: controller.signal })[Symbol.asyncIterator]();
    const expected = Array.from({ length: 6 }, (_, i) => i + 1).filter((seq) => BigInt(seq) > detail.resumeFromRevision - base());
    expect(await take(resumed, expected.length + 1)).toEqual([...expected.map((seq) => `s@${seq}#${seq}`), "caught_up#6"]);
    controller.abort();
  });

  it("sends progress carrying the revision the watcher is up to", async () => {
    const store = openStore();
    const ticks = new ManualClock(Date.UTC(2026, 5, 1));
    const client = clientFor(store, { clock: ticks });
    await client.appendEvent({ sessionId: "a", event: generate() });
    const controller = new AbortController();
    const it = client.watchSessions({ includeCurrent: true, progressInterval: durationFromMs(250) }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(await take(it, 2)).toEqual(["a@1#1", "caught_up#1"]);
    await client.appendEvent({ sessionId: "a", event: phase("x") });
    expect(await take(it, 1)).toEqual(["a@2#2"]);
    const pending = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(250);
    expect(brief((await pending).value!)).toBe("progress#2");
    controller.abort();
  });

  it("refuses a negative start_revision naming it", async () => {
    const client = clientFor(openStore());
    const negative = await failure(collect(client.watchSessions({ startRevision: -1n })));
    expect(codeAndReason(negative)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
    expect(negative.rawMessage).toMatch(/^start_revision: must not be negative/);
  });

  it("with resume_from too: replays when it can, and on a reset describes only what moved since resume_from", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "still", event: generate() });
    await client.appendEvent({ sessionId: "moved", event: generate() });
    await client.appendEvent({ sessionId: "gone", event: generate() });
    await client.appendEvent({ sessionId: "moved", event: phase("x") });
    await client.deleteSession({ sessionId: "gone" });
    const known = { still: 1n, moved: 1n, gone: 1n };
    const replay = new AbortController();
    const replayed = client.watchSessions({ startRevision: base() + 3n, resumeFrom: known }, { signal: replay.signal })[Symbol.asyncIterator]();
    expect(await take(replayed, 3)).toEqual(["moved@2#4", "gone@1x#5", "caught_up#5"]);
    replay.abort();
    const reset = new AbortController();
    const described = client.watchSessions({ startRevision: 1n, resumeFrom: known }, { signal: reset.signal })[Symbol.asyncIterator]();
    expect(await take(described, 1)).toEqual(["moved@2#5"]);
    const marker = (await described.next()).value!;
    expect(marker.kind).toMatchObject({ case: "caughtUp", value: { sessions: 1, deleted: ["gone"], reset: true } });
    reset.abort();
  });
});

describe("GetLimits", () => {
  it("reports the limits the service enforces", async () => {
    const store = openStore({ maxEventBytes: 4096, maxEventsPerAppend: 7, maxBuffered: 11, completedRetentionMs: 90_000 });
    const limits = await clientFor(store, { maxMessageBytes: 65536 }).getLimits({});
    expect(limits).toMatchObject({
      maxEventBytes: 4096n,
      maxEventsPerAppend: 7,
      maxMessageBytes: 65536n,
      watchBuffer: 11,
      maxIdempotencyKeyLength: 128,
      maxPageSize: 1000,
      completedRetention: { seconds: 90n, nanos: 0 },
    });
    expect((await clientFor(openStore({ dir: path.join(dir, "other") })).getLimits({})).completedRetention).toBeUndefined();
  });
});
