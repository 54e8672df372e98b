/**
 * LockService through @grpc/grpc-js (grpc-js-surface.ts): every RPC, each stream carried through to
 * its meaningful messages, each refusal with its typed details, a client cancelling mid-stream (the
 * lock must be freed). The set of RPCs called is checked against the generated service descriptors
 * at the end; locks.test.ts goes deeper into the semantics.
 */
import * as path from "node:path";
import { durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { HolderKind, LockEventKind, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { eventually, expectEveryRpcCalled, expectKind, failure, reader, seconds, startSessionsSurface, statusDetails } from "./grpc-js-surface.js";
import { grpcJsClient, isGrpcError, startService, stopAll, type GrpcJsClient } from "./harness.js";

afterAll(stopAll);

let projectRoot: string;
let rpc: GrpcJsClient;

beforeAll(async () => {
  ({ projectRoot, rpc } = await startSessionsSurface());
});

// ---------------------------------------------------------------------------------------------

describe("LockService over grpc-js", () => {
  it("Acquire, Inspect, CheckToken, GetLimits, KeepAlive (unary, several leases, in order), Release", async () => {
    const file = path.join(projectRoot, "src/surface.ts");
    const { lease } = await rpc.unary(LockService.method.acquire, { file, owner: "alice", ttl: seconds(5) });
    expect(lease?.file).toBe(file);
    expect(lease?.ttl?.seconds).toBe(5n);
    const token = lease!.leaseToken;
    const fencing = lease!.fencingToken;

    const held = await rpc.unary(LockService.method.inspect, { file });
    expect([held.holder?.owner, held.holder?.kind, held.holder?.fencingToken, held.lastFencingToken, held.waiters]).toEqual([
      "alice",
      HolderKind.LEASE,
      fencing,
      fencing,
      [],
    ]);
    expect(await rpc.unary(LockService.method.checkToken, { file: `${projectRoot}/src/../src/surface.ts`, fencingToken: fencing })).toMatchObject({
      current: true,
      file,
    });
    expect(await rpc.unary(LockService.method.getLimits, {})).toMatchObject({
      defaultTtl: seconds(30),
      maxTtl: seconds(3600),
      maxWait: seconds(600),
      heartbeatInterval: seconds(5),
      maxWaitersPerFile: 10_000,
      maxOwnerLength: 256,
    });

    const { renewals } = await rpc.unary(LockService.method.keepAlive, { leaseTokens: [token, "not-a-lease"] });
    expect(renewals.map((r) => [r.leaseToken, r.alive])).toEqual([
      [token, true],
      ["not-a-lease", false],
    ]);
    expect(timestampMs(renewals[0]!.expireTime!)).toBeGreaterThanOrEqual(timestampMs(lease!.expireTime!));
    expect(renewals[1]!.expireTime).toBeUndefined();

    expect((await rpc.unary(LockService.method.release, { leaseToken: token })).released).toBe(true);
    expect((await rpc.unary(LockService.method.keepAlive, { leaseTokens: [token] })).renewals).toMatchObject([{ leaseToken: token, alive: false }]);
    // A repeated release changes nothing; the token is no longer current.
    expect((await rpc.unary(LockService.method.release, { leaseToken: token })).released).toBe(false);
    expect(await rpc.unary(LockService.method.checkToken, { file, fencingToken: fencing })).toMatchObject({ current: false, currentToken: 0n });
    expect((await rpc.unary(LockService.method.inspect, { file })).holder).toBeUndefined();
  });

  it("KeepAliveStream: one answer per request, in order, on a bidi stream", async () => {
    const file = path.join(projectRoot, "src/surface-stream.ts");
    const { lease } = await rpc.unary(LockService.method.acquire, { file, owner: "alice", ttl: seconds(5) });
    const token = lease!.leaseToken;
    const call = rpc.bidi(LockService.method.keepAliveStream);
    const renewals = reader(call);
    call.write({ leaseToken: token });
    call.write({ leaseToken: "not-a-lease" });
    const renewed = (await renewals.next("the renewal of the live lease")).renewal!;
    expect([renewed.leaseToken, renewed.alive]).toEqual([token, true]);
    expect(timestampMs(renewed.expireTime!)).toBeGreaterThanOrEqual(timestampMs(lease!.expireTime!));
    const unknown = (await renewals.next("the answer for an unknown lease")).renewal!;
    expect([unknown.leaseToken, unknown.alive, unknown.expireTime]).toEqual(["not-a-lease", false, undefined]);

    expect((await rpc.unary(LockService.method.release, { leaseToken: token })).released).toBe(true);
    call.write({ leaseToken: token });
    expect((await renewals.next("the answer after the release")).renewal?.alive).toBe(false);
    call.end();
    expect((await renewals.ended).name).toBe("OK");
  });

  it("Acquire with a request_id: a repeat while the first waits joins it, and both get the same lease; a repeat while the grant lives answers it", async () => {
    const file = path.join(projectRoot, "src/retried.ts");
    const holder = (await rpc.unary(LockService.method.acquire, { file, owner: "holder" })).lease!;
    const requestId = "6b0e3c2a-0f9d-4a51-9d6e-2b7c1f0e8a44";
    // Deadlines longer than the waits: a call's deadline bounds its wait too.
    const first = rpc.unary(LockService.method.acquire, { file, owner: "retrier", maxWait: seconds(30), requestId }, { deadlineMs: 60_000 });
    await eventually(
      "the first call queued",
      () => rpc.unary(LockService.method.inspect, { file }),
      (s) => s.waiters.length === 1,
    );
    // The retry of a call whose answer the client lost (here: still waiting) waits on the same place.
    const repeat = rpc.unary(LockService.method.acquire, { file, owner: "retrier", maxWait: seconds(60), requestId }, { deadlineMs: 120_000 });
    const joined = await eventually(
      "the repeat joined the first call's place",
      () => rpc.unary(LockService.method.inspect, { file }),
      (s) => s.waiters.length === 1 && timestampMs(s.waiters[0]!.waitExpireTime!) - timestampMs(s.waiters[0]!.waitStartTime!) >= 59_000,
    );
    expect(joined.waiters.map((w) => w.owner)).toEqual(["retrier"]);
    await rpc.unary(LockService.method.release, { leaseToken: holder.leaseToken });
    const [a, b] = await Promise.all([first, repeat]);
    expect(b.lease).toEqual(a.lease);
    const again = await rpc.unary(LockService.method.acquire, { file: `${projectRoot}/src/./retried.ts`, owner: "retrier", maxWait: seconds(0), requestId });
    expect(again.lease).toEqual(a.lease);
    await rpc.unary(LockService.method.release, { leaseToken: a.lease!.leaseToken });
  });

  it("each refusal with its code, ErrorInfo reason (domain berth.locks) and typed details in grpc-status-details-bin", async () => {
    const file = path.join(projectRoot, "src/refusals.ts");
    const holder = (await rpc.unary(LockService.method.acquire, { file, owner: "holder" })).lease!;

    // A wait that runs out: RESOURCE_EXHAUSTED WAIT_EXHAUSTED, LockHeld naming the holder, RetryInfo.
    const waited = await failure(rpc.unary(LockService.method.acquire, { file, owner: "late", maxWait: { seconds: 0n, nanos: 200_000_000 } }));
    expect(waited.name).toBe("RESOURCE_EXHAUSTED");
    const exhausted = statusDetails(waited.metadata);
    expect(exhausted).toMatchObject({ reason: "WAIT_EXHAUSTED", domain: "berth.locks", retryAfterMs: 1_000 });
    expect(exhausted.lockHeld).toMatchObject({ file, owner: "holder", fencingToken: holder.fencingToken, kind: HolderKind.LEASE });
    expect(durationMs(exhausted.lockHeld!.waited!)).toBe(200);
    expect(JSON.parse(String(waited.metadata.get("berth-error-details")[0]))).toMatchObject({ reason: "WAIT_EXHAUSTED", owner: "holder", waitedMs: 200 });

    // A malformed field: INVALID_ARGUMENT INVALID_FIELD with a BadRequest naming it.
    const invalid = await failure(rpc.unary(LockService.method.acquire, { file, owner: "x", requestId: "not valid" }));
    expect(invalid.name).toBe("INVALID_ARGUMENT");
    expect(statusDetails(invalid.metadata)).toMatchObject({ reason: "INVALID_FIELD", domain: "berth.locks", fields: ["request_id"] });
    const noTokens = await failure(rpc.unary(LockService.method.keepAlive, { leaseTokens: [] }));
    expect(statusDetails(noTokens.metadata)).toMatchObject({ reason: "INVALID_FIELD", fields: ["lease_tokens"] });

    // A Hold whose lease its owner releases through Release: the stream ends OK.
    const other = path.join(projectRoot, "src/released.ts");
    const hold = reader(rpc.serverStream(LockService.method.hold, { file: other, owner: "streamer" }));
    const acquired = await expectKind(hold, "acquired");
    expect((await rpc.unary(LockService.method.release, { leaseToken: acquired.leaseToken })).released).toBe(true);
    expect((await hold.ended).name).toBe("OK");

    // A full queue: RESOURCE_EXHAUSTED TOO_MANY_WAITERS with a RetryInfo (a service with room for one waiter).
    const small = await startService("sessions", { args: ["--lock-max-waiters", "1"] });
    const smallRpc = grpcJsClient(small.url("sessions"));
    try {
      const first = (await smallRpc.unary(LockService.method.acquire, { file, owner: "holder" })).lease!;
      const queued = smallRpc.unary(LockService.method.acquire, { file, owner: "waiter", maxWait: seconds(30) });
      await eventually(
        "the waiter queued",
        () => smallRpc.unary(LockService.method.inspect, { file }),
        (s) => s.waiters.length === 1,
      );
      const crowded = await failure(smallRpc.unary(LockService.method.acquire, { file, owner: "one-too-many", maxWait: seconds(30) }));
      expect(crowded.name).toBe("RESOURCE_EXHAUSTED");
      expect(statusDetails(crowded.metadata)).toMatchObject({ reason: "TOO_MANY_WAITERS", domain: "berth.locks", retryAfterMs: 1_000, lockHeld: undefined });
      await smallRpc.unary(LockService.method.release, { leaseToken: first.leaseToken });
      await smallRpc.unary(LockService.method.release, { leaseToken: (await queued).lease!.leaseToken });
    } finally {
      smallRpc.close();
      await small.stop();
    }
    await rpc.unary(LockService.method.release, { leaseToken: holder.leaseToken });
  });

  it("WatchLocks: the current holder of one file, caught_up, then its release, until the client cancels", async () => {
    const file = path.join(projectRoot, "src/watched.ts");
    const { lease } = await rpc.unary(LockService.method.acquire, { file, owner: "watched" });
    const call = rpc.serverStream(LockService.method.watchLocks, { file, includeCurrent: true });
    const watch = reader(call);
    const current = await watch.next("the current holder");
    expect(current.kind.case === "event" && [current.kind.value.kind, current.kind.value.owner]).toEqual([LockEventKind.CURRENT_HOLDER, "watched"]);
    expect((await watch.next("caught_up")).kind.case).toBe("caughtUp");
    await rpc.unary(LockService.method.release, { leaseToken: lease!.leaseToken });
    const released = await watch.next("the release");
    expect(released.kind.case === "event" && released.kind.value.kind).toBe(LockEventKind.RELEASED);
    call.cancel();
    expect((await watch.ended).name).toBe("CANCELLED");
  });

  it("Hold: waiting (position, holder) while held, acquired on release, then held until the client cancels; a cancelled waiter leaves the queue", async () => {
    const file = path.join(projectRoot, "src/hold.ts");
    const first = (await rpc.unary(LockService.method.acquire, { file, owner: "lease-holder" })).lease!;

    const holdCall = rpc.serverStream(LockService.method.hold, { file, owner: "streamer", maxWait: seconds(30) });
    const hold = reader(holdCall);
    const waiting = await expectKind(hold, "waiting");
    expect([waiting.position, waiting.holder?.owner, waiting.holder?.kind]).toEqual([1, "lease-holder", HolderKind.LEASE]);

    // A second Hold queues behind it, then its client cancels: it leaves the queue, never granted.
    const quitterCall = rpc.serverStream(LockService.method.hold, { file, owner: "quitter", maxWait: seconds(30) });
    const quitter = reader(quitterCall);
    expect((await expectKind(quitter, "waiting")).position).toBe(2);
    const queued = await rpc.unary(LockService.method.inspect, { file });
    expect(queued.waiters.map((w) => [w.owner, w.kind])).toEqual([
      ["streamer", HolderKind.STREAM],
      ["quitter", HolderKind.STREAM],
    ]);
    quitterCall.cancel();
    expect((await quitter.ended).name).toBe("CANCELLED");
    await eventually(
      "the cancelled waiter gone",
      () => rpc.unary(LockService.method.inspect, { file }),
      (s) => s.waiters.length === 1,
    );

    await rpc.unary(LockService.method.release, { leaseToken: first.leaseToken });
    const acquired = await expectKind(hold, "acquired");
    expect(acquired.fencingToken).toBeGreaterThan(first.fencingToken);
    expect([acquired.owner, acquired.expireTime, acquired.ttl]).toEqual(["streamer", undefined, undefined]);
    const streamHeld = await rpc.unary(LockService.method.inspect, { file });
    expect([streamHeld.holder?.owner, streamHeld.holder?.kind, streamHeld.waiters]).toEqual(["streamer", HolderKind.STREAM, []]);

    // The client cancels mid-stream: the lock is free for the next Acquire at once (try once, no wait).
    holdCall.cancel();
    expect((await hold.ended).name).toBe("CANCELLED");
    const next = await eventually(
      "an Acquire granted after the Hold was cancelled",
      () =>
        rpc
          .unary(LockService.method.acquire, { file, owner: "next", maxWait: seconds(0) })
          .catch((error: unknown) => (isGrpcError(error) ? undefined : Promise.reject(error))),
      (granted) => granted !== undefined,
    );
    expect(next!.lease!.fencingToken).toBeGreaterThan(acquired.fencingToken);
    await rpc.unary(LockService.method.release, { leaseToken: next!.lease!.leaseToken });
  });
});

// ---------------------------------------------------------------------------------------------

describe("the surface", () => {
  it("every RPC of LockService was called above (checked against the generated descriptors)", () => {
    expectEveryRpcCalled(LockService);
  });
});
