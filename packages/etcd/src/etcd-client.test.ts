// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import {
  compare,
  createEtcdClient,
  EtcdCompactedError,
  EtcdLeaseLostError,
  EtcdReason,
  keepaliveIntervalMs,
  op,
  type EtcdClient,
  type WatchBatch,
} from "./index.js";
import { startEtcd, type EtcdCluster } from "./testing/index.js";

const text = (bytes: Uint8Array | undefined) => (bytes === undefined ? undefined : new TextDecoder().decode(bytes));

// One member with a 500 ms election timeout: etcd's shortest lease is then 1 s.
let etcd: EtcdCluster;
let client: EtcdClient;
let prefixes = 0;
/** A client under a prefix of its own (or of `sharing`), so that tests do not see each other's keys. */
function isolated(options: { clock?: ManualClock; sharing?: EtcdClient } = {}): EtcdClient {
  const prefix = options.sharing?.keys.prefix ?? `t${++prefixes}/`;
  const c = createEtcdClient({ endpoints: etcd.clientUrls, prefix, ...(options.clock ? { clock: options.clock } : {}) });
  opened.push(c);
  return c;
}
const opened: EtcdClient[] = [];

beforeAll(async () => {
  etcd = await startEtcd({ electionTimeoutMs: 500 });
  client = createEtcdClient({ endpoints: etcd.clientUrls });
  opened.push(client);
});
afterAll(async () => {
  for (const c of opened) c.close();
  await etcd?.stop();
});

/**
 * Collects a watch's batches: `when(check)` resolves once `check` holds of what arrived so far,
 * `until(rev)` once every change up to `rev` arrived.
 */
function collect(source: AsyncIterable<WatchBatch>) {
  const batches: WatchBatch[] = [];
  const waiters = new Set<{ check: () => boolean; resolve: () => void }>();
  const done = (async () => {
    for await (const batch of source) {
      batches.push(batch);
      for (const waiter of waiters) if (waiter.check()) waiters.delete(waiter), waiter.resolve();
    }
  })();
  const when = (check: () => boolean) =>
    new Promise<void>((resolve) => {
      if (check()) resolve();
      else waiters.add({ check, resolve });
    });
  return { batches, done, when, until: (revision: bigint) => when(() => (batches.at(-1)?.revision ?? 0n) >= revision) };
}

describe("keys and ranges", () => {
  it("keeps each client's keys under its prefix", async () => {
    const a = isolated();
    const b = isolated();
    await a.put("k", "from a");
    expect(await b.get("k")).toBeUndefined();
    const kv = await a.get("k");
    expect(kv).toMatchObject({ key: "k", version: 1n });
    expect(text(kv?.value)).toBe("from a");
    expect(kv!.createRevision).toBe(kv!.modRevision);
  });

  it("reads a prefix in key order with a limit, saying what was left out", async () => {
    const c = isolated();
    for (const name of ["s/3", "s/1", "s/2", "s0", "t"]) await c.put(name, name);
    const first = await c.range({ key: "s/", prefix: true, limit: 2 });
    expect(first.kvs.map((kv) => kv.key)).toEqual(["s/1", "s/2"]);
    expect(first.more).toBe(true);
    expect(first.count).toBe(3);
    const rest = await c.range({ key: "s/2\0", end: "s0" });
    expect(rest.kvs.map((kv) => kv.key)).toEqual(["s/3"]);
    const newest = await c.range({ key: "s/", prefix: true, limit: 1, sort: { by: "create", order: "descend" } });
    expect(newest.kvs.map((kv) => kv.key)).toEqual(["s/2"]);
  });

  it("reads the store as it was at a revision", async () => {
    const c = isolated();
    const one = await c.put("v", "1");
    await c.put("v", "2");
    expect(text((await c.get("v", { revision: one.revision }))?.value)).toBe("1");
    expect(text((await c.get("v"))?.value)).toBe("2");
  });
});

