import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { HolderKind, LockHeldSchema } from "@berth/api/berth/locks/v1/lock_service_pb";
import { LOCK_RETRY_AFTER_MS } from "../locks/index.js";
import { MAX_KEEPALIVE_TOKENS } from "./lock-handlers.js";
import {
  clock,
  client,
  closeLockService,
  errorInfo,
  failure,
  FILE,
  HEARTBEAT_MS,
  key,
  locks,
  metrics,
  ms,
  openHold,
  projectRoot,
  serve,
  setUpLockService,
} from "./lock-handler-fixtures.js";

beforeEach(setUpLockService);
afterEach(closeLockService);

describe("KeepAlive (unary)", () => {
  it("renews each lease for its ttl, answering in request order, alive = false for one that is gone", async () => {
    const a = (await client.acquire({ file: FILE, owner: "alice", ttl: ms(5_000) })).lease!;
    const b = (await client.acquire({ file: path.join(projectRoot, "src/other.ts"), owner: "bob", ttl: ms(5_000) })).lease!;
    const c = (await client.acquire({ file: path.join(projectRoot, "src/third.ts"), owner: "carol", ttl: ms(2_000) })).lease!;
    await client.release({ leaseToken: b.leaseToken });
    clock.advance(1_000);
    const { renewals } = await client.keepAlive({ leaseTokens: [a.leaseToken, b.leaseToken, "never-granted", c.leaseToken] });
    expect(renewals.map((r) => [r.leaseToken, r.alive, r.expireTime === undefined ? undefined : timestampMs(r.expireTime) - clock.now()])).toEqual([
      [a.leaseToken, true, 5_000],
      [b.leaseToken, false, undefined],
      ["never-granted", false, undefined],
      [c.leaseToken, true, 2_000],
    ]);
    clock.advance(4_999);
    expect(locks.inspect(FILE).holder?.owner).toBe("alice");
    clock.advance(1);
    expect(locks.inspect(FILE).holder).toBeNull();
  });

  it.each([
    ["no token", [], /^lease_tokens: is required/],
    ["an empty token", ["x", ""], /^lease_tokens\[1\]: is required/],
    ["a token over 128 characters", ["t".repeat(129)], /^lease_tokens\[0\]: must be at most 128/],
    [
      `more than ${MAX_KEEPALIVE_TOKENS} tokens`,
      Array.from({ length: MAX_KEEPALIVE_TOKENS + 1 }, (_, i) => `t${i}`),
      /^lease_tokens: must hold at most 1000 tokens, got 1001/,
    ],
  ])("refuses %s with INVALID_ARGUMENT naming the field", async (_name, leaseTokens, message) => {
    const error = await failure(client.keepAlive({ leaseTokens }));
    expect(error.code).toBe(Code.InvalidArgument);
    expect(errorInfo(error).reason).toBe("INVALID_FIELD");
    expect(error.rawMessage).toMatch(message);
  });

  it("leaves a refused request's valid tokens unrenewed", async () => {
    const lease = (await client.acquire({ file: FILE, owner: "alice", ttl: ms(1_000) })).lease!;
    clock.advance(900);
    expect((await failure(client.keepAlive({ leaseTokens: [lease.leaseToken, ""] }))).code).toBe(Code.InvalidArgument);
    clock.advance(100);
    expect(locks.inspect(FILE).holder).toBeNull();
  });
});

