/** etcd's v3 API as generated from proto/, for a tool that needs what the client does not offer. */
export * from "./gen/etcd/etcdserver/etcdserverpb/rpc_pb.js";
export * from "./gen/etcd/mvcc/mvccpb/kv_pb.js";
