/**
 * The one name of a lock's file, however a client spells it.
 *
 * A lock is keyed by a path, so two spellings of one file must give one key, or two clients both
 * hold "the" lock of one file. A client's relative path means something only in its own working
 * directory, which the service cannot know: relative paths are refused, and each client resolves
 * its own before sending. What arrives absolute is made canonical: the directories that exist are
 * resolved as the kernel resolves them (symlinks followed, `..` taken physically), and the names
 * below the deepest existing one are appended as given, with `.` and `..` resolved lexically. The
 * last name is never followed, even when it exists: the lock names a name in a directory (a file
 * that is not there yet, or one an editor replaces by renaming over it).
 *
 * The kernel's own file systems are not lockable: under `/proc`, `/sys` and `/dev` a name stands
 * for a process or a device, and means something else to each caller (`/proc/self` resolves to
 * the service's own pid, not the client's), so a lock there protects nothing a client meant.
 * Nor is `/` itself, which is no file. A path is refused when it resolves there, or when its last
 * name is a symlink that leads there: the key keeps the name, but what a holder writes through it
 * lands in the kernel's file system all the same.
 */
import * as fs from "node:fs";
import * as path from "node:path";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { checkPathInput, MAX_PATH_BYTES } from "@berth/shared/safe-id";
import { LOCK_RETRY_AFTER_MS } from "./lock-input.js";

/** What a client is told to do with a relative path. */
const SEND_ABSOLUTE = "must be an absolute path; resolve it against your working directory before sending";

/** The kernel's file systems, whose names are processes and devices rather than files. */
const KERNEL_FILE_SYSTEMS = ["/proc", "/sys", "/dev"] as const;

/**
 * Checks a lock path and returns its canonical form, the lock's key: {@link canonicalPath}, then
 * refused with `invalid_argument` naming `field` when it is `/` or resolves (its last name's
 * symlink included) into `/proc`, `/sys` or `/dev`.
 *
 * Cost: {@link canonicalPath}'s, plus one lstat of the last name.
 */
export function canonicalLockPath(file: unknown, field = "file"): string {
  const canonical = canonicalPath(file, field);
  const shown = JSON.stringify((file as string).slice(0, 200));
  if (canonical === "/") throw invalidArgument(field, `names the root directory, not a file: lock a file of your project, got ${shown}`);
  const kernel = kernelFileSystemOf(canonical) ?? kernelFileSystemOf(lastNameTarget(canonical, file as string, field));
  if (kernel !== undefined) {
    throw invalidArgument(
      field,
      `resolves into ${kernel}, the kernel's file system of processes and devices, which is not lockable: lock a file of your project, got ${shown}`,
    );
  }
  return canonical;
}

/** The kernel file system `canonical` lies in (or is), if any. */
function kernelFileSystemOf(canonical: string | undefined): string | undefined {
  if (canonical === undefined) return undefined;
  return KERNEL_FILE_SYSTEMS.find((root) => canonical === root || canonical.startsWith(`${root}/`));
}

/** Links followed at most, as the kernel's own limit on a path (SYMLOOP_MAX on Linux). */
const MAX_LINKS_FOLLOWED = 40;

/**
 * Where the last name of `canonical` leads when it is a symlink: its real path, or, for a link that
 * dangles, the canonical path of what it names (a link to a `/dev` name not made yet still leads
 * there). Undefined when it is no symlink.
 */
function lastNameTarget(canonical: string, input: string, field: string): string | undefined {
  let current = canonical;
  for (let followed = 0; followed < MAX_LINKS_FOLLOWED; followed++) {
    if (lstatOrMissing(current, input, field)?.isSymbolicLink() !== true) return followed === 0 ? undefined : current;
    const real = realpathOrMissing(current, input, field);
    if (real !== undefined) return real;
    const target = readlinkOrMissing(current, input, field);
    if (target === undefined) return current;
    current = canonicalPath(path.posix.resolve(path.posix.dirname(current), target), field);
  }
  throw invalidArgument(field, `passes through a loop of symbolic links, got ${JSON.stringify(input.slice(0, 200))}`);
}

