// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { createEtcdClient, type EtcdClient, type RangeOptions } from "@berth/etcd";
import { countCalls, startEtcd, wrapClient, type EtcdCluster } from "@berth/etcd/testing";
import { applyEvent, baseSnapshot, type SessionSnapshot } from "../reducer.js";
import type { SessionChange, WatchEvent } from "../session-store-api.js";
import { EtcdJournal } from "./etcd-journal.js";
import { EtcdSessionStore } from "./etcd-session-store.js";
import { HEADS } from "./store-keys.js";

// One real etcd member; each test's "instances" are stores with clients of their own on one prefix.
let etcd: EtcdCluster;
const clients: EtcdClient[] = [];
const stores: EtcdSessionStore[] = [];
let prefixes = 0;

beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  for (const store of stores) await store.close();
  for (const c of clients) c.close();
  await etcd?.stop();
});

const LIMITS = { maxEventBytes: 1024 * 1024, maxEventsPerAppend: 1000 };

/** `count` store instances on one fresh prefix; `storeClient` wraps the client a store reads its watch start with. */
function instances(count: number, storeClient: (c: EtcdClient, index: number) => EtcdClient = (c) => c): EtcdSessionStore[] {
  const prefix = `s${++prefixes}/`;
  return Array.from({ length: count }, (_, index) => {
    const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
    clients.push(client);
    const store = new EtcdSessionStore({ journal: new EtcdJournal({ client }), client: storeClient(client, index), ...LIMITS, snapshotEvery: 3 });
    stores.push(store);
    return store;
  });
}

/** The snapshot a replay of the session's journal builds up to `seq`. */
async function replayed(store: EtcdSessionStore, sessionId: string, seq: number): Promise<SessionSnapshot> {
  let snapshot = baseSnapshot(sessionId);
  for await (const stored of (await store.read(sessionId, 1, seq))!.entries) snapshot = applyEvent(snapshot, stored.entry);
  return snapshot;
}

/** A store whose journal's etcd calls are listed in `calls` (by client method). */
function countedStore(snapshotEvery?: number): { store: EtcdSessionStore; calls: string[] } {
  const prefix = `s${++prefixes}/`;
  const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
  clients.push(client);
  const { client: counted, calls } = countCalls(client);
  const store = new EtcdSessionStore({
    journal: new EtcdJournal({ client: counted }),
    client,
    ...LIMITS,
    ...(snapshotEvery === undefined ? {} : { snapshotEvery }),
  });
  stores.push(store);
  return { store, calls };
}

const comparable = (snapshot: SessionSnapshot) => JSON.parse(JSON.stringify({ ...snapshot, updatedAt: undefined })) as unknown;

