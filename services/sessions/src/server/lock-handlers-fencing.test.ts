import * as fs from "node:fs";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { HolderKind } from "@berth/api/berth/locks/v1/lock_service_pb";
import { BerthError } from "@berth/shared/errors";
import { lockFilePath } from "../locks/index.js";
import { createFenceCheck } from "./lock-handlers.js";
import {
  clock,
  client,
  closeLockService,
  failure,
  FILE,
  key,
  liveDir,
  locks,
  ms,
  openHold,
  projectRoot,
  root,
  setUpLockService,
} from "./lock-handler-fixtures.js";

beforeEach(setUpLockService);
afterEach(closeLockService);

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
