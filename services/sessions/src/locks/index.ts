/**
 * Source locks: per-file locks with leases, FIFO waiters, fencing tokens that rise across restarts,
 * and the seed's lock files kept so processes still using the seed's library and berth's clients
 * exclude each other. Domain code only: the RPC layer maps these calls and their BerthErrors.
 */
export { createLockService, type LockService, type LockServiceOptions } from "./lock-service.js";
export {
  LockTable,
  type AcquireRequest,
  type ExternalClaim,
  type ExternalLockHandle,
  type ExternalLocks,
  type HoldRequest,
  type Lease,
  type LockHolderInfo,
  type LockInspection,
  type LockLogger,
  type LockTableOptions,
  type LockTableStats,
  type LockWaiterInfo,
  type TokenCheck,
  type WaitingUpdate,
} from "./lock-table.js";
export { DEFAULT_LOCK_LIMITS, LOCK_RETRY_AFTER_MS, checkFencingToken, type LockLimits } from "./lock-input.js";
export { canonicalLockPath } from "./lock-path.js";
export { fencingFilePath, openFencingStore, type FencingStore, type FencingTokenSource } from "./fencing-store.js";
export {
  lockFilePath,
  PRIVATE_LOCK_FILE_MODE,
  SeedLockFiles,
  SHARED_LOCK_FILE_MODE,
  UNREADABLE_LOCK_STALE_MS,
  type ForeignLockHolder,
  type LockFileRecord,
} from "./seed-lock-files.js";
