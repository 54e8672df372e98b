/**
 * The sessions service's state in etcd (`--store etcd`): session journals and source locks that
 * several berth instances share through one etcd cluster. See docs/etcd.md for the key layout and
 * how each promise maps onto etcd.
 */
export { DEFAULT_ETCD_LEASE_TTL_SECONDS, ETCD_DEFAULT_MAX_REQUEST_BYTES } from "./etcd-defaults.js";
export { etcdElector } from "./etcd-elector.js";
export { decodeAppend, EtcdJournal, type EtcdJournalOptions, fenceRejected, type JournalRead, type ListedSession, type PreparedEvent } from "./etcd-journal.js";
export type { EtcdAppendOptions, EtcdAppendResult, EtcdFence, HeadChange, SessionState } from "./etcd-journal-api.js";
export { type EtcdLockGrant, type EtcdLockInspection, type EtcdLockRequest, EtcdLocks, type EtcdLocksOptions, waitExhausted } from "./etcd-locks.js";
export {
  electionKey,
  entriesPrefix,
  entryKey,
  firstSeqOfEntryKey,
  headKey,
  HEADS,
  idempotencyKey,
  idempotencyPrefix,
  lastTokenKey,
  lockWaiterKey,
  lockWaitersPrefix,
  sessionOfHead,
  sessionOfTombstone,
  snapshotKey,
  SNAPSHOTS,
  tombstoneKey,
  TOMBSTONES,
} from "./store-keys.js";
export { DEFAULT_ETCD_SNAPSHOT_CACHE, DEFAULT_SNAPSHOT_EVERY, EtcdSessionStore, type EtcdSessionStoreOptions } from "./etcd-session-store.js";
export { createEtcdSourceLocks, type EtcdSourceLocks, type EtcdSourceLocksOptions } from "./etcd-source-locks.js";
