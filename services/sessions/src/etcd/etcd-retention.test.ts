// @module-tag etcd
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createEtcdClient, type EtcdClient, type TxnRequestInit, type TxnResult } from "@berth/etcd";
import { startEtcd, wrapClient, type EtcdCluster } from "@berth/etcd/testing";
import { ManualClock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import type { SessionChange } from "../session-store-api.js";
import { EtcdJournal } from "./etcd-journal.js";
import { EtcdSessionStore } from "./etcd-session-store.js";
import { HEADS, headKey } from "./store-keys.js";
import { appendRetentionHistory, HOUR } from "../testing/retention-history.js";

// One real etcd member; each test's "instances" are stores with clients of their own on one
// prefix, on one manual clock (their entries are stamped with it, their timers run on it).
let etcd: EtcdCluster;
const clients: EtcdClient[] = [];
let stores: EtcdSessionStore[] = [];
let prefixes = 0;
let clock: ManualClock;
let warnings: unknown[];

const T0 = Date.UTC(2026, 0, 1);
const LIMITS = { maxEventBytes: 1024 * 1024, maxEventsPerAppend: 1000 };

beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  for (const c of clients) c.close();
  await etcd?.stop();
});
beforeEach(() => {
  clock = new ManualClock(T0);
  warnings = [];
});
afterEach(async () => {
  for (const store of stores) await store.close();
  stores = [];
});

const logger: Logger = { debug() {}, info() {}, warn: (fields: object) => void warnings.push(fields), error() {} };

/** A transaction a store is about to send, and the client it goes through. */
type TxnHook = (request: TxnRequestInit, send: () => Promise<TxnResult>) => Promise<TxnResult>;

/** A fresh prefix, and a way to open stores on it: each with a client of its own, a retention when asked, a hook on its transactions. */
function cluster() {
  const prefix = `r${++prefixes}/`;
  return (options: { retentionMs?: number; txn?: TxnHook } = {}) => {
    const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
    clients.push(client);
    const hooked =
      options.txn === undefined
        ? client
        : wrapClient(client, (method, call, args) => (method === "txn" ? options.txn!(args[0] as TxnRequestInit, call as () => Promise<TxnResult>) : call()));
    const store = new EtcdSessionStore({
      journal: new EtcdJournal({ client: hooked, clock }),
      client: hooked,
      clock,
      logger,
      ...LIMITS,
      ...(options.retentionMs !== undefined ? { completedRetentionMs: options.retentionMs } : {}),
    });
    stores.push(store);
    return { store, client };
  };
}

/** Whether a transaction is a deletion of `session` (its head deleted). */
const deletes = (request: TxnRequestInit, session: string) => request.success.some((op) => "delete" in op && op.delete.key === headKey(session));

/** The revision of the last append etcd has, of any session. */
async function lastHead(client: EtcdClient): Promise<bigint> {
  const result = await client.range({ key: HEADS, prefix: true, sort: { by: "mod", order: "descend" }, limit: 1, keysOnly: true });
  return result.kvs[0]?.modRevision ?? 0n;
}

/** The next change of `all` that is a deletion. */
async function nextDeletion(all: AsyncIterator<SessionChange>): Promise<string> {
  for (;;) {
    const step = await all.next();
    if (step.done) throw new Error("the watcher ended");
    if (step.value.deleted) return step.value.sessionId;
  }
}

const ids = async (store: EtcdSessionStore) => (await store.list({ includeCompleted: true })).map((view) => view.sessionId);

