/**
 * Source locks as one object: the lock table, its fencing tokens persisted under the
 * state directory, and the seed's lock files in the live directory, wired together.
 */
import * as path from "node:path";
import type { Clock } from "@berth/shared/clock";
import { systemClock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import { createFencingFile, type FencingFile } from "./fencing-file.js";
import type { LockLimits } from "./lock-input.js";
import { LockTable } from "./lock-table.js";
import { BerthError } from "@berth/shared/errors";
import { DEFAULT_MAX_BUFFERED } from "../watch-hub.js";
import { LockChangeLog, lockWatchHistory } from "./lock-changes.js";
import { SeedLockFiles } from "./seed-lock-files.js";
import type { SourceLocksApi } from "./source-locks-api.js";

/** What {@link createSourceLocks} needs. */
export interface SourceLocksOptions {
  /** The project as its seed processes spell it, when not by its real path (see SeedLockFilesOptions.projectRoot). */
  projectRoot?: string | undefined;
  /** berth's own state: fencing tokens go to `<stateDir>/locks/fencing.json`. */
  stateDir: string;
  /**
   * The live directory whose `locks/` holds the seed's lock files (a project's `.impeccable/live`).
   * null: no lock files — berth's table is the only lock (for a service no seed process shares).
   */
  liveDir: string | null;
  clock?: Clock;
  logger?: Logger;
  /** The pid written into lock files; default this process's. */
  pid?: number;
  limits?: Partial<LockLimits>;
  /** Tokens reserved per durable write (see fencing-file.ts). Default 1000. */
  fencingBlockSize?: number;
  /** The fallback re-check period while a seed-held file has berth waiters. Default 250 ms. */
  lockFileRecheckMs?: number;
  /** The mode of the lock files berth creates (see SeedLockFilesOptions.fileMode). Default 0600. */
  lockFileMode?: number;
  /** How many changes a WatchLocks watcher may fall behind (`--watch-buffer`); the history holds lockWatchHistory of it. Default 1,000. */
  watchBuffer?: number;
}

/**
 * The lock table with its persistence; `close()` releases everything and persists the fencing
 * state. It answers from memory, synchronously: a {@link SourceLocksApi} whose answers are at hand.
 */
export interface SourceLocks
  extends Pick<LockTable, "acquire" | "holdAsLongAs" | "renew" | "release" | "whenLeaseEnds" | "inspect" | "checkToken" | "resolveFile" | "stats" | "limits"> {
  watch: SourceLocksApi["watch"];
  readonly watchHistory: number;
  /** The directory of the seed's lock files, or null when they are off. */
  readonly locksDir: string | null;
  /** Rejects waiters, releases every lease (removing berth's lock files), stops watching, persists the fencing state. Idempotent. */
  close(): void;
}

/** Builds the lock service. Throws when the fencing state exists but is damaged (see fencing-file.ts). */
export function createSourceLocks(options: SourceLocksOptions): SourceLocks {
  const clock = options.clock ?? systemClock;
  const fencing: FencingFile = createFencingFile(options.stateDir, options.fencingBlockSize === undefined ? {} : { blockSize: options.fencingBlockSize });
  const locksDir = options.liveDir === null ? null : path.join(options.liveDir, "locks");
  const files =
    locksDir === null
      ? undefined
      : new SeedLockFiles({
          locksDir,
          clock,
          ...(options.projectRoot === undefined ? {} : { projectRoot: options.projectRoot }),
          ...(options.pid === undefined ? {} : { pid: options.pid }),
          ...(options.logger === undefined ? {} : { logger: options.logger }),
          ...(options.lockFileRecheckMs === undefined ? {} : { recheckMs: options.lockFileRecheckMs }),
          ...(options.lockFileMode === undefined ? {} : { fileMode: options.lockFileMode }),
        });
  const watchBuffer = options.watchBuffer ?? DEFAULT_MAX_BUFFERED;
  const changes = new LockChangeLog(clock, watchBuffer);
  const table = new LockTable({
    clock,
    changes,
    fencing,
    ...(files === undefined ? {} : { external: files }),
    ...(options.logger === undefined ? {} : { logger: options.logger }),
    ...(options.limits === undefined ? {} : { limits: options.limits }),
  });
  let closed = false;
  return implementsApi<SourceLocks>({
    locksDir,
    limits: table.limits,
    acquire: (request) => table.acquire(request),
    holdAsLongAs: (request) => table.holdAsLongAs(request),
    renew: (leaseToken, ttlMs) => table.renew(leaseToken, ttlMs),
    release: (leaseToken, requestId) => table.release(leaseToken, requestId),
    whenLeaseEnds: (leaseToken, onEnd) => table.whenLeaseEnds(leaseToken, onEnd),
    inspect: (file) => table.inspect(file),
    checkToken: (file, token) => table.checkToken(file, token),
    resolveFile: (file, field) => table.resolveFile(file, field),
    stats: () => table.stats(),
    watchHistory: lockWatchHistory(watchBuffer),
    watch: (request) => {
      if (closed) throw shuttingDown();
      return changes.watch(request, () => table.inspectAll(request.file));
    },
    close() {
      if (closed) return;
      closed = true;
      changes.close(shuttingDown());
      table.close();
      files?.close();
      fencing.close();
    },
  });
}

function shuttingDown(): BerthError {
  return new BerthError("unavailable", "the lock service is shutting down; watch again when it is back", {}, { reason: "SHUTTING_DOWN", retryAfterMs: 1_000 });
}

/** The file backend is one of the lock service's backends: checked here, where it is built. */
const implementsApi = <T extends SourceLocksApi>(locks: T): T => locks;
