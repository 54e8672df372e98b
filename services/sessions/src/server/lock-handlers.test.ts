import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { durationFromMs, durationMs, timestampMs, type Duration } from "@bufbuild/protobuf/wkt";
import { create } from "@bufbuild/protobuf";
import {
  Code,
  ConnectError,
  createClient,
  createContextValues,
  createHandlerContext,
  createRouterTransport,
  type Client,
  type Interceptor,
} from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import {
  AcquireRequestSchema,
  HolderKind,
  LockHeldSchema,
  LockService as LockServiceDesc,
  type AcquireResponse,
  type HoldResponse,
} from "@berth/api/berth/locks/v1/lock_service_pb";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { silentLogger } from "@berth/shared/logger";
import {
  AnswerDelivery,
  answerDeliveryKey,
  createErrorInterceptor,
  createObserverInterceptor,
  implement,
  ServerMetrics,
  startServer,
  type RunningServer,
} from "@berth/shared/server/index";
import { WIRE_PROTOCOLS, connectOver } from "@berth/shared/server/testing/wire-protocols";
import { createSourceLocks, DEFAULT_LOCK_LIMITS, LOCK_RETRY_AFTER_MS, lockFilePath, type LockLimits, type SourceLocks } from "../locks/index.js";
import { durationInput, createFenceCheck, createLockHandlers, MAX_KEEPALIVE_TOKENS } from "./lock-handlers.js";

let root: string;
let projectRoot: string;
let liveDir: string;
let clock: ManualClock;
let locks: SourceLocks;
let client: Client<typeof LockServiceDesc>;
let metrics: ServerMetrics;

/** The locked file: absolute, as every client sends it. */
let FILE: string;
const key = () => FILE;
const HEARTBEAT_MS = 1_000;
const HOUR = 3_600_000;

/** A lock service with `limits` and a client of its handlers, replacing the ones of beforeEach. */
function serve(limits?: Partial<LockLimits>): void {
  locks?.close();
  locks = createSourceLocks({ projectRoot, stateDir: path.join(root, "state"), liveDir, clock, ...(limits === undefined ? {} : { limits }) });
  const quiet = { debug() {}, info() {}, warn() {}, error() {} };
  const transport = createRouterTransport((router) => router.service(LockServiceDesc, createLockHandlers({ locks, clock, heartbeatMs: HEARTBEAT_MS })), {
    // As the server has them: the observer (which keeps the open streams) outermost.
    router: { interceptors: [createObserverInterceptor({ logger: quiet, metrics }), createErrorInterceptor()] },
  });
  client = createClient(LockServiceDesc, transport);
}

beforeEach(() => {
  root = fs.mkdtempSync(path.join(tmpdir(), "berth-lockrpc-"));
  projectRoot = path.join(root, "project");
  FILE = path.join(projectRoot, "src/app.ts");
  liveDir = path.join(root, "live");
  clock = new ManualClock();
  metrics = new ServerMetrics("sessions");
  serve();
});
afterEach(() => {
  locks.close();
  fs.rmSync(root, { recursive: true, force: true });
});

const ms = (n: number): Duration => durationFromMs(n);

