import * as fs from "node:fs";
import * as path from "node:path";
import { flockSync } from "fs-ext";
import { selfIdentity } from "@berth/shared/process-identity";
import { describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import {
  clearStaleLockFile,
  judgeLockFile,
  lockFilePath,
  readLockFile,
  removeDeadTempFiles,
  removeOwnLockFile,
  seedProject,
  seedSpelling,
  SWEEP_GUARD_NAME,
  tryCreateLockFile,
  UnreadableAges,
} from "./lock-file-protocol.js";
import { SeedLockFiles } from "./seed-lock-files.js";
import { KEY, lockDirFixture } from "./testing/lock-dir-fixture.js";
import { deadPid } from "./testing/child-scripts.js";
import { seedLockPath } from "./testing/seed-lock-protocol.js";

const { dirs, record, writeForeign } = lockDirFixture();
const self = selfIdentity();

describe("lock file names and content", () => {
  it("is the seed's path: <liveDir>/locks/<sha256(resolved path)[0:24]>.lock", () => {
    expect(lockFilePath(dirs.locksDir, KEY)).toBe(seedLockPath(path.join(dirs.root, "live"), "src/app.ts", "/project"));
    expect(path.basename(lockFilePath(dirs.locksDir, KEY))).toMatch(/^[0-9a-f]{24}\.lock$/);
  });

  it("names a file under a project its seed processes reach through a symlink as they do, and any other by its canonical path", () => {
    const real = path.join(fs.realpathSync(dirs.root), "proj");
    fs.mkdirSync(real);
    const spelled = path.join(dirs.root, "via-link");
    fs.symlinkSync(real, spelled);
    const project = seedProject(spelled);
    expect(project).toEqual({ spelled, canonical: real });
    expect(seedSpelling(`${real}/src/app.ts`, project)).toBe(`${spelled}/src/app.ts`);
    expect(seedSpelling(`${real}/..hidden/a`, project)).toBe(`${spelled}/..hidden/a`);
    expect(seedSpelling(real, project)).toBe(spelled);
    // Beside or above the project: the canonical path, as a seed process anywhere else names it.
    expect(seedSpelling(`${real}-other/a`, project)).toBe(`${real}-other/a`);
    expect(seedSpelling("/etc/hosts", project)).toBe("/etc/hosts");
    // No project, or one spelled by its real path: always the canonical path.
    expect(seedSpelling(`${real}/src/app.ts`, undefined)).toBe(`${real}/src/app.ts`);
    expect(seedSpelling(`${real}/src/app.ts`, seedProject(real))).toBe(`${real}/src/app.ts`);

    const files = new SeedLockFiles({ locksDir: dirs.locksDir, clock: new ManualClock(), projectRoot: spelled });
    expect(files.pathFor(`${real}/src/app.ts`)).toBe(seedLockPath(path.join(dirs.root, "live"), "src/app.ts", spelled));
    const claim = files.claim(`${real}/src/app.ts`, { owner: "o", at: 1 });
    expect(claim.ok).toBe(true);
    expect(readLockFile(files.pathFor(`${real}/src/app.ts`))).toMatchObject({ record: { file: `${spelled}/src/app.ts` } });
    if (claim.ok) files.release(claim.handle);
    files.close();
  });

  it("creates the file whole with the seed's fields and a newline, then reports it held", () => {
    const mine = record("alice");
    const outcome = tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), mine);
    expect(outcome).toEqual({ created: true, lockFile: lockFilePath(dirs.locksDir, KEY), token: mine.token });
    const text = fs.readFileSync(lockFilePath(dirs.locksDir, KEY), "utf8");
    expect(text.endsWith("}\n")).toBe(true);
    expect(JSON.parse(text)).toEqual({
      owner: "alice",
      token: mine.token,
      pid: process.pid,
      at: mine.at,
      file: KEY,
      startTime: self.startTime,
      bootId: self.bootId,
      hostname: self.hostname,
    });
    // No temp file is left behind.
    expect(fs.readdirSync(dirs.locksDir).filter((n) => n !== SWEEP_GUARD_NAME)).toEqual([path.basename(lockFilePath(dirs.locksDir, KEY))]);
    const second = tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), record("bob"));
    expect(second).toMatchObject({ created: false, reason: "held", holder: { owner: "alice", pid: process.pid, token: mine.token, readable: true } });
  });

  it("removes only its own file", () => {
    const lockPath = lockFilePath(dirs.locksDir, KEY);
    const mine = record();
    tryCreateLockFile(lockPath, mine);
    expect(removeOwnLockFile(lockPath, "someone-else")).toBe(false);
    expect(fs.existsSync(lockPath)).toBe(true);
    expect(removeOwnLockFile(lockPath, mine.token)).toBe(true);
    expect(fs.existsSync(lockPath)).toBe(false);
    expect(removeOwnLockFile(lockPath, mine.token)).toBe(false);
    // Replaced by another holder meanwhile (a seed process's sweep): left alone.
    writeForeign(JSON.stringify({ owner: "seed", token: "t2", pid: process.pid }));
    expect(removeOwnLockFile(lockPath, mine.token)).toBe(false);
    expect(fs.existsSync(lockPath)).toBe(true);
  });
});

