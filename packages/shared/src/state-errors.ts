/**
 * What a failed write to the state directory tells the client: the machine's own faults (a full
 * disk, a read-only remount, no descriptor left) are refusals a person can act on, never INTERNAL.
 */
import { BerthError } from "./errors.js";

/** How soon a call refused for want of descriptors may be tried again. */
export const TOO_MANY_OPEN_FILES_RETRY_MS = 1000;
/** The reason of a refusal for want of a file descriptor. */
export const TOO_MANY_OPEN_FILES = "TOO_MANY_OPEN_FILES";

/** The errno code of an error, if it has one. */
export function errnoCode(error: unknown): string | undefined {
  const code = (error as NodeJS.ErrnoException | undefined)?.code;
  return typeof code === "string" ? code : undefined;
}

/** True for the errors of a file system with no space left (or a quota reached). */
export function isDiskFull(error: unknown): boolean {
  const code = errnoCode(error);
  return code === "ENOSPC" || code === "EDQUOT";
}

/**
 * The refusal for `error`, thrown while `what` (e.g. "the journal of session s1 was not written")
 * wrote under the state directory `stateDir`; undefined when the error is not one of the machine's
 * own faults:
 * - no space left (ENOSPC, EDQUOT): RESOURCE_EXHAUSTED, reason DISK_FULL;
 * - a read-only or unwritable state directory (EROFS, EACCES, EPERM): UNAVAILABLE, reason STATE_READ_ONLY;
 * - no descriptor left (EMFILE, ENFILE): RESOURCE_EXHAUSTED, reason TOO_MANY_OPEN_FILES, retry in a second.
 */
export function stateWriteError(error: unknown, what: string, stateDir: string, details: Record<string, unknown> = {}): BerthError | undefined {
  const code = errnoCode(error);
  const facts = { ...details, stateDir, errno: code };
  switch (code) {
    case "ENOSPC":
    case "EDQUOT":
      return new BerthError(
        "resource_exhausted",
        `${what}: the file system of the state directory ${stateDir} is full (${code}); free space on it and retry (nothing is lost: reads go on, and writes resume once there is room, without a restart)`,
        facts,
        { reason: "DISK_FULL" },
      );
    case "EROFS":
    case "EACCES":
    case "EPERM":
      return new BerthError(
        "unavailable",
        `${what}: the state directory ${stateDir} is not writable (${code}${code === "EROFS" ? ": its file system is mounted read-only" : ""}); make it writable again (remount it read-write, fix its owner or mode) and retry`,
        facts,
        { reason: "STATE_READ_ONLY" },
      );
    case "EMFILE":
    case "ENFILE":
      return descriptorRefusal(error, what, { ...details, stateDir });
    default:
      return undefined;
  }
}

/**
 * The refusal for `error` when it is an open (or accept) refused for want of a descriptor
 * (EMFILE, ENFILE), thrown while `what` (e.g. "session s1: its journal could not be read"):
 * RESOURCE_EXHAUSTED, reason TOO_MANY_OPEN_FILES, retry in a second. Undefined for any other error.
 * A read, a watch or a lock file is refused so as a write is: the service closes its idle
 * descriptors when it meets one (see descriptors.ts), so the retry finds one free.
 */
export function descriptorRefusal(error: unknown, what: string, details: Record<string, unknown> = {}): BerthError | undefined {
  const code = errnoCode(error);
  if (code !== "EMFILE" && code !== "ENFILE") return undefined;
  return new BerthError(
    "resource_exhausted",
    `${what}: the service has no file descriptor left (${code}: too many open files or connections); retry shortly, or raise its limit (ulimit -n)`,
    { ...details, errno: code },
    { reason: TOO_MANY_OPEN_FILES, retryAfterMs: TOO_MANY_OPEN_FILES_RETRY_MS },
  );
}
