import * as fs from "node:fs";
import * as path from "node:path";
import { selfIdentity } from "@berth/shared/process-identity";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import {
  lockFilePath,
  PRIVATE_LOCK_FILE_MODE,
  readLockFile,
  removeDeadTempFiles,
  removeOwnLockFile,
  SHARED_LOCK_FILE_MODE,
  tryCreateLockFile,
} from "./lock-file-protocol.js";
import { SeedLockFiles } from "./seed-lock-files.js";
import { KEY, lockDirFixture } from "./testing/lock-dir-fixture.js";
import { childScripts, deadPid, spawnChild, type Child, type ChildScripts } from "./testing/child-scripts.js";

const { dirs, record, writeForeign } = lockDirFixture();
const self = selfIdentity();

describe("SeedLockFiles claims", () => {
  const slotFiles = () => fs.readdirSync(dirs.locksDir).filter((n) => n.startsWith(".berth-slot."));

  it("reuses a few private slot inodes instead of creating a file per grant, and deletes them on close", () => {
    const files = new SeedLockFiles({ locksDir: dirs.locksDir, clock: new ManualClock() });
    for (let i = 0; i < 50; i++) {
      const claim = files.claim(KEY, { owner: `o${i}`, at: i });
      if (!claim.ok) throw new Error("not claimed");
      expect(readLockFile(lockFilePath(dirs.locksDir, KEY))).toMatchObject({ record: { owner: `o${i}`, at: i, token: claim.handle.token } });
      files.release(claim.handle);
      expect(fs.existsSync(lockFilePath(dirs.locksDir, KEY))).toBe(false);
    }
    expect(slotFiles()).toHaveLength(1);
    const a = files.claim("/k/a", { owner: "a", at: 1 });
    const b = files.claim("/k/b", { owner: "b", at: 2 });
    expect(a.ok && b.ok).toBe(true);
    expect(slotFiles()).toHaveLength(2);
    // The slot of a live lock is not rewritten by the next grant.
    expect(readLockFile(lockFilePath(dirs.locksDir, "/k/a"))).toMatchObject({ record: { owner: "a" } });
    files.close();
    expect(slotFiles()).toEqual([]);
  });

  it("leaves a lock file alone that replaced ours (a seed sweep's doing), and still reuses the slot", () => {
    const warnings: string[] = [];
    const logger = { debug() {}, info() {}, warn: (_o: object, m?: string) => void warnings.push(m ?? ""), error() {} };
    const files = new SeedLockFiles({ locksDir: dirs.locksDir, clock: new ManualClock(), logger });
    const claim = files.claim(KEY, { owner: "berth", at: 1 });
    if (!claim.ok) throw new Error("not claimed");
    const lockPath = lockFilePath(dirs.locksDir, KEY);
    fs.unlinkSync(lockPath);
    fs.writeFileSync(lockPath, JSON.stringify({ owner: "seed", token: "other", pid: process.pid }));
    files.release(claim.handle);
    expect(readLockFile(lockPath)).toMatchObject({ record: { owner: "seed" } });
    expect(warnings).toHaveLength(1);
    fs.unlinkSync(lockPath);
    expect(files.claim(KEY, { owner: "again", at: 2 }).ok).toBe(true);
    expect(slotFiles()).toHaveLength(1);
    files.close();
  });

  it("creates its lock files and slots 0600 by default, and with the mode it is given (0644 for a project's live dir)", () => {
    const modeOf = (file: string) => fs.statSync(file).mode & 0o777;
    const own = new SeedLockFiles({ locksDir: dirs.locksDir, clock: new ManualClock() });
    const claim = own.claim(KEY, { owner: "private", at: 1 });
    if (!claim.ok) throw new Error("not claimed");
    expect(modeOf(lockFilePath(dirs.locksDir, KEY))).toBe(PRIVATE_LOCK_FILE_MODE);
    for (const name of slotFiles()) expect(modeOf(path.join(dirs.locksDir, name))).toBe(PRIVATE_LOCK_FILE_MODE);
    own.release(claim.handle);
    own.close();
    const viaTemp = record();
    tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), viaTemp);
    expect(modeOf(lockFilePath(dirs.locksDir, KEY))).toBe(PRIVATE_LOCK_FILE_MODE);
    expect(removeOwnLockFile(lockFilePath(dirs.locksDir, KEY), viaTemp.token)).toBe(true);

    const shared = new SeedLockFiles({ locksDir: dirs.locksDir, clock: new ManualClock(), fileMode: SHARED_LOCK_FILE_MODE });
    const sharedClaim = shared.claim(KEY, { owner: "shared", at: 2 });
    if (!sharedClaim.ok) throw new Error("not claimed");
    // As a file made with 0644 here (the umask may narrow both alike).
    const reference = path.join(dirs.root, "reference");
    fs.writeFileSync(reference, "", { mode: SHARED_LOCK_FILE_MODE });
    expect(modeOf(lockFilePath(dirs.locksDir, KEY))).toBe(modeOf(reference));
    shared.release(sharedClaim.handle);
    shared.close();
  });

  it("remakes a slot someone deleted", () => {
    const files = new SeedLockFiles({ locksDir: dirs.locksDir, clock: new ManualClock() });
    const first = files.claim(KEY, { owner: "one", at: 1 });
    if (!first.ok) throw new Error("not claimed");
    files.release(first.handle);
    for (const name of slotFiles()) fs.unlinkSync(path.join(dirs.locksDir, name));
    const second = files.claim(KEY, { owner: "two", at: 2 });
    if (!second.ok) throw new Error("not claimed");
    files.release(second.handle);
    expect(fs.existsSync(lockFilePath(dirs.locksDir, KEY))).toBe(false);
    files.close();
  });

  it("startup removes slots of dead berth processes, not of live ones", async () => {
    const dead = await deadPid();
    fs.writeFileSync(path.join(dirs.locksDir, `.berth-slot.${dead}.123.abcd.0`), "");
    fs.writeFileSync(path.join(dirs.locksDir, `.berth-slot.${process.pid}.${(self.startTime ?? 0) + 1}.abcd.0`), ""); // recycled pid
    fs.writeFileSync(path.join(dirs.locksDir, `.berth-slot.${process.pid}.${self.startTime}.abcd.0`), "");
    expect(removeDeadTempFiles(dirs.locksDir)).toBe(2);
    expect(slotFiles()).toEqual([`.berth-slot.${process.pid}.${self.startTime}.abcd.0`]);
  });
});