async function failure(promise: Promise<unknown>): Promise<ConnectError> {
  try {
    await promise;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("expected the call to fail");
}

/** The ErrorInfo reason and domain, and the RetryInfo delay (ms) of a refusal. */
function errorInfo(error: ConnectError) {
  const [info] = error.findDetails(ErrorInfoSchema);
  const [retry] = error.findDetails(RetryInfoSchema);
  return {
    reason: info?.reason,
    domain: info?.domain,
    retryAfterMs: retry?.retryDelay === undefined ? undefined : Number(retry.retryDelay.seconds) * 1000 + retry.retryDelay.nanos / 1e6,
  };
}

/** Collects a Hold stream's messages as they arrive, and how it ended. */
function openHold(request: { file?: string; owner: string; maxWait?: Duration }) {
  const controller = new AbortController();
  const messages: HoldResponse[] = [];
  let ended: ConnectError | "ok" | undefined;
  const done = (async () => {
    try {
      for await (const message of client.hold({ file: request.file ?? FILE, owner: request.owner, maxWait: request.maxWait }, { signal: controller.signal }))
        messages.push(message);
      ended = "ok";
    } catch (error) {
      ended = ConnectError.from(error);
    }
  })();
  return {
    messages,
    cancel: () => controller.abort(),
    done,
    get ended() {
      return ended;
    },
    kinds: () => messages.map((m) => m.kind.case),
  };
}

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
  // (which records when each call arrived), over every protocol.
  async function waitAcrossAStep(stepMs: number, request: { maxWaitMs: number; timeoutMs: number }): Promise<Array<[string, ConnectError]>> {
    let real: SourceLocks | undefined;
    let server: RunningServer | undefined;
    try {
      real = createSourceLocks({ projectRoot, stateDir: path.join(root, "state-real"), liveDir: null });
      vi.useFakeTimers({ toFake: ["Date"] }); // the wall clock only: timers and performance.now stay real
      const stepWallClock: Interceptor = (next) => (call) => {
        vi.setSystemTime(Date.now() + stepMs);
        return next(call);
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
          refusals.push([
            protocol.name,
            await failure(waiter.acquire({ file: FILE, owner: "bob", maxWait: ms(request.maxWaitMs) }, { timeoutMs: request.timeoutMs })),
          ]);
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

describe("request_id", () => {
  it("an Acquire repeated answers the first lease, also after it was released; the id for another request is ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED", async () => {
    const { lease } = await client.acquire({ file: FILE, owner: "alice", requestId: "3f1c0d9e-retry" });
    const repeat = await client.acquire({ file: FILE, owner: "alice", maxWait: ms(0), requestId: "3f1c0d9e-retry" });
    expect(repeat.lease).toEqual(lease);
    expect(await client.release({ leaseToken: lease!.leaseToken, requestId: "rel-1" })).toMatchObject({ released: true });
    expect(await client.release({ leaseToken: lease!.leaseToken, requestId: "rel-1" })).toMatchObject({ released: true });
    expect((await client.acquire({ file: FILE, owner: "alice", requestId: "3f1c0d9e-retry" })).lease).toEqual(lease);
    expect(locks.stats().held).toBe(0);
    const renewal = await client.keepAlive({ leaseTokens: [lease!.leaseToken] });
    expect(renewal.renewals.map((r) => r.alive)).toEqual([false]);
    for (const other of [
      () => client.acquire({ file: FILE, owner: "alice", ttl: ms(5_000), requestId: "3f1c0d9e-retry" }),
      () => client.acquire({ file: `${FILE}.other`, owner: "alice", requestId: "3f1c0d9e-retry" }),
      () => client.release({ leaseToken: lease!.leaseToken, requestId: "3f1c0d9e-retry" }),
    ]) {
      const error = await failure(other());
      expect(error.code).toBe(Code.AlreadyExists);
      expect(errorInfo(error)).toMatchObject({ reason: "IDEMPOTENCY_KEY_REUSED", domain: "berth.locks" });
      expect(error.findDetails(ErrorInfoSchema)[0]?.metadata).toEqual({
        requestId: "3f1c0d9e-retry",
        rpc: "Acquire",
        file: lease!.file,
        owner: "alice",
        fencingToken: String(lease!.fencingToken),
      });
    }
    expect(locks.stats()).toEqual({ held: 0, waiting: 0, blockedByLockFiles: 0 });
  });

  it("a repeat while the first call waits joins it: one place in the queue, the same lease for both", async () => {
    const holder = (await client.acquire({ file: FILE, owner: "holder" })).lease!;
    const first = client.acquire({ file: FILE, owner: "alice", maxWait: ms(60_000), requestId: "r-1" });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    const repeat = client.acquire({ file: FILE, owner: "alice", maxWait: ms(120_000), requestId: "r-1" });
    // Joined: the one place now waits as long as its longest call.
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters.map((w) => [w.owner, w.deadline - w.since])).toEqual([["alice", 120_000]]));
    await client.release({ leaseToken: holder.leaseToken });
    const [a, b] = await Promise.all([first, repeat]);
    expect(b.lease).toEqual(a.lease);
    expect(a.lease?.owner).toBe("alice");
    expect(locks.stats()).toMatchObject({ held: 1, waiting: 0 });
  });

  it("keeps the place for the repeat when the first call goes away", async () => {
    const holder = (await client.acquire({ file: FILE, owner: "holder" })).lease!;
    const controller = new AbortController();
    const first = failure(client.acquire({ file: FILE, owner: "alice", maxWait: ms(60_000), requestId: "r-2" }, { signal: controller.signal }));
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    const repeat = client.acquire({ file: FILE, owner: "alice", maxWait: ms(120_000), requestId: "r-2" });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters.map((w) => [w.owner, w.deadline - w.since])).toEqual([["alice", 120_000]]));
    controller.abort();
    expect((await first).code).toBe(Code.Canceled);
    expect(locks.inspect(FILE).waiters.map((w) => [w.owner, w.deadline - w.since])).toEqual([["alice", 120_000]]);
    await client.release({ leaseToken: holder.leaseToken });
    expect((await repeat).lease?.owner).toBe("alice");
  });

  it("a grant made in the turn its caller goes away is released without a request_id, and kept for the repeat with one", async () => {
    for (const requestId of ["", "r-3"]) {
      const holder = (await client.acquire({ file: FILE, owner: "holder" })).lease!;
      const controller = new AbortController();
      const gone = failure(client.acquire({ file: FILE, owner: "alice", maxWait: ms(60_000), requestId }, { signal: controller.signal }));
      await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
      // Granted, and the caller gone, before the handler runs again.
      locks.release(holder.leaseToken);
      controller.abort();
      expect((await gone).code).toBe(Code.Canceled);
      await vi.waitFor(() => expect(locks.stats().held).toBe(requestId === "" ? 0 : 1));
      if (requestId === "") continue;
      // The retry (the client's answer was lost) finds its lease.
      const retried = (await client.acquire({ file: FILE, owner: "alice", maxWait: ms(0), requestId })).lease!;
      expect(locks.inspect(FILE).holder).toMatchObject({ owner: "alice", fencingToken: Number(retried.fencingToken) });
      await client.release({ leaseToken: retried.leaseToken });
    }
  });

  it("refuses a malformed request_id with INVALID_ARGUMENT INVALID_FIELD naming request_id (BadRequest)", async () => {
    const error = await failure(client.acquire({ file: FILE, owner: "alice", requestId: "has spaces" }));
    expect(error.code).toBe(Code.InvalidArgument);
    expect(errorInfo(error)).toMatchObject({ reason: "INVALID_FIELD", domain: "berth.locks" });
    expect(error.rawMessage).toMatch(/^request_id: must match \[A-Za-z0-9._-\]\{1,128\}/);
    expect(error.findDetails(BadRequestSchema)[0]?.fieldViolations.map((v) => v.field)).toEqual(["request_id"]);
    expect(locks.stats()).toEqual({ held: 0, waiting: 0, blockedByLockFiles: 0 });
  });
});

