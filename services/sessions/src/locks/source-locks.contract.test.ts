/**
 * What every source-lock store promises the LockService handlers (SourceLocksApi), run against
 * each: the file store and the etcd store. One suite per rule, so that a rule one store keeps and
 * the other drifts from fails here. The etcd store's suites carry the etcd tag (skipped where etcd
 * cannot run).
 *
 * Time is a manual clock in both stores (leases, waits, request ids); etcd's own leases and
 * watches run in real time, so a test waits for what a store tells (a place in the queue, a
 * grant, a lease's end), never for a while.
 *
 * Left out, because the stores answer differently today: the refusals of a store shutting down,
 * the `waiting` count of a WAIT_EXHAUSTED refusal (the file store counts the waiters ahead, etcd
 * the keys ahead, its holder's included), a holder's pid (etcd names its instance's, the file store
 * only a lock file's), and the wording of a refused renewal of a token never granted.
 */
import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";
import { EtcdLocks } from "../etcd/etcd-locks.js";
import { createEtcdSourceLocks } from "../etcd/etcd-source-locks.js";
import { LOCK_RETRY_AFTER_MS } from "./lock-input.js";
import { createSourceLocks } from "./source-locks.js";
import type { AcquireRequest, HoldRequest, Lease, LeaseEndReason, SourceLocksApi } from "./source-locks-api.js";

const STORES = ["file", "etcd"] as const;
type StoreKind = (typeof STORES)[number];

/** The etcd store's suites carry the etcd tag, so that they are skipped where etcd cannot run. */
function storeTags(store: StoreKind): { tags: string[] } {
  return { tags: store === "etcd" ? ["etcd"] : [] };
}

const LIMITS = { defaultTtlMs: 20_000, maxTtlMs: 120_000, maxWaitMs: 300_000, idempotencyWindowMs: 60_000 };

const opened: SourceLocksApi[] = [];
const dirs: string[] = [];
const clients: EtcdClient[] = [];
// Started by the first etcd store a test opens: never where the etcd suites are skipped.
let etcd: Promise<EtcdCluster> | undefined;
let prefixes = 0;

afterAll(async () => {
  for (const locks of opened) await locks.close();
  for (const client of clients) client.close();
  await (await etcd?.catch(() => undefined))?.stop();
  for (const dir of dirs) fs.rmSync(dir, { recursive: true, force: true });
});

/** A fresh store of `kind` with no lock taken, and the clock its leases, waits and request ids run on. */
async function openLocks(kind: StoreKind): Promise<{ clock: ManualClock; locks: SourceLocksApi }> {
  const clock = new ManualClock();
  let locks: SourceLocksApi;
  if (kind === "file") {
    const stateDir = fs.mkdtempSync(path.join(tmpdir(), "berth-locks-contract-"));
    dirs.push(stateDir);
    locks = createSourceLocks({ stateDir, liveDir: null, clock, limits: LIMITS });
  } else {
    etcd ??= startEtcd();
    const client = createEtcdClient({ endpoints: (await etcd).clientUrls, prefix: `locks-contract${++prefixes}/` });
    clients.push(client);
    locks = createEtcdSourceLocks({ locks: new EtcdLocks({ client, clock, instance: "contract" }), leaseTtlSeconds: 5, clock, limits: LIMITS });
  }
  opened.push(locks);
  return { clock, locks };
}

const FILE = "/work/src/main.ts";
const OTHER_SPELLING = "/work/src/../src/./main.ts";

/** `request`, and a promise of its first place in the queue (1: next), told once it waits behind a holder. */
function queued<R extends AcquireRequest | HoldRequest>(request: R): { request: R; place: Promise<number> } {
  let told!: (position: number) => void;
  const place = new Promise<number>((resolve) => (told = resolve));
  return {
    request: {
      ...request,
      onWaiting: (update) => {
        if (update.holder !== null) told(update.position);
      },
    },
    place,
  };
}

/** A promise of how `leaseToken`'s lease ends. */
function leaseEnd(locks: SourceLocksApi, leaseToken: string): Promise<LeaseEndReason> {
  return new Promise((resolve) => locks.whenLeaseEnds(leaseToken, resolve));
}

/** Renew as a promise, whichever way the store answers (at once or later) or refuses. */
const renewing = (locks: SourceLocksApi, leaseToken: string, ttlMs?: number): Promise<Lease> => (async () => locks.renew(leaseToken, ttlMs))();

const iso = (ms: number) => new Date(ms).toISOString();

