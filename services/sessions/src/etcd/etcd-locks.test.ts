// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createEtcdClient, type EtcdClient, type WatchBatch } from "@berth/etcd";
import { startEtcd, wrapClient, type EtcdCluster } from "@berth/etcd/testing";
import { EtcdLocks, type EtcdLockGrant, type EtcdLockRequest } from "./etcd-locks.js";
import { lockWaitersPrefix } from "./store-keys.js";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";

// One real etcd member with a 500 ms election timeout, so that its shortest lease is 1 s.
let etcd: EtcdCluster;
const clients: EtcdClient[] = [];
let prefixes = 0;

beforeAll(async () => {
  etcd = await startEtcd({ electionTimeoutMs: 500 });
});
afterAll(async () => {
  for (const c of clients) c.close();
  await etcd?.stop();
});

type Instance = ReturnType<typeof instances>[number];

/** `count` berth instances (a client and lock service each) on one fresh prefix. */
function instances(count: number) {
  const prefix = `l${++prefixes}/`;
  return Array.from({ length: count }, (_, i) => {
    const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
    clients.push(client);
    return { client, locks: new EtcdLocks({ client, instance: `berth-${i}` }) };
  });
}

const FILE = "/work/src/main.ts";
const request = (owner: string, extra: Partial<EtcdLockRequest> = {}): EtcdLockRequest => ({
  file: FILE,
  owner,
  kind: "stream",
  ttlSeconds: 5,
  waitMs: 30_000,
  ...extra,
});

/**
 * `client` whose transactions, once `hold()` is called, are recorded in `txns` and held back until
 * `open()`: a grant that resolves meanwhile waited for no transaction's answer.
 */
function gated(client: EtcdClient) {
  const txns: Array<Parameters<EtcdClient["txn"]>[0]> = [];
  let holding = false;
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  const wrapped = wrapClient(client, (method, call, args) => {
    if (!holding || method !== "txn") return call();
    txns.push(args[0] as Parameters<EtcdClient["txn"]>[0]);
    return opened.then(call);
  });
  return { client: wrapped, txns, hold: () => (holding = true), open };
}

/**
 * A lock held as "holder" through `holder`, and "next" queued behind it through `waiter`'s client,
 * gated (see {@link gated}).
 */
async function heldWithGatedWaiter(holder: Instance, waiter: Instance) {
  const waiterClient = gated(waiter.client);
  const held = await holder.locks.acquire(request("holder"));
  const wait = queued(request("next"));
  const granting = new EtcdLocks({ client: waiterClient.client, instance: "berth-gated" }).acquire(wait.request);
  await wait.waiting;
  return { held, granting, waiterClient };
}

/** Resolves with the queue position once `request` is waiting (its onWaiting was called). */
function queued(base: EtcdLockRequest): { request: EtcdLockRequest; waiting: Promise<number> } {
  let told!: (position: number) => void;
  const waiting = new Promise<number>((resolve) => (told = resolve));
  return { request: { ...base, onWaiting: (update) => told(update.position) }, waiting };
}

