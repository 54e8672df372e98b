/** The locks client against an in-memory lock service (Connect's router transport). */
import { Code, ConnectError, createRouterTransport, type ServiceImpl } from "@connectrpc/connect";
import {
  HolderKind,
  LockEventKind,
  LockHeldSchema,
  LockService,
  LocksWatcherLaggedSchema,
  type HoldRequest,
  type WatchLocksRequest,
} from "@berth/api/berth/locks/v1/lock_service_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { describe, expect, it } from "vitest";
import { BerthClientError } from "./errors.js";
import { LocksClient } from "./locks.js";

function client(impl: Partial<ServiceImpl<typeof LockService>>): LocksClient {
  return new LocksClient({ transport: createRouterTransport((router) => router.service(LockService, impl)) });
}

/** A Hold that queues once, grants, and then stays open until the client ends it; what it saw. */
function holdingService() {
  const seen = { requests: [] as HoldRequest[], released: [] as string[], streamEnded: undefined as Promise<void> | undefined };
  let ended!: () => void;
  seen.streamEnded = new Promise((resolve) => (ended = resolve));
  const impl: Partial<ServiceImpl<typeof LockService>> = {
    async *hold(request, context) {
      seen.requests.push(request);
      context.signal.addEventListener("abort", () => ended());
      yield { kind: { case: "waiting", value: { position: 1, holder: { owner: "alice", fencingToken: 6n, kind: HolderKind.LEASE } } } };
      yield { kind: { case: "acquired", value: { leaseToken: "lt-7", fencingToken: 7n, file: request.file, owner: request.owner } } };
      await new Promise((resolve) => context.signal.addEventListener("abort", resolve));
    },
    release(request) {
      seen.released.push(request.leaseToken);
      return { released: true };
    },
  };
  return { seen, impl };
}

