/**
 * File helpers for state that must survive a crash: a reader (or the next process after a kill)
 * sees either the old file or the whole new one, never a prefix of it.
 */
import { randomBytes } from "node:crypto";
import * as fs from "node:fs";
import * as fsp from "node:fs/promises";
import * as path from "node:path";

/** Options for the atomic writers. */
export interface AtomicWriteOptions {
  /** Permission bits of the new file (before umask). Defaults to 0600: berth's state is private. */
  mode?: number;
}

const PRIVATE_FILE_MODE = 0o600;
const PRIVATE_DIR_MODE = 0o700;

/**
 * A temp name beside the target: the same directory keeps rename(2) on one filesystem (so it is
 * atomic), and pid + random bytes keep two writers of the same target from sharing a temp file.
 */
function tempPathFor(target: string): string {
  const dir = path.dirname(target);
  const base = path.basename(target);
  return path.join(dir, `.${base}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
}

function toBytes(data: string | Uint8Array): Uint8Array {
  return typeof data === "string" ? Buffer.from(data, "utf8") : data;
}

/** Writes all of `bytes` at the start of `fd`: write(2) may write fewer bytes than asked (signals, quotas). */
function writeAllSync(fd: number, bytes: Uint8Array): void {
  let offset = 0;
  while (offset < bytes.length) offset += fs.writeSync(fd, bytes, offset, bytes.length - offset, offset);
}

/**
 * Replaces `target` with `data` so that the final name never holds a partial file: write a temp file
 * beside it, fsync it, rename it over the target, then fsync the directory so the rename itself is
 * durable, and confirm the file system still takes writes ({@link confirmStillWritable}). On a
 * failure before the rename the temp file is removed and the target is untouched.
 */
export function writeFileAtomicSync(target: string, data: string | Uint8Array, options: AtomicWriteOptions = {}): void {
  const temp = tempPathFor(target);
  const bytes = toBytes(data);
  const fd = fs.openSync(temp, "wx", options.mode ?? PRIVATE_FILE_MODE);
  try {
    try {
      writeAllSync(fd, bytes);
      fs.fsyncSync(fd);
      fs.renameSync(temp, target);
    } catch (error) {
      fs.rmSync(temp, { force: true });
      throw error;
    }
    fsyncDirectory(path.dirname(target));
    // The descriptor is the target's now: the rename moved its name, not the file.
    confirmStillWritable(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/** The asynchronous twin of {@link writeFileAtomicSync}, with the same guarantees. */
export async function writeFileAtomic(target: string, data: string | Uint8Array, options: AtomicWriteOptions = {}): Promise<void> {
  const temp = tempPathFor(target);
  const bytes = toBytes(data);
  const handle = await fsp.open(temp, "wx", options.mode ?? PRIVATE_FILE_MODE);
  try {
    try {
      let offset = 0;
      while (offset < bytes.length) {
        const { bytesWritten } = await handle.write(bytes, offset, bytes.length - offset, offset);
        offset += bytesWritten;
      }
      await handle.sync();
      await fsp.rename(temp, target);
    } catch (error) {
      await fsp.rm(temp, { force: true });
      throw error;
    }
    await fsyncDirectoryAsync(path.dirname(target));
    confirmStillWritable(handle.fd);
  } finally {
    await handle.close();
  }
}

const NOTHING = new Uint8Array(0);

/**
 * Throws unless the file system of `fd` (open for writing) still takes writes; called after the last
 * fsync(2) or fdatasync(2) that an acknowledgement rests on. ext4 (seen on Linux 6.18) can answer a
 * sync that raced an error remounting it read-only with success, although the journal that held the
 * bytes was aborted: they are gone at the next mount. Such a sync mostly returns once the file
 * system refuses every write (EROFS or EIO, until it is mounted again), so writing nothing fails
 * then; one that returns in the instant between the journal's abort and that refusal still passes.
 * On a healthy file system writing nothing changes nothing, not even the file's mtime, and costs
 * about a microsecond.
 */
export function confirmStillWritable(fd: number): void {
  // fs.writeSync, not a FileHandle: the promise API answers a write of nothing without a write(2).
  fs.writeSync(fd, NOTHING, 0, 0, null);
}

/**
 * Makes the directory entries of `dir` durable (a create, rename or unlink inside it). Without this a
 * crash right after a rename can bring back the old name on some filesystems.
 */
export function fsyncDirectory(dir: string): void {
  const fd = fs.openSync(dir, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

async function fsyncDirectoryAsync(dir: string): Promise<void> {
  const handle = await fsp.open(dir, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** `fs.statSync`, but null when the path (or a directory on the way to it) does not exist. */
export function statOrNull(target: string): fs.Stats | null {
  try {
    return fs.statSync(target);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") return null;
    throw error;
  }
}

/**
 * `mkdir -p` with mode 0700 for the directories it creates: state directories hold journals and
 * tokens that only their owner should read. An existing directory's mode is left as its owner set it.
 */
export function ensurePrivateDir(dir: string): void {
  fs.mkdirSync(dir, { recursive: true, mode: PRIVATE_DIR_MODE });
}