describe("one lock across instances", () => {
  it("blocks an Acquire through another instance while held, naming the holder, and hands over on release", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("agent-a"));
    const tried = await berthRefusal(b!.locks.acquire(request("agent-b", { waitMs: 0 })));
    expect(tried).toMatchObject({
      code: "resource_exhausted",
      reason: "WAIT_EXHAUSTED",
      details: { owner: "agent-a", fencingToken: Number(held.token), kind: "stream" },
    });
    // The refused try left no key behind.
    expect((await b!.locks.inspect(FILE)).waiters).toEqual([]);

    const wait = queued(request("agent-b"));
    const next = b!.locks.acquire(wait.request);
    expect(await wait.waiting).toBe(1);
    const seen = await a!.locks.inspect(FILE);
    expect(seen.holder).toMatchObject({ owner: "agent-a", token: held.token, instance: "berth-0" });
    expect(seen.waiters.map((w) => [w.owner, w.instance])).toEqual([["agent-b", "berth-1"]]);
    await held.release();
    const granted = await next;
    expect(granted.token).toBeGreaterThan(held.token);
    expect(await a!.locks.checkToken(FILE, granted.token)).toEqual({ current: true, currentToken: granted.token });
    expect(await a!.locks.checkToken(FILE, held.token)).toEqual({ current: false, currentToken: granted.token });
    await granted.release();
    expect(await a!.locks.inspect(FILE)).toMatchObject({ holder: null, waiters: [] });
  });

  it("hands over with no etcd call on the waiter's side once the holder's key goes, then records since when it holds in one transaction", async () => {
    const [a, b] = instances(2);
    const { held, granting, waiterClient } = await heldWithGatedWaiter(a!, b!);
    waiterClient.hold();
    const releasedAt = Date.now();
    await held.release();
    // Granted with its only transaction, the record, sent after it and held back: the grant waited for no call.
    const grant = await granting;
    await vi.waitFor(() => expect(waiterClient.txns).toHaveLength(1));
    expect(waiterClient.txns[0]!.compare).toEqual([{ key: grant.key, target: "create", op: "==", against: grant.token }]);
    expect(grant.acquiredAt).toBeGreaterThanOrEqual(releasedAt);
    // Inspect names it, and its token as the last granted, before the record lands.
    expect(await a!.locks.inspect(FILE)).toMatchObject({ holder: { owner: "next", token: grant.token }, lastToken: grant.token });
    waiterClient.open();
    await vi.waitFor(async () => expect((await a!.locks.inspect(FILE)).holder!.since).toBe(grant.acquiredAt));
    await grant.release();
  });

  it("releases a lock handed over only once its grant is recorded, so that its token outlives it", async () => {
    const [a, b] = instances(2);
    const { held, granting, waiterClient } = await heldWithGatedWaiter(a!, b!);
    waiterClient.hold();
    await held.release();
    const grant = await granting;
    const releasing = grant.release();
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect((await a!.locks.inspect(FILE)).holder).toMatchObject({ owner: "next", token: grant.token });
    waiterClient.open();
    await releasing;
    expect(await a!.locks.inspect(FILE)).toMatchObject({ holder: null, waiters: [], lastToken: grant.token });
  });

  it("ends a grant handed over whose key is gone before it is recorded: lost, and the lock moves on", async () => {
    const [a, b] = instances(2);
    const { held, granting, waiterClient } = await heldWithGatedWaiter(a!, b!);
    const last = queued(request("last"));
    const lastGrant = a!.locks.acquire(last.request);
    expect(await last.waiting).toBe(2);
    waiterClient.hold();
    await held.release();
    const grant = await granting;
    // Its key goes from outside (an operator's delete) while the record is held back.
    await a!.client.delete({ key: grant.key });
    // The next waiter's predecessor went without a record that it held: one transaction finds nobody older.
    const granted = await lastGrant;
    expect(granted.owner).toBe("last");
    waiterClient.open();
    expect(await grant.lease.lost).toMatchObject({ reason: "ETCD_LEASE_LOST" });
    expect(grant.signal.aborted).toBe(true);
    await granted.release();
  });

  it("hands a lock on down a queue of waiters with no etcd call before each grant: each released key had held", async () => {
    const [a, b, c] = instances(3);
    const lastClient = gated(c!.client);
    const lastLocks = new EtcdLocks({ client: lastClient.client, instance: "berth-gated" });
    const held = await a!.locks.acquire(request("holder"));
    const middle = queued(request("middle"));
    const middleGrant = b!.locks.acquire(middle.request);
    expect(await middle.waiting).toBe(1);
    const last = queued(request("last"));
    const lastGrant = lastLocks.acquire(last.request);
    expect(await last.waiting).toBe(2);
    lastClient.hold();
    await held.release();
    await (await middleGrant).release();
    // Its predecessor was not the last key ahead when it queued, but its key says it held.
    const grant = await lastGrant;
    expect(grant.owner).toBe("last");
    await vi.waitFor(() => expect(lastClient.txns).toHaveLength(1));
    lastClient.open();
    await grant.release();
  });

  it("serves waiters from both instances in the order they queued, with tokens that only rise", async () => {
    const [a, b] = instances(2);
    const first = await a!.locks.acquire(request("w0"));
    const order: string[] = [];
    const pending: Array<Promise<EtcdLockGrant>> = [];
    for (let i = 1; i <= 4; i++) {
      const wait = queued(request(`w${i}`));
      const grant = (i % 2 ? b! : a!).locks.acquire(wait.request);
      pending.push(
        grant.then(async (g) => {
          order.push(g.owner);
          return g;
        }),
      );
      // Queued before the next one asks: its place is fixed by its key's create revision.
      expect(await wait.waiting).toBe(i);
    }
    const tokens = [first.token];
    await first.release();
    for (const grant of pending) {
      const g = await grant;
      tokens.push(g.token);
      await g.release();
    }
    expect(order).toEqual(["w1", "w2", "w3", "w4"]);
    expect([...tokens].sort((x, y) => (x < y ? -1 : 1))).toEqual(tokens);
    expect(new Set(tokens).size).toBe(tokens.length);
  });

  it("lets a waiter that gives up out of the queue without disturbing the others", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("holder"));
    const quitter = new AbortController();
    const middle = queued(request("quitter", { signal: quitter.signal }));
    const quitting = b!.locks.acquire(middle.request);
    await middle.waiting;
    const last = queued(request("last"));
    const lastGrant = a!.locks.acquire(last.request);
    expect(await last.waiting).toBe(2);
    quitter.abort();
    expect(await berthRefusal(quitting)).toMatchObject({ code: "cancelled" });
    // The last waiter now watches the holder (its predecessor left) and is served on release.
    expect((await a!.locks.inspect(FILE)).waiters.map((w) => w.owner)).toEqual(["last"]);
    await held.release();
    const granted = await lastGrant;
    expect(granted.owner).toBe("last");
    await granted.release();
  });

  it("frees the lock at once, never granting it, when its caller goes away as the holder's key goes", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("holder"));
    const leaving = new AbortController();
    // The caller leaves as the deletion that hands the lock over arrives.
    const client = wrapClient(b!.client, (method, call) => {
      if (method !== "watch") return call();
      const batches = call() as AsyncIterable<WatchBatch>;
      return (async function* () {
        for await (const batch of batches) {
          if (batch.events.some((event) => event.type === "delete")) leaving.abort();
          yield batch;
        }
      })();
    });
    const gone = queued(request("gone", { signal: leaving.signal }));
    const taking = new EtcdLocks({ client, instance: "berth-1" }).acquire(gone.request);
    await gone.waiting;
    const next = queued(request("next"));
    const nextGrant = a!.locks.acquire(next.request);
    expect(await next.waiting).toBe(2);
    // Its refusal may come before the release's own answer: listened for first.
    const refused = berthRefusal(taking);
    await held.release();
    expect(await refused).toMatchObject({ code: "cancelled" });
    const granted = await nextGrant;
    expect(granted.owner).toBe("next");
    expect((await a!.locks.inspect(FILE)).holder).toMatchObject({ owner: "next", token: granted.token });
    await granted.release();
  });

  it("frees the lock at once, never granting it, when its caller goes away during the round trip that took it", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("holder"));
    // The waiter ahead is handed the lock, and its key goes before its grant is recorded: the one
    // behind it then takes the lock by a transaction.
    const aheadClient = gated(a!.client);
    const ahead = queued(request("ahead"));
    const aheadGranting = new EtcdLocks({ client: aheadClient.client, instance: "berth-gated" }).acquire(ahead.request);
    await ahead.waiting;
    const leaving = new AbortController();
    // The caller leaves while the transaction that takes the lock for it is answered.
    const client = new Proxy(b!.client, {
      get(target, name, receiver) {
        if (name !== "txn") return Reflect.get(target, name, receiver);
        return async (...args: Parameters<EtcdClient["txn"]>) => {
          const result = await target.txn(...args);
          // The turn's transaction, the one that compares the waiter's own key.
          if (args[0].compare.some((c) => c.prefix !== true)) leaving.abort();
          return result;
        };
      },
    });
    const gone = queued(request("gone", { signal: leaving.signal }));
    const taking = new EtcdLocks({ client, instance: "berth-1" }).acquire(gone.request);
    expect(await gone.waiting).toBe(2);
    const next = queued(request("next"));
    const nextGrant = a!.locks.acquire(next.request);
    expect(await next.waiting).toBe(3);
    aheadClient.hold();
    const refused = berthRefusal(taking);
    await held.release();
    await a!.client.delete({ key: (await aheadGranting).key });
    expect(await refused).toMatchObject({ code: "cancelled" });
    const granted = await nextGrant;
    expect(granted.owner).toBe("next");
    expect((await a!.locks.inspect(FILE)).holder).toMatchObject({ owner: "next", token: granted.token });
    aheadClient.open();
    await granted.release();
  });

  it("refuses a request beyond the queue's cap, TOO_MANY_WAITERS, leaving no key, whichever instance queued the others", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("holder"));
    const waits = [queued(request("w1", { maxWaiters: 2 })), queued(request("w2", { maxWaiters: 2 }))];
    // One after the other: their places are their keys' create revisions.
    const granted = [a!.locks.acquire(waits[0]!.request)];
    expect(await waits[0]!.waiting).toBe(1);
    granted.push(b!.locks.acquire(waits[1]!.request));
    expect(await waits[1]!.waiting).toBe(2);
    const error = await berthRefusal(b!.locks.acquire(request("w3", { maxWaiters: 2 })));
    expect(error).toMatchObject({ code: "resource_exhausted", reason: "TOO_MANY_WAITERS", details: { file: FILE, waiting: 2, maxWaiters: 2 } });
    expect((await a!.client.range({ key: lockWaitersPrefix(FILE), prefix: true, keysOnly: true })).count).toBe(3);
    // A place freed is a place again.
    await held.release();
    const first = await granted[0]!;
    const third = queued(request("w3", { maxWaiters: 2 }));
    const late = a!.locks.acquire(third.request);
    expect(await third.waiting).toBe(2);
    await first.release();
    await (await granted[1]!).release();
    await (await late).release();
  });

  it("gives up a wait that runs out, leaving no key", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("holder"));
    const error = await berthRefusal(b!.locks.acquire(request("impatient", { waitMs: 200 })));
    expect(error).toMatchObject({ reason: "WAIT_EXHAUSTED", details: { owner: "holder", waitedMs: 200 } });
    expect((await a!.client.range({ key: lockWaitersPrefix(FILE), prefix: true, keysOnly: true })).count).toBe(1);
    await held.release();
  });
});

