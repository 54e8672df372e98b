import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { durationFromMs, timestampMs, type Duration } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, createRouterTransport, type Client } from "@connectrpc/connect";
import { HolderKind, LockHeldSchema, LockService as LockServiceDesc, type HoldResponse } from "@berth/api/berth/sessions/v1/lock_service_pb";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { createErrorInterceptor, createObserverInterceptor, ServerMetrics } from "@berth/shared/server/index";
import { createLockService, lockFilePath, type LockService } from "../locks/index.js";
import { durationInput, makeFenceCheck, makeLockHandlers } from "./lock-handlers.js";

let root: string;
let projectRoot: string;
let liveDir: string;
let clock: ManualClock;
let locks: LockService;
let client: Client<typeof LockServiceDesc>;
let metrics: ServerMetrics;

/** The locked file: absolute, as every client sends it. */
let FILE: string;
const key = () => FILE;
const HEARTBEAT_MS = 1_000;

beforeEach(() => {
  root = fs.mkdtempSync(path.join(tmpdir(), "berth-lockrpc-"));
  projectRoot = path.join(root, "project");
  FILE = path.join(projectRoot, "src/app.ts");
  liveDir = path.join(root, "live");
  clock = new ManualClock();
  locks = createLockService({ projectRoot, stateDir: path.join(root, "state"), liveDir, clock });
  metrics = new ServerMetrics("sessions");
  const quiet = { debug() {}, info() {}, warn() {}, error() {} };
  const transport = createRouterTransport((router) => router.service(LockServiceDesc, makeLockHandlers({ locks, clock, heartbeatMs: HEARTBEAT_MS })), {
    // As the server has them: the observer (which keeps the open streams) outermost.
    router: { interceptors: [createObserverInterceptor({ logger: quiet, metrics }), createErrorInterceptor()] },
  });
  client = createClient(LockServiceDesc, transport);
});
afterEach(() => {
  locks.close();
  fs.rmSync(root, { recursive: true, force: true });
});

const ms = (n: number): Duration => durationFromMs(n);