/**
 * Checks a path and returns its canonical form. Throws `invalid_argument` naming `field` for a
 * path that is empty, relative, has a NUL byte, is longer than Linux's limits (4096 bytes, 255 per
 * name), loops through symlinks or resolves to more than 4096 bytes; `unavailable` when the
 * filesystem cannot answer (EIO, out of descriptors).
 *
 * Cost: one realpath(3) of the parent directory when it exists (the common case); otherwise one
 * lstat per name down to the first missing one, plus a realpath per symlink met.
 */
export function canonicalPath(file: unknown, field = "file"): string {
  const input = checkPathInput(file, field);
  if (!path.posix.isAbsolute(input)) throw invalidArgument(field, `${SEND_ABSOLUTE}, got ${JSON.stringify(input.slice(0, 200))}`);
  const names = input.split("/").filter((name) => name !== "");
  const last = names.at(-1);
  // "/a/b/.." names the directory /a itself: nothing is left unresolved.
  const leaf = last === undefined || last === "." || last === ".." ? undefined : last;
  const dir = canonicalDirectory(leaf === undefined ? names : names.slice(0, -1), input, field);
  const canonical = leaf === undefined ? dir : path.posix.join(dir, leaf);
  const bytes = Buffer.byteLength(canonical, "utf8");
  if (bytes > MAX_PATH_BYTES) throw invalidArgument(field, `resolves to ${bytes} bytes (${canonical.slice(0, 60)}…), more than ${MAX_PATH_BYTES}`);
  return canonical;
}

/** The canonical directory `/names…`: the real path of what exists, then the missing names lexically. */
function canonicalDirectory(names: readonly string[], input: string, field: string): string {
  const whole = `/${names.join("/")}`;
  const real = realpathOrMissing(whole, input, field);
  if (real !== undefined) return real;
  // Some name is missing (or not a directory, or not searchable): walk down to it. `current` is a
  // real path while `missing` is 0, so its lexical parent is its physical one.
  let current = "/";
  let missing = 0;
  for (const name of names) {
    if (name === ".") continue;
    if (name === "..") {
      current = path.posix.dirname(current);
      if (missing > 0) missing--;
      continue;
    }
    const next = path.posix.join(current, name);
    if (missing > 0) {
      current = next;
      missing++;
      continue;
    }
    const stat = lstatOrMissing(next, input, field);
    if (stat === undefined) {
      current = next;
      missing = 1;
    } else if (stat.isSymbolicLink()) {
      const target = realpathOrMissing(next, input, field);
      // A dangling link: nothing exists below it, so its name is kept as given.
      current = target ?? next;
      if (target === undefined) missing = 1;
    } else {
      current = next;
    }
  }
  return current;
}

/** Errors that mean "this name does not lead to an existing directory": the rest is taken as given. */
const MISSING = new Set(["ENOENT", "ENOTDIR", "EACCES"]);

function realpathOrMissing(target: string, input: string, field: string): string | undefined {
  try {
    return fs.realpathSync.native(target);
  } catch (error) {
    return missingOrThrow(error, input, field);
  }
}

function readlinkOrMissing(target: string, input: string, field: string): string | undefined {
  try {
    return fs.readlinkSync(target);
  } catch (error) {
    return missingOrThrow(error, input, field);
  }
}

function lstatOrMissing(target: string, input: string, field: string): fs.Stats | undefined {
  try {
    // A missing name is the common case (a lock file not made yet): no exception built for it.
    return fs.lstatSync(target, { throwIfNoEntry: false });
  } catch (error) {
    return missingOrThrow(error, input, field);
  }
}

function missingOrThrow(error: unknown, input: string, field: string): undefined {
  const code = (error as NodeJS.ErrnoException).code ?? "";
  if (MISSING.has(code)) return undefined;
  const shown = JSON.stringify(input.slice(0, 200));
  if (code === "ELOOP") throw invalidArgument(field, `passes through a loop of symbolic links, got ${shown}`);
  if (code === "ENAMETOOLONG") throw invalidArgument(field, `resolves through symbolic links to a path longer than ${MAX_PATH_BYTES} bytes, got ${shown}`);
  throw new BerthError(
    "unavailable",
    `${field}: cannot resolve ${shown}: ${(error as Error).message}; try again`,
    { field },
    { reason: "STORAGE_UNAVAILABLE", retryAfterMs: LOCK_RETRY_AFTER_MS },
  );
}
