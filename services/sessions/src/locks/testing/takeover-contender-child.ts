/**
 * One contender of the takeover race test. For each "go" line on stdin it takes the lock file of one
 * key — with the code berth's service runs (`SeedLockFiles.claim`: race-free clearing, slot files),
 * or with the seed's protocol when argv says "seed" — appends "enter <pid>" / "leave <pid>" to a
 * shared O_APPEND log while it holds, releases, and answers "done".
 * argv[2]: JSON {locksDir, liveDir, cwd, file, key, log, holdMs, protocol: "berth" | "seed"}.
 */
import * as fs from "node:fs";
import { systemClock } from "@berth/shared/clock";
import { SeedLockFiles } from "../seed-lock-files.js";
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
const lost = () => fs.writeSync(log, `lost ${me}\n`);
const files = new SeedLockFiles({ locksDir: config.locksDir, clock: systemClock, logger: { debug() {}, info() {}, warn: lost, error: lost } });

function criticalSection(): void {
  fs.writeSync(log, `enter ${me}\n`);
  sleepSync(config.holdMs);
  fs.writeSync(log, `leave ${me}\n`);
}

function takeWithBerth(): void {
  for (;;) {
    const claim = files.claim(config.key, { owner: `contender-${me}`, at: Date.now() });
    if (claim.ok) {
      criticalSection();
      files.release(claim.handle); // logs (→ "lost") if the file was no longer ours
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
files.close();
fs.closeSync(log);