describe("a grant whose answer is not delivered", () => {
  /** Acquire called as the server calls it, its answer's delivery in the test's hands. */
  async function acquireWatched(request: { owner: string; requestId?: string; maxWait?: Duration }) {
    const delivery = new AnswerDelivery();
    const context = createHandlerContext({
      service: LockServiceDesc,
      method: LockServiceDesc.method.acquire,
      protocolName: "connect",
      requestMethod: "POST",
      url: "http://127.0.0.1/berth.locks.v1.LockService/Acquire",
      contextValues: createContextValues().set(answerDeliveryKey, delivery),
    });
    const handlers = createLockHandlers({ locks, clock, heartbeatMs: HEARTBEAT_MS });
    const answer = handlers.acquire(create(AcquireRequestSchema, { file: FILE, ...request }), context) as Promise<AcquireResponse>;
    return { delivery, answer };
  }

  it("is released at once, and the next waiter granted with the next fencing token, when the call has no request_id", async () => {
    const holder = (await client.acquire({ file: FILE, owner: "holder" })).lease!;
    const waiting = await acquireWatched({ owner: "gone", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    const next = client.acquire({ file: FILE, owner: "next", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(2));
    await client.release({ leaseToken: holder.leaseToken });
    const granted = (await waiting.answer).lease!;
    expect(locks.inspect(FILE).holder).toMatchObject({ owner: "gone", fencingToken: Number(granted.fencingToken) });
    // Its connection closed before the answer was out.
    waiting.delivery.lost();
    const lease = (await next).lease!;
    expect(lease.owner).toBe("next");
    expect(lease.fencingToken).toBe(granted.fencingToken + 1n);
    expect((await client.keepAlive({ leaseTokens: [granted.leaseToken] })).renewals[0]?.alive).toBe(false);
  });

  it("is kept (to its ttl, unless renewed) for the retry of a call with a request_id, which finds it", async () => {
    const holder = (await client.acquire({ file: FILE, owner: "holder" })).lease!;
    const waiting = await acquireWatched({ owner: "alice", requestId: "r-lost", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    await client.release({ leaseToken: holder.leaseToken });
    const granted = (await waiting.answer).lease!;
    waiting.delivery.lost();
    const retried = (await client.acquire({ file: FILE, owner: "alice", requestId: "r-lost", maxWait: ms(0) })).lease!;
    expect(retried.leaseToken).toBe(granted.leaseToken);
    expect(locks.inspect(FILE).holder).toMatchObject({ owner: "alice", fencingToken: Number(granted.fencingToken) });
  });

  it("is kept when its answer was delivered, whatever the connection does afterwards", async () => {
    const watched = await acquireWatched({ owner: "alice" });
    const lease = (await watched.answer).lease!;
    watched.delivery.delivered();
    watched.delivery.lost();
    expect(locks.inspect(FILE).holder).toMatchObject({ owner: "alice", fencingToken: Number(lease.fencingToken) });
  });
});

describe("GetLimits", () => {
  it("answers the limits the service enforces and the Hold heartbeat", async () => {
    expect(await client.getLimits({})).toMatchObject({
      defaultTtl: { seconds: 30n, nanos: 0 },
      maxTtl: { seconds: 3600n, nanos: 0 },
      maxWait: { seconds: 600n, nanos: 0 },
      heartbeatInterval: { seconds: BigInt(HEARTBEAT_MS / 1000), nanos: 0 },
      maxWaitersPerFile: DEFAULT_LOCK_LIMITS.maxWaitersPerFile,
      maxOwnerLength: DEFAULT_LOCK_LIMITS.maxOwnerLength,
      idempotencyWindow: { seconds: 3600n, nanos: 0 },
    });
    serve({ maxWaitMs: 1_500, defaultTtlMs: 2_000, idempotencyWindowMs: 90_000 });
    expect(await client.getLimits({})).toMatchObject({
      maxWait: { seconds: 1n, nanos: 500_000_000 },
      defaultTtl: { seconds: 2n },
      idempotencyWindow: { seconds: 90n },
    });
  });
});

describe("KeepAlive (unary)", () => {
  it("renews each lease for its ttl, answering in request order, alive = false for one that is gone", async () => {
    const a = (await client.acquire({ file: FILE, owner: "alice", ttl: ms(5_000) })).lease!;
    const b = (await client.acquire({ file: path.join(projectRoot, "src/other.ts"), owner: "bob", ttl: ms(5_000) })).lease!;
    const c = (await client.acquire({ file: path.join(projectRoot, "src/third.ts"), owner: "carol", ttl: ms(2_000) })).lease!;
    await client.release({ leaseToken: b.leaseToken });
    clock.advance(1_000);
    const { renewals } = await client.keepAlive({ leaseTokens: [a.leaseToken, b.leaseToken, "never-granted", c.leaseToken] });
    expect(renewals.map((r) => [r.leaseToken, r.alive, r.expireTime === undefined ? undefined : timestampMs(r.expireTime) - clock.now()])).toEqual([
      [a.leaseToken, true, 5_000],
      [b.leaseToken, false, undefined],
      ["never-granted", false, undefined],
      [c.leaseToken, true, 2_000],
    ]);
    clock.advance(4_999);
    expect(locks.inspect(FILE).holder?.owner).toBe("alice");
    clock.advance(1);
    expect(locks.inspect(FILE).holder).toBeNull();
  });

  it.each([
    ["no token", [], /^lease_tokens: is required/],
    ["an empty token", ["x", ""], /^lease_tokens\[1\]: is required/],
    ["a token over 128 characters", ["t".repeat(129)], /^lease_tokens\[0\]: must be at most 128/],
    [
      `more than ${MAX_KEEPALIVE_TOKENS} tokens`,
      Array.from({ length: MAX_KEEPALIVE_TOKENS + 1 }, (_, i) => `t${i}`),
      /^lease_tokens: must hold at most 1000 tokens, got 1001/,
    ],
  ])("refuses %s with INVALID_ARGUMENT naming the field", async (_name, leaseTokens, message) => {
    const error = await failure(client.keepAlive({ leaseTokens }));
    expect(error.code).toBe(Code.InvalidArgument);
    expect(errorInfo(error).reason).toBe("INVALID_FIELD");
    expect(error.rawMessage).toMatch(message);
  });

  it("leaves a refused request's valid tokens unrenewed", async () => {
    const lease = (await client.acquire({ file: FILE, owner: "alice", ttl: ms(1_000) })).lease!;
    clock.advance(900);
    expect((await failure(client.keepAlive({ leaseTokens: [lease.leaseToken, ""] }))).code).toBe(Code.InvalidArgument);
    clock.advance(100);
    expect(locks.inspect(FILE).holder).toBeNull();
  });
});

describe("KeepAliveStream", () => {
  it("renews each lease for its ttl and answers alive = false for one that is gone", async () => {
    const a = (await client.acquire({ file: FILE, owner: "alice", ttl: ms(5_000) })).lease!;
    const b = (await client.acquire({ file: path.join(projectRoot, "src/other.ts"), owner: "bob", ttl: ms(5_000) })).lease!;
    await client.release({ leaseToken: b.leaseToken });
    clock.advance(4_000);
    async function* requests() {
      yield { leaseToken: a.leaseToken };
      yield { leaseToken: b.leaseToken };
      yield { leaseToken: "never-granted" };
    }
    const answers = [];
    for await (const answer of client.keepAliveStream(requests())) answers.push(answer.renewal!);
    expect(answers.map((r) => [r.leaseToken, r.alive])).toEqual([
      [a.leaseToken, true],
      [b.leaseToken, false],
      ["never-granted", false],
    ]);
    expect(timestampMs(answers[0]!.expireTime!)).toBe(clock.now() + 5_000);
    expect(answers[1]!.expireTime).toBeUndefined();
    // Renewed at 4 s for 5 s: still held at 8 s, gone at 9 s.
    clock.advance(4_000);
    expect(locks.inspect(FILE).holder?.owner).toBe("alice");
    clock.advance(1_000);
    expect(locks.inspect(FILE).holder).toBeNull();
  });

  it("refuses an empty lease token with INVALID_ARGUMENT", async () => {
    async function* requests() {
      yield { leaseToken: "" };
    }
    const error = await failure(
      (async () => {
        for await (const _ of client.keepAliveStream(requests()));
      })(),
    );
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toMatch(/^lease_token: /);
  });

  it("lets an unrenewed lease expire and hands the lock to the next waiter", async () => {
    await client.acquire({ file: FILE, owner: "alice", ttl: ms(1_000) });
    const next = client.acquire({ file: FILE, owner: "bob", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    clock.advance(1_000);
    expect((await next).lease?.owner).toBe("bob");
  });
});

describe("Hold", () => {
  it("sends waiting updates, then the lease, then heartbeats; ending the stream frees the lock at once", async () => {
    const alice = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    const early = openHold({ owner: "early", maxWait: ms(60_000) });
    const hold = openHold({ owner: "holder", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting"]));
    const first = hold.messages[0]!.kind;
    expect(first.case === "waiting" && first.value.position).toBe(2);
    expect(first.case === "waiting" && first.value.holder?.owner).toBe("alice");
    expect(first.case === "waiting" && first.value.holder?.kind).toBe(HolderKind.LEASE);

    // The one ahead gives up: position 1.
    early.cancel();
    await early.done;
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "waiting"]));
    const second = hold.messages[1]!.kind;
    expect(second.case === "waiting" && second.value.position).toBe(1);

    await client.release({ leaseToken: alice.leaseToken });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "waiting", "acquired"]));
    const acquired = hold.messages[2]!.kind;
    expect(acquired.case === "acquired" && acquired.value.owner).toBe("holder");
    expect(acquired.case === "acquired" && acquired.value.expireTime).toBeUndefined();
    expect(acquired.case === "acquired" && acquired.value.ttl).toBeUndefined();
    expect(acquired.case === "acquired" && acquired.value.fencingToken).toBeGreaterThan(alice.fencingToken);
    expect(locks.inspect(FILE).holder).toMatchObject({ kind: "stream", owner: "holder" });

    // Heartbeats keep their period whichever way the wall clock steps, and say the wall time.
    clock.stepWall(-3_600_000);
    clock.advance(HEARTBEAT_MS);
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "waiting", "acquired", "heartbeat"]));
    const beat = hold.messages[3]!.kind;
    expect(beat.case === "heartbeat" && timestampMs(beat.value.sendTime!)).toBe(clock.now());

    const next = client.acquire({ file: FILE, owner: "next", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(1));
    hold.cancel();
    expect((await next).lease?.owner).toBe("next");
    await hold.done;
    expect(hold.ended).toBeInstanceOf(ConnectError);
  });

  it("says what it holds, for /debug/streams: its place in the queue, then the lock with its fencing token", async () => {
    const alice = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    const hold = openHold({ owner: "holder", maxWait: ms(60_000) });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting"]));
    expect(metrics.streams.list()).toMatchObject([{ method: "/berth.locks.v1.LockService/Hold", holds: `a place in the queue of ${FILE} as "holder"` }]);
    await client.release({ leaseToken: alice.leaseToken });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["waiting", "acquired"]));
    const acquired = hold.messages[1]!.kind;
    const token = acquired.case === "acquired" ? acquired.value.fencingToken : undefined;
    expect(metrics.streams.list()[0]?.holds).toBe(`the lock on ${key()} as "holder", fencing token ${token}`);
    hold.cancel();
    await hold.done;
    await vi.waitFor(() => expect(metrics.streams.size).toBe(0));
  });

  it("ends with RESOURCE_EXHAUSTED WAIT_EXHAUSTED when the wait runs out, at once with max_wait 0, after the longest wait with none", async () => {
    serve({ maxWaitMs: 10_000 });
    await client.acquire({ file: FILE, owner: "alice" });
    const once = openHold({ owner: "bob", maxWait: ms(0) });
    await once.done;
    expect(once.ended).toMatchObject({ code: Code.ResourceExhausted });
    expect(errorInfo(once.ended as ConnectError)).toEqual({ reason: "WAIT_EXHAUSTED", domain: "berth.locks", retryAfterMs: LOCK_RETRY_AFTER_MS });
    expect((once.ended as ConnectError).findDetails(LockHeldSchema)[0]?.owner).toBe("alice");

    const waiting = openHold({ owner: "carol", maxWait: ms(3_000) });
    const unset = openHold({ owner: "dave" });
    await vi.waitFor(() => expect([waiting.kinds(), unset.kinds()]).toEqual([["waiting"], ["waiting"]]));
    clock.advance(3_000);
    await waiting.done;
    expect(waiting.ended).toMatchObject({ code: Code.ResourceExhausted });
    expect(locks.inspect(FILE).waiters.map((w) => w.owner)).toEqual(["dave"]);
    clock.advance(7_000);
    await unset.done;
    expect((unset.ended as ConnectError).findDetails(LockHeldSchema)[0]?.waited).toMatchObject({ seconds: 10n });
    expect(locks.inspect(FILE).waiters).toHaveLength(0);
  });

  it("ends the stream OK the moment its owner releases its lease through Release, without waiting for a heartbeat", async () => {
    const hold = openHold({ owner: "holder" });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["acquired"]));
    const acquired = hold.messages[0]!.kind;
    if (acquired.case !== "acquired") throw new Error("no lease");
    expect((await client.release({ leaseToken: acquired.value.leaseToken })).released).toBe(true);
    // The clock does not move: the next holder may already have the lock, so this one must know now.
    await hold.done;
    expect(hold.kinds()).toEqual(["acquired"]);
    // The lease token went only to this stream's caller: a Release with it is the owner letting go,
    // the end it asked for, so the stream ends OK and /metrics counts it so, not as a failure.
    expect(hold.ended).toBe("ok");
    await vi.waitFor(() => expect(metrics.requestCount("/berth.locks.v1.LockService/Hold", "ok")).toBe(1));
    expect(metrics.requestCount("/berth.locks.v1.LockService/Hold", "failed_precondition")).toBe(0);
    expect(locks.inspect(FILE).holder).toBeNull();
  });

  it("ends the stream UNAVAILABLE SHUTTING_DOWN when its lease ends because the locks close under it", async () => {
    const hold = openHold({ owner: "holder" });
    await vi.waitFor(() => expect(hold.kinds()).toEqual(["acquired"]));
    locks.close();
    await hold.done;
    expect(hold.ended).toMatchObject({ code: Code.Unavailable });
    expect(errorInfo(hold.ended as ConnectError)).toEqual({ reason: "SHUTTING_DOWN", domain: "berth.locks", retryAfterMs: LOCK_RETRY_AFTER_MS });
    expect((hold.ended as ConnectError).rawMessage).toMatch(/the lock service is shutting down/);
  });
});

