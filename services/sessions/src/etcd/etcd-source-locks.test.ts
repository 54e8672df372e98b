// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import type { Lease } from "../locks/source-locks-api.js";
import { EtcdLocks } from "./etcd-locks.js";
import { createEtcdSourceLocks, type EtcdSourceLocks } from "./etcd-source-locks.js";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";

let etcd: EtcdCluster;
const clients: EtcdClient[] = [];
const opened: EtcdSourceLocks[] = [];
let prefixes = 0;

beforeAll(async () => {
  etcd = await startEtcd({ electionTimeoutMs: 500 });
});
afterAll(async () => {
  await Promise.allSettled(opened.map((locks) => locks.close()));
  for (const c of clients) c.close();
  await etcd?.stop();
});

/**
 * `count` berth instances' source locks on one fresh prefix, their leases and request ids on a
 * manual clock (etcd's own leases and watches run in real time).
 */
function instances(count: number, windowMs = 60_000) {
  const prefix = `sl${++prefixes}/`;
  const clock = new ManualClock();
  const locks = Array.from({ length: count }, (_, i) => {
    const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
    clients.push(client);
    const source = createEtcdSourceLocks({
      locks: new EtcdLocks({ client, instance: `berth-${i}` }),
      leaseTtlSeconds: 5,
      clock,
      limits: { idempotencyWindowMs: windowMs },
    });
    opened.push(source);
    return source;
  });
  return { clock, locks };
}

const FILE = "/work/src/main.ts";

/** Resolves once `locks` shows `count` waiters on FILE. */
async function waiters(locks: EtcdSourceLocks, count: number): Promise<void> {
  const end = Date.now() + 5000;
  while ((await locks.inspect(FILE)).waiters.length !== count) {
    if (Date.now() > end) throw new Error(`never ${count} waiters`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

describe("request ids on etcd", () => {
  it("a repeat answers the first lease while it lives and after it ended, for the window; the id for another request is REUSED", async () => {
    const { clock, locks } = instances(1);
    const [a] = locks;
    const first = await a!.acquire({ file: FILE, owner: "alice", ttlMs: 20_000, requestId: "r-1" });
    expect(await a!.acquire({ file: "/work/src/./main.ts", owner: "alice", ttlMs: 20_000, waitMs: 0, requestId: "r-1" })).toEqual(first);
    for (const other of [
      a!.acquire({ file: "/work/src/other.ts", owner: "alice", ttlMs: 20_000, requestId: "r-1" }),
      a!.acquire({ file: FILE, owner: "bob", ttlMs: 20_000, requestId: "r-1" }),
      a!.acquire({ file: FILE, owner: "alice", requestId: "r-1" }),
      Promise.resolve(a!.release(first.leaseToken, "r-1")),
    ].map(berthRefusal)) {
      // Each refusal is listened for from the start: a later one may come while an earlier is awaited.
      const error = await other;
      expect([error.code, error.reason, error.details]).toEqual([
        "already_exists",
        "IDEMPOTENCY_KEY_REUSED",
        { requestId: "r-1", rpc: "Acquire", file: FILE, owner: "alice", fencingToken: first.fencingToken },
      ]);
    }
    expect(await a!.release(first.leaseToken, "rel-1")).toBe(true);
    expect(await a!.release(first.leaseToken, "rel-1")).toBe(true);
    expect((await a!.inspect(FILE)).holder).toBeNull();
    // Released: the repeat is answered the first lease, which no longer renews.
    expect(await a!.acquire({ file: FILE, owner: "alice", ttlMs: 20_000, requestId: "r-1" })).toEqual(first);
    expect(() => a!.renew(first.leaseToken)).toThrow(expect.objectContaining({ code: "failed_precondition" }));
    expect((await a!.inspect(FILE)).holder).toBeNull();
    // The window closes: the id is a new request.
    clock.advance(60_000);
    const anew = await a!.acquire({ file: FILE, owner: "alice", ttlMs: 5_000, requestId: "r-1" });
    expect(anew.fencingToken).toBeGreaterThan(first.fencingToken);
    await a!.release(anew.leaseToken);
  });

  it("a repeat while the first call waits joins its one waiter key: each call gives up on its own wait or signal, the place goes with the last", async () => {
    const { clock, locks } = instances(1);
    const [a] = locks;
    const holder = await a!.acquire({ file: FILE, owner: "holder" });
    const gone = new AbortController();
    // Queued in etcd is not yet placed: the call learns its place and the holder when etcd's answer comes back.
    let placed!: () => void;
    const queued = new Promise<void>((resolve) => (placed = resolve));
    const onWaiting = (update: { holder: unknown }) => update.holder !== null && placed();
    const first = berthRefusal(a!.acquire({ file: FILE, owner: "alice", waitMs: 60_000, signal: gone.signal, requestId: "r-2", onWaiting }));
    await queued;
    const short = berthRefusal(a!.acquire({ file: FILE, owner: "alice", waitMs: 1_000, requestId: "r-2" }));
    const patient = a!.acquire({ file: FILE, owner: "alice", waitMs: 120_000, requestId: "r-2" });
    // A repeat that will not wait answers at once, naming the holder.
    const once = await berthRefusal(a!.acquire({ file: FILE, owner: "alice", waitMs: 0, requestId: "r-2" }));
    expect([once.reason, once.details?.owner, once.details?.waiting]).toEqual(["WAIT_EXHAUSTED", "holder", 1]);
    gone.abort();
    expect((await first).code).toBe("cancelled");
    clock.advance(1_000);
    const exhausted = await short;
    expect([exhausted.reason, exhausted.details?.owner, exhausted.details?.waitedMs]).toEqual(["WAIT_EXHAUSTED", "holder", 1_000]);
    expect((await a!.inspect(FILE)).waiters.map((w) => w.owner)).toEqual(["alice"]);
    await a!.release(holder.leaseToken);
    const granted: Lease = await patient;
    expect(granted.owner).toBe("alice");
    expect(await a!.acquire({ file: FILE, owner: "alice", waitMs: 0, requestId: "r-2" })).toEqual(granted);
    await a!.release(granted.leaseToken);

    // Every call gone: the waiter key goes, and a later call with the id is a new request.
    const other = await a!.acquire({ file: FILE, owner: "other" });
    const lone = new AbortController();
    const dropped = berthRefusal(a!.acquire({ file: FILE, owner: "alice", waitMs: 60_000, signal: lone.signal, requestId: "r-3" }));
    await waiters(a!, 1);
    lone.abort();
    expect((await dropped).code).toBe("cancelled");
    await waiters(a!, 0);
    const retried = a!.acquire({ file: FILE, owner: "alice", ttlMs: 7_000, waitMs: 60_000, requestId: "r-3" });
    await waiters(a!, 1);
    await a!.release(other.leaseToken);
    expect((await retried).ttlMs).toBe(7_000);
  });

  it("a repeat through another instance is another request there: it queues behind the first call's grant", async () => {
    const { locks } = instances(2);
    const [a, b] = locks;
    const first = await a!.acquire({ file: FILE, owner: "alice", requestId: "r-4" });
    const elsewhere = await berthRefusal(b!.acquire({ file: FILE, owner: "alice", waitMs: 0, requestId: "r-4" }));
    expect([elsewhere.reason, elsewhere.details?.owner, elsewhere.details?.fencingToken]).toEqual(["WAIT_EXHAUSTED", "alice", first.fencingToken]);
    // Through the instance that took it: the first answer.
    expect(await a!.acquire({ file: FILE, owner: "alice", waitMs: 0, requestId: "r-4" })).toEqual(first);
    await a!.release(first.leaseToken);
  });
});
