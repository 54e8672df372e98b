import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";
import { StructSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, createRouterTransport, type Client } from "@connectrpc/connect";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import {
  EntryIntegrity,
  FenceRejectedSchema,
  SeqConflictSchema,
  SessionService,
  WatcherLaggedSchema,
  type WatchSessionResponse,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { createErrorInterceptor, ERROR_DETAILS_HEADER } from "@berth/shared/server/index";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { SessionStore, type SessionStoreOptions } from "../session-store.js";
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
  const store = new SessionStore({ dir: path.join(dir, "sessions"), clock, fsync: "none", ...options });
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
    expect(backlog.kind.case).toBe("entry");
    expect(backlog.kind.value).toMatchObject({ seq: 2n, type: "agent_phase", sessionId: "w" });
    expect(backlog.snapshot).toBeUndefined();
    const marker = (await it.next()).value as WatchSessionResponse;
    expect(marker.kind.case).toBe("caughtUp");
    if (marker.kind.case !== "caughtUp") throw new Error("unreachable");
    expect(marker.kind.value.lastSeq).toBe(2n);
    expect(marker.kind.value.snapshot?.generationPhase).toBe("planning");
    const appended = await client.appendEvent({ sessionId: "w", event: phase("writing") });
    const live = (await it.next()).value as WatchSessionResponse;
    expect(live.kind.case).toBe("entry");
    if (live.kind.case !== "entry") throw new Error("unreachable");
    expect(live.kind.value.seq).toBe(3n);
    expect(live.kind.value.event?.kind.case).toBe("agentPhase");
    expect(live.snapshot?.generationPhase).toBe("writing");
    expect(live.snapshot).toEqual(appended.snapshot);
    controller.abort();
    await expect(it.next()).rejects.toThrow();
  });

  it("with max_batch, live entries that piled up come several to a message, each with its snapshot, none lost", async () => {
    const store = openStore();
    const client = clientFor(store, {}, json);
    await client.appendEvent({ sessionId: "b", event: generate() });
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "b", includeSnapshot: true, maxBatch: 4 }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("entry");
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
      if (message.kind.case === "entry") {
        sizes.push(1);
        seen.push(message.kind.value.seq);
        expect(message.snapshot).toEqual(snapshots.get(message.kind.value.seq));
      } else if (message.kind.case === "batch") {
        sizes.push(message.kind.value.entries.length);
        expect(message.snapshot).toBeUndefined();
        for (const watched of message.kind.value.entries) {
          seen.push(watched.entry!.seq);
          expect(watched.entry!.sessionId).toBe("b");
          expect(watched.snapshot).toEqual(snapshots.get(watched.entry!.seq));
        }
      } else {
        throw new Error(`unexpected ${String(message.kind.case)}`);
      }
    }
    expect(seen).toEqual(Array.from({ length: 10 }, (_, i) => BigInt(i + 2)));
    expect(Math.max(...sizes)).toBe(4);
    expect(sizes.length).toBeLessThan(10);
    // Caught up again: the next live entry comes alone, as an entry.
    const next = await client.appendEvent({ sessionId: "b", event: phase("last") });
    const alone = (await it.next()).value as WatchSessionResponse;
    expect(alone.kind.case === "entry" && alone.kind.value.seq).toBe(next.seq);
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
    const watched: unknown[] = [];
    for (;;) {
      const message = (await it.next()).value as WatchSessionResponse;
      if (message.kind.case !== "entry") break;
      watched.push([message.kind.value.seq, message.kind.value.idempotencyKey, message.kind.value.integrity]);
    }
    expect(watched).toEqual(expected);
    await client.appendEvents({ sessionId: "k", events: [phase("f"), phase("g")], idempotencyKey: "live" });
    for (const seq of [7n, 8n]) {
      const live = (await it.next()).value as WatchSessionResponse;
      if (live.kind.case !== "entry") throw new Error("expected a live entry");
      expect([live.kind.value.seq, live.kind.value.idempotencyKey, live.kind.value.integrity]).toEqual([seq, "live", EntryIntegrity.VERIFIED]);
    }
    controller.abort();
    await expect(it.next()).rejects.toThrow();
  });
});

