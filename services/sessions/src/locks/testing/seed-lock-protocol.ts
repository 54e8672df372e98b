/**
 * A test stand-in for a process that still uses the seed's `withSourceLockSync`, following its
 * protocol step by step — faults included, since berth must live beside it as it is:
 * 1. sweep: read the lock file; unreadable and older than 60 s, or readable with a dead (or no) pid:
 *    unlink it by path;
 * 2. create it with `open(..., "wx")`, then write `{owner, token, pid, at, file}` and a newline
 *    (so a reader can see it empty for a moment);
 * 3. on EEXIST, sleep `retryMs` (blocking the thread) and go to 1 until `waitMs` runs out, then
 *    throw an error with code SOURCE_LOCKED;
 * 4. after `fn`, unlink the file unless it holds another token (an unreadable file is unlinked too).
 * Liveness is the seed's: signal 0 reaches the pid or is refused with EPERM.
 */
import { createHash, randomUUID } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";

const UNREADABLE_LOCK_STALE_MS = 60_000;

/** Where the seed puts the lock of `file`: `<liveDir>/locks/<sha256(resolved)[0:24]>.lock`. */
export function seedLockPath(liveDir: string, file: string, cwd: string): string {
  const digest = createHash("sha256").update(path.resolve(cwd, file)).digest("hex").slice(0, 24);
  return path.join(liveDir, "locks", `${digest}.lock`);
}

/** Options of {@link withSeedLockSync}: the seed's, plus the live directory the seed derives from cwd. */
export interface SeedLockOptions {
  liveDir: string;
  cwd: string;
  waitMs?: number;
  retryMs?: number;
}

/** The error the seed throws when the wait runs out. */
export class SeedSourceLocked extends Error {
  readonly code = "SOURCE_LOCKED";
  constructor(readonly lockPath: string) {
    super("source_locked");
  }
}

function pidReachable(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

function readLock(lockPath: string): { pid?: unknown; token?: unknown } | null {
  try {
    return JSON.parse(fs.readFileSync(lockPath, "utf8"));
  } catch {
    return null;
  }
}

/** The seed's sweep: judge, then unlink by path (racy by design: this is what berth must survive). */
export function seedClearStaleLock(lockPath: string): void {
  const held = readLock(lockPath);
  if (!held) {
    try {
      const stat = fs.statSync(lockPath);
      if (Date.now() - stat.mtimeMs > UNREADABLE_LOCK_STALE_MS) fs.unlinkSync(lockPath);
    } catch {
      // gone already
    }
    return;
  }
  if (typeof held.pid === "number" && pidReachable(held.pid)) return;
  try {
    fs.unlinkSync(lockPath);
  } catch {
    // gone already
  }
}

/** Runs `fn` while holding `file`'s lock, exactly as the seed's `withSourceLockSync` does. */
export function withSeedLockSync<T>(file: string, owner: string, fn: (lockPath: string) => T, options: SeedLockOptions): T {
  const lockPath = seedLockPath(options.liveDir, file, options.cwd);
  fs.mkdirSync(path.dirname(lockPath), { recursive: true });
  const deadline = Date.now() + Math.max(0, Number(options.waitMs) || 0);
  const token = randomUUID();
  let acquired = false;
  while (!acquired) {
    seedClearStaleLock(lockPath);
    let fd: number | undefined;
    try {
      fd = fs.openSync(lockPath, "wx");
      fs.writeFileSync(fd, `${JSON.stringify({ owner, token, pid: process.pid, at: Date.now(), file: path.resolve(options.cwd, file) })}\n`);
      acquired = true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      if (Date.now() >= deadline) throw new SeedSourceLocked(lockPath);
      sleepSync(Math.max(1, Math.min(Number(options.retryMs) || 5, deadline - Date.now())));
    } finally {
      if (fd !== undefined) fs.closeSync(fd);
    }
  }
  try {
    return fn(lockPath);
  } finally {
    const held = readLock(lockPath);
    if (!held || held.token === token) {
      try {
        fs.unlinkSync(lockPath);
      } catch {
        // gone already
      }
    }
  }
}
