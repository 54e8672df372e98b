import { describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { DriftingClock } from "@berth/shared/testing/drifting-clock";
import { LOCK_RETRY_AFTER_MS } from "./lock-input.js";
import { LockTable } from "./lock-table.js";
import type { Lease } from "./source-locks-api.js";
import { counter, table } from "./testing/lock-table-fixture.js";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";

describe("acquire and release", () => {
  it("grants a free lock at once, keyed by the canonical path", async () => {
    const { clock, locks } = table();
    const lease = await locks.acquire({ file: "/project/src/a.ts", owner: "alice" });
    expect(lease).toMatchObject({
      file: "/project/src/a.ts",
      owner: "alice",
      fencingToken: 1,
      acquiredAt: clock.now(),
      expiresAt: clock.now() + 30_000,
      ttlMs: 30_000,
    });
    expect(lease.leaseToken).toMatch(/^[0-9a-f-]{36}$/);
    // The same file by another spelling is the same lock.
    const error = await berthRefusal(locks.acquire({ file: "/project/./src/x/../a.ts/", owner: "bob", waitMs: 0 }));
    expect([error.code, error.reason]).toEqual(["resource_exhausted", "WAIT_EXHAUSTED"]);
    expect(locks.release(lease.leaseToken)).toBe(true);
    expect(locks.release(lease.leaseToken)).toBe(false);
    expect(clock.pendingTimers()).toBe(0);
  });

  it("serves 5 waiters in arrival order, each the moment the previous one releases", async () => {
    const { clock, locks } = table();
    const first = await locks.acquire({ file: "/project/a", owner: "w0" });
    const order: string[] = [];
    const waiting = [1, 2, 3, 4, 5].map((i) =>
      locks.acquire({ file: "/project/a", owner: `w${i}`, waitMs: 60_000 }).then((lease) => {
        order.push(lease.owner);
        return lease;
      }),
    );
    expect(locks.inspect("/project/a").waiters.map((w) => w.owner)).toEqual(["w1", "w2", "w3", "w4", "w5"]);
    let current: Lease = first;
    for (let i = 1; i <= 5; i++) {
      locks.release(current.leaseToken);
      // Handed over in the same turn: inspect sees the next holder before any timer or tick.
      expect(locks.inspect("/project/a").holder).toMatchObject({ kind: "lease", owner: `w${i}` });
      current = await waiting[i - 1]!;
      expect(current.fencingToken).toBe(i + 1);
    }
    expect(order).toEqual(["w1", "w2", "w3", "w4", "w5"]);
    locks.release(current.leaseToken);
    expect(clock.pendingTimers()).toBe(0);
  });

  it("does not let a newcomer jump the queue", async () => {
    const { locks } = table();
    const holder = await locks.acquire({ file: "/project/a", owner: "h" });
    const queued = locks.acquire({ file: "/project/a", owner: "q", waitMs: 1000 });
    locks.release(holder.leaseToken);
    await expect(locks.acquire({ file: "/project/a", owner: "late", waitMs: 0 })).rejects.toMatchObject({
      code: "resource_exhausted",
      reason: "WAIT_EXHAUSTED",
    });
    expect((await queued).owner).toBe("q");
  });
});

describe("waiting runs out", () => {
  it("answers resource_exhausted / WAIT_EXHAUSTED naming the holder, after exactly the wait, with a retry delay", async () => {
    const { clock, locks } = table();
    const holder = await locks.acquire({ file: "/project/src/a.ts", owner: "alice" });
    clock.advance(5000);
    const waiting = berthRefusal(locks.acquire({ file: "/project/src/a.ts", owner: "bob", waitMs: 2000 }));
    clock.advance(1999);
    expect(locks.inspect("/project/src/a.ts").waiters).toHaveLength(1);
    clock.advance(1);
    const error = await waiting;
    expect([error.code, error.reason, error.options.retryAfterMs]).toEqual(["resource_exhausted", "WAIT_EXHAUSTED", LOCK_RETRY_AFTER_MS]);
    expect(error.message).toBe(
      `source locked: /project/src/a.ts is held by alice since ${new Date(holder.acquiredAt).toISOString()} (fencing token 1); it stayed locked for the whole wait of 2s; wait longer, or ask the holder to release it`,
    );
    expect(error.details).toEqual({
      file: "/project/src/a.ts",
      owner: "alice",
      acquireTime: holder.acquiredAt,
      fencingToken: 1,
      kind: "lease",
      lockPath: null,
      waitedMs: 2000,
      waiting: 0,
    });
    expect(locks.inspect("/project/src/a.ts").waiters).toHaveLength(0);
  });

  it("tries once when wait is 0", async () => {
    const { locks } = table();
    await locks.acquire({ file: "/project/a", owner: "alice" });
    const error = await berthRefusal(locks.acquire({ file: "/project/a", owner: "bob", waitMs: 0 }));
    expect(error.message).toContain("max_wait was 0: try once");
    expect(error.details).toMatchObject({ waitedMs: 0, waiting: 0 });
    expect(locks.inspect("/project/a").waiters).toEqual([]);
  });

  it("waits up to the longest wait when none is given, and caps a longer one to it", async () => {
    const clock = new ManualClock();
    const locks = new LockTable({ clock, fencing: counter(), limits: { maxWaitMs: 5_000 } });
    const holder = await locks.acquire({ file: "/project/a", owner: "alice" });
    const unset = berthRefusal(locks.acquire({ file: "/project/a", owner: "bob" }));
    const longer = berthRefusal(locks.acquire({ file: "/project/a", owner: "carol", waitMs: 3_600_000 }));
    expect(locks.inspect("/project/a").waiters.map((w) => w.deadline - clock.now())).toEqual([5_000, 5_000]);
    clock.advance(4_999);
    expect(locks.inspect("/project/a").waiters).toHaveLength(2);
    clock.advance(1);
    expect((await unset).details).toMatchObject({ waitedMs: 5_000 });
    expect((await longer).details).toMatchObject({ waitedMs: 5_000 });
    expect(locks.release(holder.leaseToken)).toBe(true);
  });

  it("refuses a newcomer when the file's queue is full: resource_exhausted / TOO_MANY_WAITERS with a retry delay", async () => {
    const clock = new ManualClock();
    const locks = new LockTable({ clock, fencing: counter(), limits: { maxWaitersPerFile: 2 } });
    await locks.acquire({ file: "/project/a", owner: "alice" });
    const queued = [locks.acquire({ file: "/project/a", owner: "w1" }), locks.acquire({ file: "/project/a", owner: "w2" })];
    const error = await berthRefusal(locks.acquire({ file: "/project/a", owner: "w3" }));
    expect([error.code, error.reason, error.options.retryAfterMs]).toEqual(["resource_exhausted", "TOO_MANY_WAITERS", LOCK_RETRY_AFTER_MS]);
    expect(error.details).toEqual({ file: "/project/a", waiting: 2, maxWaiters: 2 });
    expect(locks.inspect("/project/a").waiters.map((w) => w.owner)).toEqual(["w1", "w2"]);
    locks.close();
    await Promise.allSettled(queued);
  });
});

describe("waiters that go away", () => {
  it("a waiter whose signal aborts is never granted; the one behind it is", async () => {
    const { clock, locks } = table();
    const holder = await locks.acquire({ file: "/project/a", owner: "h" });
    const gone = new AbortController();
    const goneWaiter = berthRefusal(locks.acquire({ file: "/project/a", owner: "gone", waitMs: 10_000, signal: gone.signal }));
    const next = locks.acquire({ file: "/project/a", owner: "next", waitMs: 10_000 });
    gone.abort();
    const error = await goneWaiter;
    expect(error.code).toBe("cancelled");
    expect(locks.inspect("/project/a").waiters.map((w) => w.owner)).toEqual(["next"]);
    locks.release(holder.leaseToken);
    expect((await next).owner).toBe("next");
    expect(clock.pendingTimers()).toBe(1); // next's lease, nothing of the waiter that left
  });

  it("refuses a request whose signal is already aborted", async () => {
    const { locks } = table();
    const error = await berthRefusal(locks.acquire({ file: "/project/a", owner: "x", signal: AbortSignal.abort() }));
    expect(error.code).toBe("cancelled");
    expect(locks.inspect("/project/a").holder).toBeNull();
  });
});

describe("onWaiting", () => {
  it("reports the place in the queue when queued and whenever it or the holder changes", async () => {
    const { locks } = table();
    const first = await locks.acquire({ file: "/project/a", owner: "alice" });
    const seen: Record<string, Array<[number, string | undefined]>> = { b: [], c: [] };
    const record = (name: string) => (u: { position: number; holder: { owner?: string } | null }) => seen[name]!.push([u.position, u.holder?.owner]);
    const gone = new AbortController();
    void locks.acquire({ file: "/project/a", owner: "gone", waitMs: 9000, signal: gone.signal }).catch(() => {});
    const b = locks.acquire({ file: "/project/a", owner: "bob", waitMs: 9000, onWaiting: record("b") });
    const c = locks.acquire({ file: "/project/a", owner: "carol", waitMs: 9000, onWaiting: record("c") });
    expect(seen).toEqual({ b: [[2, "alice"]], c: [[3, "alice"]] });
    gone.abort();
    expect(seen).toEqual({
      b: [
        [2, "alice"],
        [1, "alice"],
      ],
      c: [
        [3, "alice"],
        [2, "alice"],
      ],
    });
    locks.release(first.leaseToken);
    const bob = await b;
    // bob was granted (no more reports to him); carol moved up and sees the new holder.
    expect(seen).toEqual({
      b: [
        [2, "alice"],
        [1, "alice"],
      ],
      c: [
        [3, "alice"],
        [2, "alice"],
        [1, "bob"],
      ],
    });
    locks.release(bob.leaseToken);
    await c;
    expect(seen.c).toHaveLength(3);
  });
});

describe("inspect", () => {
  it("shows the holder, the waiters in order and the last fencing token", async () => {
    const { clock, locks } = table();
    expect(locks.inspect("/project/src/a.ts")).toEqual({ file: "/project/src/a.ts", lockPath: null, holder: null, waiters: [], lastFencingToken: null });
    const lease = await locks.acquire({ file: "/project/src/a.ts", owner: "alice", ttlMs: 10_000 });
    const t0 = clock.now();
    clock.advance(10);
    const bob = locks.acquire({ file: "/project/src/a.ts", owner: "bob", waitMs: 5000 });
    clock.advance(10);
    const carol = locks.holdAsLongAs({ file: "/project/src/a.ts", owner: "carol", waitMs: 1000, signal: new AbortController().signal });
    expect(locks.inspect("/project/src/a.ts")).toEqual({
      file: "/project/src/a.ts",
      lockPath: null,
      holder: { kind: "lease", owner: "alice", fencingToken: 1, since: t0, expiresAt: t0 + 10_000 },
      waiters: [
        { kind: "lease", owner: "bob", since: t0 + 10, deadline: t0 + 5010 },
        { kind: "stream", owner: "carol", since: t0 + 20, deadline: t0 + 1020 },
      ],
      lastFencingToken: 1,
    });
    clock.advance(1000);
    await expect(carol).rejects.toMatchObject({ code: "resource_exhausted", reason: "WAIT_EXHAUSTED" });
    locks.release(lease.leaseToken);
    await bob;
    expect(locks.stats()).toEqual({ held: 1, waiting: 0, blockedByLockFiles: 0 });
  });

  it("shows a waiter's start and end exactly its wait apart, however the clocks move between readings", async () => {
    const { locks } = table(new DriftingClock());
    await locks.acquire({ file: "/project/a", owner: "holder" });
    const waiting = [20_000, 7_777].map((waitMs) => locks.acquire({ file: "/project/a", owner: `w${waitMs}`, waitMs }).catch(() => undefined));
    for (let i = 0; i < 5; i++) {
      expect(locks.inspect("/project/a").waiters.map((w) => w.deadline - w.since)).toEqual([20_000, 7_777]);
    }
    locks.close();
    await Promise.all(waiting);
  });
});

describe("input", () => {
  it.each([
    [{ file: "", owner: "o" }, /^file: is required/],
    [{ file: "a\0b", owner: "o" }, /^file: must not contain a NUL/],
    [{ file: "x".repeat(4097), owner: "o" }, /^file: must be at most 4096 bytes/],
    [{ file: "src/a.ts", owner: "o" }, /^file: must be an absolute path; resolve it against your working directory before sending, got "src\/a\.ts"$/],
    [{ file: "./a", owner: "o" }, /^file: must be an absolute path/],
    [{ file: "/project/a", owner: "" }, /^owner: is required/],
    [{ file: "/project/a", owner: "o".repeat(257) }, /^owner: must be at most 256/],
    [{ file: "/project/a", owner: "o", ttlMs: -1 }, /^ttl: must be at least 1ms, got -1ms$/],
    [{ file: "/project/a", owner: "o", ttlMs: Number.NaN }, /^ttl: must be a finite duration/],
    [{ file: "/project/a", owner: "o", ttlMs: 3_600_001 }, /^ttl: must be at most 1h \(the longest lease\), got 1h 0\.001s$/],
    [{ file: "/project/a", owner: "o", waitMs: -5 }, /^max_wait: must not be negative/],
    [{ file: "/project/a", owner: "o", waitMs: Number.NaN }, /^max_wait: must be a finite duration/],
  ])("refuses %#", async (request, message) => {
    const { locks } = table();
    const error = await berthRefusal(locks.acquire(request));
    expect(error.code).toBe("invalid_argument");
    expect(error.message).toMatch(message);
    expect(locks.stats()).toEqual({ held: 0, waiting: 0, blockedByLockFiles: 0 });
  });

  it("refuses bad paths and tokens in inspect and checkToken too", () => {
    const { locks } = table();
    expect(() => locks.inspect("a\0")).toThrow(/^file: /);
    expect(() => locks.checkToken("/project/a", 0)).toThrow(/^fencing_token: /);
    expect(() => locks.checkToken("/project/a", 1.5)).toThrow(/^fencing_token: /);
    expect(locks.checkToken("/project/a", 7n)).toEqual({ file: "/project/a", current: false, currentToken: null });
  });
});

describe("close", () => {
  it("rejects waiters with unavailable, frees leases and refuses new requests", async () => {
    const { clock, locks } = table();
    await locks.acquire({ file: "/project/a", owner: "h", ttlMs: 1000 });
    const waiting = berthRefusal(locks.acquire({ file: "/project/a", owner: "w", waitMs: 5000 }));
    locks.close();
    expect((await waiting).code).toBe("unavailable");
    expect(clock.pendingTimers()).toBe(0);
    expect((await berthRefusal(locks.acquire({ file: "/project/a", owner: "x" }))).code).toBe("unavailable");
  });
});
