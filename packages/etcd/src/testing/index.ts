export * from "./etcd-cluster.js";
export * from "./etcd-installed.js";
export * from "./wrap-client.js";
