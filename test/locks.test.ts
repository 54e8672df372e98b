/**
 * Source locks against a started sessions service, on each store (`file`, and `etcd` on one real
 * member) where the store serves it: FIFO over the network, the
 * wait timeout and its details, a Hold freed when its client process is SIGKILLed, KeepAlive,
 * lease expiry, fencing tokens across restarts of the service process, fenced appends, interop
 * with processes following the seed's lock-file protocol, and bad paths.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, readdirSync } from "node:fs";
import * as path from "node:path";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { HolderKind, LockHeldSchema, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { FenceRejectedSchema, SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { childScripts, spawnChild, type Child, type ChildScripts } from "@berth/sessions/locks/testing/child-scripts";
import {
  closeClient,
  connectClient,
  grpcJsClient,
  GrpcStatus,
  isGrpcError,
  makeTempDir,
  onStore,
  REPO_ROOT,
  startService,
  stopAll,
  STORES,
  storeTags,
  type ServiceProcess,
  type StoreKind,
  callFailure,
} from "./harness.js";

afterAll(stopAll);

/** A project directory and a sessions service (lock paths are absolute: clients send them so). */
async function lockService(options: { stateDir?: string; liveDir?: string; projectRoot?: string; store?: StoreKind } = {}) {
  const root = makeTempDir("berth-locks-e2e-");
  const projectRoot = options.projectRoot ?? path.join(root, "project");
  mkdirSync(projectRoot, { recursive: true });
  // Debug: a repeat's joining a waiting request is seen in the log.
  const args: string[] = ["--log-level", "debug"];
  if (options.liveDir !== undefined) args.push("--live-dir", options.liveDir);
  const service = await startService(
    "sessions",
    await onStore(options.store ?? "file", { args, ...(options.stateDir === undefined ? {} : { stateDir: options.stateDir }) }),
  );
  return { service, projectRoot, url: service.url("sessions") };
}

/** A LockService client on a connection of its own. */
function locksOf(url: string): Client<typeof LockService> {
  return connectClient(LockService, url, { protocol: "grpc", defaultTimeoutMs: 30_000 });
}

