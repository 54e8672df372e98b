/** etcd's v3 API as generated from proto/, for a tool that needs what the client does not offer. */
// biome-ignore-all lint/performance/noReExportAll: this surface is the generated code's, whole, and follows it when etcd's protos are regenerated
export * from "./gen/etcd/etcdserver/etcdserverpb/rpc_pb.js";
export * from "./gen/etcd/mvcc/mvccpb/kv_pb.js";
