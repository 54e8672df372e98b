/**
 * Every streaming RPC of SessionService and LockService, and the appends whose snapshot is sent
 * pre-encoded to binary calls, give the same messages over every wire protocol: gRPC, gRPC-JSON,
 * Connect and Connect JSON, gRPC-Web JSON. gRPC with protobuf binary is the reference; each other
 * protocol's messages, decoded by its client, must equal it field for field.
 *
 * The watchers of the reference and of the protocol under test watch the same appends, at the
 * same time; each protocol appends to and locks its own session and file (their names, lease
 * tokens aside, are the only differences allowed). One server on loopback, a manual clock.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { create, toJson, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { createClient, type Client } from "@connectrpc/connect";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { HoldResponseSchema, KeepAliveStreamResponseSchema, LockEventKind, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import {
  AppendEventResponseSchema,
  AppendEventsResponseSchema,
  ReadJournalResponseSchema,
  SessionService,
  WatchSessionResponseSchema,
  WatchSessionsResponseSchema,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { ManualClock } from "@berth/shared/clock";
import { implement, startServer, type RunningServer } from "@berth/shared/server/index";
import { WIRE_PROTOCOLS, connectOver, type WireProtocol } from "@berth/shared/server/testing/wire-protocols";
import { createSourceLocks, type SourceLocks } from "../locks/index.js";
import { createSessionStore } from "../create-session-store.js";
import type { SessionStore } from "../session-store.js";
import { createLockHandlers } from "./lock-handlers.js";
import { createSessionHandlers } from "./session-handlers.js";

const HEARTBEAT_MS = 1_000;
const STREAMING = [SessionService, LockService].flatMap((s) => s.methods.filter((m) => m.methodKind !== "unary").map((m) => `${s.name}.${m.name}`));
const covered = new Set<string>();

const silent = { debug() {}, info() {}, warn() {}, error() {} };

let root: string;
let clock: ManualClock;
let store: SessionStore;
let locks: SourceLocks;
let server: RunningServer;
const closers: Array<() => void> = [];

beforeEach(async () => {
  root = fs.mkdtempSync(path.join(os.tmpdir(), "berth-protocols-"));
  fs.mkdirSync(path.join(root, "project", "src"), { recursive: true });
  clock = new ManualClock(Date.UTC(2026, 0, 1, 12));
  store = createSessionStore({ dir: path.join(root, "sessions"), clock, fsync: "none" });
  locks = createSourceLocks({ projectRoot: path.join(root, "project"), stateDir: path.join(root, "state"), liveDir: null, clock });
  server = await startServer({
    name: "sessions",
    logger: silent,
    services: [
      implement(SessionService, createSessionHandlers({ store })),
      implement(LockService, createLockHandlers({ locks, clock, heartbeatMs: HEARTBEAT_MS })),
    ],
  });
});

afterEach(async () => {
  for (const close of closers.splice(0)) close();
  await server.close(false);
  locks.close();
  await store.close();
  fs.rmSync(root, { recursive: true, force: true });
});

function clients(protocol: WireProtocol) {
  const connection = connectOver(protocol, server.url);
  closers.push(connection.close);
  return { sessions: createClient(SessionService, connection.transport), locks: createClient(LockService, connection.transport) };
}

const event = (kind: MessageInitShape<typeof EventSchema>["kind"]): Event => create(EventSchema, { kind });
const generate = (count: number) => event({ case: "generate", value: { pageUrl: "http://localhost:3000/", count, token: "t" } });
const phase = (name: string) => event({ case: "agentPhase", value: { phase: name, durationMs: 10 } });

/** Messages as proto3 JSON, each `[from, to]` replacement applied (names and tokens that differ by protocol). */
function comparable<S extends DescMessage>(schema: S, messages: readonly MessageShape<S>[], replace: ReadonlyArray<readonly [string, string]> = []): unknown[] {
  let text = JSON.stringify(messages.map((m) => toJson(schema, m)));
  for (const [from, to] of replace) text = text.split(from).join(to);
  return JSON.parse(text) as unknown[];
}

/** The next `n` messages of a stream. */
async function take<T>(stream: AsyncIterator<T>, n: number): Promise<T[]> {
  const out: T[] = [];
  while (out.length < n) {
    const result = await stream.next();
    if (result.done === true) throw new Error(`the stream ended after ${out.length} of ${n} messages`);
    out.push(result.value);
  }
  return out;
}

