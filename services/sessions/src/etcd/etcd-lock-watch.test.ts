// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { startEtcd, wrapClient, type EtcdCluster } from "@berth/etcd/testing";
import type { LockWatcher, LockWatchItem } from "../locks/source-locks-api.js";
import { EtcdLocks, type EtcdLockRequest } from "./etcd-locks.js";
import { watchEtcdLocks } from "./etcd-lock-watch.js";

// One real etcd member; each test has a prefix of its own.
let etcd: EtcdCluster;
const clients: EtcdClient[] = [];
let prefixes = 0;

beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  for (const c of clients) c.close();
  await etcd?.stop();
});

function client(prefix: string): EtcdClient {
  const made = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
  clients.push(made);
  return made;
}

/**
 * A client whose watches count the events etcd delivered, so a test waits for them: `arrived(n)`
 * resolves once `n` events came, and the batch they came in was handed on.
 */
function countingWatches(base: EtcdClient): { client: EtcdClient; arrived: (count: number) => Promise<void> } {
  let delivered = 0;
  let wanted = Number.POSITIVE_INFINITY;
  let wake: (() => void) | undefined;
  const counted = wrapClient(base, (method, call) => {
    if (method !== "watch") return call();
    return (async function* () {
      for await (const batch of call() as AsyncIterable<{ events: unknown[] }>) {
        delivered += batch.events.length;
        if (delivered >= wanted) wake?.();
        yield batch;
      }
    })();
  });
  const arrived = async (count: number) => {
    wanted = count;
    if (delivered < count) await new Promise<void>((resolve) => (wake = resolve));
    // The watcher derives and queues the batch's changes within the same turn of the event loop.
    await new Promise((resolve) => setImmediate(resolve));
  };
  return { client: counted, arrived };
}

const FILE = "/work/src/main.ts";
const request = (owner: string): EtcdLockRequest => ({ file: FILE, owner, kind: "stream", ttlSeconds: 5, waitMs: 30_000 });

/** Resolves once `owner`'s request is waiting in the queue. */
function queued(owner: string): { request: EtcdLockRequest; waiting: Promise<number> } {
  let told!: (position: number) => void;
  const waiting = new Promise<number>((resolve) => (told = resolve));
  return { request: { ...request(owner), onWaiting: (update) => told(update.position) }, waiting };
}

async function take(watcher: LockWatcher, n: number): Promise<LockWatchItem[]> {
  const items: LockWatchItem[] = [];
  for (let i = 0; i < n; i++) {
    const step = await watcher.next();
    if (step.done) throw new Error("watcher ended");
    items.push(step.value);
  }
  return items;
}

const summary = (items: LockWatchItem[]) =>
  items.map((item) => (item.kind === "change" ? `${item.change.kind}:${item.change.owner}` : `caught_up:${item.reset}`));

describe("lock watch on etcd", () => {
  it("names the last revision it took whole when it lags between a release and the grant of its revision, and a resume from it sends the grant", async () => {
    const prefix = `w${++prefixes}/`;
    const locks = new EtcdLocks({ client: client(prefix), instance: "berth-0" });
    const clock = new ManualClock();
    const holder = await locks.acquire(request("holder"));
    const next = queued("next");
    const nextGrant = locks.acquire(next.request);
    await next.waiting;

    const { client: watching, arrived } = countingWatches(client(prefix));
    const watcher = watchEtcdLocks(watching, clock, { file: undefined, includeCurrent: false, startRevision: 0n }, 2);
    expect(summary(await take(watcher, 1))).toEqual(["caught_up:false"]);
    await holder.release();
    const granted = await nextGrant;
    // The release and the grant it hands on are one change of etcd's: one revision.
    const [released] = await take(watcher, 1);
    expect(summary([released!])).toEqual(["released:holder"]);
    // The grant is queued untaken; two waiters joining behind it are one more than the buffer holds.
    const joiners: Array<Promise<{ release(): Promise<unknown> }>> = [];
    for (const owner of ["third", "fourth"]) {
      const wait = queued(owner);
      joiners.push(locks.acquire(wait.request));
      await wait.waiting;
    }
    // The holder's key deleted, the grant's own write, the two waiters' keys.
    await arrived(4);
    const resumeRevision = released!.revision - 1n;
    await expect(watcher.next()).rejects.toMatchObject({ reason: "WATCHER_LAGGED", details: { lastRevision: String(resumeRevision) } });

    const resumed = watchEtcdLocks(client(prefix), clock, { file: undefined, includeCurrent: false, startRevision: resumeRevision }, 2);
    const replay = await take(resumed, 5);
    expect(summary(replay)).toEqual(["caught_up:false", "released:holder", "granted:next", "waiter_joined:third", "waiter_joined:fourth"]);
    expect(replay[1]!.revision).toBe(released!.revision);
    expect(replay[2]!.revision).toBe(released!.revision);
    await resumed.return();

    await granted.release();
    for (const grant of joiners) await (await grant).release();
  });
});
