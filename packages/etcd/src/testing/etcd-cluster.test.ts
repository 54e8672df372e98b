// @module-tag etcd
import { afterAll, describe, expect, it } from "vitest";
import { createEtcdClient, type WatchBatch } from "../index.js";
import { startEtcd, type EtcdCluster } from "./etcd-cluster.js";

/** True while a process with this pid exists (signal 0 checks without sending anything). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe("one member", () => {
  it("starts on loopback, serves the client, and stop kills it by pid and removes its data", async () => {
    const etcd = await startEtcd();
    try {
      const [member] = etcd.members;
      expect(member!.clientUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const client = createEtcdClient({ endpoints: etcd.clientUrls });
      await client.put("greeting", "hello");
      expect(new TextDecoder().decode((await client.get("greeting"))!.value)).toBe("hello");
      expect(await etcd.leader()).toBe(member);
      client.close();
      const pid = member!.pid!;
      await etcd.stop();
      expect(alive(pid)).toBe(false);
      expect(member!.pid).toBeUndefined();
      const { existsSync } = await import("node:fs");
      expect(existsSync(member!.dataDir)).toBe(false);
    } finally {
      await etcd.stop();
    }
  });
});

describe("three members", () => {
  let etcd: EtcdCluster;
  afterAll(() => etcd?.stop());

  it("elect a new leader when the leader is SIGKILLed, and a restarted member catches up", async () => {
    etcd = await startEtcd({ members: 3 });
    const leader = await etcd.leader();
    // The leader first: the client and its watch are on the member that dies.
    const client = createEtcdClient({ endpoints: [leader.clientUrl, ...etcd.clientUrls.filter((u) => u !== leader.clientUrl)] });
    try {
      const first = await client.put("before", "1");
      const abort = new AbortController();
      const seen: WatchBatch[] = [];
      const waiters: { revision: bigint; resolve: () => void }[] = [];
      /** Resolves once the watcher has delivered `revision`. */
      const delivered = (revision: bigint) =>
        new Promise<void>((resolve) => {
          if ((seen.at(-1)?.revision ?? 0n) >= revision) resolve();
          else waiters.push({ revision, resolve });
        });
      const watching = (async () => {
        for await (const batch of client.watch({ key: "", prefix: true, startRevision: first.revision, signal: abort.signal })) {
          seen.push(batch);
          for (const waiter of waiters) if (batch.revision >= waiter.revision) waiter.resolve();
        }
      })();
      await delivered(first.revision);

      await etcd.kill(leader);
      expect(leader.pid).toBeUndefined();
      const next = await etcd.leader();
      expect(next).not.toBe(leader);
      expect(etcd.members.filter((m) => m.pid !== undefined)).toHaveLength(2);

      // The client moves to a live member by itself; nothing written is lost.
      const writes: bigint[] = [];
      for (let i = 0; i < 20; i++) writes.push((await client.put(`during/${i}`, String(i))).revision);

      await etcd.restart(leader);
      expect(leader.pid).toBeGreaterThan(0);
      const alone = createEtcdClient({ endpoints: [leader.clientUrl] });
      const during = await alone.range({ key: "during/", prefix: true });
      expect(during.count).toBe(20);
      alone.close();

      // The watcher saw every change once, in order, though the member it watched on died.
      await delivered(writes[writes.length - 1]!);
      abort.abort();
      await watching;
      const revisions = seen.flatMap((b) => b.events.map((e) => e.kv.modRevision));
      expect(revisions).toEqual([first.revision, ...writes]);
    } finally {
      client.close();
    }
  });

  it("keep serving while one member is paused (SIGSTOP), and it rejoins on SIGCONT", async () => {
    const client = createEtcdClient({ endpoints: etcd.clientUrls });
    try {
      const leader = await etcd.leader();
      const follower = etcd.members.find((m) => m !== leader)!;
      etcd.pause(follower);
      expect(follower.paused).toBe(true);
      expect(follower.pid).toBeGreaterThan(0);
      expect(await etcd.leader()).toBe(leader);
      const alive = createEtcdClient({ endpoints: [leader.clientUrl] });
      await alive.put("paused", "yes");
      alive.close();
      etcd.resume(follower);
      await etcd.waitHealthy();
      const rejoined = createEtcdClient({ endpoints: [follower.clientUrl] });
      expect((await rejoined.get("paused"))?.version).toBe(1n);
      rejoined.close();
    } finally {
      client.close();
    }
  });
});
