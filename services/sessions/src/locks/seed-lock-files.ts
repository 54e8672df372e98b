/**
 * The seed's lock files as the lock table's outside locks (external-locks.ts): a grant creates the
 * lock file, a release removes it, and a file a seed process holds blocks berth's queue until it
 * goes away. The protocol on one file is lock-file-protocol.ts; here are what a long-running
 * service adds to it, a pool of reusable slot files and a watch of the locks directory.
 */
import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as path from "node:path";
import { systemClock, type Clock, type TimerHandle } from "@berth/shared/clock";
import { ensurePrivateDir } from "@berth/shared/files";
import { selfIdentity } from "@berth/shared/process-identity";
import type { ExternalClaim, ExternalLockHandle, ExternalLocks, ForeignLockHolder } from "./external-locks.js";
import type { LockLogger } from "./lock-table.js";
import {
  holderOf,
  judgeLockFile,
  lockFilePath,
  newLockFileRecord,
  PRIVATE_LOCK_FILE_MODE,
  readLockFile,
  removeDeadTempFiles,
  removeOwnLockFile,
  seedProject,
  seedSpelling,
  SHARED_LOCK_FILE_MODE,
  tryCreateLockFile,
  UnreadableAges,
  type LockFileJudge,
  type LockFileSource,
  type SeedProject,
} from "./lock-file-protocol.js";

/** Options of {@link SeedLockFiles}. */
export interface SeedLockFilesOptions {
  /** `<liveDir>/locks`: created (0700) when missing. */
  locksDir: string;
  /**
   * The project directory as its seed processes spell their working directory, when that is not
   * its real path (they were given a `cwd` through a symlink): a file under it gets the lock file a
   * seed process there names, from this spelling and the path below the project. Absent, lock
   * files are named after canonical paths, as a seed process working in the project names them.
   */
  projectRoot?: string;
  /** The pid written into berth's lock files; default this process's. */
  pid?: number;
  /** Drives the fallback re-check timer. */
  clock: Clock;
  logger?: LockLogger;
  /** The period of the fallback re-check while a seed-held file has berth waiters. Default 250 ms. */
  recheckMs?: number;
  /** Overrides of the staleness judge (tests); unreadable files' ages are measured on `clock` unless it says otherwise. */
  judge?: LockFileJudge;
  /**
   * The mode of the lock files (and slots) berth creates: {@link PRIVATE_LOCK_FILE_MODE} (the
   * default) in berth's own state directory, {@link SHARED_LOCK_FILE_MODE} in a project's live one.
   */
  fileMode?: number;
}

/** A private inode of this service in the locks directory, linked to a lock path while it holds that lock. */
interface Slot {
  path: string;
  ino: number;
  dev: number;
}

/** Free slots kept for reuse; more are deleted on release. */
const MAX_FREE_SLOTS = 64;

/**
 * The seed's lock files as the lock table's {@link ExternalLocks}: a grant creates the file, a
 * release removes it (only while it is still ours), and a file held by a seed process blocks
 * berth's queue until it goes away.
 *
 * Creating a file (a new inode) can cost milliseconds on some filesystems (2 ms measured on this
 * project's ext4 machines), while linking, unlinking and rewriting an existing file cost tens of
 * microseconds. So berth does not make a temp file per grant: it keeps a pool of *slot* files of
 * its own in the locks directory. A grant rewrites a free slot — linked nowhere else, so the write
 * is private — and links it to the lock path (published whole, as with a temp file). A release
 * checks that the lock path still names the slot's inode (exact: the slot keeps the inode alive,
 * so no other file can have its number), unlinks that name, and the slot is free again.
 *
 * berth is never told when a seed process releases, so for files with berth waiters it watches the
 * locks directory (`fs.watch`, inotify on Linux) and re-checks on every change of a watched name.
 * The watch alone is not enough, which is why a slow re-check (every `recheckMs`) runs as well, and
 * only while some seed-held file has berth waiters:
 * - a seed holder that is killed leaves its file in place: no file event ever says "free", only
 *   asking whether its pid is alive does;
 * - an unreadable file turns stale by age alone (60 s), again without any event;
 * - inotify can drop events (queue overflow) and is absent on some network and container mounts.
 */