describe("Inspect and CheckToken", () => {
  it("shows the holder, the waiters in order and the last fencing token", async () => {
    const free = await client.inspect({ file: FILE });
    expect(free).toMatchObject({ file: key(), waiters: [], lastFencingToken: 0n });
    expect(free.holder).toBeUndefined();
    const lease = (await client.acquire({ file: FILE, owner: "alice", ttl: ms(30_000) })).lease!;
    const w1 = failure(client.acquire({ file: FILE, owner: "w1", maxWait: ms(10_000) }));
    const w2 = openHold({ owner: "w2", maxWait: ms(20_000) });
    await vi.waitFor(() => expect(locks.inspect(FILE).waiters).toHaveLength(2));
    const inspection = await client.inspect({ file: key() });
    expect(inspection.holder).toMatchObject({ owner: "alice", fencingToken: lease.fencingToken, kind: HolderKind.LEASE, pid: process.pid });
    expect(timestampMs(inspection.holder!.expireTime!)).toBe(clock.now() + 30_000);
    expect(timestampMs(inspection.holder!.acquireTime!)).toBe(timestampMs(lease.acquireTime!));
    expect(inspection.waiters.map((w) => [w.owner, w.kind, timestampMs(w.waitExpireTime!) - timestampMs(w.waitStartTime!)])).toEqual([
      ["w1", HolderKind.LEASE, 10_000],
      ["w2", HolderKind.STREAM, 20_000],
    ]);
    expect(inspection.lastFencingToken).toBe(lease.fencingToken);
    expect(inspection.lockPath).toBe(lockFilePath(path.join(liveDir, "locks"), key()));
    clock.advance(20_000);
    await w1;
    await w2.done;
  });

  it("tells whether a fencing token is the current one, naming the file canonical", async () => {
    const first = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    expect(await client.checkToken({ file: FILE, fencingToken: first.fencingToken })).toMatchObject({
      current: true,
      currentToken: first.fencingToken,
      file: key(),
    });
    expect((await client.checkToken({ file: `${projectRoot}/./src/x/../app.ts`, fencingToken: first.fencingToken })).file).toBe(key());
    await client.release({ leaseToken: first.leaseToken });
    expect(await client.checkToken({ file: FILE, fencingToken: first.fencingToken })).toMatchObject({ current: false, currentToken: 0n });
    const second = (await client.acquire({ file: FILE, owner: "bob" })).lease!;
    expect(await client.checkToken({ file: FILE, fencingToken: first.fencingToken })).toMatchObject({ current: false, currentToken: second.fencingToken });
  });
});

