export { createEtcdClient, type EtcdClient, type EtcdClientOptions, type EtcdStatus } from "./etcd-client.js";
export { type EtcdCallContext, EtcdCompactedError, EtcdLeaseLostError, type EtcdOutcome, EtcdReason, isEtcdCompacted, toBerthError } from "./etcd-errors.js";
export { createKeySpace, type KeySpace, rangeEndOfPrefix, valueBytes } from "./etcd-keys.js";
export {
  compare,
  compareMessage,
  deleteRequest,
  type KeyRange,
  type KeyValue,
  keyValue,
  op,
  putRequest,
  rangeBytes,
  type RangeOptions,
  rangeRequest,
  type RangeResult,
  rangeResult,
  requestOp,
  type TxnCompare,
  type TxnOp,
  type TxnOpResult,
  txnOpResult,
  type TxnRequestInit,
  type TxnResult,
} from "./etcd-kv.js";
export type { EtcdConnectionOptions, EtcdTlsOptions } from "./connections.js";
export type { EtcdLease } from "./lease-keeper.js";
export { keepaliveIntervalMs } from "./lease-keeper.js";
export type { WatchBatch, WatchEvent, WatchOptions } from "./watcher.js";
