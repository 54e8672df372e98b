import { describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { onDescriptorShortage } from "@berth/shared/descriptors";
import { DriftingClock } from "@berth/shared/testing/drifting-clock";
import { LOCK_RETRY_AFTER_MS } from "./lock-input.js";
import type { ExternalLocks } from "./external-locks.js";
import { LockTable, type LockTableOptions } from "./lock-table.js";
import type { Lease } from "./source-locks-api.js";
import { createMemoryExternalLocks } from "./testing/memory-external-locks.js";
import { createMemoryLockPersistence } from "./testing/memory-lock-persistence.js";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";

function counter() {
  return createMemoryLockPersistence();
}

function table(clock = new ManualClock(), options: Pick<LockTableOptions, "limits" | "maxEndedKeys"> = {}) {
  return { clock, locks: new LockTable({ clock, fencing: counter(), ...options }) };
}

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

describe("request ids", () => {
  it("a repeat answers the lease's end as the same wall time, however the two clocks drift between the calls", async () => {
    // The clocks move a fraction of a millisecond apart at every reading, as real ones do: a lease
    // end converted afresh for the repeat would land a millisecond off the first answer.
    const { locks } = table(new DriftingClock());
    const first = await locks.acquire({ file: "/project/a", owner: "alice", ttlMs: 20_000, requestId: "r-1" });
    const repeat = () => locks.acquire({ file: "/project/a", owner: "alice", ttlMs: 20_000, waitMs: 0, requestId: "r-1" });
    for (let i = 0; i < 5; i++) expect(await repeat()).toEqual(first);
    // A renewal moves the end, shown afresh in its own answer; a repeat still answers the first answer.
    const renewed = locks.renew(first.leaseToken, 20_000);
    expect(renewed.expiresAt).toBeGreaterThan(first.expiresAt!);
    expect(await repeat()).toEqual(first);
    locks.close();
  });

  it("a repeat answers the first lease, identical, while it lives and after it ended (released, expired) for the window; then the id runs anew", async () => {
    const { clock, locks } = table(new ManualClock(), { limits: { idempotencyWindowMs: 60_000 } });
    const first = await locks.acquire({ file: "/project/a", owner: "alice", requestId: "r-1" });
    clock.advance(400);
    // Another spelling of the file is the same request; the default ttl spelt out is the same too.
    const repeat = await locks.acquire({ file: "/project/./a", owner: "alice", ttlMs: 30_000, waitMs: 0, requestId: "r-1" });
    expect(repeat).toEqual(first);
    expect(locks.stats()).toEqual({ held: 1, waiting: 0, blockedByLockFiles: 0 });
    expect(locks.release(first.leaseToken)).toBe(true);
    // Released: the repeat is answered the first answer, and granted nothing; its renewal finds it gone.
    expect(await locks.acquire({ file: "/project/a", owner: "alice", requestId: "r-1" })).toEqual(first);
    expect(locks.stats().held).toBe(0);
    expect(() => locks.renew(first.leaseToken)).toThrow(expect.objectContaining({ code: "failed_precondition" }));
    // Expired: the same.
    const second = await locks.acquire({ file: "/project/a", owner: "alice", requestId: "r-2" });
    clock.advance(30_000);
    expect(locks.stats().held).toBe(0);
    expect(await locks.acquire({ file: "/project/a", owner: "alice", waitMs: 0, requestId: "r-2" })).toEqual(second);
    expect(locks.keyStats()).toEqual({ live: 0, ended: 2 });
    // The window closes 60 s after each ended (on the monotonic clock): the id is a new request then.
    clock.advance(29_999);
    expect(await locks.acquire({ file: "/project/a", owner: "alice", waitMs: 0, requestId: "r-1" })).toEqual(first);
    clock.advance(1);
    const anew = await locks.acquire({ file: "/project/a", owner: "alice", ttlMs: 5000, requestId: "r-1" });
    expect(anew.fencingToken).toBeGreaterThan(second.fencingToken);
    expect(locks.keyStats()).toEqual({ live: 1, ended: 1 });
  });

  it("the id of an Acquire used for another file, owner or ttl, or for a Release, is ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED: nothing queued, nothing released", async () => {
    const { locks } = table();
    const first = await locks.acquire({ file: "/project/a", owner: "alice", ttlMs: 1000, requestId: "r-1" });
    const others = [
      locks.acquire({ file: "/project/b", owner: "alice", ttlMs: 1000, requestId: "r-1" }),
      locks.acquire({ file: "/project/a", owner: "bob", ttlMs: 1000, requestId: "r-1" }),
      locks.acquire({ file: "/project/a", owner: "alice", ttlMs: 2000, requestId: "r-1" }),
      locks.acquire({ file: "/project/a", owner: "alice", requestId: "r-1" }),
      Promise.resolve().then(() => locks.release(first.leaseToken, "r-1")),
    ];
    for (const other of others) {
      const error = await berthRefusal(other);
      expect([error.code, error.reason]).toEqual(["already_exists", "IDEMPOTENCY_KEY_REUSED"]);
      expect(error.details).toEqual({ requestId: "r-1", rpc: "Acquire", file: "/project/a", owner: "alice", fencingToken: first.fencingToken });
    }
    expect(locks.stats()).toEqual({ held: 1, waiting: 0, blockedByLockFiles: 0 });
    expect(locks.inspect("/project/b").holder).toBeNull();
    // Also while the first call still waits: the refusal names the request it waits for.
    const waiting = locks.acquire({ file: "/project/a", owner: "bob", waitMs: 10_000, requestId: "r-2" });
    const other = await berthRefusal(locks.acquire({ file: "/project/c", owner: "bob", waitMs: 10_000, requestId: "r-2" }));
    expect(other.details).toEqual({ requestId: "r-2", rpc: "Acquire", file: "/project/a", owner: "bob" });
    expect(locks.inspect("/project/a").waiters.map((w) => w.owner)).toEqual(["bob"]);
    locks.release(first.leaseToken);
    expect((await waiting).owner).toBe("bob");
  });

  it("a Release with a request id: a repeat answers the first answer for the window, the id for another lease is REUSED", async () => {
    const { clock, locks } = table(new ManualClock(), { limits: { idempotencyWindowMs: 60_000 } });
    const a = await locks.acquire({ file: "/project/a", owner: "alice" });
    const b = await locks.acquire({ file: "/project/b", owner: "alice", ttlMs: 120_000 });
    expect(locks.release(a.leaseToken, "rel-1")).toBe(true);
    expect(locks.release(a.leaseToken, "rel-1")).toBe(true);
    const reused = await berthRefusal(Promise.resolve().then(() => locks.release(b.leaseToken, "rel-1")));
    expect([reused.code, reused.reason, reused.details]).toEqual([
      "already_exists",
      "IDEMPOTENCY_KEY_REUSED",
      { requestId: "rel-1", rpc: "Release", file: "/project/a", fencingToken: a.fencingToken },
    ]);
    expect(locks.stats().held).toBe(1);
    // An Acquire with a Release's id is another request too.
    await expect(locks.acquire({ file: "/project/c", owner: "alice", requestId: "rel-1" })).rejects.toMatchObject({ reason: "IDEMPOTENCY_KEY_REUSED" });
    // A release that found nothing answers false, and so does its repeat; without an id nothing is remembered.
    expect(locks.release(a.leaseToken, "rel-2")).toBe(false);
    expect(locks.release(a.leaseToken, "rel-2")).toBe(false);
    clock.advance(60_000);
    expect(locks.release(b.leaseToken, "rel-1")).toBe(true);
    expect(locks.keyStats()).toEqual({ live: 0, ended: 1 });
  });

  it("remembers at most maxEndedKeys ended ids, the oldest forgotten first", async () => {
    const { locks } = table(new ManualClock(), { maxEndedKeys: 2 });
    const leases: Lease[] = [];
    for (const id of ["k0", "k1", "k2"]) {
      leases.push(await locks.acquire({ file: `/project/${id}`, owner: "o", requestId: id }));
      locks.release(leases.at(-1)!.leaseToken);
    }
    expect(locks.keyStats()).toEqual({ live: 0, ended: 2 });
    expect(await locks.acquire({ file: "/project/k2", owner: "o", requestId: "k2" })).toEqual(leases[2]);
    // k0 was forgotten: a new request, granted anew.
    expect((await locks.acquire({ file: "/project/k0", owner: "o", requestId: "k0" })).fencingToken).toBeGreaterThan(leases[2]!.fencingToken);
  });

  it("a repeat while the first call waits joins it: one place in the queue, one lease for both", async () => {
    const { clock, locks } = table();
    const holder = await locks.acquire({ file: "/project/a", owner: "h" });
    const first = locks.acquire({ file: "/project/a", owner: "alice", waitMs: 10_000, requestId: "r-1" });
    const behind = locks.acquire({ file: "/project/a", owner: "bob", waitMs: 10_000 });
    clock.advance(100);
    const repeat = locks.acquire({ file: "/project/a", owner: "alice", waitMs: 20_000, requestId: "r-1" });
    expect(locks.inspect("/project/a").waiters.map((w) => [w.owner, w.deadline - clock.now()])).toEqual([
      ["alice", 20_000],
      ["bob", 9_900],
    ]);
    // A repeat that will not wait answers at once, and leaves the first one's place alone.
    const once = await berthRefusal(locks.acquire({ file: "/project/a", owner: "alice", waitMs: 0, requestId: "r-1" }));
    expect([once.reason, once.details?.waiting]).toEqual(["WAIT_EXHAUSTED", 0]);
    locks.release(holder.leaseToken);
    const [a, b] = await Promise.all([first, repeat]);
    expect(b).toEqual(a);
    expect(a.owner).toBe("alice");
    expect(locks.stats()).toEqual({ held: 1, waiting: 1, blockedByLockFiles: 0 });
    locks.release(a.leaseToken);
    expect((await behind).owner).toBe("bob");
  });

  it("the place stays while any call waits on it: each call gives up on its own wait or signal", async () => {
    const { clock, locks } = table();
    const holder = await locks.acquire({ file: "/project/a", owner: "h" });
    const gone = new AbortController();
    const first = berthRefusal(locks.acquire({ file: "/project/a", owner: "alice", waitMs: 1_000, signal: gone.signal, requestId: "r-1" }));
    const short = berthRefusal(locks.acquire({ file: "/project/a", owner: "alice", waitMs: 500, requestId: "r-1" }));
    const patient = locks.acquire({ file: "/project/a", owner: "alice", waitMs: 5_000, requestId: "r-1" });
    gone.abort();
    expect((await first).code).toBe("cancelled");
    clock.advance(500);
    expect((await short).reason).toBe("WAIT_EXHAUSTED");
    expect(locks.inspect("/project/a").waiters.map((w) => w.owner)).toEqual(["alice"]);
    locks.release(holder.leaseToken);
    expect((await patient).owner).toBe("alice");
  });

  it("a place whose every call went is dropped, and its id forgotten", async () => {
    const { clock, locks } = table();
    const holder = await locks.acquire({ file: "/project/a", owner: "h" });
    const first = berthRefusal(locks.acquire({ file: "/project/a", owner: "alice", waitMs: 1_000, requestId: "r-1" }));
    clock.advance(1_000);
    expect((await first).reason).toBe("WAIT_EXHAUSTED");
    expect(locks.inspect("/project/a").waiters).toEqual([]);
    // A later call with the id is a new request, at the back of the queue.
    const bob = locks.acquire({ file: "/project/a", owner: "bob", waitMs: 5_000 });
    const later = locks.acquire({ file: "/project/a", owner: "alice", waitMs: 5_000, requestId: "r-1" });
    expect(locks.inspect("/project/a").waiters.map((w) => w.owner)).toEqual(["bob", "alice"]);
    locks.release(holder.leaseToken);
    locks.release((await bob).leaseToken);
    expect((await later).owner).toBe("alice");
    expect(clock.pendingTimers()).toBe(1); // alice's lease only
  });

  it("refuses a malformed id with invalid_argument naming request_id, and queues nothing", async () => {
    const { locks } = table();
    const error = await berthRefusal(locks.acquire({ file: "/project/a", owner: "o", requestId: "not an id" }));
    expect(error.code).toBe("invalid_argument");
    expect(error.message).toMatch(/^request_id: must match \[A-Za-z0-9._-\]\{1,128\}/);
    expect(locks.stats()).toEqual({ held: 0, waiting: 0, blockedByLockFiles: 0 });
  });
});

describe("leases", () => {
  it("an expired lease frees the lock and the next waiter gets it", async () => {
    const { clock, locks } = table();
    const first = await locks.acquire({ file: "/project/a", owner: "alice", ttlMs: 1000 });
    const next = locks.acquire({ file: "/project/a", owner: "bob", waitMs: 10_000 });
    clock.advance(999);
    expect(locks.inspect("/project/a").holder).toMatchObject({ owner: "alice" });
    clock.advance(1);
    const lease = await next;
    expect(lease).toMatchObject({ owner: "bob", acquiredAt: first.acquiredAt + 1000, fencingToken: 2 });
    expect(locks.checkToken("/project/a", first.fencingToken)).toEqual({ file: "/project/a", current: false, currentToken: 2 });
    // The late holder's release is a no-op and does not free bob's lock.
    expect(locks.release(first.leaseToken)).toBe(false);
    expect(locks.inspect("/project/a").holder).toMatchObject({ owner: "bob" });
    await expect(Promise.resolve().then(() => locks.renew(first.leaseToken))).rejects.toMatchObject({ code: "failed_precondition" });
  });

  it("renewing keeps the lease past its first expiry", async () => {
    const { clock, locks } = table();
    const lease = await locks.acquire({ file: "/project/a", owner: "alice", ttlMs: 1000 });
    clock.advance(900);
    expect(locks.renew(lease.leaseToken).expiresAt).toBe(clock.now() + 1000);
    clock.advance(900);
    expect(locks.renew(lease.leaseToken, 5000).expiresAt).toBe(clock.now() + 5000);
    clock.advance(4999);
    expect(locks.checkToken("/project/a", lease.fencingToken).current).toBe(true);
    clock.advance(1);
    expect(locks.checkToken("/project/a", lease.fencingToken).current).toBe(false);
    expect(() => locks.renew(lease.leaseToken)).toThrow(/expired at/);
  });

  it("takes ttl 0 (an unset Duration) as the default", async () => {
    const { locks } = table();
    expect((await locks.acquire({ file: "/project/a", owner: "o", ttlMs: 0 })).ttlMs).toBe(30_000);
  });

  it("tells an unknown lease from an ended one", async () => {
    const { locks } = table();
    expect(() => locks.renew("00000000-0000-0000-0000-000000000000")).toThrow(expect.objectContaining({ code: "not_found" }));
    const lease = await locks.acquire({ file: "/project/a", owner: "alice" });
    locks.release(lease.leaseToken);
    expect(() => locks.renew(lease.leaseToken)).toThrow(
      expect.objectContaining({ code: "failed_precondition", message: expect.stringContaining("was released") }),
    );
    expect(() => locks.renew("")).toThrow(expect.objectContaining({ code: "invalid_argument" }));
  });

  it("a stale release never frees a newer holder", async () => {
    const { locks } = table();
    const old = await locks.acquire({ file: "/project/a", owner: "alice" });
    expect(locks.release(old.leaseToken)).toBe(true);
    const current = await locks.acquire({ file: "/project/a", owner: "bob" });
    expect(locks.release(old.leaseToken)).toBe(false);
    expect(locks.release("not-a-lease-of-ours")).toBe(false);
    expect(locks.checkToken("/project/a", current.fencingToken).current).toBe(true);
  });

  it("serves an overdue expiry even before its timer fires", async () => {
    // A real clock's timer can be late (busy event loop); the lease must still end on time.
    const { clock, locks } = table();
    const first = await locks.acquire({ file: "/project/a", owner: "alice", ttlMs: 100 });
    const next = locks.acquire({ file: "/project/a", owner: "bob", waitMs: 10_000 });
    clock.stall(100);
    // The expiry is served at once; the hand-off waits until the I/O the stall left has been read.
    expect(locks.checkToken("/project/a", first.fencingToken)).toMatchObject({ current: false, currentToken: null });
    clock.ioRead();
    expect(locks.checkToken("/project/a", first.fencingToken)).toMatchObject({ current: false, currentToken: 2 });
    expect((await next).owner).toBe("bob");
  });

  it("after a pause: leases that ran out expire once, in order; a waiter whose client left meanwhile is never granted", async () => {
    const clock = new ManualClock();
    const ended: string[] = [];
    const logger = {
      debug() {},
      info: (fields: object, message?: string) => void ended.push(`${(fields as { owner: string }).owner} ${message}`),
      warn() {},
      error() {},
    };
    const locks = new LockTable({ clock, fencing: counter(), logger });
    await locks.acquire({ file: "/a", owner: "holder-a", ttlMs: 1000 });
    await locks.acquire({ file: "/b", owner: "holder-b", ttlMs: 2000 });
    const left = new AbortController();
    const gone = berthRefusal(locks.acquire({ file: "/a", owner: "gone", waitMs: 120_000, signal: left.signal }));
    const nextA = locks.acquire({ file: "/a", owner: "next-a", waitMs: 120_000 });
    const nextB = locks.acquire({ file: "/b", owner: "next-b", waitMs: 120_000 });
    // Stopped for 30 s; on resuming, the overdue timers run before the sockets are read.
    clock.stall(30_000);
    clock.advance(0);
    expect(ended).toEqual(["holder-a lock expired", "holder-b lock expired"]);
    expect(locks.inspect("/a").holder).toBeNull();
    // Then the I/O: the first waiter's client had gone.
    left.abort();
    clock.ioRead();
    expect((await gone).code).toBe("cancelled");
    expect(await nextA).toMatchObject({ owner: "next-a", fencingToken: 3 });
    expect(await nextB).toMatchObject({ owner: "next-b", fencingToken: 4 });
    expect(ended).toHaveLength(2);
  });

  it("after a pause whose I/O is read before the timers run, the overdue leases still expire in the order their times came", async () => {
    const clock = new ManualClock();
    const ended: string[] = [];
    const logger = {
      debug() {},
      info: (fields: object, message?: string) => void ended.push(`${(fields as { owner: string }).owner} ${message}`),
      warn() {},
      error() {},
    };
    const locks = new LockTable({ clock, fencing: counter(), logger });
    await locks.acquire({ file: "/a", owner: "holder-a", ttlMs: 1000 });
    const b = await locks.acquire({ file: "/b", owner: "holder-b", ttlMs: 2000 });
    clock.stall(30_000);
    // holder-b's renewal is the first thing read: too late, and holder-a's lease ran out before it.
    expect(() => locks.renew(b.leaseToken)).toThrow(/expired at/);
    expect(ended).toEqual(["holder-a lock expired", "holder-b lock expired"]);
    clock.ioRead();
    clock.advance(0);
    expect(ended).toHaveLength(2);
    expect(clock.pendingTimers()).toBe(0);
  });
});

describe("the wall clock steps (NTP, a person setting the date)", () => {
  const HOUR = 3_600_000;

  it("a step back does not keep a dead holder's lease: it ends after its ttl, and the waiter gets the lock", async () => {
    const { clock, locks } = table();
    const dead = await locks.acquire({ file: "/project/a", owner: "dead", ttlMs: 1000 });
    const next = locks.acquire({ file: "/project/a", owner: "next", waitMs: 10_000 });
    clock.stepWall(-HOUR);
    clock.advance(999);
    expect(locks.checkToken("/project/a", dead.fencingToken).current).toBe(true);
    clock.advance(1);
    expect(await next).toMatchObject({ owner: "next", fencingToken: 2 });
    expect(() => locks.renew(dead.leaseToken)).toThrow(/expired at/);
  });

  it("a step forward does not cut a live holder's lease short, read or timer", async () => {
    const { clock, locks } = table();
    const live = await locks.acquire({ file: "/project/a", owner: "live", ttlMs: 1000 });
    const behind = locks.acquire({ file: "/project/a", owner: "behind", waitMs: 5000 });
    clock.stepWall(HOUR);
    expect(locks.checkToken("/project/a", live.fencingToken).current).toBe(true);
    clock.advance(500);
    // Renewed from now on the monotonic clock; shown in the wall time of this answer.
    expect(locks.renew(live.leaseToken).expiresAt).toBe(clock.now() + 1000);
    clock.advance(999);
    expect(locks.inspect("/project/a").holder).toMatchObject({ owner: "live", expiresAt: clock.now() + 1 });
    expect(locks.inspect("/project/a").waiters.map((w) => w.owner)).toEqual(["behind"]);
    locks.release(live.leaseToken);
    expect(await behind).toMatchObject({ owner: "behind", fencingToken: 2 });
  });

  it("a waiter's wait runs for its length whichever way the wall clock steps", async () => {
    for (const step of [-HOUR, HOUR]) {
      const { clock, locks } = table();
      const holder = await locks.acquire({ file: "/project/a", owner: "holder", ttlMs: 60_000 });
      let settled = false;
      const waiter = berthRefusal(locks.acquire({ file: "/project/a", owner: "waiter", waitMs: 5000 })).finally(() => (settled = true));
      clock.stepWall(step);
      // Both shown in the stepped wall clock, as of the answer: it has waited nothing yet, 5 s to go.
      expect(locks.inspect("/project/a").waiters).toEqual([{ kind: "lease", owner: "waiter", since: clock.now(), deadline: clock.now() + 5000 }]);
      clock.advance(4999);
      await Promise.resolve();
      expect(settled).toBe(false);
      clock.advance(1);
      expect((await waiter).message).toContain("for the whole wait of 5s");
      locks.release(holder.leaseToken);
      expect(clock.pendingTimers()).toBe(0);
    }
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

describe("whenLeaseEnds", () => {
  it("tells once, however the lease ends, how it ended, and at once for a lease that is not held", async () => {
    const { clock, locks } = table();
    const ends: string[] = [];
    const leased = await locks.acquire({ file: "/project/a", owner: "leased", ttlMs: 1000 });
    locks.whenLeaseEnds(leased.leaseToken, (how) => ends.push(`leased ${how}`));
    const unsubscribed = locks.whenLeaseEnds(leased.leaseToken, () => ends.push("unsubscribed"));
    unsubscribed();
    clock.advance(1000);
    expect(ends).toEqual(["leased expired"]);

    const stream = new AbortController();
    const held = await locks.holdAsLongAs({ file: "/project/b", owner: "hold", signal: stream.signal });
    locks.whenLeaseEnds(held.leaseToken, (how) => ends.push(`held ${how}`));
    expect(locks.release(held.leaseToken)).toBe(true);
    stream.abort();
    locks.whenLeaseEnds(held.leaseToken, (how) => ends.push(`already ${how}`));
    expect(ends).toEqual(["leased expired", "held released", "already released"]);

    const closing = await locks.holdAsLongAs({ file: "/project/c", owner: "hold", signal: new AbortController().signal });
    locks.whenLeaseEnds(closing.leaseToken, (how) => ends.push(`closing ${how}`));
    locks.close();
    expect(ends.at(-1)).toBe("closing closed");
  });
});

describe("holdAsLongAs", () => {
  it("holds without a lease timer and releases the moment the signal aborts", async () => {
    const { clock, locks } = table();
    const stream = new AbortController();
    const lease = await locks.holdAsLongAs({ file: "/project/a", owner: "hold", signal: stream.signal });
    expect(lease.expiresAt).toBeNull();
    const next = locks.acquire({ file: "/project/a", owner: "next", waitMs: 100_000 });
    clock.advance(99_000);
    expect(locks.inspect("/project/a").holder).toMatchObject({ kind: "stream", owner: "hold", expiresAt: null });
    stream.abort();
    expect((await next).owner).toBe("next");
  });

  it("a queued hold whose stream ends is dropped", async () => {
    const { locks } = table();
    const holder = await locks.acquire({ file: "/project/a", owner: "h" });
    const stream = new AbortController();
    const hold = berthRefusal(locks.holdAsLongAs({ file: "/project/a", owner: "hold", waitMs: 1000, signal: stream.signal }));
    stream.abort();
    expect((await hold).code).toBe("cancelled");
    locks.release(holder.leaseToken);
    expect(locks.inspect("/project/a").holder).toBeNull();
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

describe("a lock an outside process holds", () => {
  it("queues berth's requests behind it and hands the lock to the first the moment it is freed", async () => {
    const clock = new ManualClock();
    const external = createMemoryExternalLocks();
    const locks = new LockTable({ clock, fencing: counter(), external });
    expect(external.holdOutside("/project/a", { owner: "seed", pid: 7, since: clock.now() })).toBe(true);
    const first = locks.acquire({ file: "/project/a", owner: "first", waitMs: 10_000 });
    const second = locks.acquire({ file: "/project/a", owner: "second", waitMs: 10_000 });
    expect(locks.inspect("/project/a").holder).toMatchObject({ kind: "seed-file", owner: "seed", pid: 7, lockFile: "memory:/project/a" });
    expect(locks.stats()).toEqual({ held: 0, waiting: 2, blockedByLockFiles: 1 });
    external.freeOutside("/project/a");
    const lease = await first;
    expect(lease).toMatchObject({ owner: "first", fencingToken: 1 });
    expect(external.claimedByBerth()).toEqual(["/project/a"]);
    // A handoff between berth's own holders: the next one takes the outside lock in turn.
    locks.release(lease.leaseToken);
    expect(await second).toMatchObject({ owner: "second", fencingToken: 2 });
    expect(external.holdOutside("/project/a", { owner: "seed", pid: 7, since: clock.now() })).toBe(false);
  });
});

describe("an outside lock that cannot be taken", () => {
  it("refuses a direct request with unavailable; a queued one is retried on the next re-check", async () => {
    const clock = new ManualClock();
    let failing = true;
    let failure: Error = Object.assign(new Error("EACCES: permission denied"), { code: "EACCES" });
    let recheck: (() => void) | undefined;
    const external: ExternalLocks = {
      claim(key) {
        if (failing) throw failure;
        return { ok: true, handle: { key, lockFile: `/locks/${key}`, token: "t", pid: 42 } };
      },
      release() {},
      peek: () => undefined,
      pathFor: (key) => `/locks${key}`,
      watch(_key, onMaybeFree) {
        recheck = onMaybeFree;
        return () => (recheck = undefined);
      },
    };
    const locks = new LockTable({ clock, fencing: counter(), external });
    const error = await berthRefusal(locks.acquire({ file: "/project/a", owner: "o", waitMs: 1000 }));
    expect(error.code).toBe("unavailable");
    expect(error.reason).toBe("STATE_READ_ONLY");
    expect(error.message).toBe(
      "no lock was granted: cannot take the lock file /locks/project/a for /project/a: the state directory /locks/project is not writable (EACCES); make it writable again (remount it read-write, fix its owner or mode) and retry",
    );
    // A failure that is none of the machine's known faults: unavailable, to be retried.
    failure = Object.assign(new Error("EIO: i/o error"), { code: "EIO" });
    const other = await berthRefusal(locks.acquire({ file: "/project/a", owner: "o", waitMs: 1000 }));
    expect([other.code, other.reason, other.options.retryAfterMs]).toEqual(["unavailable", "STORAGE_UNAVAILABLE", LOCK_RETRY_AFTER_MS]);
    expect(other.message).toBe("cannot take the lock file /locks/project/a for /project/a: EIO: i/o error");
    expect(locks.stats()).toEqual({ held: 0, waiting: 0, blockedByLockFiles: 0 });

    const held = await locks.acquire({ file: "/project/b", owner: "first", waitMs: 0 }).catch(() => undefined);
    expect(held).toBeUndefined();
    failing = false;
    const first = await locks.acquire({ file: "/project/b", owner: "first" });
    failing = true;
    const queued = locks.acquire({ file: "/project/b", owner: "second", waitMs: 5000 });
    locks.release(first.leaseToken);
    expect(locks.stats()).toEqual({ held: 0, waiting: 1, blockedByLockFiles: 1 });
    failing = false;
    recheck!();
    expect(await queued).toMatchObject({ owner: "second" });
    expect(locks.inspect("/project/b").holder).toMatchObject({ kind: "lease", owner: "second", pid: 42 });
  });

  it("a wait that runs out while the lock file cannot be read (no descriptor left) is still refused, naming what is known", async () => {
    const clock = new ManualClock();
    const holder = { lockFile: "/locks/project/a", owner: "seed", pid: 7, since: clock.now(), readable: true };
    const external: ExternalLocks = {
      claim: () => ({ ok: false, holder }),
      release() {},
      peek() {
        throw Object.assign(new Error("EMFILE: too many open files, open '/locks/project/a'"), { code: "EMFILE" });
      },
      pathFor: (key) => `/locks${key}`,
      watch: () => () => {},
    };
    const locks = new LockTable({ clock, fencing: counter(), external });
    const waiter = berthRefusal(locks.acquire({ file: "/project/a", owner: "o", waitMs: 1000 }));
    clock.advance(1000);
    const error = await waiter;
    expect([error.code, error.reason]).toEqual(["resource_exhausted", "WAIT_EXHAUSTED"]);
    expect(error.message).toMatch(/^source locked: \/project\/a is held by seed \(pid 7\) through its lock file/);
    expect(locks.stats().waiting).toBe(0);
  });

  it("a lock file refused a descriptor is made again once the idle descriptors are closed; refused again, the grant is RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES", async () => {
    let descriptors = 0;
    const unregister = onDescriptorShortage(() => {
      descriptors = 1;
      return 1;
    });
    try {
      const external: ExternalLocks = {
        claim(key) {
          if (descriptors === 0) throw Object.assign(new Error(`EMFILE: too many open files, open '/state/locks${key}'`), { code: "EMFILE" });
          descriptors--;
          return { ok: true, handle: { key, lockFile: `/state/locks${key}`, token: "t", pid: 42 } };
        },
        release() {},
        peek: () => undefined,
        pathFor: (key) => `/state/locks${key}`,
        watch: () => () => {},
      };
      const locks = new LockTable({ clock: new ManualClock(), fencing: counter(), external });
      expect((await locks.acquire({ file: "/project/a", owner: "o" })).fencingToken).toBe(1);
      unregister();
      const refused = await berthRefusal(locks.acquire({ file: "/project/b", owner: "o" }));
      expect(refused).toMatchObject({ code: "resource_exhausted", reason: "TOO_MANY_OPEN_FILES", options: { retryAfterMs: 1000 } });
    } finally {
      unregister();
    }
  });

  it("a queued request whose lock frees while its lock file cannot be made is refused with why, not as locked", async () => {
    const clock = new ManualClock();
    let full = false;
    const external: ExternalLocks = {
      claim(key) {
        if (full) throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" });
        return { ok: true, handle: { key, lockFile: `/state/locks${key}`, token: "t", pid: 42 } };
      },
      release() {},
      peek: () => undefined,
      pathFor: (key) => `/state/locks${key}`,
      watch: () => () => {},
    };
    const locks = new LockTable({ clock, fencing: counter(), external });
    const first = await locks.acquire({ file: "/a", owner: "first" });
    const queued = berthRefusal(locks.acquire({ file: "/a", owner: "second", waitMs: 5000 }));
    full = true;
    locks.release(first.leaseToken);
    clock.advance(5000);
    const error = await queued;
    expect(error).toMatchObject({ code: "resource_exhausted", reason: "DISK_FULL" });
    expect(error.message).toMatch(
      /^no lock was granted: cannot take the lock file \/state\/locks\/a for \/a: the file system of the state directory \/state\/locks is full \(ENOSPC\)/,
    );
    full = false;
    expect(await locks.acquire({ file: "/a", owner: "third" })).toMatchObject({ owner: "third" });
  });
});