describe("the last token granted", () => {
  it("is the holder's, recorded as it is granted, whether the lock was free or handed over, and outlives the holder", async () => {
    const [a, b] = instances(2);
    expect((await a!.locks.inspect(FILE)).lastToken).toBeNull();
    const first = await a!.locks.acquire(request("first"));
    expect((await b!.locks.inspect(FILE)).lastToken).toBe(first.token);
    const wait = queued(request("second"));
    const next = b!.locks.acquire(wait.request);
    await wait.waiting;
    await first.release();
    const second = await next;
    expect(second.token).toBeGreaterThan(first.token);
    expect((await a!.locks.inspect(FILE)).lastToken).toBe(second.token);
    await second.release();
    expect(await a!.locks.inspect(FILE)).toMatchObject({ holder: null, waiters: [], lastToken: second.token });
    // Kept outside the lock's range: its reads and watches see waiters only.
    expect((await a!.client.range({ key: lockWaitersPrefix(FILE), prefix: true, keysOnly: true })).count).toBe(0);
    // Free again: the put that grants records its own revision.
    const third = await b!.locks.acquire(request("third", { waitMs: 0 }));
    expect((await a!.locks.inspect(FILE)).lastToken).toBe(third.token);
    await third.release();
  });

  it("is not moved by a request that was refused", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("holder"));
    await berthRefusal(b!.locks.acquire(request("refused", { waitMs: 0 })));
    await held.release();
    expect((await b!.locks.inspect(FILE)).lastToken).toBe(held.token);
  });
});