describe("retention of completed sessions on etcd", () => {
  it("deletes at start what is past it, and the rest when it falls due; active and revived sessions stay", async () => {
    const open = cluster();
    const { store: writer } = open();
    await appendRetentionHistory(writer, clock);
    clock.advance(2 * HOUR); // T0 + 4h: "old" completed 4h ago, "young" 2h ago

    const all = writer.watchAll();
    await writer.list(); // the watcher has its start
    const { store } = open({ retentionMs: 3 * HOUR });
    expect(await nextDeletion(all)).toBe("old");
    expect(await ids(store)).toEqual(["active", "revived", "young"]);
    expect(store.limits().completedRetentionMs).toBe(3 * HOUR);
    // The timer, not a call, deletes "young" once it is due (T0 + 5h), from what the start's look found.
    await store.settled();
    clock.advance(HOUR - 1);
    await store.settled();
    expect(await ids(store)).toEqual(["active", "revived", "young"]);
    clock.advance(1);
    expect(await nextDeletion(all)).toBe("young");
    expect(await ids(writer)).toEqual(["active", "revived"]);
    // Deleted as DeleteSession deletes: nothing of them is left in etcd but their tombstones, and
    // the id continues after its last seq.
    const left = (await clients.at(-1)!.range({ key: "", prefix: true, keysOnly: true })).kvs.filter((kv) => /old|young/.test(kv.key));
    expect(left.map((kv) => kv.key)).toEqual(["t/old", "t/young"]);
    expect(await writer.append("old", [{ type: "generate" }])).toMatchObject({ firstSeq: 3 });
    await all.return!();
    expect(warnings).toEqual([]);
  });

  it("hears of sessions completed through another instance and deletes them when due, counted from the completing entry", async () => {
    const open = cluster();
    const { store } = open({ retentionMs: HOUR });
    const { store: writer, client } = open();
    await store.settled(); // the first sweep found nothing
    const all = writer.watchAll();
    await writer.list();
    await writer.append("done", [{ type: "generate" }, { type: "complete" }]);
    await writer.append("late", [{ type: "generate" }, { type: "discarded" }]);
    // Seen before the clock moves: a change is looked at one period after this instance saw it.
    await store.retentionSeen(await lastHead(client));
    clock.advance(HOUR / 2);
    // Late news the reducer ignores: "late" stays discarded, and still falls due an hour after its discarding entry.
    await writer.append("late", [{ type: "variant_plan", plan: {} }]);
    await store.retentionSeen(await lastHead(client));
    clock.advance(HOUR / 2);
    const deleted = [await nextDeletion(all), await nextDeletion(all)].sort();
    expect(deleted).toEqual(["done", "late"]);
    expect(await ids(store)).toEqual([]);
    await all.return!();
    expect(warnings).toEqual([]);
  });

  it("keeps a session appended to after the sweep decided to delete it", async () => {
    const open = cluster();
    const { store: writer } = open();
    await writer.append("busy", [{ type: "generate" }, { type: "complete" }]);
    clock.advance(2 * HOUR);
    // Between the look that found it due and the deletion, another instance revives it.
    let raced = 0;
    const { store } = open({
      retentionMs: HOUR,
      txn: async (request, send) => {
        if (deletes(request, "busy") && raced++ === 0) await writer.append("busy", [{ type: "generate" }]);
        return send();
      },
    });
    await store.settled();
    expect(raced).toBe(1);
    expect(await ids(store)).toEqual(["busy"]);
    // Looked at again in a later sweep: active now, so kept for good.
    clock.advance(HOUR);
    await store.sweepCompleted();
    await store.settled();
    expect(await ids(store)).toEqual(["busy"]);
    const read: number[] = [];
    for await (const stored of (await store.read("busy"))!.entries) read.push(stored.entry.seq);
    expect(read).toEqual([1, 2, 3]);
    expect(raced).toBe(1);
    expect(warnings).toEqual([]);
  });

  it("when two instances sweep one session at once, one deletes it and the other finds it gone, without an error", async () => {
    const open = cluster();
    const { store: writer } = open();
    await writer.append("both", [{ type: "generate" }, { type: "complete" }]);
    const all = writer.watchAll();
    await writer.list();
    clock.advance(2 * HOUR);
    // Both deletions are held until both instances have decided, then sent together.
    const outcomes: boolean[] = [];
    let arrived = 0;
    let release!: () => void;
    const bothDecided = new Promise<void>((resolve) => (release = resolve));
    const race: TxnHook = async (request, send) => {
      if (!deletes(request, "both")) return send();
      if (++arrived === 2) release();
      await bothDecided;
      const result = await send();
      outcomes.push(result.succeeded);
      return result;
    };
    const [a, b] = [open({ retentionMs: HOUR, txn: race }).store, open({ retentionMs: HOUR, txn: race }).store];
    await Promise.all([a.settled(), b.settled()]);
    expect(outcomes.sort()).toEqual([false, true]);
    expect(await nextDeletion(all)).toBe("both");
    // One deletion only: the next change a watcher hears of is a later append.
    await writer.append("after", [{ type: "generate" }]);
    expect((await all.next()).value).toMatchObject({ sessionId: "after", deleted: false });
    await all.return!();
    // The instance that lost looks once more, finds nothing, and forgets it.
    clock.advance(HOUR);
    await Promise.all([a.sweepCompleted(), b.sweepCompleted()]);
    expect(await ids(a)).toEqual(["after"]);
    expect(warnings).toEqual([]);
  });

  it("is off by default", async () => {
    const { store } = cluster()();
    await store.append("s1", [{ type: "complete" }]);
    clock.advance(1000 * 24 * HOUR);
    await store.sweepCompleted();
    expect(await ids(store)).toEqual(["s1"]);
    expect(store.limits().completedRetentionMs).toBeUndefined();
  });
});
