import { describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { onDescriptorShortage } from "@berth/shared/descriptors";
import { LOCK_RETRY_AFTER_MS } from "./lock-input.js";
import type { ExternalLocks } from "./external-locks.js";
import { LockTable } from "./lock-table.js";
import type { WaitingUpdate } from "./source-locks-api.js";
import { counter } from "./testing/lock-table-fixture.js";
import { createMemoryExternalLocks } from "./testing/memory-external-locks.js";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";

describe("a lock an outside process holds", () => {
  it("queues berth's requests behind it and hands the lock to the first the moment it is freed", async () => {
    const clock = new ManualClock();
    const external = createMemoryExternalLocks();
    const locks = new LockTable({ clock, fencing: counter(), external });
    expect(external.holdOutside("/project/a", { owner: "seed", pid: 7, since: clock.now() })).toBe(true);
    const first = locks.acquire({ file: "/project/a", owner: "first", waitMs: 10_000 });
    const second = locks.acquire({ file: "/project/a", owner: "second", waitMs: 10_000 });
    expect(locks.inspect("/project/a").holder).toMatchObject({ kind: "seed-file", owner: "seed", pid: 7, lockFile: "memory:/project/a" });
    expect(locks.stats()).toEqual({ held: 0, waiting: 2, blockedByLockFiles: 1 });
    external.freeOutside("/project/a");
    const lease = await first;
    expect(lease).toMatchObject({ owner: "first", fencingToken: 1 });
    expect(external.claimedByBerth()).toEqual(["/project/a"]);
    // A handoff between berth's own holders: the next one takes the outside lock in turn.
    locks.release(lease.leaseToken);
    expect(await second).toMatchObject({ owner: "second", fencingToken: 2 });
    expect(external.holdOutside("/project/a", { owner: "seed", pid: 7, since: clock.now() })).toBe(false);
  });
});

describe("a handoff whose next request arrives before the hand-on runs", () => {
  it("starts no watch of the outside lock and tells each waiter once", async () => {
    const clock = new ManualClock();
    const memory = createMemoryExternalLocks();
    let watches = 0;
    const external: ExternalLocks = {
      ...memory,
      watch(key, onMaybeFree) {
        watches++;
        return memory.watch(key, onMaybeFree);
      },
    };
    const locks = new LockTable({ clock, fencing: counter(), external });
    const first = await locks.acquire({ file: "/project/a", owner: "first", waitMs: 10_000 });
    const told: string[] = [];
    const tell = (who: string) => (update: WaitingUpdate) => told.push(`${who} ${update.position} ${update.holder?.owner ?? "-"}`);
    const second = locks.acquire({ file: "/project/a", owner: "second", waitMs: 10_000, onWaiting: tell("second") });
    // The release and the next request are read in one turn; the hand-on waits for the turn's end.
    clock.stall(1);
    locks.release(first.leaseToken);
    const third = locks.acquire({ file: "/project/a", owner: "third", waitMs: 10_000, onWaiting: tell("third") });
    clock.ioRead();
    expect(await second).toMatchObject({ owner: "second", fencingToken: 2 });
    expect(told).toEqual(["second 1 first", "third 1 second"]);
    expect(watches).toBe(0);
    locks.release((await second).leaseToken);
    expect(await third).toMatchObject({ owner: "third", fencingToken: 3 });
  });
});

describe("an outside lock that cannot be taken", () => {
  it("refuses a direct request with unavailable; a queued one is retried on the next re-check", async () => {
    const clock = new ManualClock();
    let failing = true;
    let failure: Error = Object.assign(new Error("EACCES: permission denied"), { code: "EACCES" });
    let recheck: (() => void) | undefined;
    const external: ExternalLocks = {
      claim(key) {
        if (failing) throw failure;
        return { ok: true, handle: { key, lockFile: `/locks/${key}`, token: "t", pid: 42 } };
      },
      release() {},
      peek: () => undefined,
      pathFor: (key) => `/locks${key}`,
      watch(_key, onMaybeFree) {
        recheck = onMaybeFree;
        return () => (recheck = undefined);
      },
    };
    const locks = new LockTable({ clock, fencing: counter(), external });
    const error = await berthRefusal(locks.acquire({ file: "/project/a", owner: "o", waitMs: 1000 }));
    expect(error.code).toBe("unavailable");
    expect(error.reason).toBe("STATE_READ_ONLY");
    expect(error.message).toBe(
      "no lock was granted: cannot take the lock file /locks/project/a for /project/a: the state directory /locks/project is not writable (EACCES); make it writable again (remount it read-write, fix its owner or mode) and retry",
    );
    // A failure that is none of the machine's known faults: unavailable, to be retried.
    failure = Object.assign(new Error("EIO: i/o error"), { code: "EIO" });
    const other = await berthRefusal(locks.acquire({ file: "/project/a", owner: "o", waitMs: 1000 }));
    expect([other.code, other.reason, other.options.retryAfterMs]).toEqual(["unavailable", "STORAGE_UNAVAILABLE", LOCK_RETRY_AFTER_MS]);
    expect(other.message).toBe("cannot take the lock file /locks/project/a for /project/a: EIO: i/o error");
    expect(locks.stats()).toEqual({ held: 0, waiting: 0, blockedByLockFiles: 0 });

    const held = await locks.acquire({ file: "/project/b", owner: "first", waitMs: 0 }).catch(() => undefined);
    expect(held).toBeUndefined();
    failing = false;
    const first = await locks.acquire({ file: "/project/b", owner: "first" });
    failing = true;
    const queued = locks.acquire({ file: "/project/b", owner: "second", waitMs: 5000 });
    locks.release(first.leaseToken);
    expect(locks.stats()).toEqual({ held: 0, waiting: 1, blockedByLockFiles: 1 });
    failing = false;
    recheck!();
    expect(await queued).toMatchObject({ owner: "second" });
    expect(locks.inspect("/project/b").holder).toMatchObject({ kind: "lease", owner: "second", pid: 42 });
  });

  it("a wait that runs out while the lock file cannot be read (no descriptor left) is still refused, naming what is known", async () => {
    const clock = new ManualClock();
    const holder = { lockFile: "/locks/project/a", owner: "seed", pid: 7, since: clock.now(), readable: true };
    const external: ExternalLocks = {
      claim: () => ({ ok: false, holder }),
      release() {},
      peek() {
        throw Object.assign(new Error("EMFILE: too many open files, open '/locks/project/a'"), { code: "EMFILE" });
      },
      pathFor: (key) => `/locks${key}`,
      watch: () => () => {},
    };
    const locks = new LockTable({ clock, fencing: counter(), external });
    const waiter = berthRefusal(locks.acquire({ file: "/project/a", owner: "o", waitMs: 1000 }));
    clock.advance(1000);
    const error = await waiter;
    expect([error.code, error.reason]).toEqual(["resource_exhausted", "WAIT_EXHAUSTED"]);
    expect(error.message).toMatch(/^source locked: \/project\/a is held by seed \(pid 7\) through its lock file/);
    expect(locks.stats().waiting).toBe(0);
  });

  it("a lock file refused a descriptor is made again once the idle descriptors are closed; refused again, the grant is RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES", async () => {
    let descriptors = 0;
    const unregister = onDescriptorShortage(() => {
      descriptors = 1;
      return 1;
    });
    try {
      const external: ExternalLocks = {
        claim(key) {
          if (descriptors === 0) throw Object.assign(new Error(`EMFILE: too many open files, open '/state/locks${key}'`), { code: "EMFILE" });
          descriptors--;
          return { ok: true, handle: { key, lockFile: `/state/locks${key}`, token: "t", pid: 42 } };
        },
        release() {},
        peek: () => undefined,
        pathFor: (key) => `/state/locks${key}`,
        watch: () => () => {},
      };
      const locks = new LockTable({ clock: new ManualClock(), fencing: counter(), external });
      expect((await locks.acquire({ file: "/project/a", owner: "o" })).fencingToken).toBe(1);
      unregister();
      const refused = await berthRefusal(locks.acquire({ file: "/project/b", owner: "o" }));
      expect(refused).toMatchObject({ code: "resource_exhausted", reason: "TOO_MANY_OPEN_FILES", options: { retryAfterMs: 1000 } });
    } finally {
      unregister();
    }
  });

  it("a queued request whose lock frees while its lock file cannot be made is refused with why, not as locked", async () => {
    const clock = new ManualClock();
    let full = false;
    const external: ExternalLocks = {
      claim(key) {
        if (full) throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC" });
        return { ok: true, handle: { key, lockFile: `/state/locks${key}`, token: "t", pid: 42 } };
      },
      release() {},
      peek: () => undefined,
      pathFor: (key) => `/state/locks${key}`,
      watch: () => () => {},
    };
    const locks = new LockTable({ clock, fencing: counter(), external });
    const first = await locks.acquire({ file: "/a", owner: "first" });
    const queued = berthRefusal(locks.acquire({ file: "/a", owner: "second", waitMs: 5000 }));
    full = true;
    locks.release(first.leaseToken);
    clock.advance(5000);
    const error = await queued;
    expect(error).toMatchObject({ code: "resource_exhausted", reason: "DISK_FULL" });
    expect(error.message).toMatch(
      /^no lock was granted: cannot take the lock file \/state\/locks\/a for \/a: the file system of the state directory \/state\/locks is full \(ENOSPC\)/,
    );
    full = false;
    expect(await locks.acquire({ file: "/a", owner: "third" })).toMatchObject({ owner: "third" });
  });
});
