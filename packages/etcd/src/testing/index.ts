export * from "./etcd-cluster.js";
export * from "./wrap-client.js";
