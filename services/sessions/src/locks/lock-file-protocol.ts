/**
 * The seed's lock-file protocol, as functions on one lock file: its name, reading and judging it,
 * creating it atomically, clearing a stale one race-free, removing one's own. The class that keeps
 * berth's lock files with them (its slot pool and directory watch) is seed-lock-files.ts.
 *
 * The seed's protocol: a lock is the file `<liveDir>/locks/<first 24 hex of sha256(resolved path)>.lock`
 * holding `{owner, token, pid, at, file}` and a newline. The seed resolves a path with
 * `path.resolve(cwd, file)`, its process's working directory by default: a real path (getcwd(3)),
 * so for a file under it the seed's resolved path is berth's canonical one (see lock-path.ts). A
 * project whose seed processes are given their directory through a symlink is named by
 * {@link SeedLockFilesOptions.projectRoot}, and files under it are named as those processes name
 * them (see {@link seedSpelling}). A taker creates it exclusively; a holder
 * deletes it only while it still holds its own token; a file is *stale* when its pid is dead, or
 * when it cannot be read and is older than 60 s (younger, a writer may be between create and write).
 *
 * berth follows that protocol and repairs two of its faults on berth's side:
 * - **Atomic create.** The seed opens the file with `wx` and writes afterwards, so a reader can see an
 *   empty or half-written file. berth writes the full content into a private file (a temp file, or
 *   one of the service's reusable slot files, see {@link SeedLockFiles}) and `link(2)`s it to the
 *   lock path: the link fails with EEXIST when the lock is taken, and a reader only ever sees
 *   berth's file whole.
 * - **Race-free clearing of a stale file** (see {@link clearStaleLockFile}). The seed's sweep reads,
 *   judges dead, then unlinks *by path*, which deletes whatever file is there by then — possibly a new
 *   holder's, letting two holders in. berth clears under an exclusive flock(2) and re-judges inside it.
 *
 * Files berth writes also carry the writer's process start time and boot id: the seed ignores them,
 * and berth uses them so a recycled pid (a service restarted as pid 1 in a container, say) never
 * keeps a dead run's lock alive.
 *
 * Time: the seed's only rule on time is the 60 s age of an unreadable file, measured as the wall
 * clock minus the file's mtime (file times are wall-clock by nature), and the record's `at` is the
 * wall-clock time of the grant, shown and never judged. berth writes `at` as the seed does and judges
 * by the seed's rule, but measures the age on its monotonic clock from the moment it first saw the
 * file ({@link UnreadableAges}), so a wall-clock step after that neither sweeps a fresh file nor
 * keeps a crashed writer's wreck for the length of the step.
 */
import { createHash, randomBytes, randomUUID } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import { flockSync } from "fs-ext";
import { systemClock, type Clock } from "@berth/shared/clock";
import { identityIsLive, isPidAlive, sameProcess } from "@berth/shared/process-identity";
import { canonicalPath } from "./lock-path.js";
import type { ForeignLockHolder } from "./external-locks.js";

/** The seed's age after which an unreadable lock file counts as a crashed writer's leftover. */
export const UNREADABLE_LOCK_STALE_MS = 60_000;

/** The name of the file berth's sweepers take an exclusive flock(2) on (never a `<hex>.lock` name). */
export const SWEEP_GUARD_NAME = ".berth-sweep.guard";

/** The lock file of `key` (a resolved path, as the seed spells it) in `locksDir`: the seed's `sourceLockPath`. */
export function lockFilePath(locksDir: string, key: string): string {
  return path.join(locksDir, `${lockFileDigest(key)}.lock`);
}

/** A project directory as the seed's processes spell it, and its canonical path. */
export interface SeedProject {
  readonly spelled: string;
  readonly canonical: string;
}

/** The {@link SeedProject} of a directory spelled `spelled` (made absolute against this process's cwd). */
export function seedProject(spelled: string): SeedProject {
  const absolute = path.resolve(spelled);
  // The trailing "." makes the directory's own last name resolved too (lock-path.ts keeps a file's).
  return { spelled: absolute, canonical: canonicalPath(`${absolute}/.`, "project_root") };
}

/**
 * How a seed process whose working directory is `project.spelled` spells the file whose canonical
 * path is `key`: the spelled project and the path below it, for a file under the project; the
 * canonical path itself otherwise, or without a project.
 */
