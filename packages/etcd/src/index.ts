export * from "./etcd-client.js";
export * from "./etcd-errors.js";
export * from "./etcd-keys.js";
export * from "./etcd-kv.js";
export type { EtcdConnectionOptions, EtcdTlsOptions } from "./connections.js";
export type { EtcdLease } from "./lease-keeper.js";
export { keepaliveIntervalMs } from "./lease-keeper.js";
export type { WatchBatch, WatchEvent, WatchOptions } from "./watcher.js";
