import { describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { DriftingClock } from "@berth/shared/testing/drifting-clock";
import type { Lease } from "./source-locks-api.js";
import { table } from "./testing/lock-table-fixture.js";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";

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
    ].map(berthRefusal);
    for (const other of others) {
      const error = await other;
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
