/**
 * A lock file this service may not read: another user's seed process made it under a umask that
 * keeps others out (root with umask 077 beside a service running as uid 1000, as in a container).
 * Its holder cannot be judged, so it is held for as long as it is there, never swept.
 *
 * The tests run as root in CI, where no file is unreadable: opening the lock files named in
 * `forbidden` fails with EACCES here, as it does for a service of another uid.
 */
import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { createSourceLocks, type SourceLocks } from "./source-locks.js";
import { clearStaleLockFile, judgeLockFile, lockFilePath, newLockFileRecord, readLockFile, tryCreateLockFile } from "./lock-file-protocol.js";
import { SeedLockFiles } from "./seed-lock-files.js";

const forbidden = vi.hoisted(() => new Set<string>());

vi.mock("node:fs", async (importOriginal) => {
  const actual = await importOriginal<typeof import("node:fs")>();
  const openSync = ((file: fs.PathLike, ...rest: unknown[]) => {
    if (forbidden.has(String(file))) {
      throw Object.assign(new Error(`EACCES: permission denied, open '${String(file)}'`), { code: "EACCES", errno: -13, syscall: "open", path: String(file) });
    }
    return (actual.openSync as (...args: unknown[]) => number)(file, ...rest);
  }) as typeof fs.openSync;
  return { ...actual, default: { ...actual, openSync }, openSync };
});

let root: string;
let projectRoot: string;
let liveDir: string;
let locksDir: string;
let services: SourceLocks[];

beforeEach(() => {
  root = fs.mkdtempSync(path.join(tmpdir(), "berth-lockperm-"));
  projectRoot = path.join(root, "project");
  liveDir = path.join(projectRoot, ".impeccable", "live");
  locksDir = path.join(liveDir, "locks");
  fs.mkdirSync(locksDir, { recursive: true });
  services = [];
});
afterEach(() => {
  forbidden.clear();
  for (const service of services) service.close();
  fs.rmSync(root, { recursive: true, force: true });
});

const key = () => path.join(projectRoot, "src", "app.css");

/** Another user's lock file of `key()`, written `ageMs` ago, which this process may not open. */
function foreignUnreadable(ageMs: number): string {
  const lockPath = lockFilePath(locksDir, key());
  fs.writeFileSync(lockPath, `${JSON.stringify({ owner: "root-tool", token: "t", pid: 1, at: Date.now() - ageMs, file: key() })}\n`, { mode: 0o600 });
  const then = new Date(Date.now() - ageMs);
  fs.utimesSync(lockPath, then, then);
  forbidden.add(lockPath);
  return lockPath;
}

describe("a lock file this service may not read", () => {
  it("is forbidden, and held however old it is (never stale)", () => {
    const lockPath = foreignUnreadable(10 * 60_000);
    const seen = readLockFile(lockPath);
    expect(seen.state).toBe("forbidden");
    expect(judgeLockFile(seen as Exclude<typeof seen, { state: "absent" }>)).toBe("held");
  });

  it("is neither taken over nor swept: creating reports it held by an unreadable holder, clearing leaves it", () => {
    const lockPath = foreignUnreadable(10 * 60_000);
    const before = fs.readFileSync(lockPath, "utf8");
    const outcome = tryCreateLockFile(lockPath, newLockFileRecord({ owner: "berth", file: key(), at: Date.now(), pid: process.pid }));
    expect(outcome).toMatchObject({ created: false, reason: "held", holder: { lockFile: lockPath, readable: false } });
    expect(clearStaleLockFile(lockPath)).toBe("held");
    expect(fs.readFileSync(lockPath, "utf8")).toBe(before);
  });

  it("shows through SeedLockFiles as a foreign holder", () => {
    const lockPath = foreignUnreadable(90_000);
    const files = new SeedLockFiles({ locksDir, clock: new ManualClock() });
    try {
      expect(files.peek(key())).toMatchObject({ lockFile: lockPath, readable: false });
      expect(files.claim(key(), { owner: "berth", at: Date.now() })).toMatchObject({ ok: false, holder: { readable: false } });
    } finally {
      files.close();
    }
  });

  it("makes the lock service answer: Inspect names it, Acquire is refused as locked, a waiter gives up at its deadline", async () => {
    const lockPath = foreignUnreadable(90_000);
    const clock = new ManualClock();
    const locks = createSourceLocks({ projectRoot, stateDir: path.join(root, "state"), liveDir, clock });
    services.push(locks);

    expect(locks.inspect(key())).toMatchObject({ lockPath, holder: { kind: "seed-file", readable: false } });
    await expect(locks.acquire({ file: key(), owner: "berth", waitMs: 0, ttlMs: 10_000 })).rejects.toMatchObject({
      code: "resource_exhausted",
      reason: "WAIT_EXHAUSTED",
    });

    const waiting = locks.acquire({ file: key(), owner: "berth", waitMs: 1_000, ttlMs: 10_000 });
    const settled = waiting.then(
      () => "granted",
      (error: unknown) => error,
    );
    clock.advance(1_000);
    const error = await settled;
    expect(error).toBeInstanceOf(BerthError);
    expect(error).toMatchObject({ code: "resource_exhausted", reason: "WAIT_EXHAUSTED" });
    expect((error as BerthError).message).toContain(lockPath);
    expect(fs.existsSync(lockPath)).toBe(true);
  });
});