async function failure(promise: Promise<unknown>): Promise<ConnectError> {
  try {
    await promise;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("expected the call to fail");
}

/** Collects a Hold stream's messages as they arrive, and how it ended. */
function openHold(request: { file?: string; owner: string; wait?: Duration }) {
  const controller = new AbortController();
  const messages: HoldResponse[] = [];
  let ended: ConnectError | "ok" | undefined;
  const done = (async () => {
    try {
      for await (const message of client.hold({ file: request.file ?? FILE, owner: request.owner, wait: request.wait }, { signal: controller.signal })) messages.push(message);
      ended = "ok";
    } catch (error) {
      ended = ConnectError.from(error);
    }
  })();
  return {
    messages,
    cancel: () => controller.abort(),
    done,
    get ended() {
      return ended;
    },
    kinds: () => messages.map((m) => m.kind.case),
  };
}

describe("Acquire and Release", () => {
  it("grants a lease with a fencing token, expiry and ttl; releases only with its own token", async () => {
    const { lease } = await client.acquire({ file: FILE, owner: "alice", ttl: ms(10_000) });
    expect(lease?.file).toBe(key());
    expect(lease?.owner).toBe("alice");
    expect(lease?.fencingToken).toBeGreaterThan(0n);
    expect(timestampMs(lease!.expiresAt!)).toBe(clock.now() + 10_000);
    expect(timestampMs(lease!.acquiredAt!)).toBe(clock.now());
    expect(lease?.ttl?.seconds).toBe(10n);

    expect((await client.release({ leaseToken: lease!.leaseToken })).released).toBe(true);
    const second = await client.acquire({ file: FILE, owner: "bob" });
    expect(second.lease!.fencingToken).toBeGreaterThan(lease!.fencingToken);
    // A stale (repeated) release of the first lease never frees bob's lock.
    expect((await client.release({ leaseToken: lease!.leaseToken })).released).toBe(false);
    expect((await client.inspect({ file: FILE })).holder?.owner).toBe("bob");
  });

  it("refuses a busy lock with ABORTED SOURCE_LOCKED and the LockHeld detail", async () => {
    const { lease } = await client.acquire({ file: FILE, owner: "alice" });
    const error = await failure(client.acquire({ file: FILE, owner: "bob" }));
    expect(error.code).toBe(Code.Aborted);
    expect(error.rawMessage).toMatch(/held by alice since .* \(fencing token \d+\)/);
    const [held] = error.findDetails(LockHeldSchema);
    expect(held).toMatchObject({
      reason: "SOURCE_LOCKED",
      file: key(),
      owner: "alice",
      fencingToken: lease!.fencingToken,
      kind: HolderKind.LEASE,
      lockPath: lockFilePath(path.join(liveDir, "locks"), key()),
      pid: process.pid,
    });
    expect(timestampMs(held!.since!)).toBe(timestampMs(lease!.acquiredAt!));
  });

  it("serves waiters in arrival order, each the moment the lock is released", async () => {
    const first = (await client.acquire({ file: FILE, owner: "w0" })).lease!;
    const order: string[] = [];
    const waiters = ["w1", "w2", "w3"].map((owner) => client.acquire({ file: FILE, owner, wait: ms(60_000) }).then((r) => (order.push(owner), r.lease!)));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters.map((w) => w.owner)).toEqual(["w1", "w2", "w3"]));
    let token = first.leaseToken;
    let fencing = first.fencingToken;
    for (const waiter of waiters) {
      await client.release({ leaseToken: token });
      const lease = await waiter;
      expect(lease.fencingToken).toBeGreaterThan(fencing);
      token = lease.leaseToken;
      fencing = lease.fencingToken;
    }
    expect(order).toEqual(["w1", "w2", "w3"]);
  });

  it("answers a wait that runs out with SOURCE_LOCKED naming the holder", async () => {
    await client.acquire({ file: FILE, owner: "alice" });
    const pending = failure(client.acquire({ file: FILE, owner: "bob", wait: ms(2_000) }));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    clock.advance(2_000);
    const error = await pending;
    expect(error.code).toBe(Code.Aborted);
    expect(error.rawMessage).toMatch(/whole wait of 2s/);
    expect(error.findDetails(LockHeldSchema)[0]?.owner).toBe("alice");
    expect(locks.inspect(FILE).waiters).toHaveLength(0);
  });

  it("drops a waiter whose caller went away; it is never granted", async () => {
    const { lease } = await client.acquire({ file: FILE, owner: "alice" });
    const controller = new AbortController();
    const pending = failure(client.acquire({ file: FILE, owner: "gone", wait: ms(60_000) }, { signal: controller.signal }));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    controller.abort();
    expect((await pending).code).toBe(Code.Canceled);
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(0));
    await client.release({ leaseToken: lease!.leaseToken });
    expect(locks.inspect(FILE).holder).toBeNull();
  });

  it("bounds the wait by the call's deadline, answering SOURCE_LOCKED before it", async () => {
    // Real time here: the deadline is the client's, not the service clock's.
    const real = createLockService({ projectRoot, stateDir: path.join(root, "state-real"), liveDir: null });
    try {
      const realClient = createClient(
        LockServiceDesc,
        createRouterTransport((router) => router.service(LockServiceDesc, makeLockHandlers({ locks: real })), { router: { interceptors: [createErrorInterceptor()] } }),
      );
      await realClient.acquire({ file: FILE, owner: "alice" });
      const started = Date.now();
      const error = await failure(realClient.acquire({ file: FILE, owner: "bob", wait: ms(60_000) }, { timeoutMs: 400 }));
      expect(error.code).toBe(Code.Aborted);
      expect(error.findDetails(LockHeldSchema)[0]?.owner).toBe("alice");
      expect(Date.now() - started).toBeLessThan(2_000);
    } finally {
      real.close();
    }
  });
});

