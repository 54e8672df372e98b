/**
 * Source locks: per-file locks with leases, FIFO waiters, fencing tokens that rise across restarts,
 * and the seed's lock files kept so processes still using the seed's library and berth's clients
 * exclude each other. Domain code only: the RPC layer maps these calls and their BerthErrors.
 */
export { createSourceLocks, type SourceLocks, type SourceLocksOptions } from "./source-locks.js";
export type {
  AcquireRequest,
  HoldRequest,
  Lease,
  LeaseEndReason,
  LockChange,
  LockChangeKind,
  LockHolderInfo,
  LockInspection,
  LockTableStats,
  LockWaiterInfo,
  LockWatcher,
  LockWatchItem,
  LockWatchRequest,
  SourceLocksApi,
  TokenCheck,
  WaitingUpdate,
} from "./source-locks-api.js";
export { LockTable, type LockTableOptions } from "./lock-table.js";
export { DEFAULT_LOCK_LIMITS, LOCK_RETRY_AFTER_MS, checkFencingToken, type LockLimits } from "./lock-input.js";
export { canonicalLockPath } from "./lock-path.js";
export { fencingFilePath, createFencingFile, type FencingFile } from "./fencing-file.js";
export type { FencingTokenSource, LockPersistence } from "./lock-persistence.js";
export type { ExternalClaim, ExternalLockHandle, ExternalLocks, ForeignLockHolder } from "./external-locks.js";
export { lockFilePath, PRIVATE_LOCK_FILE_MODE, SHARED_LOCK_FILE_MODE, UNREADABLE_LOCK_STALE_MS, type LockFileRecord } from "./lock-file-protocol.js";
export { SeedLockFiles } from "./seed-lock-files.js";
export { LockChangeLog, firstRevisionOfRun, lockWatchHistory } from "./lock-changes.js";