describe.each(STORES)("the source locks contract: %s store", (store) => {
  describe("grant and FIFO hand-off", storeTags(store), () => {
    it("grants a free lock at once under its canonical path, and hands it to the waiters in the order they queued", async () => {
      const { clock, locks } = await openLocks(store);
      const first = await locks.acquire({ file: OTHER_SPELLING, owner: "w0", ttlMs: 10_000 });
      expect(first).toMatchObject({ file: FILE, owner: "w0", acquiredAt: clock.now(), expiresAt: clock.now() + 10_000, ttlMs: 10_000 });
      expect(first.leaseToken).toMatch(/^[0-9a-f-]{36}$/);
      const waiting: Array<Promise<Lease>> = [];
      for (let i = 1; i <= 3; i++) {
        const wait = queued({ file: FILE, owner: `w${i}`, waitMs: 60_000 });
        waiting.push(locks.acquire(wait.request));
        // Queued before the next one asks: its place is fixed.
        expect(await wait.place).toBe(i);
      }
      expect((await locks.inspect(FILE)).waiters.map((w) => w.owner)).toEqual(["w1", "w2", "w3"]);
      let current = first;
      for (let i = 1; i <= 3; i++) {
        expect(await locks.release(current.leaseToken)).toBe(true);
        const next = await waiting[i - 1]!;
        expect(next.owner).toBe(`w${i}`);
        expect(next.fencingToken).toBeGreaterThan(current.fencingToken);
        expect(await locks.inspect(FILE)).toMatchObject({ holder: { owner: `w${i}` }, waiters: ["w2", "w3"].slice(i - 1).map((owner) => ({ owner })) });
        current = next;
      }
      await locks.release(current.leaseToken);
    });

    it("does not let a newcomer jump the queue while the lock passes to the next waiter", async () => {
      const { locks } = await openLocks(store);
      const holder = await locks.acquire({ file: FILE, owner: "holder" });
      const wait = queued({ file: FILE, owner: "queued", waitMs: 60_000 });
      const next = locks.acquire(wait.request);
      await wait.place;
      await locks.release(holder.leaseToken);
      expect(await berthRefusal(locks.acquire({ file: FILE, owner: "late", waitMs: 0 }))).toMatchObject({
        code: "resource_exhausted",
        reason: "WAIT_EXHAUSTED",
      });
      const granted = await next;
      expect(granted.owner).toBe("queued");
      await locks.release(granted.leaseToken);
    });
  });

  describe("try once and waits that run out", storeTags(store), () => {
    it("refuses a try-once (max_wait 0) on a held lock resource_exhausted WAIT_EXHAUSTED, naming the holder, and queues nothing", async () => {
      const { locks } = await openLocks(store);
      const holder = await locks.acquire({ file: FILE, owner: "holder" });
      const refused = await berthRefusal(locks.acquire({ file: OTHER_SPELLING, owner: "other", waitMs: 0 }));
      expect(refused).toMatchObject({
        code: "resource_exhausted",
        reason: "WAIT_EXHAUSTED",
        options: { retryAfterMs: LOCK_RETRY_AFTER_MS },
        details: { file: FILE, lockPath: null, waitedMs: 0, owner: "holder", acquireTime: holder.acquiredAt, fencingToken: holder.fencingToken, kind: "lease" },
      });
      expect(refused.message).toBe(
        `source locked: ${FILE} is held by holder since ${iso(holder.acquiredAt)} (fencing token ${holder.fencingToken}); it was not free (max_wait was 0: try once); wait longer, or ask the holder to release it`,
      );
      expect((await locks.inspect(FILE)).waiters).toEqual([]);
      await locks.release(holder.leaseToken);
    });

    it("refuses a wait that runs out WAIT_EXHAUSTED after exactly its wait, and takes the request out of the queue", async () => {
      const { clock, locks } = await openLocks(store);
      const holder = await locks.acquire({ file: FILE, owner: "holder" });
      const wait = queued({ file: FILE, owner: "impatient", waitMs: 5_000 });
      const refusal = berthRefusal(locks.acquire(wait.request));
      await wait.place;
      clock.advance(4_999);
      expect((await locks.inspect(FILE)).waiters.map((w) => w.owner)).toEqual(["impatient"]);
      clock.advance(1);
      expect(await refusal).toMatchObject({ code: "resource_exhausted", reason: "WAIT_EXHAUSTED", details: { owner: "holder", waitedMs: 5_000 } });
      expect((await locks.inspect(FILE)).waiters).toEqual([]);
      await locks.release(holder.leaseToken);
    });
  });

  describe("ttl bounds", storeTags(store), () => {
    it("gives a lease the default ttl when none (or 0) is asked, and up to the longest", async () => {
      const { clock, locks } = await openLocks(store);
      expect(locks.limits).toMatchObject(LIMITS);
      for (const ttlMs of [undefined, 0]) {
        const lease = await locks.acquire({ file: FILE, owner: "alice", ttlMs });
        expect([lease.ttlMs, lease.expiresAt]).toEqual([20_000, clock.now() + 20_000]);
        await locks.release(lease.leaseToken);
      }
      const longest = await locks.acquire({ file: FILE, owner: "alice", ttlMs: 120_000 });
      expect([longest.ttlMs, longest.expiresAt]).toEqual([120_000, clock.now() + 120_000]);
      await locks.release(longest.leaseToken);
    });

    it("refuses a ttl over the longest, or under 1 ms, invalid_argument on ttl, and takes nothing", async () => {
      const { locks } = await openLocks(store);
      for (const ttlMs of [120_001, -1, 0.4, Number.NaN]) {
        const refused = await berthRefusal(locks.acquire({ file: FILE, owner: "alice", ttlMs }));
        expect(refused).toMatchObject({ code: "invalid_argument", details: { field: "ttl" } });
      }
      expect(await locks.inspect(FILE)).toMatchObject({ holder: null, waiters: [], lastFencingToken: null });
    });
  });

  describe("renew", storeTags(store), () => {
    it("extends a lease from the renewal, by its own ttl or the one asked; refuses a ttl over the longest and keeps the lease", async () => {
      const { clock, locks } = await openLocks(store);
      const lease = await locks.acquire({ file: FILE, owner: "alice", ttlMs: 10_000 });
      clock.advance(6_000);
      const renewed = await renewing(locks, lease.leaseToken);
      expect(renewed).toEqual({ ...lease, expiresAt: clock.now() + 10_000 });
      // Past the first expiry: held, renewed.
      clock.advance(6_000);
      expect(await renewing(locks, lease.leaseToken, 30_000)).toEqual({ ...lease, ttlMs: 30_000, expiresAt: clock.now() + 30_000 });
      expect(await berthRefusal(renewing(locks, lease.leaseToken, 120_001))).toMatchObject({ code: "invalid_argument", details: { field: "ttl" } });
      expect((await locks.inspect(FILE)).holder).toMatchObject({ owner: "alice", fencingToken: lease.fencingToken, expiresAt: clock.now() + 30_000 });
      await locks.release(lease.leaseToken);
    });

    it("ends a lease not renewed within its ttl, hands the lock on, and refuses a late renewal failed_precondition saying how it ended", async () => {
      const { clock, locks } = await openLocks(store);
      const lease = await locks.acquire({ file: FILE, owner: "alice", ttlMs: 10_000 });
      const ended = leaseEnd(locks, lease.leaseToken);
      const wait = queued({ file: FILE, owner: "bob", waitMs: 60_000 });
      const next = locks.acquire(wait.request);
      await wait.place;
      const expiresAt = clock.now() + 10_000;
      clock.advance(10_000);
      expect(await ended).toBe("expired");
      const late = await berthRefusal(renewing(locks, lease.leaseToken));
      expect(late).toMatchObject({ code: "failed_precondition", details: { file: FILE, ended: "expired", endedAt: expiresAt } });
      expect(late.message).toBe(
        `lease ${lease.leaseToken.slice(0, 8)}… on ${FILE} expired at ${iso(expiresAt)}; acquire the lock again (and renew sooner than the lease length)`,
      );
      const granted = await next;
      expect(granted.fencingToken).toBeGreaterThan(lease.fencingToken);
      // A stale release frees nothing: the next holder keeps the lock.
      expect(await locks.release(lease.leaseToken)).toBe(false);
      expect((await locks.inspect(FILE)).holder).toMatchObject({ owner: "bob" });
      await locks.release(granted.leaseToken);
    });

    it("refuses renewing a released lease the same way, and a token never granted not_found", async () => {
      const { locks } = await openLocks(store);
      const lease = await locks.acquire({ file: FILE, owner: "alice" });
      await locks.release(lease.leaseToken);
      expect(await berthRefusal(renewing(locks, lease.leaseToken))).toMatchObject({ code: "failed_precondition", details: { file: FILE, ended: "released" } });
      expect(await berthRefusal(renewing(locks, "00000000-0000-4000-8000-000000000000"))).toMatchObject({ code: "not_found" });
      expect(await berthRefusal(renewing(locks, ""))).toMatchObject({ code: "invalid_argument", details: { field: "lease_token" } });
    });
  });

  describe("release and the last fencing token", storeTags(store), () => {
    it("frees the lock on release, once, and Inspect still answers the last fencing token granted", async () => {
      const { locks } = await openLocks(store);
      expect(await locks.inspect(FILE)).toEqual({ file: FILE, lockPath: null, holder: null, waiters: [], lastFencingToken: null });
      const lease = await locks.acquire({ file: FILE, owner: "alice" });
      expect((await locks.inspect(FILE)).lastFencingToken).toBe(lease.fencingToken);
      expect(await locks.release(lease.leaseToken)).toBe(true);
      expect(await locks.release(lease.leaseToken)).toBe(false);
      expect(await locks.inspect(OTHER_SPELLING)).toEqual({ file: FILE, lockPath: null, holder: null, waiters: [], lastFencingToken: lease.fencingToken });
      // Another file's lock is another lock: none granted there.
      expect((await locks.inspect("/work/src/other.ts")).lastFencingToken).toBeNull();
    });

    it("answers the token of the last hand-off once its holder released too", async () => {
      const { locks } = await openLocks(store);
      const first = await locks.acquire({ file: FILE, owner: "alice" });
      const wait = queued({ file: FILE, owner: "bob", waitMs: 60_000 });
      const next = locks.acquire(wait.request);
      await wait.place;
      await locks.release(first.leaseToken);
      const second = await next;
      expect((await locks.inspect(FILE)).lastFencingToken).toBe(second.fencingToken);
      await locks.release(second.leaseToken);
      expect(await locks.inspect(FILE)).toMatchObject({ holder: null, lastFencingToken: second.fencingToken });
    });
  });

  describe("fencing tokens", storeTags(store), () => {
    it("rise strictly from holder to holder, leases and holds alike, and only the holder's is current", async () => {
      const { locks } = await openLocks(store);
      const tokens: number[] = [];
      for (const owner of ["a", "b", "c"]) {
        const lease = await locks.acquire({ file: FILE, owner, waitMs: 0 });
        tokens.push(lease.fencingToken);
        expect(await locks.checkToken(OTHER_SPELLING, lease.fencingToken)).toEqual({ file: FILE, current: true, currentToken: lease.fencingToken });
        await locks.release(lease.leaseToken);
      }
      const stream = new AbortController();
      const hold = await locks.holdAsLongAs({ file: FILE, owner: "d", signal: stream.signal });
      expect(hold).toMatchObject({ owner: "d", expiresAt: null, ttlMs: null });
      tokens.push(hold.fencingToken);
      const wait = queued({ file: FILE, owner: "e", waitMs: 60_000 });
      const next = locks.acquire(wait.request);
      await wait.place;
      // The hold's stream ends: its lock passes on.
      stream.abort();
      const last = await next;
      tokens.push(last.fencingToken);
      expect(tokens).toEqual([...tokens].sort((x, y) => x - y));
      expect(new Set(tokens).size).toBe(tokens.length);
      expect(await locks.checkToken(FILE, tokens[0]!)).toEqual({ file: FILE, current: false, currentToken: last.fencingToken });
      await locks.release(last.leaseToken);
      expect(await locks.checkToken(FILE, last.fencingToken)).toEqual({ file: FILE, current: false, currentToken: null });
    });
  });

  describe("request ids", storeTags(store), () => {
    it("answers a repeat the first lease while it lives and after it ended, for the window; the id for another request is REUSED", async () => {
      const { clock, locks } = await openLocks(store);
      const first = await locks.acquire({ file: FILE, owner: "alice", ttlMs: 20_000, requestId: "r-1" });
      expect(await locks.acquire({ file: OTHER_SPELLING, owner: "alice", ttlMs: 20_000, waitMs: 0, requestId: "r-1" })).toEqual(first);
      for (const other of [
        locks.acquire({ file: "/work/src/other.ts", owner: "alice", ttlMs: 20_000, requestId: "r-1" }),
        locks.acquire({ file: FILE, owner: "bob", ttlMs: 20_000, requestId: "r-1" }),
        locks.acquire({ file: FILE, owner: "alice", ttlMs: 10_000, requestId: "r-1" }),
        (async () => locks.release(first.leaseToken, "r-1"))(),
      ].map(berthRefusal)) {
        // Each refusal is listened for from the start: a later one may come while an earlier is awaited.
        expect(await other).toMatchObject({
          code: "already_exists",
          reason: "IDEMPOTENCY_KEY_REUSED",
          details: { requestId: "r-1", rpc: "Acquire", file: FILE, owner: "alice", fencingToken: first.fencingToken },
        });
      }
      expect(await locks.release(first.leaseToken, "rel-1")).toBe(true);
      expect(await locks.release(first.leaseToken, "rel-1")).toBe(true);
      expect((await locks.inspect(FILE)).holder).toBeNull();
      // Released: a repeat is answered the first lease, which no longer renews, and takes nothing.
      expect(await locks.acquire({ file: FILE, owner: "alice", ttlMs: 20_000, requestId: "r-1" })).toEqual(first);
      expect(await berthRefusal(renewing(locks, first.leaseToken))).toMatchObject({ code: "failed_precondition" });
      expect((await locks.inspect(FILE)).holder).toBeNull();
      // The window closes: the id names a new request.
      clock.advance(60_000);
      const anew = await locks.acquire({ file: FILE, owner: "alice", ttlMs: 5_000, requestId: "r-1" });
      expect(anew.fencingToken).toBeGreaterThan(first.fencingToken);
      await locks.release(anew.leaseToken);
    });

    it("joins a repeat to the first call's wait: one place in the queue, one lease for both", async () => {
      const { locks } = await openLocks(store);
      const holder = await locks.acquire({ file: FILE, owner: "holder" });
      const wait = queued({ file: FILE, owner: "alice", waitMs: 60_000, requestId: "r-2" });
      const first = locks.acquire(wait.request);
      await wait.place;
      const repeat = locks.acquire({ file: FILE, owner: "alice", waitMs: 60_000, requestId: "r-2" });
      expect((await locks.inspect(FILE)).waiters.map((w) => w.owner)).toEqual(["alice"]);
      await locks.release(holder.leaseToken);
      const granted = await first;
      expect(await repeat).toEqual(granted);
      expect(await locks.inspect(FILE)).toMatchObject({ holder: { owner: "alice", fencingToken: granted.fencingToken }, waiters: [] });
      await locks.release(granted.leaseToken);
    });
  });

  describe("inspect", storeTags(store), () => {
    it("shows the holder as granted, and the waiters in order with their kind and their wait", async () => {
      const { clock, locks } = await openLocks(store);
      const holder = await locks.acquire({ file: FILE, owner: "holder", ttlMs: 10_000 });
      expect((await locks.inspect(FILE)).holder).toMatchObject({
        kind: "lease",
        owner: "holder",
        fencingToken: holder.fencingToken,
        since: holder.acquiredAt,
        expiresAt: holder.expiresAt,
      });
      const queuedAt = clock.now();
      const leaseWait = queued({ file: FILE, owner: "by-lease", waitMs: 5_000 });
      const byLease = locks.acquire(leaseWait.request);
      expect(await leaseWait.place).toBe(1);
      const stream = new AbortController();
      const holdWait = queued({ file: FILE, owner: "by-stream", waitMs: 8_000, signal: stream.signal });
      const byStream = berthRefusal(locks.holdAsLongAs(holdWait.request));
      expect(await holdWait.place).toBe(2);
      clock.advance(1_000);
      expect((await locks.inspect(FILE)).waiters).toEqual([
        { kind: "lease", owner: "by-lease", since: queuedAt, deadline: queuedAt + 5_000 },
        { kind: "stream", owner: "by-stream", since: queuedAt, deadline: queuedAt + 8_000 },
      ]);
      await locks.release(holder.leaseToken);
      const granted = await byLease;
      const now = await locks.inspect(FILE);
      expect(now.holder).toMatchObject({
        kind: "lease",
        owner: "by-lease",
        fencingToken: granted.fencingToken,
        since: granted.acquiredAt,
        expiresAt: granted.expiresAt,
      });
      expect(now.waiters.map((w) => [w.kind, w.owner])).toEqual([["stream", "by-stream"]]);
      // A waiter whose caller goes away leaves the queue.
      stream.abort();
      expect((await byStream).code).toBe("cancelled");
      expect((await locks.inspect(FILE)).waiters).toEqual([]);
      await locks.release(granted.leaseToken);
    });

    it("shows a hold as a stream holder with no expiry", async () => {
      const { locks } = await openLocks(store);
      const stream = new AbortController();
      const hold = await locks.holdAsLongAs({ file: FILE, owner: "streamer", signal: stream.signal });
      expect((await locks.inspect(FILE)).holder).toMatchObject({
        kind: "stream",
        owner: "streamer",
        fencingToken: hold.fencingToken,
        since: hold.acquiredAt,
        expiresAt: null,
      });
      const ended = leaseEnd(locks, hold.leaseToken);
      stream.abort();
      expect(await ended).toBe("released");
    });
  });
});