describe("KeepAlive", () => {
  it("renews each lease for its ttl and answers alive = false for one that is gone", async () => {
    const a = (await client.acquire({ file: FILE, owner: "alice", ttl: ms(5_000) })).lease!;
    const b = (await client.acquire({ file: path.join(projectRoot, "src/other.ts"), owner: "bob", ttl: ms(5_000) })).lease!;
    await client.release({ leaseToken: b.leaseToken });
    clock.advance(4_000);
    async function* requests() {
      yield { leaseToken: a.leaseToken };
      yield { leaseToken: b.leaseToken };
      yield { leaseToken: "never-granted" };
    }
    const answers = [];
    for await (const answer of client.keepAlive(requests())) answers.push(answer);
    expect(answers.map((r) => [r.leaseToken, r.alive])).toEqual([
      [a.leaseToken, true],
      [b.leaseToken, false],
      ["never-granted", false],
    ]);
    expect(timestampMs(answers[0]!.expiresAt!)).toBe(clock.now() + 5_000);
    expect(answers[1]!.expiresAt).toBeUndefined();
    // Renewed at 4 s for 5 s: still held at 8 s, gone at 9 s.
    clock.advance(4_000);
    expect(locks.inspect(FILE).holder?.owner).toBe("alice");
    clock.advance(1_000);
    expect(locks.inspect(FILE).holder).toBeNull();
  });

  it("refuses an empty lease token with INVALID_ARGUMENT", async () => {
    async function* requests() {
      yield { leaseToken: "" };
    }
    const error = await failure((async () => {
      for await (const _ of client.keepAlive(requests()));
    })());
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toMatch(/^lease_token: /);
  });

  it("lets an unrenewed lease expire and hands the lock to the next waiter", async () => {
    await client.acquire({ file: FILE, owner: "alice", ttl: ms(1_000) });
    const next = client.acquire({ file: FILE, owner: "bob", wait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    clock.advance(1_000);
    expect((await next).lease?.owner).toBe("bob");
  });
});

describe("Hold", () => {
  it("sends waiting updates, then the lease, then heartbeats; ending the stream frees the lock at once", async () => {
    const alice = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    const early = openHold({ owner: "early", wait: ms(60_000) });
    const hold = openHold({ owner: "holder", wait: ms(60_000) });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting"]));
    const first = hold.messages[0]!.kind;
    expect(first.case === "waiting" && first.value.position).toBe(2);
    expect(first.case === "waiting" && first.value.holder?.owner).toBe("alice");
    expect(first.case === "waiting" && first.value.holder?.kind).toBe(HolderKind.LEASE);

    // The one ahead gives up: position 1.
    early.cancel();
    await early.done;
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "waiting"]));
    const second = hold.messages[1]!.kind;
    expect(second.case === "waiting" && second.value.position).toBe(1);

    await client.release({ leaseToken: alice.leaseToken });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "waiting", "acquired"]));
    const acquired = hold.messages[2]!.kind;
    expect(acquired.case === "acquired" && acquired.value.owner).toBe("holder");
    expect(acquired.case === "acquired" && acquired.value.expiresAt).toBeUndefined();
    expect(acquired.case === "acquired" && acquired.value.ttl).toBeUndefined();
    expect(acquired.case === "acquired" && acquired.value.fencingToken).toBeGreaterThan(alice.fencingToken);
    expect(locks.inspect(FILE).holder).toMatchObject({ kind: "stream", owner: "holder" });

    // Heartbeats keep their period whichever way the wall clock steps, and say the wall time.
    clock.stepWall(-3_600_000);
    clock.advance(HEARTBEAT_MS);
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "waiting", "acquired", "heartbeat"]));
    const beat = hold.messages[3]!.kind;
    expect(beat.case === "heartbeat" && timestampMs(beat.value.at!)).toBe(clock.now());

    const next = client.acquire({ file: FILE, owner: "next", wait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    hold.cancel();
    expect((await next).lease?.owner).toBe("next");
    await hold.done;
    expect(hold.ended).toBeInstanceOf(ConnectError);
  });

  it("says what it holds, for /debug/streams: its place in the queue, then the lock with its fencing token", async () => {
    const alice = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    const hold = openHold({ owner: "holder", wait: ms(60_000) });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting"]));
    expect(metrics.streams.list()).toMatchObject([{ method: "/berth.sessions.v1.LockService/Hold", holds: `a place in the queue of ${FILE} as "holder"` }]);
    await client.release({ leaseToken: alice.leaseToken });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "acquired"]));
    const acquired = hold.messages[1]!.kind;
    const token = acquired.case === "acquired" ? acquired.value.fencingToken : undefined;
    expect(metrics.streams.list()[0]?.holds).toBe(`the lock on ${key()} as "holder", fencing token ${token}`);
    hold.cancel();
    await hold.done;
    await vi.waitFor(() => expect(metrics.streams.size).toBe(0));
  });

  it("ends with ABORTED SOURCE_LOCKED when the wait runs out, and with try-once by default", async () => {
    await client.acquire({ file: FILE, owner: "alice" });
    const once = openHold({ owner: "bob" });
    await once.done;
    expect(once.ended).toMatchObject({ code: Code.Aborted });
    expect((once.ended as ConnectError).findDetails(LockHeldSchema)[0]?.owner).toBe("alice");

    const waiting = openHold({ owner: "carol", wait: ms(3_000) });
    await vi.waitFor(() => expect(waiting.kinds()).toEqual(["waiting"]));
    clock.advance(3_000);
    await waiting.done;
    expect(waiting.ended).toMatchObject({ code: Code.Aborted });
    expect(locks.inspect(FILE).waiters).toHaveLength(0);
  });

  it("ends the stream the moment its lease is released through Release, without waiting for a heartbeat", async () => {
    const hold = openHold({ owner: "holder" });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["acquired"]));
    const acquired = hold.messages[0]!.kind;
    if (acquired.case !== "acquired") throw new Error("no lease");
    expect((await client.release({ leaseToken: acquired.value.leaseToken })).released).toBe(true);
    // The clock does not move: the next holder may already have the lock, so this one must know now.
    await hold.done;
    expect(hold.kinds()).toEqual(["acquired"]);
    expect(hold.ended).toMatchObject({ code: Code.Aborted });
    expect((hold.ended as ConnectError).rawMessage).toMatch(/lease was released/);
  });
});

