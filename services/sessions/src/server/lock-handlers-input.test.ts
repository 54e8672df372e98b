import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { durationFromMs, type Duration } from "@bufbuild/protobuf/wkt";
import { Code } from "@connectrpc/connect";
import { DEFAULT_LOCK_LIMITS } from "../locks/index.js";
import { durationInput } from "./lock-handlers.js";
import { client, closeLockService, failure, FILE, HEARTBEAT_MS, locks, ms, serve, setUpLockService } from "./lock-handler-fixtures.js";

beforeEach(setUpLockService);
afterEach(closeLockService);

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