export function seedSpelling(key: string, project: SeedProject | undefined): string {
  if (project === undefined || project.spelled === project.canonical) return key;
  const below = path.posix.relative(project.canonical, key);
  if (below === ".." || below.startsWith("../") || path.posix.isAbsolute(below)) return key;
  return path.posix.join(project.spelled, below);
}

/** The first 24 hex digits of sha256(key): the seed's lock file name without `.lock`. */
export function lockFileDigest(key: string): string {
  return createHash("sha256").update(key).digest("hex").slice(0, 24);
}

/** The content of a lock file: the seed's fields, and berth's identity fields when berth wrote it. */
export interface LockFileRecord {
  owner: string;
  /** A random id of this acquisition: a release deletes the file only while it still holds this. */
  token: string;
  pid: number;
  /** When the lock was taken (ms since the epoch). */
  at: number;
  /** The resolved path of the locked file, as the seed spells it (its digest names the file). */
  file: string;
  /** berth only: the writer's process start time (/proc/PID/stat field 22), against pid reuse. */
  startTime?: number;
  /** berth only: the boot the start time belongs to. */
  bootId?: string;
  /** berth only: the host the pid belongs to. */
  hostname?: string;
}

/** What is at a lock path right now. */
export type LockFileState =
  | { state: "absent" }
  | { state: "readable"; record: Partial<LockFileRecord>; raw: string; mtimeMs: number; identity: FileIdentity }
  | { state: "unreadable"; raw: string; mtimeMs: number; identity: FileIdentity }
  /** There, but this process may not open it: another user's file, made under a umask that keeps others out. */
  | { state: "forbidden"; mtimeMs: number; identity: FileIdentity };

/**
 * Which file a path named when it was read: the same path may name another file later. The inode
 * number alone does not tell: a file created right after another was unlinked often gets the freed
 * inode. Its change time does: set at creation and at every write, in nanoseconds.
 */
export interface FileIdentity {
  dev: bigint;
  ino: bigint;
  ctimeNs: bigint;
}

function sameFile(stat: fs.BigIntStats, identity: FileIdentity): boolean {
  return stat.dev === identity.dev && stat.ino === identity.ino && stat.ctimeNs === identity.ctimeNs;
}

/** Reads the lock file at `lockPath` without judging it. */
export function readLockFile(lockPath: string): LockFileState {
  let fd: number;
  try {
    fd = fs.openSync(lockPath, "r");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return { state: "absent" };
    if (code !== "EACCES" && code !== "EPERM") throw error;
    // Reading needs permission on the file; its times need only the directory's.
    const stat = fs.lstatSync(lockPath, { bigint: true, throwIfNoEntry: false });
    if (stat === undefined) return { state: "absent" };
    return { state: "forbidden", mtimeMs: Number(stat.mtimeMs), identity: { dev: stat.dev, ino: stat.ino, ctimeNs: stat.ctimeNs } };
  }
  try {
    // stat and read through one descriptor: both describe the same file even if the path changes.
    const stat = fs.fstatSync(fd, { bigint: true });
    const mtimeMs = Number(stat.mtimeMs);
    const identity = { dev: stat.dev, ino: stat.ino, ctimeNs: stat.ctimeNs };
    const raw = fs.readFileSync(fd, "utf8");
    let parsed: unknown;
    try {
      parsed = JSON.parse(raw);
    } catch {
      parsed = null;
    }
    // The seed treats any falsy parse result as unreadable and any truthy one as a record.
    if (!parsed) return { state: "unreadable", raw, mtimeMs, identity };
    const record = typeof parsed === "object" ? (parsed as Partial<LockFileRecord>) : {};
    return { state: "readable", record, raw, mtimeMs, identity };
  } finally {
    fs.closeSync(fd);
  }
}

/** Is a lock file's owner still there? The seed's rules, with berth's stricter check for berth's files. */
export interface LockFileJudge {
  /** Liveness of a recorded pid. Default: signal 0, EPERM alive (the seed's rule). */
  isPidAlive?: (pid: number) => boolean;
  /**
   * The age of an unreadable file. Default: the seed's measure, the wall clock's now minus the
   * file's mtime; a {@link SeedLockFiles} measures it with {@link UnreadableAges}.
   */
  unreadableAgeMs?: (seen: { identity: FileIdentity; mtimeMs: number }) => number;
}

