import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { createSourceLocks, type SourceLocks } from "./source-locks.js";
import { firstRevisionOfRun } from "./lock-changes.js";
import type { LockWatcher, LockWatchItem } from "./source-locks-api.js";

let stateDir: string;
let locks: SourceLocks;
let clock: ManualClock;

beforeEach(() => {
  stateDir = fs.mkdtempSync(path.join(tmpdir(), "berth-lockwatch-"));
  clock = new ManualClock();
  locks = createSourceLocks({ stateDir, liveDir: null, clock, watchBuffer: 8 });
});
afterEach(() => {
  locks.close();
  fs.rmSync(stateDir, { recursive: true, force: true });
});

const FILE = "/tmp/berth-watch/a.ts";
const OTHER = "/tmp/berth-watch/b.ts";

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
  items.map((item) => (item.kind === "change" ? `${item.change.kind}:${item.change.owner}:${item.change.position}` : `caught_up:${item.reset}`));

/** Lets the table hand a freed lock on (it waits for the event loop's next poll). */
const handedOn = () => new Promise<void>((resolve) => setImmediate(resolve));

describe("lock changes on the file store", () => {
  it("sends grants, waiters joining and leaving, releases and expiries in order with growing revisions", async () => {
    const started = clock.now();
    const watcher = await locks.watch({ file: undefined, includeCurrent: false, startRevision: 0n });
    const a = await locks.acquire({ file: FILE, owner: "a", ttlMs: 1000 });
    const gone = new AbortController();
    const b = locks.acquire({ file: FILE, owner: "b", signal: gone.signal });
    b.catch(() => {});
    const c = locks.acquire({ file: FILE, owner: "c", ttlMs: 1000 });
    gone.abort();
    locks.release(a.leaseToken);
    await handedOn();
    await c;
    clock.advance(1000);
    const items = await take(watcher, 7);
    expect(summary(items)).toEqual([
      "caught_up:false",
      "granted:a:0",
      "waiter_joined:b:1",
      "waiter_joined:c:2",
      "waiter_left:b:1",
      "released:a:0",
      "granted:c:0",
    ]);
    const next = await take(watcher, 1);
    expect(summary(next)).toEqual(["expired:c:0"]);
    const revisions = [...items, ...next].map((item) => item.revision);
    expect(revisions[0]).toBe(firstRevisionOfRun(started));
    for (let i = 2; i < revisions.length; i++) expect(revisions[i]! > revisions[i - 1]!).toBe(true);
    await watcher.return?.();
  });

  it("describes the current state of one file, then its changes alone", async () => {
    await locks.acquire({ file: OTHER, owner: "x" });
    const held = await locks.acquire({ file: FILE, owner: "a" });
    const waiting = locks.acquire({ file: FILE, owner: "b" });
    const watcher = await locks.watch({ file: FILE, includeCurrent: true, startRevision: 0n });
    await locks.acquire({ file: `${OTHER}.2`, owner: "y" });
    locks.release(held.leaseToken);
    await handedOn();
    await waiting;
    expect(summary(await take(watcher, 5))).toEqual(["current_holder:a:0", "current_waiter:b:1", "caught_up:false", "released:a:0", "granted:b:0"]);
    await watcher.return?.();
  });

  it("replays one file's changes alone, and its progress moves past the other files' changes", async () => {
    const watcher = await locks.watch({ file: FILE, includeCurrent: false, startRevision: 0n });
    const [caughtUp] = await take(watcher, 1);
    await locks.acquire({ file: FILE, owner: "a" });
    await locks.acquire({ file: OTHER, owner: "x" });
    const [granted] = await take(watcher, 1);
    expect(watcher.progressRevision()).toBe(granted!.revision + 1n);
    await watcher.return?.();
    const resumed = await locks.watch({ file: FILE, includeCurrent: false, startRevision: caughtUp!.revision });
    const items = await take(resumed, 2);
    expect(summary(items)).toEqual(["granted:a:0", "caught_up:false"]);
    expect(items[1]!.revision).toBe(granted!.revision + 1n);
    await resumed.return?.();
  });

  it("resumes after a revision with exactly the changes missed, and resets from one it cannot replay", async () => {
    const first = await locks.watch({ file: undefined, includeCurrent: false, startRevision: 0n });
    const [caughtUp] = await take(first, 1);
    const lease = await locks.acquire({ file: FILE, owner: "a" });
    const [granted] = await take(first, 1);
    await first.return?.();
    locks.release(lease.leaseToken);
    await locks.acquire({ file: FILE, owner: "b" });
    const resumed = await locks.watch({ file: undefined, includeCurrent: false, startRevision: granted!.revision });
    expect(summary(await take(resumed, 3))).toEqual(["released:a:0", "granted:b:0", "caught_up:false"]);
    await resumed.return?.();
    // Thirty-two changes kept (four times the watch buffer): the first is gone after more.
    await locks.acquire({ file: OTHER, owner: "c" });
    await locks.acquire({ file: `${OTHER}2`, owner: "d" });
    for (let i = 0; i < 15; i++) locks.release((await locks.acquire({ file: `${OTHER}3`, owner: "e" })).leaseToken);
    for (const start of [caughtUp!.revision, caughtUp!.revision - 5n, caughtUp!.revision + 1000n]) {
      const reset = await locks.watch({ file: undefined, includeCurrent: false, startRevision: start });
      const items = await take(reset, 4);
      expect(summary(items)).toEqual(["current_holder:b:0", "current_holder:c:0", "current_holder:d:0", "caught_up:true"]);
      await reset.return?.();
    }
  });

  it("ends a watcher that falls behind with WATCHER_LAGGED naming the revision to resume from", async () => {
    const watcher = await locks.watch({ file: undefined, includeCurrent: false, startRevision: 0n });
    const [caughtUp] = await take(watcher, 1);
    for (let i = 0; i < 9; i++) await locks.acquire({ file: `${FILE}.${i}`, owner: "a" });
    const error = await watcher.next().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(BerthError);
    expect((error as BerthError).reason).toBe("WATCHER_LAGGED");
    expect((error as BerthError).details?.lastRevision).toBe(String(caughtUp!.revision));
  });

  it("keeps four times the watch buffer: a watcher lagged one past its buffer resumes by replay with every change, no reset", async () => {
    expect(locks.watchHistory).toBe(32);
    const watcher = await locks.watch({ file: undefined, includeCurrent: false, startRevision: 0n });
    await take(watcher, 1);
    await locks.acquire({ file: FILE, owner: "a" });
    const [first] = await take(watcher, 1);
    // Nine changes unread: one past the buffer of eight.
    const owners = Array.from({ length: 32 }, (_, i) => `o${i}`);
    for (const owner of owners.slice(0, 9)) await locks.acquire({ file: `${FILE}.${owner}`, owner });
    const error = await watcher.next().then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toMatchObject({ reason: "WATCHER_LAGGED", details: { lastRevision: String(first!.revision) } });
    // More changes while the client is away, up to the history's bound after the revision it was told.
    for (const owner of owners.slice(9)) await locks.acquire({ file: `${FILE}.${owner}`, owner });
    const resumed = await locks.watch({ file: undefined, includeCurrent: false, startRevision: first!.revision });
    const items = await take(resumed, owners.length + 1);
    expect(summary(items)).toEqual([...owners.map((owner) => `granted:${owner}:0`), "caught_up:false"]);
    await resumed.return?.();
  });

  it("ends watchers SHUTTING_DOWN when the service closes", async () => {
    const watcher = await locks.watch({ file: undefined, includeCurrent: false, startRevision: 0n });
    await take(watcher, 1);
    const pending = watcher.next();
    locks.close();
    await expect(pending).rejects.toMatchObject({ reason: "SHUTTING_DOWN" });
  });
});