describe("AppendEvent", () => {
  it("refuses a stale expected_seq with FAILED_PRECONDITION and a SeqConflict detail, writing nothing", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "s", event: generate(), expectedSeq: 0n });
    await client.appendEvent({ sessionId: "s", event: phase("a"), expectedSeq: 1n });
    const error = await failure(client.appendEvent({ sessionId: "s", event: phase("b"), expectedSeq: 1n }));
    expect(error.code).toBe(Code.FailedPrecondition);
    expect(error.rawMessage).toMatch(/expected seq 1 but the session is at 2/);
    const [conflict] = error.findDetails(SeqConflictSchema);
    expect(conflict).toMatchObject({ sessionId: "s", expectedSeq: 1n, currentSeq: 2n });
    // The generic forms every BerthError has are still there.
    expect(error.findDetails(StructSchema)).toHaveLength(1);
    expect(JSON.parse(error.metadata.get(ERROR_DETAILS_HEADER)!)).toMatchObject({ currentSeq: 2 });
    expect(journalLines("s")).toHaveLength(2);
    // expected_seq 0 on an existing session is a conflict too.
    const fresh = await failure(client.appendEvent({ sessionId: "s", event: phase("c"), expectedSeq: 0n }));
    expect(fresh.findDetails(SeqConflictSchema)[0]).toMatchObject({ expectedSeq: 0n, currentSeq: 2n });
  });

  it("answers a retried idempotency key with the original result and writes nothing", async () => {
    const store = openStore();
    const client = clientFor(store);
    const first = await client.appendEvent({ sessionId: "s", event: generate(), idempotencyKey: "req-1" });
    await client.appendEvent({ sessionId: "s", event: phase("a") });
    const retry = await client.appendEvent({ sessionId: "s", event: generate(), idempotencyKey: "req-1" });
    expect(retry.duplicate).toBe(true);
    expect(retry.seq).toBe(first.seq);
    expect(retry.snapshot).toEqual(first.snapshot);
    expect(journalLines("s")).toHaveLength(2);
  });

  it("checks a fence right before sequencing and refuses a stale token with ABORTED and FenceRejected", async () => {
    const store = openStore();
    const calls: Array<[string, bigint]> = [];
    let current = 7n;
    // Shaped as the lock service's check (lock-handlers.ts makeFenceCheck): prepared with the
    // request, run right before sequencing.
    const fenceCheck: FenceCheck = (file, token) => () => {
      calls.push([file, token]);
      if (token === current) return;
      throw new BerthError("aborted", `fence rejected: token ${token} is stale`, { reason: "FENCE_REJECTED", file: `/abs${file}`, fencingToken: Number(token), currentToken: Number(current) });
    };
    const client = clientFor(store, { fenceCheck });
    const ok = await client.appendEvent({ sessionId: "s", event: generate(), fence: { file: "/p/src/a.css", fencingToken: 7n } });
    expect(ok.seq).toBe(1n);
    current = 8n;
    const error = await failure(client.appendEvent({ sessionId: "s", event: phase("x"), fence: { file: "/p/src/a.css", fencingToken: 7n } }));
    expect(error.code).toBe(Code.Aborted);
    expect(error.findDetails(FenceRejectedSchema)[0]).toMatchObject({ file: "/abs/p/src/a.css", fencingToken: 7n, currentToken: 8n });
    expect(calls).toEqual([
      ["/p/src/a.css", 7n],
      ["/p/src/a.css", 7n],
    ]);
    expect(journalLines("s")).toHaveLength(1);
    // A batch is fenced once, as a whole.
    const batch = await failure(client.appendEvents({ sessionId: "s", events: [phase("x"), phase("y")], fence: { file: "/p/src/a.css", fencingToken: 7n } }));
    expect(batch.code).toBe(Code.Aborted);
    expect(journalLines("s")).toHaveLength(1);
  });

  it("refuses a fence it cannot check, and a malformed fence, before anything is written", async () => {
    const store = openStore();
    const unchecked = clientFor(store);
    const error = await failure(unchecked.appendEvent({ sessionId: "s", event: generate(), fence: { file: "a", fencingToken: 1n } }));
    expect(error.code).toBe(Code.Unavailable);
    const client = clientFor(store, { fenceCheck: () => () => {} });
    const noToken = await failure(client.appendEvent({ sessionId: "s", event: generate(), fence: { file: "a", fencingToken: 0n } }));
    expect(noToken.code).toBe(Code.InvalidArgument);
    expect(noToken.rawMessage).toMatch(/^fence\.fencing_token: /);
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
    const cases: Array<[() => Promise<unknown>, Code, RegExp]> = [
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
      [() => client.appendEvent({ sessionId: "s", event: generate(), expectedSeq: 2n ** 60n }), Code.InvalidArgument, /^expected_seq: must be at most/],
      [
        () => client.appendEvent({ sessionId: "s", event: big(4000) }),
        Code.ResourceExhausted,
        /over the limit of 2048 bytes/,
      ],
    ];
    for (const [i, [call, code, message]] of cases.entries()) {
      const error = await failure(call()).catch((e: Error) => new ConnectError(`case ${i}: ${e.message}`));
      expect({ i, code: error.code, message: error.rawMessage }).toEqual({ i, code, message: expect.stringMatching(message) });
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
    const res = await client.appendEvents({ sessionId: "b", events: [phase("a"), phase("b"), phase("c")], expectedSeq: 1n, idempotencyKey: "batch-1" });
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
    expect(many.code).toBe(Code.ResourceExhausted);
    const conflict = await failure(client.appendEvents({ sessionId: "b", events: [phase("a")], expectedSeq: 5n }));
    expect(conflict.findDetails(SeqConflictSchema)[0]).toMatchObject({ sessionId: "b", expectedSeq: 5n, currentSeq: 0n });
    expect(store.has("b")).toBe(false);
  });
});