/**
 * The ages of unreadable lock files, measured so that the wall clock cannot jump them: the seed's
 * measure (wall-clock now minus mtime, never below 0: an mtime in the future means the clock was
 * set back since) at the first sight of a file, plus the time since on the monotonic clock. A file
 * is known by its dev, inode and change time, so a rewritten or replaced file is a new sighting.
 * A fresh file that a forward step had already aged before berth first saw it is judged as the
 * seed's processes judge it; no reading taken afterwards can tell how old it really is.
 */
export class UnreadableAges {
  private readonly sightings = new Map<string, { ageAtSight: number; sightedAt: number }>();

  constructor(
    private readonly clock: Pick<Clock, "now" | "monotonicNow">,
    /** How many files are remembered (the oldest sighting is forgotten first). */
    private readonly capacity = 4096,
  ) {}

  /** The age of the unreadable file `seen` (ms). */
  ageOf(seen: { identity: FileIdentity; mtimeMs: number }): number {
    const key = `${seen.identity.dev}:${seen.identity.ino}:${seen.identity.ctimeNs}`;
    const monotonicNow = this.clock.monotonicNow();
    let sighting = this.sightings.get(key);
    if (sighting === undefined) {
      sighting = { ageAtSight: Math.max(0, this.clock.now() - seen.mtimeMs), sightedAt: monotonicNow };
      this.sightings.set(key, sighting);
      if (this.sightings.size > this.capacity) this.sightings.delete(this.sightings.keys().next().value!);
    }
    return sighting.ageAtSight + (monotonicNow - sighting.sightedAt);
  }

  /** How many files are remembered (tests). */
  get size(): number {
    return this.sightings.size;
  }
}

/** The verdict on an existing lock file. */
export type LockFileVerdict = "held" | "stale";

/** Judges an existing lock file by the seed's staleness rules. */
export function judgeLockFile(seen: Exclude<LockFileState, { state: "absent" }>, judge: LockFileJudge = {}): LockFileVerdict {
  const ageOf = judge.unreadableAgeMs ?? ((file: { mtimeMs: number }) => systemClock.now() - file.mtimeMs);
  // Who holds it cannot be read, so neither can it be known that they are gone: held for as long as
  // it is there. (The seed, which cannot tell this from a half-written file, sweeps it after 60 s:
  // from a live holder, when that holder is another user's process.)
  if (seen.state === "forbidden") return "held";
  if (seen.state === "unreadable") return ageOf(seen) > UNREADABLE_LOCK_STALE_MS ? "stale" : "held";
  const { pid, startTime, bootId, hostname } = seen.record;
  if (typeof pid !== "number") return "stale";
  if (judge.isPidAlive) return judge.isPidAlive(pid) ? "held" : "stale";
  if (typeof startTime === "number" && typeof hostname === "string") {
    return identityIsLive({ pid, startTime, bootId: typeof bootId === "string" ? bootId : undefined, hostname }) ? "held" : "stale";
  }
  return isPidAlive(pid) ? "held" : "stale";
}

/** The outcome of {@link clearStaleLockFile}. */
export type ClearOutcome = "cleared" | "held" | "absent" | "busy";

/**
 * Removes the lock file at `lockPath` if, judged under the sweep guard, it is stale.
 *
 * Why this cannot remove a live holder's file (the seed's sweep can): every berth sweeper takes an
 * exclusive flock(2) on one guard file in the locks directory, then reads and judges the file, and
 * unlinks it only if it is stale — all inside the flock. Once a file is stale, nothing but a sweeper
 * removes it: its owner is dead (a release only ever deletes its own, live, file), and an unreadable
 * file older than 60 s is by the seed's own rule a crashed writer's. So among berth processes, between
 * our read and our unlink the path still names the very file we judged: no other sweeper can run
 * (flock), and no one else removes a stale file. A new holder can appear only after our unlink, by an
 * exclusive create, which exactly one taker wins. The kernel drops a flock when its holder dies, so a
 * sweeper that crashes mid-sweep cannot wedge the others.
 *
 * A process using the seed's own sweep ignores the flock: it may sweep the same stale file by path
 * and create its own while we judge. So right before the unlink the path is checked to still name the
 * file that was read ({@link FileIdentity}); a replaced file is left alone and reported "held", to be
 * judged afresh. That leaves only the span of one system call, where the seed's sweep leaves the
 * whole of its read, parse and pid check; no unlink-if-this-inode call exists to close it entirely.
 *
 * Why not "rename the stale file aside, re-read it, put it back if it was not the stale one": between
 * the rename and the put-back the lock path is empty, a third taker creates its file there, and the
 * put-back fails — while the holder whose file was moved aside still believes it holds. Two holders.
 *
 * Processes using the seed's own sweep are outside this guarantee: they unlink by path without the
 * flock, so one that judged a dead file stale just before berth replaced it deletes berth's file.
 * That is the seed's fault and berth cannot reach into their code; berth's releases notice it
 * (the token no longer matches) and log it.
 *
 * Returns "busy" without waiting when another sweeper holds the guard: a blocking flock would stall
 * the event loop behind a stopped process. The caller tries again on the next change or re-check.
 */