export class SeedLockFiles implements ExternalLocks {
  /** The directory of the lock files. */
  readonly locksDir: string;
  private readonly pid: number;
  private readonly identity: { startTime?: number | undefined; bootId?: string | undefined; hostname?: string | undefined };
  private readonly clock: Clock;
  private readonly logger: LockLogger | undefined;
  private readonly recheckMs: number;
  private readonly judge: LockFileJudge;
  private readonly fileMode: number;
  private readonly project: SeedProject | undefined;
  /** Lock file name → callbacks of the keys watched under it. */
  private readonly watched = new Map<string, Set<() => void>>();
  private watcher: fs.FSWatcher | undefined;
  private recheckTimer: TimerHandle | undefined;
  private closed = false;
  private readonly slotPrefix: string;
  private slotCount = 0;
  private readonly freeSlots: Slot[] = [];
  /** Lock file token → the slot linked at its lock path. */
  private readonly slotsInUse = new Map<string, Slot>();

  constructor(options: SeedLockFilesOptions) {
    this.locksDir = options.locksDir;
    this.pid = options.pid ?? process.pid;
    this.clock = options.clock;
    this.logger = options.logger;
    this.recheckMs = options.recheckMs ?? 250;
    const ages = new UnreadableAges(options.clock);
    this.judge = { unreadableAgeMs: (seen) => ages.ageOf(seen), ...options.judge };
    this.fileMode = options.fileMode ?? PRIVATE_LOCK_FILE_MODE;
    this.project = options.projectRoot === undefined ? undefined : seedProject(options.projectRoot);
    // The start time only describes this process; a pid given for another process goes bare.
    const self = selfIdentity();
    this.identity = this.pid === self.pid ? { startTime: self.startTime, bootId: self.bootId, hostname: self.hostname } : {};
    this.slotPrefix = `.berth-slot.${self.pid}.${self.startTime ?? "x"}.${randomBytes(4).toString("hex")}.`;
    ensurePrivateDir(this.locksDir);
    removeDeadTempFiles(this.locksDir);
  }

  /** The lock file of `key` (a canonical path): the one a seed process of the project names. */
  pathFor(key: string): string {
    return lockFilePath(this.locksDir, seedSpelling(key, this.project));
  }

  claim(key: string, holder: { owner: string; at: number }): ExternalClaim {
    const record = newLockFileRecord({ owner: holder.owner, file: seedSpelling(key, this.project), at: holder.at, pid: this.pid, ...this.identity });
    let slot: Slot | undefined;
    const source: LockFileSource = {
      prepare: (content) => {
        slot = this.takeSlot();
        try {
          this.writeSlot(slot, content);
        } catch (error) {
          this.dropSlot(slot);
          throw error;
        }
        return slot.path;
      },
      done: (_prepared, linked) => {
        if (linked) this.slotsInUse.set(record.token, slot!);
        else this.giveBack(slot!);
      },
    };
    const outcome = tryCreateLockFile(this.pathFor(key), record, this.judge, source);
    if (outcome.created) return { ok: true, handle: { key, lockFile: outcome.lockFile, token: outcome.token, pid: this.pid } };
    return outcome.holder ? { ok: false, holder: outcome.holder } : { ok: false };
  }

  release(handle: ExternalLockHandle): void {
    const slot = this.slotsInUse.get(handle.token);
    let removed: boolean;
    if (!slot) {
      removed = removeOwnLockFile(handle.lockFile, handle.token);
    } else {
      this.slotsInUse.delete(handle.token);
      removed = this.unlinkIfSlot(handle.lockFile, slot);
      // Whatever happened at the lock path, the slot's inode is linked nowhere else now: reusable.
      this.giveBack(slot);
    }
    if (removed) return;
    this.logger?.warn(
      { file: handle.key, lockFile: handle.lockFile },
      "berth's lock file was already removed or replaced by another process (a seed process's sweep?); left what is there alone",
    );
  }

  peek(key: string): ForeignLockHolder | undefined {
    const lockFile = this.pathFor(key);
    const seen = readLockFile(lockFile);
    if (seen.state === "absent" || judgeLockFile(seen, this.judge) === "stale") return undefined;
    return holderOf(lockFile, seen);
  }

  watch(key: string, onMaybeFree: () => void): () => void {
    if (this.closed) return () => {};
    const name = path.basename(this.pathFor(key));
    let callbacks = this.watched.get(name);
    if (!callbacks) {
      callbacks = new Set();
      this.watched.set(name, callbacks);
    }
    // Wrapped so the same function may be registered for two keys and removed separately.
    const callback = () => onMaybeFree();
    callbacks.add(callback);
    this.startWatching();
    return () => {
      const set = this.watched.get(name);
      if (!set) return;
      set.delete(callback);
      if (set.size === 0) this.watched.delete(name);
      if (this.watched.size === 0) this.stopWatching();
    };
  }

