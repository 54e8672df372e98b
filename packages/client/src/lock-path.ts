/**
 * Lock paths as the caller spells them. The service refuses a relative path: only the client knows
 * the directory it is relative to, so every call that names a lock file (a lock, an inspection, an
 * append's fence) sends it through here, resolved against the caller's working directory.
 */
import { joinLockPath } from "./lock-path-join.js";

/**
 * `file` made absolute against this process's working directory. Joined, not normalised: the
 * service resolves `..` as the kernel does (after a symlinked directory it is the target's parent),
 * which a lexical normalisation here would undo. The service answers with the canonical path.
 */
export function absoluteLockPath(file: string, cwd: string = process.cwd()): string {
  return joinLockPath(file, cwd);
}