describe("SeedLockFiles watching", () => {
  it("calls back when a watched lock file goes away, and re-checks on the clock as a fallback", async () => {
    const clock = new ManualClock();
    const files = new SeedLockFiles({ locksDir: dirs.locksDir, clock, recheckMs: 250 });
    const lockPath = writeForeign(JSON.stringify({ owner: "seed", token: "t", pid: process.pid }));
    let calls = 0;
    const changed = new Promise<void>((resolve) => {
      const stop = files.watch(KEY, () => {
        calls++;
        stop();
        resolve();
      });
    });
    fs.unlinkSync(lockPath);
    await changed; // by the file event, no clock involved
    expect(calls).toBe(1);
    expect(clock.pendingTimers()).toBe(0);

    let rechecks = 0;
    const stop = files.watch(KEY, () => rechecks++);
    clock.advance(249);
    expect(rechecks).toBe(0);
    clock.advance(1);
    expect(rechecks).toBe(1);
    clock.advance(500);
    expect(rechecks).toBe(3);
    stop();
    expect(clock.pendingTimers()).toBe(0);
    files.close();
  });
});

describe("four processes racing to take over a dead holder's lock file", () => {
  let scripts: ChildScripts;
  beforeAll(() => {
    scripts = childScripts();
  });
  afterAll(() => scripts.dispose());

  /**
   * Runs up to `rounds` rounds (fewer with `untilOverlap`: it stops after the first round with two
   * holders); returns the rounds run, how many had two holders at once, from the shared log.
   */
  async function race(
    protocol: "berth" | "seed",
    rounds: number,
    untilOverlap = false,
  ): Promise<{ rounds: number; overlaps: number; sections: number; lost: number }> {
    const script = await scripts.script("takeover-contender-child.ts");
    const log = path.join(dirs.root, `sections-${protocol}.log`);
    const liveDir = path.join(dirs.root, "live");
    const config = { locksDir: dirs.locksDir, liveDir, cwd: "/project", file: "src/app.ts", key: KEY, log, holdMs: 2, protocol };
    const children: Child[] = Array.from({ length: 4 }, () => spawnChild(script, config));
    const result = { rounds: 0, overlaps: 0, sections: 0, lost: 0 };
    try {
      await Promise.all(children.map((c) => c.next("ready")));
      const dead = await deadPid();
      const lockPath = lockFilePath(dirs.locksDir, KEY);
      let judged = 0;
      for (let round = 0; round < rounds && !(untilOverlap && result.overlaps > 0); round++) {
        // A dead holder's file: mostly a crashed holder's record, sometimes a file cut short by a crash.
        if (round % 5 === 4) writeForeign('{"owner":"torn', 120_000);
        else fs.writeFileSync(lockPath, `${JSON.stringify({ owner: "crashed", token: `dead-${round}`, pid: dead, at: Date.now(), file: KEY })}\n`);
        for (const child of children) child.send(`go ${round}`);
        await Promise.all(children.map((c) => c.next("done")));
        // Every child has written its round's lines before it says done.
        const text = fs.readFileSync(log, "utf8");
        let inside = 0;
        let overlapped = false;
        for (const line of text.slice(judged).split("\n")) {
          if (line.startsWith("enter ")) {
            inside++;
            result.sections++;
            if (inside > 1) overlapped = true;
          } else if (line.startsWith("leave ")) inside--;
          else if (line.startsWith("lost ")) result.lost++;
        }
        judged = text.length;
        if (overlapped) result.overlaps++;
        result.rounds++;
      }
      for (const child of children) child.send("exit");
      await Promise.all(children.map((c) => c.exited));
      return result;
    } finally {
      for (const child of children) child.process.kill("SIGKILL");
    }
  }

  it("berth never lets two in (60 rounds of 4 sections; BERTH_RACE_ROUNDS for more)", async () => {
    const rounds = Number(process.env.BERTH_RACE_ROUNDS ?? 60);
    const { overlaps, sections, lost } = await race("berth", rounds);
    expect(sections).toBe(4 * rounds);
    expect(overlaps).toBe(0);
    expect(lost).toBe(0);
  });

  // The same harness with the seed's own protocol (read, judge, unlink by path) does let two in:
  // the check above is one that can fail. About one round in ten overlaps on this machine, but a
  // fresh container on Node 24 went 300 rounds without one: up to 1,500 (it stops at the first),
  // so that no overlap means a broken harness, not a slow machine's luck.
  it("sees the seed's protocol let two holders in under the same race", { timeout: 120_000 }, async () => {
    const { rounds, overlaps, sections } = await race("seed", 1500, true);
    console.log(JSON.stringify({ measure: "seed takeover race", roundsUntilTwoHolders: rounds }));
    expect(overlaps).toBe(1);
    expect(sections).toBeGreaterThanOrEqual(4 * rounds);
  });
});
