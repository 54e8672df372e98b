/**
 * One contender of the takeover race test. For each "go" line on stdin it takes the lock file of one
 * key — with berth's code (`tryCreateLockFile`, race-free clearing), or with the seed's protocol when
 * argv says "seed" — appends "enter <pid>" / "leave <pid>" to a shared O_APPEND log while it holds,
 * releases, and answers "done".
 * argv[2]: JSON {locksDir, liveDir, cwd, file, key, log, holdMs, protocol: "berth" | "seed"}.
 */
import * as fs from "node:fs";
import { selfIdentity } from "@berth/shared/process-identity";
import { lockFilePath, newLockFileRecord, removeOwnLockFile, tryCreateLockFile } from "../seed-lock-files.js";
import { readLineSync, say, sleepSync } from "./child-io.js";
import { withSeedLockSync } from "./seed-lock-protocol.js";

interface Config {
  locksDir: string;
  liveDir: string;
  cwd: string;
  file: string;
  key: string;
  log: string;
  holdMs: number;
  protocol: "berth" | "seed";
}
const config = JSON.parse(process.argv[2]!) as Config;
const log = fs.openSync(config.log, "a");
const me = process.pid;
const self = selfIdentity();

function criticalSection(): void {
  fs.writeSync(log, `enter ${me}\n`);
  sleepSync(config.holdMs);
  fs.writeSync(log, `leave ${me}\n`);
}

function takeWithBerth(): void {
  const lockPath = lockFilePath(config.locksDir, config.key);
  for (;;) {
    const record = newLockFileRecord({ owner: `contender-${me}`, file: config.key, at: Date.now(), pid: me, startTime: self.startTime, bootId: self.bootId, hostname: self.hostname });
    const outcome = tryCreateLockFile(lockPath, record);
    if (outcome.created) {
      criticalSection();
      if (!removeOwnLockFile(lockPath, record.token)) fs.writeSync(log, `lost ${me}\n`);
      return;
    }
    sleepSync(1);
  }
}

say({ event: "ready", pid: me });
for (let line = readLineSync(); line !== null && line !== "exit"; line = readLineSync()) {
  if (config.protocol === "berth") takeWithBerth();
  else withSeedLockSync(config.file, `contender-${me}`, criticalSection, { liveDir: config.liveDir, cwd: config.cwd, waitMs: 60_000, retryMs: 1 });
  say({ event: "done", round: line });
}
fs.closeSync(log);