/** A server stream opened with a signal the test aborts at the end. */
function open<T>(call: (options: { signal: AbortSignal }) => AsyncIterable<T>): AsyncIterator<T> {
  const controller = new AbortController();
  closers.push(() => controller.abort());
  return call({ signal: controller.signal })[Symbol.asyncIterator]();
}

describe.each(WIRE_PROTOCOLS.slice(1))("SessionService and LockService over $name equal gRPC's", (protocol) => {
  let reference: ReturnType<typeof clients>;
  let tested: ReturnType<typeof clients>;
  beforeEach(() => {
    reference = clients(WIRE_PROTOCOLS[0]!);
    tested = clients(protocol);
  });

  it("AppendEvent and AppendEvents: the snapshot each append produced", async () => {
    const run = async (client: Client<typeof SessionService>, sessionId: string) => [
      comparable(AppendEventResponseSchema, [await client.appendEvent({ sessionId, event: generate(2) })], [[sessionId, "own"]]),
      comparable(AppendEventsResponseSchema, [await client.appendEvents({ sessionId, events: [phase("planning"), phase("writing")] })], [[sessionId, "own"]]),
    ];
    const expected = await run(reference.sessions, "reference");
    expect(expected[1]![0]).toMatchObject({ firstSeq: "2", lastSeq: "3", snapshot: { id: "own", generationPhase: "writing", expectedVariants: 2 } });
    expect(await run(tested.sessions, "tested")).toEqual(expected);
  });

  it("WatchSession (a backlog message, one live entry a message, and batches), WatchSessions and ReadJournal", async () => {
    covered.add("SessionService.WatchSession").add("SessionService.WatchSessions").add("SessionService.ReadJournal");
    await reference.sessions.appendEvents({ sessionId: "s", events: [generate(3), phase("planning")] });
    const watchers = [reference, tested].map(({ sessions }) => ({
      single: open((o) => sessions.watchSession({ sessionId: "s", fromSeq: 1n, includeSnapshot: true }, o)),
      batched: open((o) => sessions.watchSession({ sessionId: "s", fromSeq: 1n, includeSnapshot: true, maxBatch: 8 }, o)),
      all: open((o) => sessions.watchSessions({ includeCurrent: true, includeSnapshot: true }, o)),
    }));
    // Backlog (2 entries, one message), caught up; the current sessions, caught up.
    const before = await Promise.all(
      watchers.map(async (w) => ({ single: await take(w.single, 2), batched: await take(w.batched, 2), all: await take(w.all, 2) })),
    );
    // Three entries in one append (a batch for the batched watcher), then one more, then another session.
    await reference.sessions.appendEvents({ sessionId: "s", events: [phase("a"), phase("b"), phase("c")] });
    await reference.sessions.appendEvent({ sessionId: "s", event: phase("d") });
    await reference.sessions.appendEvent({ sessionId: "t", event: generate(1) });
    const results = await Promise.all(
      watchers.map(async (w, i) => {
        const single = [...before[i]!.single, ...(await take(w.single, 4))];
        const batched = [...before[i]!.batched, ...(await take(w.batched, 2))];
        const all = [...before[i]!.all, ...(await take(w.all, 3))];
        return {
          single: comparable(WatchSessionResponseSchema, single),
          batched: comparable(WatchSessionResponseSchema, batched),
          all: comparable(WatchSessionsResponseSchema, all),
        };
      }),
    );
    const [expected, actual] = results;
    expect(expected!.single[0]).toMatchObject({ entries: { entries: [{ entry: { seq: "1", type: "generate" } }, { entry: { seq: "2" } }] } });
    expect(expected!.single[2]).toMatchObject({ entries: { entries: [{ entry: { seq: "3", type: "agent_phase" }, snapshot: { generationPhase: "a" } }] } });
    expect(expected!.batched[2]).toMatchObject({
      entries: { entries: [{ entry: { seq: "3" }, snapshot: {} }, { entry: { seq: "4" } }, { entry: { seq: "5" } }] },
    });
    expect(expected!.all[4]).toMatchObject({ change: { sessionId: "t", lastSeq: "1", snapshot: { id: "t" } } });
    expect(actual).toEqual(expected);

    const read = async (client: Client<typeof SessionService>) => {
      const messages = [];
      for await (const message of client.readJournal({ sessionId: "s", fromSeq: 1n })) messages.push(message);
      return comparable(ReadJournalResponseSchema, messages);
    };
    const journal = await read(reference.sessions);
    expect(journal).toMatchObject([{ entries: Array.from({ length: 6 }, (_, i) => ({ seq: String(i + 1) })), end: { lastSeq: "6", nextSeq: "7" } }]);
    expect(await read(tested.sessions)).toEqual(journal);
  });

  it("Hold (waiting, acquired, heartbeat) and KeepAliveStream", async () => {
    covered.add("LockService.Hold").add("LockService.KeepAliveStream");
    const fileOf = (name: string) => path.join(root, "project", "src", `${name}.ts`);
    // Both holds step by step together, so that their times are the same; fencing tokens are
    // global, so they are compared by role.
    const holds = await Promise.all(
      [reference, tested].map(async (client, i) => {
        const file = fileOf(`hold-${i}`);
        const blocker = await locks.acquire({ file, owner: "blocker" });
        const stream = open((o) => client.locks.hold({ file, owner: "holder", maxWait: { seconds: 60n } }, o));
        return { file, blocker, stream, messages: await take(stream, 1) };
      }),
    );
    for (const hold of holds) locks.release(hold.blocker.leaseToken);
    for (const hold of holds) hold.messages.push(...(await take(hold.stream, 1)));
    clock.advance(HEARTBEAT_MS);
    const [expected, actual] = await Promise.all(
      holds.map(async ({ file, blocker, stream, messages }) => {
        messages.push(...(await take(stream, 1)));
        const lease = messages[1]!.kind.case === "acquired" ? messages[1]!.kind.value : undefined;
        return comparable(HoldResponseSchema, messages, [
          [lease?.leaseToken ?? "", "lease"],
          [`"fencingToken":"${lease?.fencingToken}"`, '"fencingToken":"holder"'],
          [`"fencingToken":"${blocker.fencingToken}"`, '"fencingToken":"blocker"'],
          [file, "file"],
        ]);
      }),
    );
    expect(expected).toMatchObject([
      { waiting: { position: 1, holder: { owner: "blocker", fencingToken: "blocker" } } },
      { acquired: { owner: "holder", file: "file", fencingToken: "holder" } },
      { heartbeat: { sendTime: expect.any(String) } },
    ]);
    expect(actual).toEqual(expected);

    const keepAlive = async (client: Client<typeof LockService>, name: string) => {
      const lease = await locks.acquire({ file: fileOf(`${name}-kept`), owner: "kept", ttlMs: 10_000 });
      const responses = [];
      const requests = async function* () {
        yield { leaseToken: lease.leaseToken };
        yield { leaseToken: "gone" };
      };
      for await (const response of client.keepAliveStream(requests())) responses.push(response);
      locks.release(lease.leaseToken);
      return comparable(KeepAliveStreamResponseSchema, responses, [[lease.leaseToken, "lease"]]);
    };
    const renewed = await keepAlive(reference.locks, "reference");
    expect(renewed).toMatchObject([{ renewal: { leaseToken: "lease", alive: true, expireTime: expect.any(String) } }, { renewal: { leaseToken: "gone" } }]);
    expect(await keepAlive(tested.locks, "tested")).toEqual(renewed);
  });

  it("WatchLocks: the current holder, caught_up, then a release and the next grant", async () => {
    covered.add("LockService.WatchLocks");
    const fileOf = (name: string) => path.join(root, "project", "src", `${name}.ts`);
    const [expected, actual] = await Promise.all(
      [reference, tested].map(async (client, i) => {
        const file = fileOf(`watched-${i}`);
        const first = await locks.acquire({ file, owner: "first" });
        const stream = open((o) => client.locks.watchLocks({ file, includeCurrent: true }, o));
        const messages = await take(stream, 2);
        locks.release(first.leaseToken);
        const second = await locks.acquire({ file, owner: "second" });
        messages.push(...(await take(stream, 2)));
        locks.release(second.leaseToken);
        // Revisions, times and tokens differ by watcher: compared by what they say.
        return messages.map((m) =>
          m.kind.case === "event" ? { event: m.kind.value.kind, owner: m.kind.value.owner, sameFile: m.kind.value.file === file } : { other: m.kind.case },
        );
      }),
    );
    expect(expected).toEqual([
      { event: LockEventKind.CURRENT_HOLDER, owner: "first", sameFile: true },
      { other: "caughtUp" },
      { event: LockEventKind.RELEASED, owner: "first", sameFile: true },
      { event: LockEventKind.GRANTED, owner: "second", sameFile: true },
    ]);
    expect(actual).toEqual(expected);
  });
});

it("covers every streaming RPC of SessionService and LockService", () => {
  expect([...covered].sort()).toEqual([...STREAMING].sort());
});