describe("the etcd session store", () => {
  it("keeps a deleted session's keys and a keyed deletion for the idempotency window, then sweeps them out of etcd (the seqs still continue)", async () => {
    const clock = new ManualClock(Date.UTC(2026, 0, 1));
    const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix: `s${++prefixes}/` });
    clients.push(client);
    const journal = new EtcdJournal({ client, clock, idempotencyWindowMs: 60_000 });
    const store = new EtcdSessionStore({ journal, client, clock, ...LIMITS, idempotencyWindowMs: 60_000 });
    stores.push(store);
    await store.settled();
    await store.append("w", [{ type: "generate" }], { idempotencyKey: "k" });
    expect(await store.delete("w", { idempotencyKey: "d" })).toEqual({ lastSeq: 1, duplicate: false });
    clock.advance(59_999);
    await expect(store.append("w", [{ type: "generate" }], { idempotencyKey: "k" })).rejects.toMatchObject({ reason: "SESSION_DELETED" });
    expect(await store.delete("w", { idempotencyKey: "d" })).toEqual({ lastSeq: 1, duplicate: true });
    const keys = async () => (await client.range({ key: "", prefix: true, keysOnly: true })).kvs.map((kv) => kv.key);
    expect(await keys()).toEqual(["i/w/d", "i/w/k", "t/w"]);
    clock.advance(1);
    // Past the window, before any sweep: the keys are free again (an append overwrites its record)…
    expect(await store.append("w", [{ type: "generate" }], { idempotencyKey: "k" })).toMatchObject({ firstSeq: 2, duplicate: false });
    // …and the sweep takes out what is left of the deletion, keeping the live session's key.
    expect(await journal.sweepTombstones()).toBe(Infinity);
    expect(await keys()).toEqual(["e/w/00000000000000000002", "h/w", "i/w/k", "t/w"]);
    expect(await store.delete("w", { idempotencyKey: "d" })).toEqual({ lastSeq: 2, duplicate: false });
    expect(await store.append("w", [{ type: "generate" }])).toMatchObject({ firstSeq: 3 });
  });

  it("answers each append, through either instance, with the snapshot a replay of the journal builds", async () => {
    const [a, b, fresh] = instances(3);
    const results = [];
    for (let i = 1; i <= 12; i++) {
      const through = i % 3 === 0 ? b! : a!;
      results.push(await through.append("mixed", [{ type: "generate", pageUrl: `/p${i}`, count: i }]));
    }
    expect(results.map((r) => r.lastSeq)).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
    for (const result of results) expect(comparable(result.snapshot)).toEqual(comparable(await replayed(a!, "mixed", result.lastSeq)));
    // `fresh` has appended nothing: it rebuilds the state from etcd's snapshot cache and the tail.
    for (const store of [a!, b!, fresh!]) {
      const view = await store.getSnapshot("mixed");
      expect(view).toMatchObject({ lastSeq: 12, exists: true });
      expect(comparable(view!.snapshot)).toEqual(comparable(await replayed(a!, "mixed", 12)));
    }
  });

  it("reads a journal as of one moment: its last seq and its entries agree whatever is appended or deleted through another instance meanwhile", async () => {
    const [a, b] = instances(2);
    for (let i = 1; i <= 3; i++) await a!.append("moment", [{ type: "generate", pageUrl: `/p${i}`, count: i }]);
    const reading = (await a!.read("moment", 2))!;
    expect(reading.lastSeq).toBe(3);
    await b!.append("moment", [{ type: "generate", pageUrl: "/later", count: 4 }]);
    await b!.delete("moment");
    const seqs: number[] = [];
    for await (const stored of reading.entries) seqs.push(stored.entry.seq);
    expect(seqs).toEqual([2, 3]);
    // Deleted: no journal, as the file store answers it.
    expect(await a!.read("moment")).toBeNull();
    expect(await a!.read("never")).toBeNull();
  });

  it("creates a session in one round trip: its first append (and a re-created session's) reads nothing back", async () => {
    const { store, calls } = countedStore(100);
    await store.settled(); // the sweep of tombstones at start
    calls.length = 0;
    const first = await store.append("created", [{ type: "generate", pageUrl: "/p1", count: 1 }]);
    expect(calls).toEqual(["txn"]);
    expect(comparable(first.snapshot)).toEqual(comparable(await replayed(store, "created", 1)));
    await store.append("created", [{ type: "generate", pageUrl: "/p2", count: 2 }]);
    await store.delete("created");
    calls.length = 0;
    const again = await store.append("created", [{ type: "generate", pageUrl: "/again", count: 3 }]);
    expect(calls).toEqual(["txn"]);
    // Seqs never go back: the new session continues after the deleted one's last.
    expect(again).toMatchObject({ firstSeq: 3, lastSeq: 3 });
    expect(comparable(again.snapshot)).toEqual(comparable(await replayed(store, "created", 3)));
    expect(store.stats().rebuilds).toBe(0);
  });

  it("answers an append after another instance's from what its transaction brought back: one transaction once the heads' watch has heard, nothing read back", async () => {
    const prefix = `s${++prefixes}/`;
    const [a, b] = [0, 1].map(() => {
      const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
      clients.push(client);
      const { client: counted, calls } = countCalls(client);
      const journal = new EtcdJournal({ client: counted });
      const store = new EtcdSessionStore({ journal, client, ...LIMITS, snapshotEvery: 1000 });
      stores.push(store);
      return { store, journal, calls };
    });
    await Promise.all([a!.store.settled(), b!.store.settled()]);
    // Each instance's first append to the session reads it (it keeps no head of it yet).
    await a!.store.append("turns", [{ type: "generate", pageUrl: "/p1", count: 1 }]);
    await b!.store.append("turns", [{ type: "generate", pageUrl: "/p2", count: 2 }]);
    const rebuilds = a!.store.stats().rebuilds + b!.store.stats().rebuilds;
    for (let i = 3; i <= 12; i++) {
      const [through, other] = i % 2 === 0 ? [b!, a!] : [a!, b!];
      if (i <= 8) await vi.waitFor(() => expect(through.journal.cachedHeadSeq("turns")).toBe(i - 1));
      through.calls.length = 0;
      const result = await through.store.append("turns", [{ type: "generate", pageUrl: `/p${i}`, count: i }]);
      expect(result.lastSeq).toBe(i);
      // Heard: the transaction commits at once. Not yet heard (the later ones): at most the retry.
      if (i <= 8) expect(through.calls).toEqual(["txn"]);
      else expect(through.calls.every((c) => c === "txn") && through.calls.length <= 2).toBe(true);
      expect(comparable(result.snapshot)).toEqual(comparable(await replayed(other.store, "turns", i)));
    }
    expect(a!.store.stats().rebuilds + b!.store.stats().rebuilds).toBe(rebuilds);
  });

  it("caches a snapshot in etcd every 1,000 entries or 100 appends, whichever comes first, so that appends of 100 events do not write one each", async () => {
    const { store, calls } = countedStore();
    const hundred = (n: number) => Array.from({ length: 100 }, (_, i) => ({ type: "generate", pageUrl: `/p${n}-${i}`, count: i }));
    for (let n = 0; n < 25; n++) await store.append("big", hundred(n));
    // 25 appends and a snapshot after the 10th and the 20th.
    expect(calls.filter((c) => c === "txn")).toHaveLength(27);
    calls.length = 0;
    for (let n = 0; n < 150; n++) await store.append("small", [{ type: "generate", pageUrl: `/p${n}`, count: n }]);
    expect(calls.filter((c) => c === "txn")).toHaveLength(151);
  });

  it("writes the plain appends that queued behind each other on one session together, in order, in one transaction", async () => {
    const [a, b] = instances(2);
    const watcher = b!.watchAll();
    await b!.list(); // resolves once the watcher has its start
    const client = clients.at(-1)!;
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => a!.append("grouped", [{ type: "generate", pageUrl: `/p${i + 1}`, count: i + 1 }])));
    // The first went alone; the 19 that queued behind it, in one transaction: two revisions.
    const written = await client.range({ key: "e/grouped/", prefix: true });
    expect(written.kvs).toHaveLength(20);
    expect(new Set(written.kvs.map((kv) => kv.modRevision)).size).toBe(2);
    expect(results.map((r) => r.lastSeq)).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
    // Each snapshot built on the one before it, the first on the empty session's: nothing was read back.
    expect(a!.stats().rebuilds).toBe(0);
    for (const result of results) expect(comparable(result.snapshot)).toEqual(comparable(await replayed(a!, "grouped", result.lastSeq)));
    // Still one change per append for a watcher of every session, in order.
    const changes: SessionChange[] = [];
    while (changes.length < 20) changes.push((await watcher.next()).value as SessionChange);
    await watcher.return?.();
    expect(changes.map((c) => [c.firstSeq, c.lastSeq])).toEqual(results.map((r) => [r.firstSeq, r.lastSeq]));
    // An append with an expectation goes alone, after those before it.
    const [grouped, expected] = await Promise.all([a!.append("grouped", [{ type: "steer" }]), a!.append("grouped", [{ type: "steer" }], { expectedSeq: 21 })]);
    expect([grouped.lastSeq, expected.lastSeq]).toEqual([21, 22]);
  });

  it("gives a watcher with snapshots the state after each live entry, whoever appended it", async () => {
    const [a, b] = instances(2);
    await a!.append("watched", [{ type: "generate", pageUrl: "/one", count: 1 }]);
    const watcher = b!.watch("watched", 1, { includeSnapshot: true });
    const events: WatchEvent[] = [];
    for (;;) {
      const step = await watcher.next();
      events.push(step.value as WatchEvent);
      if ((step.value as WatchEvent).kind === "caught_up") break;
    }
    await a!.append("watched", [{ type: "steer", pageUrl: "/two" }]);
    const live = (await watcher.next()).value as WatchEvent;
    await watcher.return?.();
    expect(events.map((e) => e.kind)).toEqual(["entry", "caught_up"]);
    expect(live.kind === "entry" && live.entry.seq).toBe(2);
    expect(comparable((live as { snapshot: SessionSnapshot }).snapshot)).toEqual(comparable(await replayed(a!, "watched", 2)));
  });

  it("lists after a watch of every session has started: a session created between the two is in the list or reaches the watcher", async () => {
    // The watcher's start is held back until the test lets it go: a list must wait for it.
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    let started!: () => void;
    const watchStarted = new Promise<void>((resolve) => (started = resolve));
    const gated = (client: EtcdClient): EtcdClient =>
      wrapClient(client, (method, call, args) => {
        const options = args[0] as RangeOptions;
        if (method !== "range" || options.key !== HEADS || options.limit !== 1) return call();
        return (async () => {
          await held;
          const result = await call();
          started();
          return result;
        })();
      });
    const [watching, writer] = instances(2, (client, index) => (index === 0 ? gated(client) : client));
    const watcher = watching!.watchAll();
    const order: string[] = [];
    void watchStarted.then(() => order.push("watch started"));
    const listing = watching!.list().then((views) => (order.push("listed"), views));
    // Created while the watcher is not yet watching and the list has not read.
    await writer!.append("between", [{ type: "generate" }]);
    release();
    const listed = (await listing).map((view) => view.sessionId);
    // Once the watcher has its start, a later session reaches it: the end of what it will bring.
    await watchStarted;

    await writer!.append("after", [{ type: "generate" }]);
    const changes: SessionChange[] = [];
    while (!changes.some((c) => c.sessionId === "after")) changes.push((await watcher.next()).value as SessionChange);
    await watcher.return?.();
    const seen = new Set([...listed, ...changes.map((c) => c.sessionId)]);
    expect(seen.has("between")).toBe(true);
    expect(order).toEqual(["watch started", "listed"]);
  });
});

