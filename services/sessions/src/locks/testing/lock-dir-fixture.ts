/**
 * The lock-file tests' ground: a fresh `<root>/live/locks` per test (vitest's beforeEach and
 * afterEach), a record of this process for one file, and a foreign lock file of any content and age.
 */
import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach } from "vitest";
import { selfIdentity } from "@berth/shared/process-identity";
import { lockFilePath, newLockFileRecord, type LockFileRecord } from "../lock-file-protocol.js";

/** The file every fixture lock is for. */
export const KEY = "/project/src/app.ts";

export function lockDirFixture() {
  const dirs = { root: "", locksDir: "" };
  beforeEach(() => {
    dirs.root = fs.mkdtempSync(path.join(tmpdir(), "berth-lockfiles-"));
    dirs.locksDir = path.join(dirs.root, "live", "locks");
    fs.mkdirSync(dirs.locksDir, { recursive: true });
  });
  afterEach(() => fs.rmSync(dirs.root, { recursive: true, force: true }));

  const self = selfIdentity();
  return {
    dirs,
    record(owner = "berth-test", pid = process.pid): LockFileRecord {
      return newLockFileRecord({ owner, file: KEY, at: Date.now(), pid, startTime: self.startTime, bootId: self.bootId, hostname: self.hostname });
    },
    /** Writes KEY's lock file as another process would, `ageMs` old. */
    writeForeign(content: string, ageMs = 0): string {
      const lockPath = lockFilePath(dirs.locksDir, KEY);
      fs.writeFileSync(lockPath, content);
      if (ageMs > 0) {
        const then = new Date(Date.now() - ageMs);
        fs.utimesSync(lockPath, then, then);
      }
      return lockPath;
    },
  };
}
