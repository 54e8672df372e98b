/** The budget's etcd backends: the fleet view. */
export * from "./etcd-fleet.js";