describe("Inspect and CheckToken", () => {
  it("shows the holder, the waiters in order and the last fencing token", async () => {
    const free = await client.inspect({ file: FILE });
    expect(free).toMatchObject({ file: key(), waiters: [], lastFencingToken: 0n });
    expect(free.holder).toBeUndefined();
    const lease = (await client.acquire({ file: FILE, owner: "alice", ttl: ms(30_000) })).lease!;
    const w1 = failure(client.acquire({ file: FILE, owner: "w1", wait: ms(10_000) }));
    const w2 = openHold({ owner: "w2", wait: ms(20_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(2));
    const inspection = await client.inspect({ file: key() });
    expect(inspection.holder).toMatchObject({ owner: "alice", fencingToken: lease.fencingToken, kind: HolderKind.LEASE, pid: process.pid });
    expect(timestampMs(inspection.holder!.expiresAt!)).toBe(clock.now() + 30_000);
    expect(inspection.waiters.map((w) => [w.owner, w.kind, timestampMs(w.deadline!) - timestampMs(w.since!)])).toEqual([
      ["w1", HolderKind.LEASE, 10_000],
      ["w2", HolderKind.STREAM, 20_000],
    ]);
    expect(inspection.lastFencingToken).toBe(lease.fencingToken);
    expect(inspection.lockPath).toBe(lockFilePath(path.join(liveDir, "locks"), key()));
    clock.advance(20_000);
    await w1;
    await w2.done;
  });

  it("tells whether a fencing token is the current one", async () => {
    const first = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    expect(await client.checkToken({ file: FILE, fencingToken: first.fencingToken })).toMatchObject({ current: true, currentToken: first.fencingToken });
    await client.release({ leaseToken: first.leaseToken });
    expect(await client.checkToken({ file: FILE, fencingToken: first.fencingToken })).toMatchObject({ current: false, currentToken: 0n });
    const second = (await client.acquire({ file: FILE, owner: "bob" })).lease!;
    expect(await client.checkToken({ file: FILE, fencingToken: first.fencingToken })).toMatchObject({ current: false, currentToken: second.fencingToken });
  });
});

describe("input validation", () => {
  const cases: Array<[string, () => Promise<unknown>, RegExp]> = [
    ["a relative path", () => client.acquire({ file: "src/app.ts", owner: "x" }), /^file: must be an absolute path; resolve it against your working directory before sending, got "src\/app\.ts"$/],
    ["a path with NUL", () => client.acquire({ file: "/src/a\0b.ts", owner: "x" }), /^file: must not contain a NUL/],
    ["an over-long path", () => client.acquire({ file: `/src/${"a".repeat(5000)}`, owner: "x" }), /^file: must be at most 4096 bytes/],
    ["an empty path", () => client.acquire({ file: "", owner: "x" }), /^file: is required/],
    ["an empty owner", () => client.acquire({ file: FILE, owner: "" }), /^owner: is required/],
    ["a negative wait", () => client.acquire({ file: FILE, owner: "x", wait: { seconds: -1n, nanos: 0 } }), /^wait: must not be negative/],
    ["a negative ttl", () => client.acquire({ file: FILE, owner: "x", ttl: { seconds: 0n, nanos: -5 } }), /^ttl: must not be negative/],
    ["a ttl over the maximum", () => client.acquire({ file: FILE, owner: "x", ttl: ms(2 * 3_600_000) }), /^ttl: must be at most/],
    ["a wait over the maximum", () => client.acquire({ file: FILE, owner: "x", wait: ms(3_600_000) }), /^wait: must be at most/],
    ["an empty release token", () => client.release({ leaseToken: "" }), /^lease_token: is required/],
    ["Inspect with a relative path", () => client.inspect({ file: "../x" }), /^file: must be an absolute path/],
    ["CheckToken with a relative path", () => client.checkToken({ file: "x", fencingToken: 1n }), /^file: must be an absolute path/],
    ["CheckToken with token 0", () => client.checkToken({ file: FILE, fencingToken: 0n }), /^fencing_token: must be a positive integer/],
    ["CheckToken with NUL", () => client.checkToken({ file: "/a\0", fencingToken: 1n }), /^file: must not contain a NUL/],
    [
      "Hold with a relative path",
      async () => {
        for await (const _ of client.hold({ file: "a/../b", owner: "x" }));
      },
      /^file: must be an absolute path/,
    ],
    [
      "Hold with a negative wait",
      async () => {
        for await (const _ of client.hold({ file: FILE, owner: "x", wait: { seconds: -3n, nanos: 0 } }));
      },
      /^wait: must not be negative/,
    ],
  ];
  it.each(cases)("refuses %s with INVALID_ARGUMENT naming the field", async (_name, call, message) => {
    const error = await failure(call());
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toMatch(message);
    expect(locks.stats()).toEqual({ held: 0, waiting: 0, blockedByLockFiles: 0 });
  });

  it("reads durations to the millisecond, rounding sub-millisecond remainders up", () => {
    expect(durationInput(undefined, "wait")).toBe(0);
    expect(durationInput(durationFromMs(0), "wait")).toBe(0);
    expect(durationInput({ seconds: 1n, nanos: 500_000_001 } as Duration, "wait")).toBe(1_501);
    expect(() => durationInput({ seconds: 0n, nanos: 1_000_000_000 } as Duration, "ttl")).toThrow(/^ttl: nanos must be at most/);
  });
});

describe("makeFenceCheck", () => {
  it("passes the current token and refuses a stale one with aborted and the FenceRejected facts", async () => {
    const check = makeFenceCheck(locks);
    const first = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    expect(() => check(FILE, first.fencingToken)()).not.toThrow();
    await client.release({ leaseToken: first.leaseToken });
    const second = (await client.acquire({ file: FILE, owner: "bob" })).lease!;
    let refused: unknown;
    try {
      check(key(), first.fencingToken)();
    } catch (error) {
      refused = error;
    }
    expect(refused).toBeInstanceOf(BerthError);
    expect(refused).toMatchObject({ code: "aborted", details: { file: key(), fencingToken: Number(first.fencingToken), currentToken: Number(second.fencingToken) } });
    // Refused when prepared, with the request: before the append is ever sequenced.
    expect(() => check("a/../b", 1n)).toThrow(/^fence\.file: must be an absolute path/);
    expect(() => check(FILE, 0n)).toThrow(/^fence\.fencing_token: /);
  });

  it("matches a fence given with another spelling of the locked file (a symlinked directory, '..')", async () => {
    fs.mkdirSync(path.join(projectRoot, "src", "x"), { recursive: true });
    fs.symlinkSync(projectRoot, path.join(root, "link"));
    const check = makeFenceCheck(locks);
    const lease = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    expect(() => check(path.join(root, "link") + "/src/x/../app.ts", lease.fencingToken)()).not.toThrow();
    expect(() => check(`${projectRoot}/./src//app.ts`, lease.fencingToken)()).not.toThrow();
  });
});
