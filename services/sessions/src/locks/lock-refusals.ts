/**
 * The refusals of a request for a lock that both stores give, worded once. A wait that ran out
 * (or a try-once that found the lock taken) is RESOURCE_EXHAUSTED WAIT_EXHAUSTED with a retry
 * delay; its details mirror the API's LockHeld (file, owner, acquireTime, fencingToken — 0 for a
 * seed lock file, which has none — pid, kind, lockPath, waitedMs) plus `waiting`, the requests
 * queued ahead of the caller.
 */
import { BerthError } from "@berth/shared/errors";
import { formatDuration } from "@berth/shared/units";
import type { ForeignLockHolder } from "./external-locks.js";
import { LOCK_RETRY_AFTER_MS } from "./lock-input.js";

/** Where a refused request stood: its file, the file's lock file (null without), its wait, the requests ahead of it. */
export interface RefusedWait {
  readonly file: string;
  readonly lockPath: string | null;
  readonly waitedMs: number;
  readonly ahead: number;
}

/** A lock held through berth, as a refusal names it. */
export interface BerthHolderNamed {
  readonly owner: string;
  readonly since: number;
  readonly fencingToken: number;
  readonly kind: "lease" | "stream";
  readonly pid?: number | undefined;
}

const iso = (ms: number) => new Date(ms).toISOString();
const HINT = "wait longer, or ask the holder to release it";
const OPTIONS = { reason: "WAIT_EXHAUSTED", retryAfterMs: LOCK_RETRY_AFTER_MS } as const;

function waited(waitedMs: number): string {
  return waitedMs === 0 ? "it was not free (max_wait was 0: try once)" : `it stayed locked for the whole wait of ${formatDuration(waitedMs)}`;
}

function base(wait: RefusedWait): Record<string, unknown> {
  return { file: wait.file, lockPath: wait.lockPath, waitedMs: wait.waitedMs, waiting: wait.ahead };
}

/** The wait ran out while berth's `holder` held the lock. */
export function heldByBerth(wait: RefusedWait, holder: BerthHolderNamed): BerthError {
  const details: Record<string, unknown> = {
    ...base(wait),
    owner: holder.owner,
    acquireTime: holder.since,
    fencingToken: holder.fencingToken,
    kind: holder.kind,
  };
  if (holder.pid !== undefined) details.pid = holder.pid;
  return new BerthError(
    "resource_exhausted",
    `source locked: ${wait.file} is held by ${holder.owner} since ${iso(holder.since)} (fencing token ${holder.fencingToken}); ${waited(wait.waitedMs)}; ${HINT}`,
    details,
    OPTIONS,
  );
}

/** The wait ran out while another process held the file's lock file. */
export function heldByLockFile(wait: RefusedWait, foreign: ForeignLockHolder): BerthError {
  const who = `${foreign.owner ?? "an unknown owner"}${foreign.pid !== undefined ? ` (pid ${foreign.pid})` : ""}`;
  const details: Record<string, unknown> = { ...base(wait), owner: foreign.owner ?? "", acquireTime: foreign.since, fencingToken: 0, kind: "seed-file" };
  if (foreign.pid !== undefined) details.pid = foreign.pid;
  return new BerthError(
    "resource_exhausted",
    `source locked: ${wait.file} is held by ${who} through its lock file ${foreign.lockFile} since ${iso(foreign.since)}; ${waited(wait.waitedMs)}; ${HINT}`,
    details,
    OPTIONS,
  );
}

/** The wait ran out with nobody identifiable holding the lock: requests queued ahead wait for a lock file being taken over. */
export function heldByNobodyKnown(wait: RefusedWait): BerthError {
  const ahead = wait.ahead;
  return new BerthError(
    "resource_exhausted",
    `source locked: ${wait.file} was not free: ${ahead} request${ahead === 1 ? "" : "s"} queued ahead; ${waited(wait.waitedMs)}; ${HINT}`,
    { ...base(wait), owner: "", acquireTime: null, fencingToken: 0, kind: "unknown" },
    OPTIONS,
  );
}

/** A request whose signal had aborted before it could queue. */
export function cancelledBeforeQueued(file: string): BerthError {
  return new BerthError("cancelled", `the request for ${file} was cancelled before it was queued`, { file });
}

/** A waiting call whose caller went away (its signal aborted). */
export function callerWentAway(file: string): BerthError {
  return new BerthError("cancelled", `gave up waiting for ${file}: the caller went away`, { file });
}
