export * from "./etcd-cluster.js";
