import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, type ConnectError, createClient, createRouterTransport, type Interceptor } from "@connectrpc/connect";
import { HolderKind, LockHeldSchema, LockService as LockServiceDesc } from "@berth/api/berth/locks/v1/lock_service_pb";
import { silentLogger } from "@berth/shared/logger";
import { createErrorInterceptor, implement, startServer, toConnectError, type RunningServer } from "@berth/shared/server/index";
import { WIRE_PROTOCOLS, connectOver } from "@berth/shared/server/testing/wire-protocols";
import { createSourceLocks, LOCK_RETRY_AFTER_MS, lockFilePath, type SourceLocks } from "../locks/index.js";
import { createLockHandlers } from "./lock-handlers.js";
import {
  clock,
  client,
  closeLockService,
  errorInfo,
  failure,
  FILE,
  key,
  liveDir,
  locks,
  ms,
  projectRoot,
  root,
  serve,
  setUpLockService,
} from "./lock-handler-fixtures.js";

const HOUR = 3_600_000;

beforeEach(setUpLockService);
afterEach(closeLockService);

describe("Acquire and Release", () => {
  it("grants a lease with a fencing token, expiry and ttl; releases only with its own token", async () => {
    const { lease } = await client.acquire({ file: FILE, owner: "alice", ttl: ms(10_000) });
    expect(lease?.file).toBe(key());
    expect(lease?.owner).toBe("alice");
    expect(lease?.fencingToken).toBeGreaterThan(0n);
    expect(timestampMs(lease!.expireTime!)).toBe(clock.now() + 10_000);
    expect(timestampMs(lease!.acquireTime!)).toBe(clock.now());
    expect(lease?.ttl?.seconds).toBe(10n);

    expect((await client.release({ leaseToken: lease!.leaseToken })).released).toBe(true);
    const second = await client.acquire({ file: FILE, owner: "bob" });
    expect(second.lease!.fencingToken).toBeGreaterThan(lease!.fencingToken);
    // A stale (repeated) release of the first lease never frees bob's lock.
    expect((await client.release({ leaseToken: lease!.leaseToken })).released).toBe(false);
    expect((await client.inspect({ file: FILE })).holder?.owner).toBe("bob");
  });

  it("refuses a busy lock tried once with RESOURCE_EXHAUSTED WAIT_EXHAUSTED (domain berth.locks, RetryInfo) and the LockHeld detail", async () => {
    const { lease } = await client.acquire({ file: FILE, owner: "alice" });
    const error = await failure(client.acquire({ file: FILE, owner: "bob", maxWait: ms(0) }));
    expect(error.code).toBe(Code.ResourceExhausted);
    expect(errorInfo(error)).toEqual({ reason: "WAIT_EXHAUSTED", domain: "berth.locks", retryAfterMs: LOCK_RETRY_AFTER_MS });
    expect(error.rawMessage).toMatch(/held by alice since .* \(fencing token \d+\); it was not free \(max_wait was 0: try once\)/);
    // The JSON mirror names the reason once, from ErrorInfo, and the same facts.
    expect(JSON.parse(error.metadata.get("berth-error-details")!)).toMatchObject({ reason: "WAIT_EXHAUSTED", file: key(), owner: "alice", waitedMs: 0 });
    const [held] = error.findDetails(LockHeldSchema);
    expect(held).toMatchObject({
      file: key(),
      owner: "alice",
      fencingToken: lease!.fencingToken,
      kind: HolderKind.LEASE,
      lockPath: lockFilePath(path.join(liveDir, "locks"), key()),
      pid: process.pid,
    });
    expect(timestampMs(held!.acquireTime!)).toBe(timestampMs(lease!.acquireTime!));
    expect(held!.waited).toMatchObject({ seconds: 0n, nanos: 0 });
  });

  it("serves waiters in arrival order, each the moment the lock is released", async () => {
    const first = (await client.acquire({ file: FILE, owner: "w0" })).lease!;
    const order: string[] = [];
    const waiters = ["w1", "w2", "w3"].map((owner) => client.acquire({ file: FILE, owner, maxWait: ms(60_000) }).then((r) => (order.push(owner), r.lease!)));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters.map((w) => w.owner)).toEqual(["w1", "w2", "w3"]));
    let token = first.leaseToken;
    let fencing = first.fencingToken;
    for (const waiter of waiters) {
      await client.release({ leaseToken: token });
      const lease = await waiter;
      expect(lease.fencingToken).toBeGreaterThan(fencing);
      token = lease.leaseToken;
      fencing = lease.fencingToken;
    }
    expect(order).toEqual(["w1", "w2", "w3"]);
  });

  it("answers a wait that runs out with WAIT_EXHAUSTED naming the holder and how long it waited", async () => {
    await client.acquire({ file: FILE, owner: "alice" });
    const pending = failure(client.acquire({ file: FILE, owner: "bob", maxWait: ms(2_000) }));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    clock.advance(2_000);
    const error = await pending;
    expect(error.code).toBe(Code.ResourceExhausted);
    expect(errorInfo(error).reason).toBe("WAIT_EXHAUSTED");
    expect(error.rawMessage).toMatch(/whole wait of 2s/);
    expect(error.findDetails(LockHeldSchema)[0]).toMatchObject({ owner: "alice", waited: { seconds: 2n, nanos: 0 } });
    expect(locks.inspect(FILE).waiters).toHaveLength(0);
  });

  it("waits up to the longest wait when max_wait is unset, and caps a longer one to it", async () => {
    serve({ maxWaitMs: 5_000 });
    await client.acquire({ file: FILE, owner: "alice" });
    const unset = failure(client.acquire({ file: FILE, owner: "bob" }));
    const longer = failure(client.acquire({ file: FILE, owner: "carol", maxWait: ms(24 * 3_600_000) }));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters.map((w) => w.deadline - w.since)).toEqual([5_000, 5_000]));
    clock.advance(5_000);
    for (const error of [await unset, await longer]) {
      expect(errorInfo(error).reason).toBe("WAIT_EXHAUSTED");
      expect(error.findDetails(LockHeldSchema)[0]?.waited).toMatchObject({ seconds: 5n });
    }
  });

  it("refuses a waiter beyond the file's queue with RESOURCE_EXHAUSTED TOO_MANY_WAITERS and a RetryInfo", async () => {
    serve({ maxWaitersPerFile: 1 });
    await client.acquire({ file: FILE, owner: "alice" });
    const queued = failure(client.acquire({ file: FILE, owner: "bob" }));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    const error = await failure(client.acquire({ file: FILE, owner: "carol" }));
    expect(error.code).toBe(Code.ResourceExhausted);
    expect(errorInfo(error)).toEqual({ reason: "TOO_MANY_WAITERS", domain: "berth.locks", retryAfterMs: LOCK_RETRY_AFTER_MS });
    expect(error.rawMessage).toMatch(/1 requests already wait for .*app\.ts, the most one file's queue holds/);
    locks.close();
    expect((await queued).code).toBe(Code.Unavailable);
  });

  it("drops a waiter whose caller went away; it is never granted", async () => {
    const { lease } = await client.acquire({ file: FILE, owner: "alice" });
    const controller = new AbortController();
    const pending = failure(client.acquire({ file: FILE, owner: "gone", maxWait: ms(60_000) }, { signal: controller.signal }));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    controller.abort();
    expect((await pending).code).toBe(Code.Canceled);
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(0));
    await client.release({ leaseToken: lease!.leaseToken });
    expect(locks.inspect(FILE).holder).toBeNull();
  });

  it("bounds the wait by the call's deadline, answering WAIT_EXHAUSTED before it", async () => {
    // Real time here: the deadline is the client's, not the service clock's.
    const real = createSourceLocks({ projectRoot, stateDir: path.join(root, "state-real"), liveDir: null });
    try {
      const realClient = createClient(
        LockServiceDesc,
        createRouterTransport((router) => router.service(LockServiceDesc, createLockHandlers({ locks: real })), {
          router: { interceptors: [createErrorInterceptor()] },
        }),
      );
      await realClient.acquire({ file: FILE, owner: "alice" });
      const started = Date.now();
      const error = await failure(realClient.acquire({ file: FILE, owner: "bob" }, { timeoutMs: 400 }));
      expect(error.code).toBe(Code.ResourceExhausted);
      expect(error.findDetails(LockHeldSchema)[0]?.owner).toBe("alice");
      expect(Date.now() - started).toBeLessThan(2_000);
    } finally {
      real.close();
    }
  });

  // A step of the wall clock between a call's arrival and its handler: connect's timeoutMs() moves by
  // the step, the call's deadline does not. An interceptor makes the step there, on a real server
  // (which records when each call arrived), over every protocol. What is judged is the server's
  // answer as its handler gave it (mapped as the server maps it), not what the client received: on a
  // box busy enough to delay the answer past the margin the server leaves before the deadline, the
  // client's own deadline would fire first, which says nothing of how the server bounded its wait.
  async function waitAcrossAStep(stepMs: number, request: { maxWaitMs: number; timeoutMs: number }): Promise<Array<[string, ConnectError]>> {
    let real: SourceLocks | undefined;
    let server: RunningServer | undefined;
    try {
      real = createSourceLocks({ projectRoot, stateDir: path.join(root, "state-real"), liveDir: null });
      vi.useFakeTimers({ toFake: ["Date"] }); // the wall clock only: timers and performance.now stay real
      let answered: (error: ConnectError) => void = () => {};
      const stepWallClock: Interceptor = (next) => async (call) => {
        vi.setSystemTime(Date.now() + stepMs);
        try {
          return await next(call);
        } catch (error) {
          if (call.method.name === "Acquire") answered(toConnectError(error));
          throw error;
        }
      };
      server = await startServer({
        name: "sessions",
        logger: silentLogger,
        services: [implement(LockServiceDesc, createLockHandlers({ locks: real }))],
        interceptors: [stepWallClock],
      });
      await real.acquire({ file: FILE, owner: "alice" });
      const refusals: Array<[string, ConnectError]> = [];
      for (const protocol of WIRE_PROTOCOLS) {
        const connection = connectOver(protocol, server.url);
        try {
          const waiter = createClient(LockServiceDesc, connection.transport);
          // Connected first, so that the deadline is spent on the wait, not on the handshake.
          await waiter.getLimits({});
          const serverAnswer = new Promise<ConnectError>((resolve) => (answered = resolve));
          await failure(waiter.acquire({ file: FILE, owner: "bob", maxWait: ms(request.maxWaitMs) }, { timeoutMs: request.timeoutMs }));
          refusals.push([protocol.name, await serverAnswer]);
        } finally {
          connection.close();
        }
      }
      return refusals;
    } finally {
      await server?.close(false);
      vi.useRealTimers();
      real?.close();
    }
  }

  const waitedMs = (error: ConnectError) => {
    const waited = error.findDetails(LockHeldSchema)[0]?.waited;
    return waited === undefined ? undefined : durationMs(waited);
  };

  it("keeps the whole wait a call asked for when the wall clock steps forward two hours after the call arrived", async () => {
    for (const [protocol, error] of await waitAcrossAStep(2 * HOUR, { maxWaitMs: 300, timeoutMs: 10_000 })) {
      expect(error.code, protocol).toBe(Code.ResourceExhausted);
      // Not "it was not free (max_wait was 0: try once)".
      expect(error.rawMessage, protocol).toContain("it stayed locked for the whole wait of 300ms");
      expect(waitedMs(error), protocol).toBe(300);
    }
  });

  it("still ends the wait before the call's deadline when the wall clock steps back an hour after the call arrived", async () => {
    for (const [protocol, error] of await waitAcrossAStep(-HOUR, { maxWaitMs: 60_000, timeoutMs: 1_500 })) {
      // Not DEADLINE_EXCEEDED after a wait bounded by a deadline an hour away.
      expect(error.code, protocol).toBe(Code.ResourceExhausted);
      expect(waitedMs(error), protocol).toBeLessThan(1_500);
    }
  });
});