export function clearStaleLockFile(lockPath: string, judge: LockFileJudge = {}): ClearOutcome {
  const guardPath = path.join(path.dirname(lockPath), SWEEP_GUARD_NAME);
  const fd = fs.openSync(guardPath, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
  try {
    try {
      flockSync(fd, "exnb");
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "EAGAIN" || code === "EWOULDBLOCK") return "busy";
      throw error;
    }
    const seen = readLockFile(lockPath);
    if (seen.state === "absent") return "absent";
    if (judgeLockFile(seen, judge) === "held") return "held";
    const current = fs.lstatSync(lockPath, { bigint: true, throwIfNoEntry: false });
    if (current === undefined) return "absent";
    if (!sameFile(current, seen.identity)) return "held";
    try {
      fs.unlinkSync(lockPath);
    } catch (error) {
      // Nobody else may remove a stale file (see above), so ENOENT here means a seed process swept it.
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return "absent";
      throw error;
    }
    return "cleared";
  } finally {
    // Closing the only descriptor of the guard releases the flock.
    fs.closeSync(fd);
  }
}

/** The holder a lock file names, as the outside-lock seam reports it. */
export function holderOf(lockPath: string, seen: Exclude<LockFileState, { state: "absent" }>): ForeignLockHolder {
  if (seen.state === "unreadable" || seen.state === "forbidden") return { lockFile: lockPath, since: seen.mtimeMs, readable: false };
  const { owner, pid, at, token } = seen.record;
  const holder: ForeignLockHolder = { lockFile: lockPath, since: typeof at === "number" ? at : seen.mtimeMs, readable: true };
  if (typeof owner === "string") holder.owner = owner;
  if (typeof pid === "number") holder.pid = pid;
  if (typeof token === "string") holder.token = token;
  return holder;
}

/** The outcome of {@link tryCreateLockFile}. */
export type CreateOutcome =
  | { created: true; lockFile: string; token: string }
  | {
      created: false;
      lockFile: string;
      /** "held": a live holder; "busy": another berth sweeper is clearing a stale file; "contended": it changed hands repeatedly. */
      reason: "held" | "busy" | "contended";
      /** The holder seen last, when there was one. */
      holder?: ForeignLockHolder;
    };

/** How many create/clear rounds one attempt makes before answering "contended". */
const CREATE_ATTEMPTS = 4;

/**
 * Where the full content of a new lock file is prepared before it is linked to the lock path: a file
 * nobody else can see, since `link(2)` publishes it whole or not at all.
 */
export interface LockFileSource {
  /** Returns the path of a private file holding exactly `content`. */
  prepare(content: string): string;
  /** Called once for each prepared file: `linked` tells whether it became the lock file. */
  done(prepared: string, linked: boolean): void;
}

/**
 * The mode of berth's lock files in its own state directory, where no seed process looks: private,
 * like every other file of the state.
 */
export const PRIVATE_LOCK_FILE_MODE = 0o600;

/**
 * The mode of berth's lock files in a project's live directory: 0644 like the seed's own files, as
 * a seed process of another user that could not read berth's file would judge it unreadable and,
 * after 60 s, sweep it. It holds nothing secret.
 */
export const SHARED_LOCK_FILE_MODE = 0o644;

