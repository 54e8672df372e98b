import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { BerthError } from "@berth/shared/errors";
import { createEtcdClient, EtcdCompactedError, EtcdReason, op, toBerthError, type EtcdClient } from "./index.js";
import { startEtcd, type EtcdCluster } from "./testing/index.js";

const call = { op: "put", endpoint: "http://127.0.0.1:2379", write: true };

describe("toBerthError", () => {
  it("tells etcd's cases apart by message where the code is shared", () => {
    const tooLarge = toBerthError(new ConnectError("etcdserver: request is too large", Code.InvalidArgument), { ...call, requestBytes: () => 2_000_000 });
    expect(tooLarge).toMatchObject({ code: "invalid_argument", reason: EtcdReason.REQUEST_TOO_LARGE, details: { requestBytes: 2_000_000 } });
    expect(tooLarge.message).toMatch(/2000000 bytes.*--max-request-bytes/);
    const tooMany = toBerthError(new ConnectError("etcdserver: too many operations in txn request", Code.InvalidArgument), call);
    expect(tooMany).toMatchObject({ code: "invalid_argument", reason: EtcdReason.TOO_MANY_OPS });
    const noSpace = toBerthError(new ConnectError("etcdserver: mvcc: database space exceeded", Code.ResourceExhausted), call);
    expect(noSpace).toMatchObject({ code: "resource_exhausted", reason: EtcdReason.NO_SPACE });
    const busy = toBerthError(new ConnectError("etcdserver: too many requests", Code.ResourceExhausted), call);
    expect(busy).toMatchObject({ code: "unavailable", reason: EtcdReason.UNAVAILABLE, details: { outcome: "not_applied" } });
  });

  it("says whether a failed write may have been applied", () => {
    const refused = new ConnectError(
      "connect ECONNREFUSED",
      Code.Unavailable,
      undefined,
      undefined,
      Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }),
    );
    expect(toBerthError(refused, call).details).toMatchObject({ outcome: "not_applied" });
    expect(toBerthError(new ConnectError("etcdserver: no leader", Code.Unavailable), call).details).toMatchObject({ outcome: "not_applied" });
    const timedOut = toBerthError(new ConnectError("etcdserver: request timed out", Code.Unavailable), call);
    expect(timedOut.details).toMatchObject({ outcome: "unknown" });
    expect(timedOut.message).toMatch(/may or may not have been applied/);
    expect(toBerthError(new ConnectError("deadline", Code.DeadlineExceeded), call).details).toMatchObject({ outcome: "unknown" });
    // A connection reset under the call (its member SIGKILLed): connect-node says ABORTED, but
    // another member can answer, and a write may have landed.
    const reset = toBerthError(
      new ConnectError("read ECONNRESET", Code.Aborted, undefined, undefined, Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" })),
      call,
    );
    expect(reset).toMatchObject({ code: "unavailable", reason: EtcdReason.UNAVAILABLE, details: { outcome: "unknown" } });
    const goaway = new ConnectError(
      "stream closed",
      Code.Internal,
      undefined,
      undefined,
      Object.assign(new Error("goaway"), { code: "ERR_HTTP2_GOAWAY_SESSION" }),
    );
    expect(toBerthError(goaway, call)).toMatchObject({ code: "unavailable", details: { outcome: "unknown" } });
    // A read has no outcome to doubt.
    expect(toBerthError(new ConnectError("deadline", Code.DeadlineExceeded), { ...call, write: false }).details).toMatchObject({ outcome: "not_applied" });
  });

  it("makes a connection that could not be opened for want of a descriptor RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES, not applied (connect-node says INTERNAL)", () => {
    for (const code of ["EMFILE", "ENFILE"]) {
      const cause = Object.assign(new Error(`connect ${code} 127.0.0.1:2379 - Local (undefined:undefined)`), { code });
      const error = toBerthError(new ConnectError(cause.message, Code.Internal, undefined, undefined, cause), call);
      expect(error).toMatchObject({
        code: "resource_exhausted",
        reason: "TOO_MANY_OPEN_FILES",
        options: { retryAfterMs: 1000 },
        details: { endpoint: call.endpoint, outcome: "not_applied", errno: code },
      });
      expect(error.message).toMatch(/^etcd put at http:\/\/127.0.0.1:2379: no connection to etcd could be opened: the service has no file descriptor left/);
    }
  });

  it("makes a compacted revision its own error, and passes berth's errors through", () => {
    const compacted = toBerthError(new ConnectError("etcdserver: mvcc: required revision has been compacted", Code.OutOfRange), { ...call, revision: 5n });
    expect(compacted).toBeInstanceOf(EtcdCompactedError);
    expect(compacted).toMatchObject({ requestedRevision: 5n, compactRevision: undefined });
    const own = new BerthError("aborted", "mine");
    expect(toBerthError(own, call)).toBe(own);
    expect(toBerthError(new ConnectError("etcdserver: permission denied", Code.PermissionDenied), call)).toMatchObject({
      code: "internal",
      reason: EtcdReason.AUTH,
    });
    expect(toBerthError(new Error("boom"), call)).toMatchObject({ code: "internal", reason: EtcdReason.ERROR });
  });
});