describe("lock", () => {
  it("waits (telling onWaiting), holds, and `await using` releases it and ends the stream when the block ends", async () => {
    const { seen, impl } = holdingService();
    const locks = client(impl);
    const waiting: string[] = [];
    let signal: AbortSignal | undefined;
    {
      await using lease = await locks.lock("src/app.css", {
        cwd: "/proj",
        owner: "me",
        maxWaitMs: 1500,
        onWaiting: (w) => waiting.push(`${w.position} ${w.holder?.owner}`),
      });
      expect(lease.fencingToken).toBe(7n);
      expect(lease.file).toBe("/proj/src/app.css");
      signal = lease.signal;
      expect(signal.aborted).toBe(false);
      expect(seen.released).toEqual([]);
    }
    expect(seen.released).toEqual(["lt-7"]);
    expect(signal.aborted).toBe(true);
    await seen.streamEnded;
    expect(waiting).toEqual(["1 alice"]);
    expect(seen.requests[0]).toMatchObject({ file: "/proj/src/app.css", owner: "me", maxWait: { seconds: 1n, nanos: 500_000_000 } });
  });

  it("resolves a relative path against this process's directory by default, and names a default owner", async () => {
    const { seen, impl } = holdingService();
    const lease = await client(impl).lock("a.css");
    await lease.release();
    expect(seen.requests[0]!.file).toBe(`${process.cwd()}/a.css`);
    expect(seen.requests[0]!.owner).toMatch(/@.* pid \d+$/);
    // A second release answers the first one's outcome and calls nothing more.
    expect(await lease.release()).toBe(true);
    expect(seen.released).toHaveLength(1);
  });

  it("is lost when the service ends the hold: the signal aborts, `lost` says why", async () => {
    const locks = client({
      async *hold(request) {
        yield { kind: { case: "acquired", value: { leaseToken: "lt", fencingToken: 1n, file: request.file } } };
        throw new ConnectError("the lock service is shutting down", Code.Unavailable, undefined, [
          { desc: ErrorInfoSchema, value: { reason: "SHUTTING_DOWN" } },
        ]);
      },
    });
    const lease = await locks.lock("/x");
    await new Promise((resolve) => lease.signal.addEventListener("abort", resolve));
    expect(lease.lost).toBeInstanceOf(BerthClientError);
    expect(lease.lost).toMatchObject({ code: Code.Unavailable, reason: "SHUTTING_DOWN" });
    expect(lease.signal.reason).toBe(lease.lost);
    expect(await lease.release()).toBe(false);
  });

  it("is lost when the hold ends OK without its release(): its lease was released through Release from elsewhere", async () => {
    const locks = client({
      async *hold(request) {
        // What the service does when a Release with the lease token lands: the stream ends OK.
        yield { kind: { case: "acquired", value: { leaseToken: "lt", fencingToken: 1n, file: request.file } } };
      },
    });
    const lease = await locks.lock("/x");
    await new Promise((resolve) => lease.signal.addEventListener("abort", resolve));
    expect(lease.lost).toMatchObject({ code: Code.FailedPrecondition });
    expect(lease.lost?.rawMessage).toMatch(/^the lock on \/x was released through Release with its lease token, not by this lock's release\(\)$/);
    expect(await lease.release()).toBe(false);
  });

  it("is not lost when its own release() ends the hold, whichever comes first: the answer or the stream's OK end", async () => {
    let end!: () => void;
    const ended = new Promise<void>((resolve) => (end = resolve));
    const locks = client({
      async *hold(request) {
        yield { kind: { case: "acquired", value: { leaseToken: "lt", fencingToken: 1n, file: request.file } } };
        await ended;
      },
      async release() {
        // The service ends the hold OK before Release's answer is back.
        end();
        await new Promise((resolve) => setImmediate(resolve));
        return { released: true };
      },
    });
    const lease = await locks.lock("/x");
    expect(await lease.release()).toBe(true);
    expect(lease.lost).toBeUndefined();
    expect(lease.signal.aborted).toBe(true);
  });

  it("a wait that runs out throws with the holder in lockHeld", async () => {
    const locks = client({
      // A generator that refuses before granting.
      async *hold() {
        throw new ConnectError("held by bob", Code.ResourceExhausted, undefined, [
          { desc: ErrorInfoSchema, value: { reason: "WAIT_EXHAUSTED" } },
          { desc: LockHeldSchema, value: { file: "/x", owner: "bob", fencingToken: 3n, kind: HolderKind.LEASE } },
        ]);
      },
    });
    const error = (await locks.lock("/x", { maxWaitMs: 0 }).catch((e: unknown) => e)) as BerthClientError;
    expect(error).toBeInstanceOf(BerthClientError);
    expect(error.reason).toBe("WAIT_EXHAUSTED");
    expect(error.lockHeld).toMatchObject({ owner: "bob", fencingToken: 3n });
  });

  it("a signal aborted while waiting withdraws the request (CANCELED); aborted while holding, frees the lock", async () => {
    const waitingOnly = client({
      async *hold(_request, context) {
        yield { kind: { case: "waiting", value: { position: 2 } } };
        await new Promise((resolve) => context.signal.addEventListener("abort", resolve));
      },
    });
    const stop = new AbortController();
    const pending = waitingOnly.lock("/x", { signal: stop.signal, onWaiting: () => stop.abort() });
    await expect(pending).rejects.toMatchObject({ code: Code.Canceled });

    const { seen, impl } = holdingService();
    const cancel = new AbortController();
    const lease = await client(impl).lock("/y", { signal: cancel.signal });
    cancel.abort();
    await seen.streamEnded;
    expect(lease.signal.aborted).toBe(true);
    expect(lease.lost).toBeUndefined();
  });
});

describe("leases", () => {
  it("acquire and release carry request ids, the same one on every attempt of a call", async () => {
    const acquires: string[] = [];
    const releases: string[] = [];
    let failures = 1;
    const locks = client({
      acquire(request) {
        acquires.push(request.requestId);
        if (failures-- > 0) throw new ConnectError("connection reset", Code.Unavailable);
        return { lease: { leaseToken: "lt-1", fencingToken: 3n, file: request.file, owner: request.owner } };
      },
      release(request) {
        releases.push(request.requestId);
        return { released: true };
      },
      keepAlive: (request) => ({ renewals: request.leaseTokens.map((leaseToken) => ({ leaseToken, alive: true })) }),
    });
    const lease = await locks.acquire("/src/a.ts", { owner: "me", ttlMs: 5000 });
    expect([lease.leaseToken, lease.file]).toEqual(["lt-1", "/src/a.ts"]);
    expect(acquires).toHaveLength(2);
    expect(acquires[1]).toBe(acquires[0]);
    expect((await locks.keepAlive([lease.leaseToken])).map((r) => r.alive)).toEqual([true]);
    expect(await locks.release(lease.leaseToken, { requestId: "rel-1" })).toBe(true);
    expect(releases).toEqual(["rel-1"]);
  });
});

describe("watch", () => {
  it("resumes a watch ended WATCHER_LAGGED from its LocksWatcherLagged revision, the file resolved, and throws on a resume lagged again at once", async () => {
    const requests: WatchLocksRequest[] = [];
    const lagged = (revision: bigint) =>
      new ConnectError("watcher fell behind", Code.ResourceExhausted, undefined, [
        { desc: ErrorInfoSchema, value: { reason: "WATCHER_LAGGED" } },
        { desc: LocksWatcherLaggedSchema, value: { resumeFromRevision: revision } },
      ]);
    const locks = client({
      async *watchLocks(request) {
        requests.push(request);
        if (requests.length === 1) {
          yield { kind: { case: "caughtUp", value: { revision: 4n } } };
          yield { kind: { case: "event", value: { revision: 5n, kind: LockEventKind.GRANTED, file: request.file } } };
          throw lagged(5n);
        }
        throw lagged(5n);
      },
    });
    const seen: string[] = [];
    const error = await (async () => {
      for await (const item of locks.watch("a.css", { cwd: "/proj", includeCurrent: true })) {
        seen.push(item.kind === "event" ? `event ${item.event.revision} ${item.event.file}` : `${item.kind} ${item.revision}`);
      }
    })().catch((e: unknown) => e);
    expect(seen).toEqual(["caughtUp 4", "event 5 /proj/a.css", "resumed 5"]);
    expect(error).toMatchObject({ code: Code.ResourceExhausted, reason: "WATCHER_LAGGED", locksWatcherLagged: { resumeFromRevision: 5n } });
    expect(requests.map((r) => [r.file, r.includeCurrent, r.startRevision])).toEqual([
      ["/proj/a.css", true, 0n],
      ["/proj/a.css", false, 5n],
    ]);
  });
});
