/**
 * The election of a state directory on the local file system (the file backend of elector.ts): at
 * most one berth process serves a state directory.
 *
 * Exclusion comes from flock(2) on `<stateDir>/<name>.lock`, not from the claim written inside it.
 * The kernel drops a flock when the last descriptor of its holder closes — including when the
 * holder is SIGKILLed — so there is no stale lock to detect and break: of N processes racing, even
 * over a claim left by a dead pid, exactly one gets LOCK_EX and the rest get EWOULDBLOCK. (The
 * file-based protocol this replaces decided "dead holder" by reading the claim and then broke it;
 * two racers could both decide so and both win.)
 *
 * The claim (pid, start time, boot id, hostname, time, service) is informational: it lets a loser
 * and tools such as `berth status` name the holder. It is never used to decide who holds the lock.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import fsExt from "fs-ext";
import { invalidArgument } from "./errors.js";
import { claimIsLive, ElectionHeldError, type ElectionClaim, type ElectionLock, type Elector } from "./elector.js";
import { confirmStillWritable, ensurePrivateDir } from "./files.js";
import { selfIdentity } from "./process-identity.js";

const NAME_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;

/** The lock file of election `name` in `stateDir`. */
export function electionLockPath(stateDir: string, name: string): string {
  return path.join(stateDir, `${name}.lock`);
}

/**
 * Takes the election lock `<stateDir>/<name>.lock` without waiting, or throws `ElectionHeldError`
 * naming the holder. Synchronous on purpose: it runs once at start, before anything is served.
 * Creates `stateDir` (0700) when it is missing.
 */
export function acquireElection(stateDir: string, name: string, options: { service?: string } = {}): ElectionLock {
  if (!NAME_PATTERN.test(name)) throw invalidArgument("election name", "must match [A-Za-z0-9_-]{1,64}");
  ensurePrivateDir(stateDir);
  const lockPath = electionLockPath(stateDir, name);
  // Node opens with O_CLOEXEC, so processes the service spawns do not inherit (and keep) the lock.
  const fd = fs.openSync(lockPath, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
  try {
    fsExt.flockSync(fd, "exnb");
  } catch (error) {
    fs.closeSync(fd);
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EWOULDBLOCK" || code === "EAGAIN") throw new ElectionHeldError(stateDir, lockPath, awaitHolderClaim(lockPath));
    throw error;
  }

  const claim: ElectionClaim = { ...selfIdentity(), at: new Date().toISOString(), service: options.service ?? name };
  try {
    writeClaim(fd, claim);
  } catch (error) {
    fs.closeSync(fd);
    throw error;
  }

  let held = true;
  return {
    claim,
    path: lockPath,
    release() {
      if (!held) return;
      held = false;
      try {
        // Clear the claim while still holding the lock (a successor writes only after our unlock), so a
        // clean stop leaves no claim behind to be read as a holder.
        fs.ftruncateSync(fd, 0);
      } catch {
        // the claim is informational: failing to clear it must not keep the lock held
      }
      // Never unlink the lock file. A flock belongs to an inode, not a name: if we unlinked it, a racer
      // that had already opened the old file could lock that orphaned inode while another creates and
      // locks a new file under the same name — two holders. The file stays; only the lock goes.
      try {
        fsExt.flockSync(fd, "un");
      } finally {
        fs.closeSync(fd);
      }
    },
  };
}

/**
 * How long a loser waits for the winner's claim, to name it rather than "a process still starting".
 * Generous: two services starting at once on a busy 2-core machine can leave the winner unscheduled
 * for a few hundred ms between its lock and its claim, and only a refusal ever waits this long.
 */
const CLAIM_WAIT_MS = 2_000;

/**
 * The holder's claim, waiting briefly for it: the winner takes the kernel lock first and writes its
 * claim just after, so a loser that reads in between would find no live claim. Waiting never
 * changes who holds the lock; it only lets the refusal name the holder.
 */
function awaitHolderClaim(lockPath: string): ElectionClaim | undefined {
  const deadline = performance.now() + CLAIM_WAIT_MS;
  const pause = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    const claim = readClaim(lockPath);
    if ((claim && claimIsLive(claim)) || performance.now() >= deadline) return claim;
    Atomics.wait(pause, 0, 0, 10);
  }
}

/** Replaces the file's content with `claim`: truncate, write at offset 0, fsync. */
function writeClaim(fd: number, claim: ElectionClaim): void {
  const bytes = Buffer.from(`${JSON.stringify(claim)}\n`, "utf8");
  fs.ftruncateSync(fd, 0);
  let offset = 0;
  while (offset < bytes.length) offset += fs.writeSync(fd, bytes, offset, bytes.length - offset, offset);
  fs.fsyncSync(fd);
  confirmStillWritable(fd);
}

/**
 * The claim in a lock file, or undefined when the file is missing, empty, half-written or not a claim.
 * A claim says who took the lock last; whether that process still runs is {@link claimIsLive}'s question.
 */
export function readClaim(lockPath: string): ElectionClaim | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(fs.readFileSync(lockPath, "utf8"));
  } catch {
    return undefined;
  }
  if (typeof parsed !== "object" || parsed === null) return undefined;
  const raw = parsed as Record<string, unknown>;
  if (typeof raw.pid !== "number" || !Number.isInteger(raw.pid) || typeof raw.hostname !== "string") return undefined;
  return {
    pid: raw.pid,
    startTime: typeof raw.startTime === "number" ? raw.startTime : undefined,
    bootId: typeof raw.bootId === "string" ? raw.bootId : undefined,
    hostname: raw.hostname,
    at: typeof raw.at === "string" ? raw.at : "at an unknown time",
    service: typeof raw.service === "string" ? raw.service : "unknown service",
  };
}

/** The election on the local file system: {@link acquireElection} behind the {@link Elector} seam. */
export const fileElector: Elector = {
  acquire: (scope, name, options) => Promise.resolve().then(() => acquireElection(scope, name, options)),
};