describe("the etcd store's watch of every session, by revision", () => {
  /** The next `n` changes, as session@lastSeq (deletions marked) with their revisions. */
  async function take(watcher: AsyncIterator<SessionChange>, n: number): Promise<Array<[string, number]>> {
    const got: Array<[string, number]> = [];
    for (let i = 0; i < n; i++) {
      const { value } = await watcher.next();
      got.push([`${value.sessionId}@${value.lastSeq}${value.deleted ? "x" : ""}`, value.revision]);
    }
    return got;
  }

  it("carries etcd's revision of each change and resumes after a revision with exactly what followed, a deletion included", async () => {
    const [a, b] = instances(2);
    const client = clients.at(-1)!;
    const first = b!.watchAll();
    const start = await first.started;
    expect(start.reset).toBe(false);
    const one = await a!.append("x", [{ type: "generate" }]);
    await a!.append("y", [{ type: "generate" }]);
    const seen = await take(first, 2);
    const xRevision = (await client.range({ key: "e/x/", prefix: true })).kvs[0]!.modRevision;
    expect(seen).toEqual([
      ["x@1", Number(xRevision)],
      ["y@1", seen[1]![1]],
    ]);
    expect(seen[1]![1]).toBeGreaterThan(seen[0]![1]);
    expect(one.lastSeq).toBe(1);
    await first.return?.();
    // Away after x: y, a deletion and another append happen.
    await a!.delete("x");
    await a!.append("y", [{ type: "steer" }]);
    const resumed = b!.watchAll({ startRevision: seen[0]![1] });
    expect(await resumed.started).toEqual({ after: seen[0]![1], caughtUpAt: seen[0]![1], reset: false });
    const replay = await take(resumed, 3);
    expect(replay.map(([what]) => what)).toEqual(["y@1", "x@1x", "y@2"]);
    expect(replay[0]![1]).toBe(seen[1]![1]);
    expect(replay[1]![1]).toBeLessThan(replay[2]![1]);
    expect(resumed.progressRevision()).toBe(replay[2]![1]);
    await resumed.return?.();
  });

  it("names the last revision it took whole when it lags, and a resume from it replays the appends one transaction wrote", async () => {
    // The journal's watch of entries counts the events etcd delivered, so the test waits for them.
    let delivered = 0;
    let wanted = Number.POSITIVE_INFINITY;
    let arrived: (() => void) | undefined;
    const counting = (client: EtcdClient): EtcdClient =>
      wrapClient(client, (method, call, args) => {
        if (method !== "watch" || (args[0] as { key: string }).key !== "e/") return call();
        return (async function* () {
          for await (const batch of call() as AsyncIterable<{ events: unknown[] }>) {
            delivered += batch.events.length;
            if (delivered >= wanted) arrived?.();
            yield batch;
          }
        })();
      });
    const eventsArrived = async (count: number) => {
      wanted = count;
      if (delivered < count) await new Promise<void>((resolve) => (arrived = resolve));
      // The batch is handed on within the same turn of the event loop.
      await new Promise((resolve) => setImmediate(resolve));
    };
    const [a] = instances(1);
    const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix: `s${prefixes}/` });
    clients.push(client);
    const b = new EtcdSessionStore({ journal: new EtcdJournal({ client: counting(client) }), client, ...LIMITS });
    stores.push(b);

    const lone = b.watchAll({ maxBuffered: 2 });
    await lone.started;
    await a!.append("lone", [{ type: "generate" }]);
    const [taken] = await take(lone, 1);
    for (let i = 0; i < 3; i++) await a!.append("lone", [{ type: "steer" }]);
    await eventsArrived(4);
    await expect(lone.next()).rejects.toMatchObject({ reason: "WATCHER_LAGGED", details: { lastRevision: taken![1] } });
    const resumed = b.watchAll({ startRevision: taken![1] });
    expect((await take(resumed, 3)).map(([what]) => what)).toEqual(["lone@2", "lone@3", "lone@4"]);
    await resumed.return?.();

    delivered = 0;
    wanted = Number.POSITIVE_INFINITY;
    const watcher = b.watchAll({ maxBuffered: 2 });
    const start = await watcher.started;
    // Twenty appends queued behind each other go in two transactions: 1, then 19 at one revision.
    await Promise.all(Array.from({ length: 20 }, (_, i) => a!.append("grouped", [{ type: "generate", count: i }])));
    await eventsArrived(20);
    await expect(watcher.next()).rejects.toMatchObject({ reason: "WATCHER_LAGGED", details: { lastRevision: start.after } });
    const again = b.watchAll({ startRevision: start.after });
    const all = await take(again, 20);
    expect(all.map(([what]) => what)).toEqual(Array.from({ length: 20 }, (_, i) => `grouped@${i + 1}`));
    expect(new Set(all.map(([, revision]) => revision)).size).toBe(2);
    await again.return?.();
  });

  it("resets a start revision ahead of etcd's or compacted away: the watch starts at the current revision", async () => {
    const [a, b] = instances(2);
    const client = clients.at(-1)!;
    await a!.append("z", [{ type: "generate" }]);
    const current = (await client.range({ key: "", limit: 1 })).revision;
    const ahead = b!.watchAll({ startRevision: Number(current) + 1000 });
    expect(await ahead.started).toMatchObject({ reset: true });
    expect((await ahead.started).after).toBeGreaterThanOrEqual(Number(current));
    await ahead.return?.();
    await a!.append("z", [{ type: "steer" }]);
    const now = (await client.range({ key: "", limit: 1 })).revision;
    await client.compact(now);
    const compacted = b!.watchAll({ startRevision: Number(current) - 1 });
    expect(await compacted.started).toEqual({ after: Number(now), caughtUpAt: Number(now), reset: true });
    await a!.append("z", [{ type: "steer" }]);
    expect((await take(compacted, 1))[0]![0]).toBe("z@3");
    await compacted.return?.();
  });
});
