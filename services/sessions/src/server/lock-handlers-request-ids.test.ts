import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { Duration } from "@bufbuild/protobuf/wkt";
import { create } from "@bufbuild/protobuf";
import { Code, createContextValues, createHandlerContext } from "@connectrpc/connect";
import { BadRequestSchema, ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { AcquireRequestSchema, LockService as LockServiceDesc, type AcquireResponse } from "@berth/api/berth/locks/v1/lock_service_pb";
import { AnswerDelivery, answerDeliveryKey } from "@berth/shared/server/index";
import { createLockHandlers } from "./lock-handlers.js";
import { clock, client, closeLockService, errorInfo, failure, FILE, HEARTBEAT_MS, locks, ms, setUpLockService } from "./lock-handler-fixtures.js";

beforeEach(setUpLockService);
afterEach(closeLockService);

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
