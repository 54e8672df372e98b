export { type EtcdCluster, type EtcdClusterOptions, type EtcdMember, startEtcd, stopAllEtcd } from "./etcd-cluster.js";
export { etcdBinary, etcdctlBinary, etcdMissing } from "./etcd-installed.js";
export { type AroundCall, countCalls, wrapClient } from "./wrap-client.js";
