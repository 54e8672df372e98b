/**
 * A child process using the seed's lock protocol: takes the lock of a file with the seed's
 * `withSourceLockSync` and holds it until it reads "release" on stdin.
 * argv[2]: JSON {liveDir, cwd, file, owner, waitMs}. Prints JSON lines: {"event":"started"} as it
 * begins trying (so a caller can tell node's start-up from the wait), then {"event":"acquired"} and
 * {"event":"released"}, or {"event":"locked"} (exit code 3) when the wait ran out.
 */
import { readLineSync, say } from "./child-io.js";
import { SeedSourceLocked, withSeedLockSync } from "./seed-lock-protocol.js";

const { liveDir, cwd, file, owner, waitMs } = JSON.parse(process.argv[2]!) as { liveDir: string; cwd: string; file: string; owner: string; waitMs: number };
say({ event: "started", pid: process.pid, at: Date.now() });
try {
  withSeedLockSync(
    file,
    owner,
    (lockPath) => {
      say({ event: "acquired", lockPath, pid: process.pid, at: Date.now() });
      readLineSync();
    },
    { liveDir, cwd, waitMs },
  );
  say({ event: "released", at: Date.now() });
} catch (error) {
  if (!(error instanceof SeedSourceLocked)) throw error;
  say({ event: "locked", at: Date.now() });
  process.exitCode = 3;
}