describe("leases", () => {
  it("frees the lock of an instance that died when its lease expires, and the next waiter gets it", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("doomed", { ttlSeconds: 1 }));
    const wait = queued(request("survivor"));
    const next = b!.locks.acquire(wait.request);
    await wait.waiting;
    // The instance's client goes away without releasing: nobody renews the lease any more.
    a!.client.close();
    const granted = await next;
    expect(granted.owner).toBe("survivor");
    expect(granted.token).toBeGreaterThan(held.token);
    // etcd itself says the dead holder's lease is gone.
    expect((await b!.locks.inspect(FILE)).holder).toMatchObject({ owner: "survivor" });
    await granted.release();
  });

  it("tells the holder when its lease is lost, and the lock is free at once", async () => {
    const [a, b] = instances(2);
    const held = await a!.locks.acquire(request("long", { ttlSeconds: 1 }));
    expect(await berthRefusal(b!.locks.acquire(request("other", { waitMs: 0 })))).toMatchObject({ reason: "WAIT_EXHAUSTED" });
    // Revoked from elsewhere (an operator, or etcd expiring it): the holder's signal says so.
    await b!.client.revokeLease(held.lease.id);
    const loss = await held.lease.lost;
    expect(loss).toMatchObject({ reason: "ETCD_LEASE_LOST" });
    expect(held.signal.aborted).toBe(true);
    const granted = await b!.locks.acquire(request("other", { waitMs: 0 }));
    expect(granted.token).toBeGreaterThan(held.token);
    await granted.release();
  });
});