/** A fresh temp file per attempt, removed afterwards (the lock file keeps the inode). */
export function tempFileSource(lockPath: string, mode = PRIVATE_LOCK_FILE_MODE): LockFileSource {
  return {
    prepare(content) {
      const temp = path.join(path.dirname(lockPath), `.${path.basename(lockPath)}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
      fs.writeFileSync(temp, content, { flag: "wx", mode });
      return temp;
    },
    done(prepared) {
      fs.rmSync(prepared, { force: true });
    },
  };
}

/**
 * Tries once to take the lock file at `lockPath` with `record` (its `token` identifies this claim):
 * a stale file is cleared race-free first ({@link clearStaleLockFile}); a live one is reported.
 * Synchronous: a handful of system calls, no waiting. `source` prepares the content to link
 * (default: a temp file).
 */
export function tryCreateLockFile(
  lockPath: string,
  record: LockFileRecord,
  judge: LockFileJudge = {},
  source: LockFileSource = tempFileSource(lockPath),
): CreateOutcome {
  const prepared = source.prepare(`${JSON.stringify(record)}\n`);
  let linked = false;
  let holder: ForeignLockHolder | undefined;
  try {
    for (let attempt = 0; attempt < CREATE_ATTEMPTS; attempt++) {
      try {
        fs.linkSync(prepared, lockPath);
        linked = true;
        return { created: true, lockFile: lockPath, token: record.token };
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      }
      const seen = readLockFile(lockPath);
      if (seen.state === "absent") continue; // released between our link and our read
      holder = holderOf(lockPath, seen);
      if (judgeLockFile(seen, judge) === "held") return { created: false, lockFile: lockPath, reason: "held", holder };
      if (clearStaleLockFile(lockPath, judge) === "busy") return { created: false, lockFile: lockPath, reason: "busy", holder };
      // "cleared", "absent" (try the link again) or "held" (replaced meanwhile: judged afresh next round)
    }
    return holder ? { created: false, lockFile: lockPath, reason: "contended", holder } : { created: false, lockFile: lockPath, reason: "contended" };
  } finally {
    source.done(prepared, linked);
  }
}

/**
 * Deletes the lock file at `lockPath` only while it still holds `token`. Returns false (and leaves
 * the path alone) when it is gone or holds something else: the file was removed or replaced by a
 * process using the seed's by-path sweep, and deleting what is there now would end someone else's hold.
 */
export function removeOwnLockFile(lockPath: string, token: string): boolean {
  const seen = readLockFile(lockPath);
  if (seen.state !== "readable" || seen.record.token !== token) return false;
  // Between that read and this unlink the file cannot change: it is ours and we are alive, so no
  // sweeper (berth's or the seed's) judges it stale.
  try {
    fs.unlinkSync(lockPath);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
    throw error;
  }
}

/** The name prefix of slot files (see {@link SeedLockFiles}): `.berth-slot.<pid>.<start time>.<instance>.<n>`. */
const SLOT_NAME = /^\.berth-slot\.(\d+)\.(\d+|x)\.[0-9a-f]+\.\d+$/;

/**
 * Removes what crashed berth processes left in `locksDir`: temp files and slot files whose process
 * is gone (a slot's recorded start time must match too, so a recycled pid does not keep them).
 */
export function removeDeadTempFiles(locksDir: string): number {
  let removed = 0;
  let names: string[];
  try {
    names = fs.readdirSync(locksDir);
  } catch {
    return 0;
  }
  for (const name of names) {
    const temp = /^\.[0-9a-f]{24}\.lock\.(\d+)\.[0-9a-f]{12}\.tmp$/.exec(name);
    const slot = SLOT_NAME.exec(name);
    if (temp && isPidAlive(Number(temp[1]))) continue;
    if (slot && sameProcess(Number(slot[1]), slot[2] === "x" ? undefined : Number(slot[2]))) continue;
    if (!temp && !slot) continue;
    fs.rmSync(path.join(locksDir, name), { force: true });
    removed++;
  }
  return removed;
}

/** Creates a fresh record for a berth-held lock file. */
export function newLockFileRecord(fields: {
  owner: string;
  file: string;
  at: number;
  pid: number;
  startTime?: number | undefined;
  bootId?: string | undefined;
  hostname?: string | undefined;
}): LockFileRecord {
  const record: LockFileRecord = { owner: fields.owner, token: randomUUID(), pid: fields.pid, at: fields.at, file: fields.file };
  if (fields.startTime !== undefined) record.startTime = fields.startTime;
  if (fields.bootId !== undefined) record.bootId = fields.bootId;
  if (fields.hostname !== undefined) record.hostname = fields.hostname;
  return record;
}