describe("transactions", () => {
  it("write only when the key is absent, and say what is there when it is not", async () => {
    const c = isolated();
    const create = () => c.txn({ compare: [compare.absent("idem/x")], success: [op.put("idem/x", "first")], failure: [op.get({ key: "idem/x" })] });
    const won = await create();
    expect(won.succeeded).toBe(true);
    expect(won.results).toEqual([{ put: { revision: won.revision } }]);
    const lost = await create();
    expect(lost.succeeded).toBe(false);
    const found = lost.results[0];
    expect(found && "get" in found && text(found.get.kvs[0]?.value)).toBe("first");
  });

  it("compare mod and create revisions, versions and values", async () => {
    const c = isolated();
    const head = await c.put("head", "7");
    const append = (expected: bigint) => c.txn({ compare: [compare.mod("head", "==", expected)], success: [op.put("head", "8"), op.put("entry/8", "e")] });
    expect((await append(head.revision - 1n)).succeeded).toBe(false);
    const appended = await append(head.revision);
    expect(appended.succeeded).toBe(true);
    expect((await c.get("entry/8"))?.modRevision).toBe(appended.revision);
    // Both puts of one transaction share its revision.
    expect((await c.get("head"))?.modRevision).toBe(appended.revision);

    expect((await c.txn({ compare: [compare.create("head", "==", head.revision)], success: [] })).succeeded).toBe(true);
    expect((await c.txn({ compare: [compare.version("head", "==", 2n)], success: [] })).succeeded).toBe(true);
    expect((await c.txn({ compare: [compare.value("head", "==", "8")], success: [] })).succeeded).toBe(true);
    expect((await c.txn({ compare: [compare.value("head", "==", "7")], success: [] })).succeeded).toBe(false);
    // A value compare on a missing key fails whatever the operator (etcd's rule).
    expect((await c.txn({ compare: [compare.value("missing", "!=", "x")], success: [] })).succeeded).toBe(false);
  });

  it("compare every key of a range: the oldest waiter of a queue is the one nothing older precedes", async () => {
    const c = isolated();
    const a = await c.put("q/a", "");
    const b = await c.put("q/b", "");
    const oldest = (rev: bigint) => c.txn({ compare: [{ key: "q/", prefix: true, target: "create", op: ">", against: rev - 1n }], success: [] });
    expect((await oldest(b.revision)).succeeded).toBe(false);
    expect((await oldest(a.revision)).succeeded).toBe(true);
    await c.delete({ key: "q/a" });
    expect((await oldest(b.revision)).succeeded).toBe(true);
  });

  it("delete a prefix, counting what went", async () => {
    const c = isolated();
    await c.put("d/1", "");
    await c.put("d/2", "");
    await c.put("e", "");
    expect((await c.delete({ key: "d/", prefix: true })).deleted).toBe(2);
    expect((await c.range({ key: "", prefix: true })).kvs.map((kv) => kv.key)).toEqual(["e"]);
  });
});

describe("leases", () => {
  it("are raised to etcd's minimum and kept alive past their TTL", async () => {
    const c = isolated();
    const lease = await c.grantLease(1);
    expect(lease.ttlSeconds).toBeGreaterThanOrEqual(1);
    await c.put("held", "x", { lease: lease.id });
    const granted = lease.deadline();
    // What is tested is time passing: 2.5 TTLs, after which etcd would have deleted the key unless
    // keepalives got through.
    await new Promise((resolve) => setTimeout(resolve, lease.ttlSeconds * 2500));
    expect(lease.signal.aborted).toBe(false);
    expect(lease.deadline()).toBeGreaterThan(granted);
    expect((await c.get("held"))?.lease).toBe(lease.id);
    await lease.revoke();
    expect(await c.get("held")).toBeUndefined();
    expect(lease.signal.reason).toBeInstanceOf(EtcdLeaseLostError);
  });

  it("expire when nobody keeps them alive, and etcd deletes their keys (a watcher sees it)", async () => {
    const c = isolated();
    const holder = isolated({ sharing: c });
    const lease = await holder.grantLease(1);
    const put = await holder.put("mine", "x", { lease: lease.id });
    const abort = new AbortController();
    const watch = collect(c.watch({ key: "mine", startRevision: put.revision + 1n, signal: abort.signal }));
    const closedAt = Date.now();
    holder.close(); // no more keepalives
    expect(lease.signal.aborted).toBe(true);
    await watch.when(() => watch.batches.some((b) => b.events.some((e) => e.type === "delete")));
    // etcd's own expiry: not before the TTL counted from the last keepalive (the grant, here).
    expect(Date.now() - closedAt).toBeGreaterThanOrEqual(lease.ttlSeconds * 1000 - 500);
    abort.abort();
    await watch.done;
    expect(await c.get("mine")).toBeUndefined();
  });

  it("are lost when no keepalive is answered by the deadline", async () => {
    const clock = new ManualClock();
    const c = isolated({ clock });
    const lease = await c.grantLease(5);
    // Every keepalive of the next TTL is sent, but time passes faster than any answer can come.
    clock.advance(lease.ttlSeconds * 1000 + 1);
    const loss = await lease.lost;
    expect(loss).toBeInstanceOf(EtcdLeaseLostError);
    expect(loss.reason).toBe(EtcdReason.LEASE_LOST);
    expect(loss.message).toMatch(/no keepalive was answered within its TTL/);
    expect(lease.signal.aborted).toBe(true);
  });

  it("count their deadline on the monotonic clock: a wall-clock step back keeps no lease past its TTL", async () => {
    const clock = new ManualClock();
    const c = isolated({ clock });
    const lease = await c.grantLease(3);
    const ttlMs = lease.ttlSeconds * 1000;
    clock.stepWall(-3_600_000);
    clock.advance(keepaliveIntervalMs(ttlMs)); // a keepalive goes out, sent an hour before the grant by the wall clock
    // Answered: the lease runs for its TTL from that send, shown in the stepped wall clock.
    await expect.poll(() => lease.deadline()).toBe(clock.now() + ttlMs);
    // No answer comes in time for the next TTL: lost then, not an hour later.
    clock.advance(ttlMs);
    expect(lease.signal.aborted).toBe(true);
    expect((await lease.lost).message).toMatch(/no keepalive was answered within its TTL/);
  });

  it("are lost when etcd says they are gone (revoked elsewhere)", async () => {
    const clock = new ManualClock();
    const c = isolated({ clock });
    const lease = await c.grantLease(3);
    // Revoked behind the client's back, by another client that knows only its id.
    await isolated().revokeLease(lease.id);
    expect(lease.signal.aborted).toBe(false);
    clock.advance(keepaliveIntervalMs(lease.ttlSeconds * 1000)); // the next keepalive goes out; etcd answers TTL 0
    const loss = await lease.lost;
    expect(loss.message).toMatch(/etcd says it has expired/);
  });
});