describe("input validation", () => {
  const cases: Array<[string, () => Promise<unknown>, RegExp]> = [
    [
      "a relative path",
      () => client.acquire({ file: "src/app.ts", owner: "x" }),
      /^file: must be an absolute path; resolve it against your working directory before sending, got "src\/app\.ts"$/,
    ],
    ["a path with NUL", () => client.acquire({ file: "/src/a\0b.ts", owner: "x" }), /^file: must not contain a NUL/],
    ["an over-long path", () => client.acquire({ file: `/src/${"a".repeat(5000)}`, owner: "x" }), /^file: must be at most 4096 bytes/],
    ["an empty path", () => client.acquire({ file: "", owner: "x" }), /^file: is required/],
    ["an empty owner", () => client.acquire({ file: FILE, owner: "" }), /^owner: is required/],
    ["a negative wait", () => client.acquire({ file: FILE, owner: "x", maxWait: { seconds: -1n, nanos: 0 } }), /^max_wait: must not be negative/],
    [
      "a negative ttl",
      () => client.acquire({ file: FILE, owner: "x", ttl: { seconds: 0n, nanos: -5 } }),
      /^ttl: nanos must be 0 to 999999999 for a non-negative duration/,
    ],
    [
      "a ttl over the maximum",
      () => client.acquire({ file: FILE, owner: "x", ttl: ms(2 * 3_600_000) }),
      /^ttl: must be at most 1h \(the longest lease\), got 2h$/,
    ],
    ["a malformed request id", () => client.acquire({ file: FILE, owner: "x", requestId: "x".repeat(129) }), /^request_id: must match/],
    ["KeepAlive with no token", () => client.keepAlive({ leaseTokens: [] }), /^lease_tokens: is required/],
    ["an empty release token", () => client.release({ leaseToken: "" }), /^lease_token: is required/],
    ["Inspect with a relative path", () => client.inspect({ file: "../x" }), /^file: must be an absolute path/],
    ["CheckToken with a relative path", () => client.checkToken({ file: "x", fencingToken: 1n }), /^file: must be an absolute path/],
    ["CheckToken with token 0", () => client.checkToken({ file: FILE, fencingToken: 0n }), /^fencing_token: must be a positive integer/],
    ["CheckToken with NUL", () => client.checkToken({ file: "/a\0", fencingToken: 1n }), /^file: must not contain a NUL/],
    [
      "Hold with a relative path",
      async () => {
        for await (const _ of client.hold({ file: "a/../b", owner: "x" }));
      },
      /^file: must be an absolute path/,
    ],
    [
      "Hold with a negative wait",
      async () => {
        for await (const _ of client.hold({ file: FILE, owner: "x", maxWait: { seconds: -3n, nanos: 0 } }));
      },
      /^max_wait: must not be negative/,
    ],
  ];
  it.each(cases)("refuses %s with INVALID_ARGUMENT naming the field", async (_name, call, message) => {
    const error = await failure(call());
    expect(error.code).toBe(Code.InvalidArgument);
    expect(error.rawMessage).toMatch(message);
    expect(locks.stats()).toEqual({ held: 0, waiting: 0, blockedByLockFiles: 0 });
  });

  it("reads durations to the nearest millisecond, unset as 0", () => {
    expect(durationInput(undefined, "wait")).toBe(0);
    expect(durationInput(durationFromMs(0), "wait")).toBe(0);
    expect(durationInput({ seconds: 1n, nanos: 500_600_000 } as Duration, "wait")).toBe(1_501);
    expect(() => durationInput({ seconds: 0n, nanos: 1_000_000_000 } as Duration, "ttl")).toThrow(/^ttl: nanos must be 0 to 999999999/);
  });
});