describe("KeepAliveStream", () => {
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
    for await (const answer of client.keepAliveStream(requests())) answers.push(answer.renewal!);
    expect(answers.map((r) => [r.leaseToken, r.alive])).toEqual([
      [a.leaseToken, true],
      [b.leaseToken, false],
      ["never-granted", false],
    ]);
    expect(timestampMs(answers[0]!.expireTime!)).toBe(clock.now() + 5_000);
    expect(answers[1]!.expireTime).toBeUndefined();
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
    const error = await failure(
      (async () => {
        for await (const _ of client.keepAliveStream(requests()));
      })(),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toMatch(/^lease_token: /);
  });

  it("lets an unrenewed lease expire and hands the lock to the next waiter", async () => {
    await client.acquire({ file: FILE, owner: "alice", ttl: ms(1_000) });
    const next = client.acquire({ file: FILE, owner: "bob", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    clock.advance(1_000);
    expect((await next).lease?.owner).toBe("bob");
  });
});

describe("Hold", () => {
  it("sends waiting updates, then the lease, then heartbeats; ending the stream frees the lock at once", async () => {
    const alice = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    const early = openHold({ owner: "early", maxWait: ms(60_000) });
    const hold = openHold({ owner: "holder", maxWait: ms(60_000) });
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
    expect(acquired.case === "acquired" && acquired.value.expireTime).toBeUndefined();
    expect(acquired.case === "acquired" && acquired.value.ttl).toBeUndefined();
    expect(acquired.case === "acquired" && acquired.value.fencingToken).toBeGreaterThan(alice.fencingToken);
    expect(locks.inspect(FILE).holder).toMatchObject({ kind: "stream", owner: "holder" });

    // Heartbeats keep their period whichever way the wall clock steps, and say the wall time.
    clock.stepWall(-3_600_000);
    clock.advance(HEARTBEAT_MS);
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "waiting", "acquired", "heartbeat"]));
    const beat = hold.messages[3]!.kind;
    expect(beat.case === "heartbeat" && timestampMs(beat.value.sendTime!)).toBe(clock.now());

    const next = client.acquire({ file: FILE, owner: "next", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    hold.cancel();
    expect((await next).lease?.owner).toBe("next");
    await hold.done;
    expect(hold.ended).toBeInstanceOf(ConnectError);
  });

  it("says what it holds, for /debug/streams: its place in the queue, then the lock with its fencing token", async () => {
    const alice = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    const hold = openHold({ owner: "holder", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting"]));
    expect(metrics.streams.list()).toMatchObject([{ method: "/berth.locks.v1.LockService/Hold", holds: `a place in the queue of ${FILE} as "holder"` }]);
    await client.release({ leaseToken: alice.leaseToken });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "acquired"]));
    const acquired = hold.messages[1]!.kind;
    const token = acquired.case === "acquired" ? acquired.value.fencingToken : undefined;
    expect(metrics.streams.list()[0]?.holds).toBe(`the lock on ${key()} as "holder", fencing token ${token}`);
    hold.cancel();
    await hold.done;
    await vi.waitFor(() => expect(metrics.streams.size).toBe(0));
  });

  it("ends with RESOURCE_EXHAUSTED WAIT_EXHAUSTED when the wait runs out, at once with max_wait 0, after the longest wait with none", async () => {
    serve({ maxWaitMs: 10_000 });
    await client.acquire({ file: FILE, owner: "alice" });
    const once = openHold({ owner: "bob", maxWait: ms(0) });
    await once.done;
    expect(once.ended).toMatchObject({ code: Code.ResourceExhausted });
    expect(errorInfo(once.ended as ConnectError)).toEqual({ reason: "WAIT_EXHAUSTED", domain: "berth.locks", retryAfterMs: LOCK_RETRY_AFTER_MS });
    expect((once.ended as ConnectError).findDetails(LockHeldSchema)[0]?.owner).toBe("alice");

    const waiting = openHold({ owner: "carol", maxWait: ms(3_000) });
    const unset = openHold({ owner: "dave" });
    await vi.waitFor(() => expect([waiting.kinds(), unset.kinds()]).toEqual([["waiting"], ["waiting"]]));
    clock.advance(3_000);
    await waiting.done;
    expect(waiting.ended).toMatchObject({ code: Code.ResourceExhausted });
    expect(locks.inspect(FILE).waiters.map((w) => w.owner)).toEqual(["dave"]);
    clock.advance(7_000);
    await unset.done;
    expect((unset.ended as ConnectError).findDetails(LockHeldSchema)[0]?.waited).toMatchObject({ seconds: 10n });
    expect(locks.inspect(FILE).waiters).toHaveLength(0);
  });

  it("ends the stream OK the moment its owner releases its lease through Release, without waiting for a heartbeat", async () => {
    const hold = openHold({ owner: "holder" });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["acquired"]));
    const acquired = hold.messages[0]!.kind;
    if (acquired.case !== "acquired") throw new Error("no lease");
    expect((await client.release({ leaseToken: acquired.value.leaseToken })).released).toBe(true);
    // The clock does not move: the next holder may already have the lock, so this one must know now.
    await hold.done;
    expect(hold.kinds()).toEqual(["acquired"]);
    // The lease token went only to this stream's caller: a Release with it is the owner letting go,
    // the end it asked for, so the stream ends OK and /metrics counts it so, not as a failure.
    expect(hold.ended).toBe("ok");
    await vi.waitFor(() => expect(metrics.requestCount("/berth.locks.v1.LockService/Hold", "ok")).toBe(1));
    expect(metrics.requestCount("/berth.locks.v1.LockService/Hold", "failed_precondition")).toBe(0);
    expect(locks.inspect(FILE).holder).toBeNull();
  });

  it("ends the stream UNAVAILABLE SHUTTING_DOWN when its lease ends because the locks close under it", async () => {
    const hold = openHold({ owner: "holder" });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["acquired"]));
    locks.close();
    await hold.done;
    expect(hold.ended).toMatchObject({ code: Code.Unavailable });
    expect(errorInfo(hold.ended as ConnectError)).toEqual({ reason: "SHUTTING_DOWN", domain: "berth.locks", retryAfterMs: LOCK_RETRY_AFTER_MS });
    expect((hold.ended as ConnectError).rawMessage).toMatch(/the lock service is shutting down/);
  });
});