describe("watches", () => {
  it("deliver every change from a revision in order, and resume from any later one", async () => {
    const c = isolated();
    const revisions: bigint[] = [];
    for (let i = 0; i < 5; i++) revisions.push((await c.put(`w/${i}`, String(i))).revision);
    await c.put("elsewhere", "not watched");
    const abort = new AbortController();
    const all = collect(c.watch({ key: "w/", prefix: true, startRevision: revisions[0]!, signal: abort.signal }));
    await all.until(revisions[4]!);
    const del = await c.delete({ key: "w/0" });
    await all.until(del.revision);
    abort.abort();
    await all.done;
    const events = all.batches.flatMap((b) => b.events);
    expect(events.map((e) => [e.type, e.kv.key, e.kv.modRevision])).toEqual([
      ...revisions.map((r, i) => ["put", `w/${i}`, r]),
      ["delete", "w/0", del.revision],
    ]);

    const abort2 = new AbortController();
    const later = collect(c.watch({ key: "w/", prefix: true, startRevision: revisions[3]!, signal: abort2.signal }));
    await later.until(del.revision);
    abort2.abort();
    await later.done;
    expect(later.batches.flatMap((b) => b.events.map((e) => e.kv.modRevision))).toEqual([revisions[3], revisions[4], del.revision]);
  });

  it("end with EtcdCompactedError when the revision they need was compacted", async () => {
    const c = isolated();
    const old = await c.put("c", "1");
    const now = await c.put("c", "2");
    await c.compact(now.revision, { physical: true });
    const error = await c.get("c", { revision: old.revision }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EtcdCompactedError);
    expect(error).toMatchObject({ code: "resource_exhausted", reason: EtcdReason.COMPACTED, requestedRevision: old.revision });

    const watched = await (async () => {
      for await (const batch of c.watch({ key: "c", startRevision: old.revision })) return batch;
    })().catch((e: unknown) => e);
    expect(watched).toBeInstanceOf(EtcdCompactedError);
    expect(watched).toMatchObject({ requestedRevision: old.revision, compactRevision: now.revision });
  });
});

describe("status", () => {
  it("names the member, its leader and the revision", async () => {
    const status = await client.status();
    expect(status.leader).toBe(status.memberId);
    expect(status.version).toBe("3.4.23");
    expect(status.revision).toBeGreaterThan(0n);
  });
});

describe("errors", () => {
  it("an etcd nobody listens on is UNAVAILABLE, and a write to it certainly not applied", async () => {
    const dead = createEtcdClient({ endpoints: ["http://127.0.0.1:1"], requestTimeoutMs: 2_000 });
    opened.push(dead);
    const error = await dead.put("k", "v").catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BerthError);
    expect(error).toMatchObject({ code: "unavailable", reason: EtcdReason.UNAVAILABLE, details: { outcome: "not_applied" } });
  });
});