describe("createFenceCheck", () => {
  it("passes the current token and refuses a stale one with aborted and the FenceRejected facts", async () => {
    const check = createFenceCheck(locks);
    const first = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    expect(() => check(FILE, first.fencingToken)()).not.toThrow();
    await client.release({ leaseToken: first.leaseToken });
    const second = (await client.acquire({ file: FILE, owner: "bob" })).lease!;
    let refused: unknown;
    try {
      check(key(), first.fencingToken)();
    } catch (error) {
      refused = error;
    }
    expect(refused).toBeInstanceOf(BerthError);
    expect(refused).toMatchObject({
      code: "aborted",
      details: { file: key(), fencingToken: Number(first.fencingToken), currentToken: Number(second.fencingToken) },
    });
    // Refused when prepared, with the request: before the append is ever sequenced.
    expect(() => check("a/../b", 1n)).toThrow(/^fence\.file: must be an absolute path/);
    expect(() => check(FILE, 0n)).toThrow(/^fence\.fencing_token: /);
  });

  it("matches a fence given with another spelling of the locked file (a symlinked directory, '..')", async () => {
    fs.mkdirSync(path.join(projectRoot, "src", "x"), { recursive: true });
    fs.symlinkSync(projectRoot, path.join(root, "link"));
    const check = createFenceCheck(locks);
    const lease = (await client.acquire({ file: FILE, owner: "alice" })).lease!;
    expect(() => check(`${path.join(root, "link")}/src/x/../app.ts`, lease.fencingToken)()).not.toThrow();
    expect(() => check(`${projectRoot}/./src//app.ts`, lease.fencingToken)()).not.toThrow();
  });
});