describe("staleness, by the seed's rules", () => {
  it("a dead pid is stale and is taken over", async () => {
    const pid = await deadPid();
    writeForeign(`${JSON.stringify({ owner: "crashed", token: "t", pid, at: 1, file: KEY })}\n`);
    const mine = record();
    expect(tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), mine)).toMatchObject({ created: true });
    expect(readLockFile(lockFilePath(dirs.locksDir, KEY))).toMatchObject({ state: "readable", record: { token: mine.token } });
  });

  it("a live pid (even one not ours to signal: pid 1, EPERM) holds however old the file", () => {
    writeForeign(JSON.stringify({ owner: "init", token: "t", pid: 1, at: 1, file: KEY }), 3_600_000);
    expect(tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), record())).toMatchObject({
      created: false,
      reason: "held",
      holder: { owner: "init", pid: 1, since: 1 },
    });
  });

  it("a readable record without a pid is stale", () => {
    writeForeign(JSON.stringify({ owner: "odd" }));
    expect(tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), record())).toMatchObject({ created: true });
  });

  it("an unreadable file is held while young (a writer between create and write)…", () => {
    writeForeign("");
    expect(tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), record())).toMatchObject({ created: false, reason: "held", holder: { readable: false } });
    writeForeign('{"owner":"half', 59_000);
    expect(tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), record())).toMatchObject({ created: false, reason: "held" });
  });

  it("…and stale once older than 60 s", () => {
    writeForeign('{"owner":"half', 61_000);
    expect(tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), record())).toMatchObject({ created: true });
  });

  it("a berth file whose pid is alive but whose process start time differs is stale (pid reuse)", () => {
    const reused = { ...record("old run"), startTime: (self.startTime ?? 0) + 1 };
    writeForeign(JSON.stringify(reused));
    const seen = readLockFile(lockFilePath(dirs.locksDir, KEY));
    expect(seen.state === "readable" && judgeLockFile(seen)).toBe("stale");
    expect(tryCreateLockFile(lockFilePath(dirs.locksDir, KEY), record())).toMatchObject({ created: true });
  });
});

describe("the age of an unreadable file, whatever the wall clock does", () => {
  const HOUR = 3_600_000;
  const claim = (files: SeedLockFiles) => files.claim(KEY, { owner: "berth", at: Date.now() });

  it("a fresh file stays held through a step forward, and turns stale 60 s after berth first saw it", () => {
    const clock = new ManualClock(Date.now());
    const files = new SeedLockFiles({ locksDir: dirs.locksDir, clock });
    writeForeign("");
    expect(claim(files)).toMatchObject({ ok: false, holder: { readable: false } });
    clock.stepWall(HOUR);
    expect(claim(files)).toMatchObject({ ok: false });
    // (File times are coarser than the clock: the age at first sight may be a few ms.)
    clock.advance(59_000);
    expect(files.peek(KEY)).toMatchObject({ readable: false });
    clock.advance(1_001);
    expect(files.peek(KEY)).toBeUndefined();
    expect(claim(files)).toMatchObject({ ok: true });
    files.close();
  });

  it("a wreck is not kept for the length of a step back: stale 60 s after berth first saw it", () => {
    // Written an hour "in the future": the wall clock was set back an hour since.
    const clock = new ManualClock(Date.now() - HOUR);
    const files = new SeedLockFiles({ locksDir: dirs.locksDir, clock });
    writeForeign('{"owner":"half');
    expect(claim(files)).toMatchObject({ ok: false });
    clock.advance(60_001);
    expect(claim(files)).toMatchObject({ ok: true });
    files.close();
  });

  it("a file already older than 60 s by the seed's measure when first seen is stale at once", () => {
    const files = new SeedLockFiles({ locksDir: dirs.locksDir, clock: new ManualClock(Date.now()) });
    writeForeign('{"owner":"half', 61_000);
    expect(claim(files)).toMatchObject({ ok: true });
    files.close();
  });

  it("a rewritten file is a new sighting; the memory of sightings is bounded", () => {
    const clock = new ManualClock(Date.now());
    const ages = new UnreadableAges(clock, 2);
    const identity = (ino: bigint) => ({ dev: 1n, ino, ctimeNs: 5n });
    expect(ages.ageOf({ identity: identity(1n), mtimeMs: clock.now() - 10_000 })).toBe(10_000);
    clock.stepWall(HOUR);
    clock.advance(5000);
    expect(ages.ageOf({ identity: identity(1n), mtimeMs: 0 })).toBe(15_000);
    expect(ages.ageOf({ identity: { ...identity(1n), ctimeNs: 6n }, mtimeMs: clock.now() })).toBe(0);
    ages.ageOf({ identity: identity(3n), mtimeMs: clock.now() });
    expect(ages.size).toBe(2);
  });
});

