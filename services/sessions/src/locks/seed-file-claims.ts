/**
 * The lock table's claims on the seed's lock files (lock-table.ts): a grant takes the file's lock
 * file too, and a lock file another process holds keeps the queue waiting, recorded on the entry.
 */
import * as path from "node:path";
import { retryAfterRelief } from "@berth/shared/descriptors";
import { BerthError } from "@berth/shared/errors";
import type { Logger } from "@berth/shared/logger";
import { stateWriteError } from "@berth/shared/state-errors";
import type { ExternalClaim, ExternalLockHandle, ExternalLocks } from "./external-locks.js";
import type { Entry } from "./lock-entries.js";
import { LOCK_RETRY_AFTER_MS } from "./lock-input.js";

/**
 * Takes the lock file of `entry` for a grant to `owner`. Returns the handle, `true` when there are
 * no lock files, or undefined when the lock file cannot be had: another process holds it (recorded
 * in `entry.blockedBy`), or it cannot be taken at all (permissions, disk full: the refusal saying
 * why, DISK_FULL, STATE_READ_ONLY, TOO_MANY_OPEN_FILES, else STORAGE_UNAVAILABLE, is recorded in
 * `entry.claimError` until a claim gets past it).
 */
export function claimLockFile(
  external: ExternalLocks | undefined,
  entry: Entry,
  owner: string,
  at: number,
  logger: Logger,
): ExternalLockHandle | true | undefined {
  if (!external) return true;
  let claim: ExternalClaim;
  try {
    // Short of descriptors, the idle journals are closed and the claim made once more (it changes
    // nothing on disk before its lock file is in place).
    claim = retryAfterRelief(() => external.claim(entry.key, { owner, at }));
  } catch (error) {
    logger.error({ file: entry.key, err: error }, "cannot take the lock file");
    const lockPath = external.pathFor(entry.key);
    const what = `no lock was granted: cannot take the lock file ${lockPath} for ${entry.key}`;
    entry.claimError =
      stateWriteError(error, what, path.dirname(lockPath), { file: entry.key, lockPath }) ??
      new BerthError(
        "unavailable",
        `cannot take the lock file ${lockPath} for ${entry.key}: ${(error as Error).message}`,
        { file: entry.key, lockPath },
        { reason: "STORAGE_UNAVAILABLE", retryAfterMs: LOCK_RETRY_AFTER_MS },
      );
    entry.blocked = true;
    return undefined;
  }
  delete entry.claimError;
  if (claim.ok) {
    entry.blocked = false;
    delete entry.blockedBy;
    return claim.handle;
  }
  entry.blocked = true;
  if (claim.holder) entry.blockedBy = claim.holder;
  return undefined;
}
