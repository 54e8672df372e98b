import { describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { LockTable } from "./lock-table.js";
import { counter, table } from "./testing/lock-table-fixture.js";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";

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