describe("clearing a stale file", () => {
  it("answers busy, and touches nothing, while another sweeper holds the guard", async () => {
    const pid = await deadPid();
    const lockPath = writeForeign(JSON.stringify({ owner: "crashed", token: "t", pid }));
    const guard = fs.openSync(path.join(dirs.locksDir, SWEEP_GUARD_NAME), "a+");
    flockSync(guard, "ex");
    try {
      expect(clearStaleLockFile(lockPath)).toBe("busy");
      expect(tryCreateLockFile(lockPath, record())).toMatchObject({ created: false, reason: "busy", holder: { owner: "crashed" } });
      expect(fs.existsSync(lockPath)).toBe(true);
    } finally {
      fs.closeSync(guard);
    }
    expect(clearStaleLockFile(lockPath)).toBe("cleared");
    expect(clearStaleLockFile(lockPath)).toBe("absent");
  });

  it("re-judges inside the guard: a file that turned live is not removed", () => {
    const lockPath = writeForeign(JSON.stringify({ owner: "live", token: "t", pid: process.pid }));
    expect(clearStaleLockFile(lockPath)).toBe("held");
    expect(fs.existsSync(lockPath)).toBe(true);
  });

  it("leaves alone a file a seed process put in place of the stale one while it was being judged", async () => {
    const dead = await deadPid();
    const lockPath = writeForeign(JSON.stringify({ owner: "crashed", token: "t0", pid: dead }));
    const seedRecord = JSON.stringify({ owner: "seed", token: "t1", pid: process.pid, at: Date.now(), file: KEY });
    // The seed's sweep, which ignores berth's guard, runs between berth's read and its unlink: it
    // removes the dead holder's file by path and creates its own, exclusively.
    const judgeWhileSeedSweeps = {
      isPidAlive: (pid: number) => {
        fs.unlinkSync(lockPath);
        fs.writeFileSync(lockPath, seedRecord, { flag: "wx" });
        return pid !== dead;
      },
    };
    expect(clearStaleLockFile(lockPath, judgeWhileSeedSweeps)).toBe("held");
    expect(fs.readFileSync(lockPath, "utf8")).toBe(seedRecord);
    // Judged afresh, the seed's live file holds.
    expect(tryCreateLockFile(lockPath, record())).toMatchObject({ created: false, reason: "held", holder: { owner: "seed" } });
  });

  it("removes temp files of dead berth processes only", async () => {
    const dead = await deadPid();
    const digest = "0123456789abcdef01234567";
    fs.writeFileSync(path.join(dirs.locksDir, `.${digest}.lock.${dead}.aaaaaaaaaaaa.tmp`), "x");
    fs.writeFileSync(path.join(dirs.locksDir, `.${digest}.lock.${process.pid}.bbbbbbbbbbbb.tmp`), "x");
    expect(removeDeadTempFiles(dirs.locksDir)).toBe(1);
    expect(fs.readdirSync(dirs.locksDir)).toEqual([`.${digest}.lock.${process.pid}.bbbbbbbbbbbb.tmp`]);
  });
});