  /** Stops watching and deletes the slot files. Lock files are the table's to release; this removes none. */
  close(): void {
    this.closed = true;
    this.watched.clear();
    this.stopWatching();
    for (const slot of [...this.freeSlots, ...this.slotsInUse.values()]) fs.rmSync(slot.path, { force: true });
    this.freeSlots.length = 0;
    this.slotsInUse.clear();
  }

  private takeSlot(): Slot {
    const reused = this.freeSlots.pop();
    if (reused) return reused;
    const slotPath = path.join(this.locksDir, `${this.slotPrefix}${this.slotCount++}`);
    fs.writeFileSync(slotPath, "", { flag: "wx", mode: this.fileMode });
    const stat = fs.statSync(slotPath);
    return { path: slotPath, ino: stat.ino, dev: stat.dev };
  }

  /**
   * Rewrites a free slot with `content`. Private: a free slot is linked at no lock path. Written in
   * place and then cut to length, never opened with O_TRUNC: truncating to zero frees the data
   * block, which costs ~300 µs on a filesystem mounted with `discard` (this machine's ext4), against
   * ~20 µs for the rewrite.
   */
  private writeSlot(slot: Slot, content: string): void {
    let fd: number;
    try {
      fd = fs.openSync(slot.path, "r+");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      // Someone deleted the slot: make it again (its inode is re-read below).
      fd = fs.openSync(slot.path, "wx", this.fileMode);
    }
    try {
      const bytes = Buffer.from(content, "utf8");
      let offset = 0;
      while (offset < bytes.length) offset += fs.writeSync(fd, bytes, offset, bytes.length - offset, offset);
      fs.ftruncateSync(fd, bytes.length);
      const stat = fs.fstatSync(fd);
      slot.ino = stat.ino;
      slot.dev = stat.dev;
    } finally {
      fs.closeSync(fd);
    }
  }

  /**
   * Unlinks `lockFile` if it still names `slot`'s inode. Between the lstat and the unlink the path
   * cannot change: it names our live file, which no sweeper (berth's or the seed's) judges stale.
   */
  private unlinkIfSlot(lockFile: string, slot: Slot): boolean {
    let stat: fs.Stats;
    try {
      stat = fs.lstatSync(lockFile);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
      throw error;
    }
    if (stat.ino !== slot.ino || stat.dev !== slot.dev) return false;
    try {
      fs.unlinkSync(lockFile);
      return true;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
      throw error;
    }
  }

  private giveBack(slot: Slot): void {
    if (this.closed || this.freeSlots.length >= MAX_FREE_SLOTS) this.dropSlot(slot);
    else this.freeSlots.push(slot);
  }

  private dropSlot(slot: Slot): void {
    fs.rmSync(slot.path, { force: true });
  }

  private notify(name: string | null): void {
    const targets = name === null ? [...this.watched.values()] : [this.watched.get(name)];
    for (const set of targets) {
      if (!set) continue;
      for (const callback of [...set]) {
        try {
          callback();
        } catch (error) {
          this.logger?.error({ err: error }, "lock file watcher callback failed");
        }
      }
    }
  }

  private startWatching(): void {
    if (!this.watcher) {
      try {
        const watcher = fs.watch(this.locksDir, { persistent: false }, (_event, filename) => {
          const name = filename === null ? null : String(filename);
          // berth's own temp files and the sweep guard change all the time; only lock names matter.
          if (name !== null && !this.watched.has(name)) return;
          this.notify(name);
        });
        watcher.on("error", (error) => {
          this.logger?.warn({ err: error, locksDir: this.locksDir }, "watching the lock files failed; falling back to periodic re-checks");
          watcher.close();
          if (this.watcher === watcher) this.watcher = undefined;
        });
        this.watcher = watcher;
      } catch (error) {
        this.logger?.warn({ err: error, locksDir: this.locksDir }, "cannot watch the lock files; falling back to periodic re-checks");
      }
    }
    if (this.recheckTimer === undefined) this.scheduleRecheck();
  }

  private scheduleRecheck(): void {
    this.recheckTimer = this.clock.setTimeout(() => {
      this.recheckTimer = undefined;
      if (this.watched.size === 0) return;
      this.notify(null);
      if (this.watched.size > 0 && this.recheckTimer === undefined) this.scheduleRecheck();
    }, this.recheckMs);
  }

  private stopWatching(): void {
    this.watcher?.close();
    this.watcher = undefined;
    if (this.recheckTimer !== undefined) this.clock.clearTimeout(this.recheckTimer);
    this.recheckTimer = undefined;
  }
}
