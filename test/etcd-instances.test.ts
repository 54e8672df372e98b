// @module-tag etcd
/**
 * Two sessions services on one etcd (`--store etcd`, a single real member) are one service: an
 * append through one reaches a watcher on the other, in order; a lock held through one blocks
 * Acquire through the other, and its release hands it over; an instance SIGKILLed mid-appends
 * loses nothing it acknowledged, and the locks it granted free when their etcd lease expires; with
 * --completed-retention, a completed session is deleted once, by one of them. A combination of
 * settings the etcd store cannot serve is refused at start, naming the setting.
 */
import * as path from "node:path";
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { create } from "@bufbuild/protobuf";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { FenceRejectedSchema, SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { connectClient, launchService, makeTempDir, startService, stopAll, type ServiceProcess, callFailure } from "./harness.js";

let etcd: EtcdCluster;
beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  await stopAll();
  await etcd?.stop();
});

/** A sessions service on the test's etcd, under `prefix` (one prefix per test: a fresh service). */
function etcdService(prefix: string, more: string[] = []): Promise<ServiceProcess> {
  return startService("sessions", { args: ["--store", "etcd", "--etcd-endpoints", etcd.clientUrls.join(","), "--etcd-prefix", prefix, ...more] });
}

const sessionsOf = (service: ServiceProcess): Client<typeof SessionService> =>
  connectClient(SessionService, service.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 30_000 });
const locksOf = (service: ServiceProcess): Client<typeof LockService> =>
  connectClient(LockService, service.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 30_000 });
const step = (n: number): Event => create(EventSchema, { kind: { case: "generate", value: { pageUrl: `http://localhost:3000/${n}`, count: n } } });

