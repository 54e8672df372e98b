/**
 * The sessions service's state in etcd (`--store etcd`): session journals and source locks that
 * several berth instances share through one etcd cluster. See docs/etcd.md for the key layout and
 * how each promise maps onto etcd.
 */
export * from "./etcd-defaults.js";
export * from "./etcd-elector.js";
export * from "./etcd-journal.js";
export * from "./etcd-journal-api.js";
export * from "./etcd-locks.js";
export * from "./store-keys.js";
export * from "./etcd-session-store.js";
export * from "./etcd-source-locks.js";