describe("reads", () => {
  it("GetSnapshot tells a missing session from a hidden completed one", async () => {
    const store = openStore();
    const client = clientFor(store);
    const none = await client.getSnapshot({ sessionId: "none" });
    expect(none).toMatchObject({ exists: false, lastSeq: 0n });
    expect(none.snapshot).toBeUndefined();
    expect(store.has("none")).toBe(false);
    await client.appendEvent({ sessionId: "done", event: generate() });
    await client.appendEvent({ sessionId: "done", event: complete() });
    const hidden = await client.getSnapshot({ sessionId: "done" });
    expect(hidden).toMatchObject({ exists: true, lastSeq: 2n });
    expect(hidden.snapshot).toBeUndefined();
    const shown = await client.getSnapshot({ sessionId: "done", includeCompleted: true });
    expect(shown.snapshot?.phase).toBe("completed");
    const bad = await failure(client.getSnapshot({ sessionId: "a b" }));
    expect(bad.code).toBe(Code.InvalidArgument);
  });

  it("ListSessions sorts by id and hides completed sessions unless asked; HasSession never creates", async () => {
    const store = openStore();
    const client = clientFor(store);
    for (const id of ["c", "a", "b"]) await client.appendEvent({ sessionId: id, event: generate() });
    await client.appendEvent({ sessionId: "b", event: complete() });
    expect((await client.listSessions({})).sessions.map((s) => s.id)).toEqual(["a", "c"]);
    expect((await client.listSessions({ includeCompleted: true })).sessions.map((s) => s.id)).toEqual(["a", "b", "c"]);
    expect(await client.hasSession({ sessionId: "a" })).toMatchObject({ exists: true });
    expect(await client.hasSession({ sessionId: "zz" })).toMatchObject({ exists: false });
    expect(store.has("zz")).toBe(false);
    expect((await failure(client.hasSession({ sessionId: "." }))).code).toBe(Code.InvalidArgument);
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
    expect(missing.code).toBe(Code.NotFound);
    expect(store.has("g")).toBe(false);
  });

  it("ReadJournal streams entries in bounded batches from a seq, up to a limit", async () => {
    const store = openStore();
    const client = clientFor(store, { readBatchEntries: 4 });
    await client.appendEvents({ sessionId: "r", events: Array.from({ length: 10 }, (_, i) => phase(`p${i}`)) });
    const all = await collect(client.readJournal({ sessionId: "r" }));
    expect(all.map((m) => m.entries.length)).toEqual([4, 4, 2]);
    expect(all.flatMap((m) => m.entries.map((e) => e.seq))).toEqual(Array.from({ length: 10 }, (_, i) => BigInt(i + 1)));
    const first = all[0]!.entries[0]!;
    expect(first).toMatchObject({ sessionId: "r", type: "agent_phase" });
    expect(first.ts?.seconds).toBe(BigInt(Date.UTC(2026, 0, 1) / 1000));
    const part = await collect(client.readJournal({ sessionId: "r", fromSeq: 3n, limit: 5 }));
    expect(part.flatMap((m) => m.entries.map((e) => Number(e.seq)))).toEqual([3, 4, 5, 6, 7]);
    expect(await collect(client.readJournal({ sessionId: "r", fromSeq: 11n }))).toEqual([]);
    const missing = await failure(collect(client.readJournal({ sessionId: "nope" })));
    expect(missing.code).toBe(Code.NotFound);
    const bad = await failure(collect(client.readJournal({ sessionId: "r", fromSeq: 2n ** 63n })));
    expect(bad.rawMessage).toMatch(/^from_seq: /);
  });

  it("ReadJournal closes a message once its events reach the byte bound", async () => {
    const store = openStore();
    const client = clientFor(store, { readBatchBytes: 1000 });
    await client.appendEvents({ sessionId: "r", events: Array.from({ length: 6 }, () => big(400)) });
    const batches = await collect(client.readJournal({ sessionId: "r" }));
    expect(batches.map((b) => b.entries.length)).toEqual([2, 2, 2]);
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
          if (message.kind.case === "entry") seen.push(message.kind.value.seq);
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
    expect(((await stream.next()).value as WatchSessionResponse).kind.case).toBe("entry");
    seen.push(1n);
    expect(((await stream.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    // Nobody reads while ten entries land: the watcher's buffer of three overflows.
    for (let i = 0; i < 10; i++) await client.appendEvent({ sessionId: "slow", event: phase(`p${i}`) });
    let error: ConnectError | undefined;
    for (;;) {
      try {
        const step = await stream.next();
        if (step.done) break;
        const message = step.value as WatchSessionResponse;
        if (message.kind.case === "entry") seen.push(message.kind.value.seq);
      } catch (e) {
        error = ConnectError.from(e);
        break;
      }
    }
    expect(error?.code).toBe(Code.ResourceExhausted);
    const [lag] = error!.findDetails(WatcherLaggedSchema);
    expect(lag?.sessionId).toBe("slow");
    expect(lag?.resumeFromSeq).toBe(seen[seen.length - 1]! + 1n);
    const controller = new AbortController();
    for await (const message of client.watchSession({ sessionId: "slow", fromSeq: lag!.resumeFromSeq }, { signal: controller.signal })) {
      if (message.kind.case === "entry") seen.push(message.kind.value.seq);
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
    const first = (await it.next()).value as WatchSessionResponse;
    expect(first.kind.value).toMatchObject({ seq: 1n });
    expect(first.snapshot?.phase).toBe("generate_requested");
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
    expect(error.code).toBe(Code.Unavailable);
    const other = openStore({ dir: path.join(dir, "other") });
    const bad = await failure(collect(clientFor(other).watchSession({ sessionId: "" })));
    expect(bad.rawMessage).toMatch(/^session_id: /);
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
    expect(current.kind.value.ts?.seconds).toBe(BigInt(Date.UTC(2026, 0, 1) / 1000));
    const marker = (await it.next()).value!;
    expect(marker.kind).toMatchObject({ case: "caughtUp", value: { sessions: 1 } });
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
    expect(error?.code).toBe(Code.ResourceExhausted);
    expect(error!.findDetails(WatcherLaggedSchema)[0]).toMatchObject({ sessionId: "", resumeFromSeq: 0n });
  });
});