describe("two instances on one etcd", () => {
  let a: ServiceProcess;
  let b: ServiceProcess;
  beforeAll(async () => {
    [a, b] = await Promise.all([etcdService("two/"), etcdService("two/")]);
  });

  it("delivers appends through one to a watcher on the other, in order, with the snapshot", async () => {
    const watcher = sessionsOf(b).watchSession({ sessionId: "relay", includeSnapshot: true });
    const iterator = watcher[Symbol.asyncIterator]();
    const first = await iterator.next();
    expect(first.value?.kind.case).toBe("caughtUp");
    const writer = sessionsOf(a);
    const appended: number[] = [];
    for (let i = 1; i <= 20; i++) appended.push(Number((await writer.appendEvent({ sessionId: "relay", event: step(i) })).seq));
    const seen: number[] = [];
    let page: string | undefined;
    while (seen.length < 20) {
      const message = await iterator.next();
      if (message.value?.kind.case !== "entries") continue;
      for (const watched of message.value.kind.value.entries) {
        seen.push(Number(watched.entry!.seq));
        page = watched.snapshot?.pageUrl ?? page;
      }
    }
    await iterator.return?.();
    expect(appended).toEqual(Array.from({ length: 20 }, (_, i) => i + 1));
    expect(seen).toEqual(appended);
    // Each live entry carries the snapshot after it, built on the other instance.
    expect(page).toBe("http://localhost:3000/20");
    const fromB = await sessionsOf(b).getSnapshot({ sessionId: "relay" });
    expect(fromB.lastSeq).toBe(20n);
    // A write through b follows a's head (the conflict is etcd's, not either instance's memory).
    const error = await callFailure(sessionsOf(b).appendEvent({ sessionId: "relay", event: step(0), expected: { case: "expectedSeq", value: 19n } }));
    expect(error.code).toBe(Code.Aborted);
    expect((await sessionsOf(b).appendEvent({ sessionId: "relay", event: step(21), expected: { case: "expectedSeq", value: 20n } })).seq).toBe(21n);
  });

  it("blocks Acquire through one while the lock is held through the other, hands it over on release, and fences the old holder's writes", async () => {
    const file = path.join(makeTempDir("berth-etcd-locks-"), "src/shared.ts");
    const held = (await locksOf(a).acquire({ file, owner: "on-a" })).lease!;
    const refused = await callFailure(locksOf(b).acquire({ file, owner: "on-b", maxWait: { seconds: 0n } }));
    expect(refused.code).toBe(Code.ResourceExhausted);
    expect(refused.findDetails(ErrorInfoSchema)[0]?.reason).toBe("WAIT_EXHAUSTED");
    expect(refused.rawMessage).toContain("held by on-a");
    const inspected = await locksOf(b).inspect({ file });
    expect(inspected.holder).toMatchObject({ owner: "on-a", fencingToken: held.fencingToken });

    const waiting = locksOf(b).acquire({ file, owner: "on-b", maxWait: { seconds: 30n } });
    for (;;) {
      if ((await locksOf(a).inspect({ file })).waiters.length === 1) break;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    // A fenced append through b while a holds: accepted (the token is current cluster-wide).
    expect((await sessionsOf(b).appendEvent({ sessionId: "fenced", event: step(1), fence: { file, fencingToken: held.fencingToken } })).seq).toBe(1n);
    expect((await locksOf(a).release({ leaseToken: held.leaseToken })).released).toBe(true);
    const next = (await waiting).lease!;
    expect(next.fencingToken).toBeGreaterThan(held.fencingToken);
    // The old token is refused by etcd's compare, through either instance.
    for (const service of [a, b]) {
      const stale = await callFailure(
        sessionsOf(service).appendEvent({ sessionId: "fenced", event: step(2), fence: { file, fencingToken: held.fencingToken } }),
      );
      expect(stale.code).toBe(Code.FailedPrecondition);
      expect(stale.findDetails(FenceRejectedSchema)[0]).toMatchObject({ fencingToken: held.fencingToken, currentToken: next.fencingToken });
    }
    expect((await sessionsOf(a).getSnapshot({ sessionId: "fenced" })).lastSeq).toBe(1n);
    await locksOf(b).release({ leaseToken: next.leaseToken });
  });
});

describe("an instance killed", () => {
  it("loses nothing it acknowledged, and the other instance goes on from there", async () => {
    const [a, b] = await Promise.all([etcdService("kill/"), etcdService("kill/")]);
    const watcher = sessionsOf(b).watchSession({ sessionId: "crash" })[Symbol.asyncIterator]();
    expect((await watcher.next()).value?.kind.case).toBe("caughtUp");
    const writer = sessionsOf(a);
    const acknowledged: number[] = [];
    // Appends in flight when a dies: those answered must all be there, once, in order.
    const writing = (async () => {
      for (let i = 1; ; i++) {
        try {
          acknowledged.push(Number((await writer.appendEvent({ sessionId: "crash", event: step(i), idempotencyKey: `k${i}` })).seq));
        } catch {
          return;
        }
      }
    })();
    while (acknowledged.length < 30) await new Promise((resolve) => setTimeout(resolve, 5));
    a.kill();
    await writing;
    const seqs: number[] = [];
    for await (const batch of sessionsOf(b).readJournal({ sessionId: "crash" })) for (const entry of batch.entries) seqs.push(Number(entry.seq));
    expect(seqs.slice(0, acknowledged.length)).toEqual(acknowledged);
    expect(seqs).toEqual(Array.from({ length: seqs.length }, (_, i) => i + 1));
    // The watcher on b saw every one of them, in order.
    const seen: number[] = [];
    while (seen.length < seqs.length) {
      const message = await watcher.next();
      if (message.value?.kind.case === "entries") for (const watched of message.value.kind.value.entries) seen.push(Number(watched.entry!.seq));
    }
    expect(seen).toEqual(seqs);
    await watcher.return?.();
    expect((await sessionsOf(b).appendEvent({ sessionId: "crash", event: step(0) })).seq).toBe(BigInt(seqs.length + 1));
  });

  it("frees the locks it granted when their etcd lease expires", async () => {
    const [a, b] = await Promise.all([etcdService("expiry/", ["--etcd-lease-ttl", "2s"]), etcdService("expiry/", ["--etcd-lease-ttl", "2s"])]);
    const file = path.join(makeTempDir("berth-etcd-locks-"), "orphan.ts");
    const held = (await locksOf(a).acquire({ file, owner: "dies", ttl: { seconds: 3600n } })).lease!;
    a.kill();
    // Waits in etcd's queue until the dead instance's lease runs out (2 s, or a little more).
    const started = Date.now();
    const next = (await locksOf(b).acquire({ file, owner: "survivor", maxWait: { seconds: 30n } })).lease!;
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(next.fencingToken).toBeGreaterThan(held.fencingToken);
  });
});

describe("retention of completed sessions", () => {
  it("two instances with --completed-retention delete a completed session once, when it falls due", { timeout: 60_000 }, async () => {
    const [a, b] = await Promise.all([etcdService("retention/", ["--completed-retention", "2s"]), etcdService("retention/", ["--completed-retention", "2s"])]);
    expect((await sessionsOf(a).getLimits({})).completedRetention).toMatchObject({ seconds: 2n });
    const controller = new AbortController();
    const all = sessionsOf(b).watchSessions({ includeCurrent: true }, { signal: controller.signal, timeoutMs: 30_000 })[Symbol.asyncIterator]();
    expect((await all.next()).value?.kind.case).toBe("caughtUp");
    const writer = sessionsOf(a);
    await writer.appendEvent({ sessionId: "active", event: step(1) });
    const done = await writer.appendEvents({ sessionId: "done", events: [step(1), create(EventSchema, { kind: { case: "complete", value: {} } })] });
    // About 2 s later one of the two deletes it: watchers hear of one deletion, then what comes next.
    const changes: string[] = [];
    for (;;) {
      const change = (await all.next()).value!.kind;
      if (change.case !== "change") continue;
      changes.push(`${change.value.sessionId}${change.value.deleted ? " deleted" : ""}@${change.value.lastSeq}`);
      if (change.value.deleted) break;
    }
    expect(changes).toEqual(["active@1", `done@${done.lastSeq}`, `done deleted@${done.lastSeq}`]);
    await writer.appendEvent({ sessionId: "active", event: step(2) });
    const next = (await all.next()).value!.kind;
    expect(next.case === "change" && next.value).toMatchObject({ sessionId: "active", lastSeq: 2n, deleted: false });
    controller.abort();
    const deleter = await Promise.any([a, b].map((service) => service.waitForLog((entry) => entry.msg === "deleted a completed session past its retention")));
    expect(deleter).toMatchObject({ sessionId: "done" });
    const logged = [a, b].flatMap((service) => service.entries()).filter((entry) => entry.msg === "deleted a completed session past its retention");
    expect(logged).toHaveLength(1);
    expect((await sessionsOf(b).listSessions({ includeCompleted: true })).sessions.map((snapshot) => snapshot.id)).toEqual(["active"]);
  });
});

describe("settings", () => {
  it("refuses --store etcd without endpoints, and with a setting only the file store serves", async () => {
    const missing = launchService("sessions", { args: ["--store", "etcd"] });
    expect(await missing.outcome).toMatchObject({ state: "exited" });
    expect(missing.stderr() + missing.logs()).toContain("--store etcd needs --etcd-endpoints");
    const live = launchService("sessions", { args: ["--store", "etcd", "--etcd-endpoints", etcd.clientUrls[0]!, "--live-dir", makeTempDir()] });
    expect(await live.outcome).toMatchObject({ state: "exited" });
    expect(live.stderr() + live.logs()).toContain("--live-dir cannot be served with --store etcd");
    const stray = launchService("sessions", { args: ["--etcd-endpoints", etcd.clientUrls[0]!] });
    expect(await stray.outcome).toMatchObject({ state: "exited" });
    expect(stray.stderr() + stray.logs()).toContain("--etcd-endpoints is for --store etcd");
  });

  it("takes its settings from the environment too, and runs without a state-directory election", async () => {
    const stateDir = makeTempDir();
    const env = { BERTH_STORE: "etcd", BERTH_ETCD_ENDPOINTS: etcd.clientUrls.join(","), BERTH_ETCD_PREFIX: "env/" };
    // Two instances on one state directory: in etcd mode neither holds it.
    const [a, b] = await Promise.all([startService("sessions", { stateDir, env }), startService("sessions", { stateDir, env })]);
    await sessionsOf(a).appendEvent({ sessionId: "env", event: step(1) });
    expect((await sessionsOf(b).getSnapshot({ sessionId: "env" })).lastSeq).toBe(1n);
  });
});