// A member with small limits, to reach them quickly: 64 KiB requests (gRPC's own limit is then
// 64 KiB + 512 KiB) and a storage quota of 1 MiB.
describe("etcd's limits, for real", { tags: ["etcd"] }, () => {
  let etcd: EtcdCluster;
  let client: EtcdClient;
  beforeAll(async () => {
    etcd = await startEtcd({ electionTimeoutMs: 500, args: ["--max-request-bytes", String(64 * 1024), "--quota-backend-bytes", String(1024 * 1024)] });
    client = createEtcdClient({ endpoints: etcd.clientUrls, requestTimeoutMs: 1_000 });
  });
  afterAll(async () => {
    client?.close();
    await etcd?.stop();
  });

  it("a request over --max-request-bytes is INVALID_ARGUMENT naming the limit", async () => {
    const overEtcd = await client.put("big", new Uint8Array(100 * 1024)).catch((e: unknown) => e);
    expect(overEtcd).toMatchObject({ code: "invalid_argument", reason: EtcdReason.REQUEST_TOO_LARGE });
    expect((overEtcd as BerthError).details?.requestBytes).toBeGreaterThan(100 * 1024);
    const overGrpc = await client.put("bigger", new Uint8Array(700 * 1024)).catch((e: unknown) => e);
    expect(overGrpc).toMatchObject({ code: "invalid_argument", reason: EtcdReason.REQUEST_TOO_LARGE });
    await client.put("small", new Uint8Array(32 * 1024));
  });

  it("a transaction over --max-txn-ops is INVALID_ARGUMENT", async () => {
    const ops = Array.from({ length: 129 }, (_, i) => op.put(`ops/${i}`, ""));
    await expect(client.txn({ compare: [], success: ops })).rejects.toMatchObject({ code: "invalid_argument", reason: EtcdReason.TOO_MANY_OPS });
    expect((await client.txn({ compare: [], success: ops.slice(0, 128) })).succeeded).toBe(true);
  });

  it("a write to a member that does not answer is UNAVAILABLE with an unknown outcome", async () => {
    const [member] = etcd.members;
    etcd.pause(member!);
    try {
      const error = await client.put("paused", "x").catch((e: unknown) => e);
      expect(error).toMatchObject({ code: "unavailable", reason: EtcdReason.UNAVAILABLE, details: { outcome: "unknown" } });
    } finally {
      etcd.resume(member!);
    }
    await etcd.waitHealthy();
  });

  // Last: the alarm stays raised.
  it("the storage quota alarm is RESOURCE_EXHAUSTED saying what an operator must do", async () => {
    await client.put("before-full", "x");
    let error: unknown;
    for (let i = 0; i < 200 && !error; i++)
      error = await client.put(`fill/${i}`, new Uint8Array(60 * 1024)).then(
        () => undefined,
        (e: unknown) => e,
      );
    expect(error).toMatchObject({ code: "resource_exhausted", reason: EtcdReason.NO_SPACE, details: { alarm: "NOSPACE" } });
    expect((error as BerthError).message).toMatch(/--quota-backend-bytes.*etcdctl alarm disarm/);
    // Reads still work; every write is refused, even a small one.
    expect((await client.get("before-full"))?.version).toBe(1n);
    await expect(client.put("tiny", "x")).rejects.toMatchObject({ reason: EtcdReason.NO_SPACE });
  });
});