/** Polls Inspect until `predicate` holds (the service is in another process: no hooks to wait on). */
async function until(
  client: Client<typeof LockService>,
  file: string,
  predicate: (state: Awaited<ReturnType<Client<typeof LockService>["inspect"]>>) => boolean,
  timeoutMs = 10_000,
) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const state = await client.inspect({ file });
    if (predicate(state)) return state;
    if (Date.now() > deadline)
      throw new Error(`inspect of ${file} never matched: ${JSON.stringify({ holder: state.holder?.owner, waiters: state.waiters.map((w) => w.owner) })}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

for (const store of STORES) {
  describe(`LockService over the network (${store} store)`, storeTags(store), () => {
    let service: ServiceProcess;
    let url: string;
    let projectRoot: string;
    beforeAll(async () => {
      ({ service, url, projectRoot } = await lockService({ store }));
    });
    afterAll(() => service.stop());

    it("serves waiters on separate connections in arrival order", async () => {
      const file = path.join(projectRoot, "src/fifo.ts");
      const holder = locksOf(url);
      const first = (await holder.acquire({ file, owner: "holder" })).lease!;
      const order: string[] = [];
      const leases: Array<Promise<{ owner: string; token: bigint; leaseToken: string; client: Client<typeof LockService> }>> = [];
      for (let i = 0; i < 5; i++) {
        const client = locksOf(url);
        const owner = `waiter-${i}`;
        leases.push(
          client.acquire({ file, owner, maxWait: { seconds: 30n } }).then(({ lease }) => {
            order.push(owner);
            return { owner, token: lease!.fencingToken, leaseToken: lease!.leaseToken, client };
          }),
        );
        // Each joins only once the previous one is queued: that is the arrival order.
        await until(holder, file, (s) => s.waiters.length === i + 1);
      }
      expect((await holder.inspect({ file })).waiters.map((w) => w.owner)).toEqual(["waiter-0", "waiter-1", "waiter-2", "waiter-3", "waiter-4"]);
      await holder.release({ leaseToken: first.leaseToken });
      let lastToken = first.fencingToken;
      for (const pending of leases) {
        const lease = await pending;
        expect(lease.token).toBeGreaterThan(lastToken);
        lastToken = lease.token;
        await lease.client.release({ leaseToken: lease.leaseToken });
        closeClient(lease.client);
      }
      expect(order).toEqual(["waiter-0", "waiter-1", "waiter-2", "waiter-3", "waiter-4"]);
    });

    it("answers a wait that runs out with RESOURCE_EXHAUSTED WAIT_EXHAUSTED, the holder in the LockHeld detail and the error header", async () => {
      const file = path.join(projectRoot, "src/timeout.ts");
      const holder = locksOf(url);
      const lease = (await holder.acquire({ file, owner: "alice" })).lease!;
      const started = Date.now();
      const error = await callFailure(locksOf(url).acquire({ file, owner: "bob", maxWait: { seconds: 0n, nanos: 300_000_000 } }));
      expect(Date.now() - started).toBeGreaterThanOrEqual(250);
      expect(error.code).toBe(Code.ResourceExhausted);
      expect(error.findDetails(ErrorInfoSchema)[0]).toMatchObject({ reason: "WAIT_EXHAUSTED", domain: "berth.locks" });
      expect(error.rawMessage).toMatch(
        /^source locked: .*timeout\.ts is held by alice since .* \(fencing token \d+\); it stayed locked for the whole wait of 300ms/,
      );
      const [held] = error.findDetails(LockHeldSchema);
      expect(held).toMatchObject({
        file,
        owner: "alice",
        fencingToken: lease.fencingToken,
        kind: HolderKind.LEASE,
        pid: service.pid,
        waited: { seconds: 0n, nanos: 300_000_000 },
      });
      expect(timestampMs(held!.acquireTime!)).toBe(timestampMs(lease.acquireTime!));

      // A grpc-js client (another implementation) sees the status and the JSON details header.
      const grpcJs = grpcJsClient(url);
      try {
        await grpcJs.unary(LockService.method.acquire, { file, owner: "carol", maxWait: { seconds: 0n } });
        throw new Error("expected RESOURCE_EXHAUSTED");
      } catch (e) {
        if (!isGrpcError(e)) throw e;
        expect(e.code).toBe(GrpcStatus.RESOURCE_EXHAUSTED);
        const details = JSON.parse(String(e.metadata.get("berth-error-details")[0])) as Record<string, unknown>;
        expect(details).toMatchObject({ reason: "WAIT_EXHAUSTED", file, owner: "alice", fencingToken: Number(lease.fencingToken), kind: "lease", waitedMs: 0 });
      }
      await holder.release({ leaseToken: lease.leaseToken });
    });

    it("keeps a renewed lease past its ttl; unrenewed, it expires and the next waiter gets it", async () => {
      const file = path.join(projectRoot, "src/lease.ts");
      const holder = locksOf(url);
      const lease = (await holder.acquire({ file, owner: "renewer", ttl: { seconds: 2n } })).lease!;
      const waiter = locksOf(url);
      let grantedAt = 0;
      const next = waiter.acquire({ file, owner: "next", maxWait: { seconds: 20n } }).then((r) => ((grantedAt = Date.now()), r.lease!));

      // Renew every 200 ms for 5 s: 2.5 ttls, each renewal with 1.8 s to spare for a stalled process;
      // on one stream for the first half, then with unary calls.
      const renewals: boolean[] = [];
      const stop = new AbortController();
      async function* requests() {
        const end = Date.now() + 2_500;
        while (Date.now() < end) {
          yield { leaseToken: lease.leaseToken };
          await new Promise((resolve) => setTimeout(resolve, 200));
        }
      }
      for await (const answer of holder.keepAliveStream(requests(), { signal: stop.signal })) renewals.push(answer.renewal!.alive);
      for (const end = Date.now() + 2_500; Date.now() < end; await new Promise((resolve) => setTimeout(resolve, 200))) {
        renewals.push(...(await holder.keepAlive({ leaseTokens: [lease.leaseToken] })).renewals.map((r) => r.alive));
      }
      expect(renewals.length).toBeGreaterThanOrEqual(10);
      expect(renewals.every(Boolean)).toBe(true);
      expect(grantedAt).toBe(0);
      const held = await holder.inspect({ file });
      expect(held.holder?.owner).toBe("renewer");
      expect(held.waiters.map((w) => w.owner)).toEqual(["next"]);

      // No more renewals: gone within a ttl (plus slack for a loaded machine), and handed on.
      const stoppedAt = Date.now();
      const granted = await next;
      expect(granted.owner).toBe("next");
      expect(grantedAt - stoppedAt).toBeLessThan(6_000);
      async function* late() {
        yield { leaseToken: lease.leaseToken };
      }
      for await (const answer of holder.keepAliveStream(late())) expect(answer.renewal?.alive).toBe(false);
      expect((await holder.keepAlive({ leaseTokens: [lease.leaseToken] })).renewals).toMatchObject([{ leaseToken: lease.leaseToken, alive: false }]);
      expect((await holder.release({ leaseToken: lease.leaseToken })).released).toBe(false);
      expect((await holder.inspect({ file })).holder?.owner).toBe("next");
      await waiter.release({ leaseToken: granted.leaseToken });
    });

    it("request ids: a repeat answers the first answer (also after the lease ended), the id for another request is ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED, a repeat while the first waits joins it", async () => {
      const client = locksOf(url);
      const file = path.join(projectRoot, "src/keyed.ts");
      const seconds = (s: number) => ({ seconds: BigInt(s), nanos: 0 });
      const first = (await client.acquire({ file, owner: "retrier", ttl: seconds(20), maxWait: seconds(5), requestId: "acq-1" })).lease!;
      const respelt = path.join(projectRoot, "src/./keyed.ts");
      expect((await client.acquire({ file: respelt, owner: "retrier", ttl: seconds(20), maxWait: seconds(0), requestId: "acq-1" })).lease).toEqual(first);
      const reuses = [
        () => client.acquire({ file, owner: "retrier", ttl: seconds(30), requestId: "acq-1" }),
        () => client.acquire({ file: path.join(projectRoot, "src/other.ts"), owner: "retrier", ttl: seconds(20), requestId: "acq-1" }),
        () => client.release({ leaseToken: first.leaseToken, requestId: "acq-1" }),
      ];
      for (const reuse of reuses) {
        const error = await callFailure(reuse());
        expect(error.code).toBe(Code.AlreadyExists);
        const [info] = error.findDetails(ErrorInfoSchema);
        expect([info?.reason, info?.domain, info?.metadata.requestId, info?.metadata.rpc, info?.metadata.file]).toEqual([
          "IDEMPOTENCY_KEY_REUSED",
          "berth.locks",
          "acq-1",
          "Acquire",
          first.file,
        ]);
      }
      expect((await client.inspect({ file: path.join(projectRoot, "src/other.ts") })).holder).toBeUndefined();
      expect((await client.release({ leaseToken: first.leaseToken, requestId: "rel-1" })).released).toBe(true);
      expect((await client.release({ leaseToken: first.leaseToken, requestId: "rel-1" })).released).toBe(true);
      // After the lease ended: the first answer again, granting nothing; its renewal finds it gone.
      expect((await client.acquire({ file, owner: "retrier", ttl: seconds(20), requestId: "acq-1" })).lease).toEqual(first);
      expect((await client.inspect({ file })).holder).toBeUndefined();
      expect((await client.keepAlive({ leaseTokens: [first.leaseToken] })).renewals.map((r) => r.alive)).toEqual([false]);
      expect((await client.getLimits({})).idempotencyWindow).toMatchObject({ seconds: 3600n });

      // The first call leaves while it waits: the repeat (on another connection) keeps its one place.
      const holder = (await client.acquire({ file, owner: "holder" })).lease!;
      const leaving = new AbortController();
      const gone = callFailure(client.acquire({ file, owner: "retrier", maxWait: seconds(20), requestId: "acq-2" }, { signal: leaving.signal }));
      await until(client, file, (s) => s.waiters.length === 1);
      const again = locksOf(url).acquire({ file, owner: "retrier", maxWait: seconds(20), requestId: "acq-2" });
      await service.waitForLog((e) => e.msg === "lock request joined by a repeat" && e.requestId === "acq-2");
      leaving.abort();
      expect((await gone).code).toBe(Code.Canceled);
      expect((await client.inspect({ file })).waiters.map((w) => w.owner)).toEqual(["retrier"]);
      await client.release({ leaseToken: holder.leaseToken });
      const granted = (await again).lease!;
      expect(granted.owner).toBe("retrier");
      expect((await client.acquire({ file, owner: "retrier", maxWait: seconds(0), requestId: "acq-2" })).lease).toEqual(granted);
      await client.release({ leaseToken: granted.leaseToken });
    });

    it("refuses bad paths (relative, too long, in /proc, /sys, /dev, the root) with INVALID_ARGUMENT naming the field and rule", async () => {
      const client = locksOf(url);
      const cases: Array<[string, RegExp]> = [
        ["src/../../etc/passwd", /^file: must be an absolute path; resolve it against your working directory before sending/],
        ["/src/a\0.ts", /^file: must not contain a NUL byte/],
        [`/src/${"x".repeat(4100)}`, /^file: must be at most 4096 bytes/],
        [`/src/${"x".repeat(300)}.ts`, /^file: must have names of at most 255 bytes between slashes/],
        ["", /^file: is required/],
        ["/proc/self/environ", /^file: resolves into \/proc, the kernel's file system of processes and devices, which is not lockable/],
        ["/sys/kernel", /^file: resolves into \/sys/],
        ["/dev/null", /^file: resolves into \/dev/],
        ["/", /^file: names the root directory, not a file/],
      ];
      for (const [file, message] of cases) {
        for (const call of [
          () => client.acquire({ file, owner: "x", maxWait: { seconds: 0n } }),
          () => client.inspect({ file }),
          () => client.checkToken({ file, fencingToken: 1n }),
        ]) {
          const error = await callFailure(call());
          expect(error.code).toBe(Code.InvalidArgument);
          expect(error.rawMessage).toMatch(message);
        }
        const error = await callFailure(
          (async () => {
            for await (const _ of client.hold({ file, owner: "x", maxWait: { seconds: 0n } }));
          })(),
        );
        expect(error.code).toBe(Code.InvalidArgument);
      }
      const negative = await callFailure(client.acquire({ file: "/ok.ts", owner: "x", maxWait: { seconds: -1n } }));
      expect(negative.rawMessage).toMatch(/^max_wait: must not be negative/);
    });
  });
}

for (const store of STORES) {
  describe(`Hold and the client process (${store} store)`, storeTags(store), () => {
    const children: ChildProcess[] = [];
    afterEach(() => {
      for (const child of children) child.kill("SIGKILL");
      children.length = 0;
    });

    /** A separate node process holding `file` through a Hold stream; resolves once it holds. */
    async function holdingProcess(url: string, file: string, owner: string): Promise<{ child: ChildProcess; token: bigint }> {
      const script = `
      import { createClient } from "@connectrpc/connect";
      import { createGrpcTransport } from "@connectrpc/connect-node";
      import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
      const [url, file, owner] = process.argv.slice(1);
      const client = createClient(LockService, createGrpcTransport({ baseUrl: url }));
      for await (const message of client.hold({ file, owner, maxWait: { seconds: 30n } })) {
        if (message.kind.case === "acquired") process.stdout.write("acquired " + message.kind.value.fencingToken + "\\n");
      }`;
      const child = spawn(process.execPath, ["--input-type=module", "-e", script, url, file, owner], { cwd: REPO_ROOT, stdio: ["ignore", "pipe", "inherit"] });
      children.push(child);
      const token = await new Promise<bigint>((resolve, reject) => {
        let out = "";
        child.stdout!.on("data", (chunk: Buffer) => {
          out += chunk.toString();
          const match = /acquired (\d+)/.exec(out);
          if (match) resolve(BigInt(match[1]!));
        });
        child.once("exit", (code) => reject(new Error(`the holding process exited (${code}) before holding`)));
      });
      return { child, token };
    }

    it("frees the lock the moment the holding process is SIGKILLed; the next waiter gets it", async () => {
      const { service, url, projectRoot } = await lockService({ store });
      const file = path.join(projectRoot, "src/killed.ts");
      const { child, token } = await holdingProcess(url, file, "doomed");
      const client = locksOf(url);
      expect((await client.inspect({ file })).holder).toMatchObject({ owner: "doomed", kind: HolderKind.STREAM, fencingToken: token });
      let grantedAt = 0;
      const next = client.acquire({ file, owner: "next", maxWait: { seconds: 20n } }).then((r) => ((grantedAt = Date.now()), r.lease!));
      await until(client, file, (s) => s.waiters.length === 1);
      const exited = new Promise((resolve) => child.once("exit", resolve));
      const killedAt = Date.now();
      child.kill("SIGKILL");
      const lease = await next;
      await exited;
      expect(lease.owner).toBe("next");
      expect(lease.fencingToken).toBeGreaterThan(token);
      // "Promptly": the connection's end, not a lease timeout (there is none on a Hold) nor the
      // stream's 5 s heartbeat meeting a dead socket; the bound leaves a loaded machine room.
      expect(grantedAt - killedAt).toBeLessThan(4_000);
      await service.stop();
    });
  });
}

// The file store only: the seed's lock files are kept in a live directory, which the etcd store does not serve.
describe("shutdown", () => {
  it("ends open Hold streams and waiting Acquires with UNAVAILABLE, exits 0 and removes berth's lock files", async () => {
    const root = makeTempDir("berth-locks-shutdown-");
    const projectRoot = path.join(root, "project");
    const liveDir = path.join(projectRoot, ".impeccable", "live");
    mkdirSync(liveDir, { recursive: true });
    const { service, url } = await lockService({ liveDir, projectRoot });
    const client = locksOf(url);
    const file = path.join(projectRoot, "src/shutdown.ts");
    let acquired = false;
    const holding = (async () => {
      try {
        for await (const message of client.hold({ file, owner: "holder" })) if (message.kind.case === "acquired") acquired = true;
        return "ended";
      } catch (error) {
        return ConnectError.from(error).code;
      }
    })();
    await until(client, file, (s) => s.holder !== undefined);
    const waiting = callFailure(locksOf(url).acquire({ file, owner: "waiter", maxWait: { seconds: 60n } }));
    await until(client, file, (s) => s.waiters.length === 1);
    const lockPath = (await client.inspect({ file })).lockPath;
    expect(readdirSync(path.dirname(lockPath))).toContain(path.basename(lockPath));

    const started = Date.now();
    expect(await service.stop()).toEqual({ code: 0, signal: null });
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(acquired).toBe(true);
    expect(await holding).toBe(Code.Unavailable);
    expect((await waiting).code).toBe(Code.Unavailable);
    expect(readdirSync(path.dirname(lockPath)).filter((name) => name.endsWith(".lock"))).toEqual([]);
  });
});

for (const store of STORES) {
  describe(`fencing across restarts and fenced appends (${store} store)`, storeTags(store), () => {
    it("keeps fencing tokens rising across a clean restart and a crash of the service process", async () => {
      const stateDir = path.join(makeTempDir("berth-locks-state-"), "state");
      const project = makeTempDir("berth-locks-project-");
      const tokens: bigint[] = [];
      for (const ending of ["stop", "kill", "stop"] as const) {
        const { service, url } = await lockService({ stateDir, projectRoot: project, store });
        const client = locksOf(url);
        for (let i = 0; i < 3; i++) {
          const { lease } = await client.acquire({ file: path.join(project, "src/fenced.ts"), owner: `run-${tokens.length}` });
          tokens.push(lease!.fencingToken);
          await client.release({ leaseToken: lease!.leaseToken });
        }
        closeClient(client);
        if (ending === "stop") expect((await service.stop()).code).toBe(0);
        else await service.kill();
      }
      for (let i = 1; i < tokens.length; i++) expect(tokens[i]).toBeGreaterThan(tokens[i - 1]!);
    });

    it("refuses an AppendEvent whose fence is no longer current (FAILED_PRECONDITION FENCE_REJECTED, FenceRejected) and writes nothing", async () => {
      const { service, url, projectRoot } = await lockService({ store });
      const locks = locksOf(url);
      const sessions = connectClient(SessionService, url, { protocol: "grpc" });
      const file = path.join(projectRoot, "src/journal.ts");
      const stale = (await locks.acquire({ file, owner: "paused-writer", ttl: { seconds: 0n, nanos: 200_000_000 } })).lease!;
      // The writer pauses past its lease; another takes the lock.
      const current = (await locks.acquire({ file, owner: "new-writer", maxWait: { seconds: 10n } })).lease!;
      expect(current.fencingToken).toBeGreaterThan(stale.fencingToken);

      const event = { kind: { case: "agentPhase" as const, value: { phase: "planning" } } };
      const refused = await callFailure(sessions.appendEvent({ sessionId: "fenced-1", event, fence: { file, fencingToken: stale.fencingToken } }));
      expect(refused.code).toBe(Code.FailedPrecondition);
      expect(refused.findDetails(FenceRejectedSchema)[0]).toMatchObject({ file, fencingToken: stale.fencingToken, currentToken: current.fencingToken });
      expect((await callFailure(sessions.getSnapshot({ sessionId: "fenced-1" }))).code).toBe(Code.NotFound);

      const ok = await sessions.appendEvent({ sessionId: "fenced-1", event, fence: { file, fencingToken: current.fencingToken } });
      expect(ok.seq).toBe(1n);
      // Released: the token is no longer current either.
      await locks.release({ leaseToken: current.leaseToken });
      const afterRelease = await callFailure(sessions.appendEvent({ sessionId: "fenced-1", event, fence: { file, fencingToken: current.fencingToken } }));
      expect(afterRelease.code).toBe(Code.FailedPrecondition);
      expect(afterRelease.findDetails(FenceRejectedSchema)[0]?.currentToken).toBe(0n);
      const journal = [];
      for await (const entry of sessions.readJournal({ sessionId: "fenced-1" })) journal.push(entry);
      expect(journal).toHaveLength(1);
      await service.stop();
    });
  });
}

describe("interop with processes using the seed's lock-file protocol", () => {
  let scripts: ChildScripts;
  const children: Child[] = [];
  beforeAll(() => {
    scripts = childScripts();
  });
  afterAll(() => scripts.dispose());
  afterEach(async () => {
    for (const child of children) child.process.kill("SIGKILL");
    await Promise.all(children.map((c) => c.exited));
    children.length = 0;
  });

  async function seedHolder(liveDir: string, cwd: string, file: string, owner: string, waitMs: number): Promise<Child> {
    const child = spawnChild(await scripts.script("seed-holder-child.ts"), { liveDir, cwd, file, owner, waitMs });
    children.push(child);
    return child;
  }

  it("waits for a seed process's lock file, and makes a seed process wait for a berth holder", async () => {
    const root = makeTempDir("berth-locks-seed-");
    const projectRoot = path.join(root, "project");
    const liveDir = path.join(projectRoot, ".impeccable", "live");
    mkdirSync(liveDir, { recursive: true });
    const { service, url } = await lockService({ liveDir, projectRoot });
    const client = locksOf(url);
    // A seed process working in the project names the file relative to it; berth's clients send it absolute.
    const relative = "src/shared.ts";
    const file = path.join(projectRoot, relative);

    // 1. A seed process holds it: berth refuses a try-once, names the process, and queues a waiter
    //    that is granted once the seed process lets go.
    const seed = await seedHolder(liveDir, projectRoot, relative, "seed-tool", 0);
    await seed.next("acquired");
    const refused = await callFailure(client.acquire({ file, owner: "berth-client", maxWait: { seconds: 0n } }));
    expect(refused.code).toBe(Code.ResourceExhausted);
    expect(refused.findDetails(LockHeldSchema)[0]).toMatchObject({ owner: "seed-tool", kind: HolderKind.SEED_LOCK_FILE, pid: seed.pid, fencingToken: 0n });
    expect((await client.inspect({ file })).holder).toMatchObject({ owner: "seed-tool", kind: HolderKind.SEED_LOCK_FILE, pid: seed.pid });
    const waiting = client.acquire({ file, owner: "berth-client", maxWait: { seconds: 20n } });
    await until(client, file, (s) => s.waiters.length === 1);
    seed.send("release");
    await seed.next("released");
    const lease = (await waiting).lease!;
    expect(lease.owner).toBe("berth-client");

    // 2. berth holds it: a seed process trying once is refused; one that waits gets it after release.
    const once = await seedHolder(liveDir, projectRoot, relative, "seed-once", 0);
    await once.next("locked");
    expect(await once.exited).toBe(3);
    const patient = await seedHolder(liveDir, projectRoot, relative, "seed-patient", 20_000);
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await client.release({ leaseToken: lease.leaseToken })).toMatchObject({ released: true });
    await patient.next("acquired");
    expect((await client.inspect({ file })).holder).toMatchObject({ owner: "seed-patient", kind: HolderKind.SEED_LOCK_FILE });
    patient.send("release");
    await patient.next("released");
    await until(client, file, (s) => s.holder === undefined);
    await service.stop();
  });
});
