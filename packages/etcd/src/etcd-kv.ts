/**
 * What berth reads from and writes to etcd, as plain typed values (relative keys, bigint
 * revisions), and their translation to etcd's messages. Kept to what berth needs: point and range
 * reads with limits, puts under leases, deletes, and transactions that compare versions, create
 * and mod revisions, values or leases of one key or a range.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import {
  Compare_CompareResult,
  Compare_CompareTarget,
  RangeRequest_SortOrder,
  RangeRequest_SortTarget,
  CompareSchema,
  DeleteRangeRequestSchema,
  PutRequestSchema,
  RangeRequestSchema,
  RequestOpSchema,
  type Compare,
  type DeleteRangeRequest,
  type PutRequest,
  type RangeRequest,
  type RangeResponse,
  type RequestOp,
  type ResponseOp,
} from "./gen/etcd/etcdserver/etcdserverpb/rpc_pb.js";
import type { KeyValue as PbKeyValue } from "./gen/etcd/mvcc/mvccpb/kv_pb.js";
import { valueBytes, type KeySpace } from "./etcd-keys.js";

/** A key's state as etcd keeps it. */
export interface KeyValue {
  /** Relative to the client's prefix. */
  readonly key: string;
  readonly value: Uint8Array;
  /** The revision of the transaction that created the key (since its last deletion). */
  readonly createRevision: bigint;
  /** The revision of its last change. */
  readonly modRevision: bigint;
  /** How many times it was written since created (1 after the first put). */
  readonly version: bigint;
  /** The lease it lives under; 0n for none. */
  readonly lease: bigint;
}

/** Which keys a read, a delete or a compare covers: one key, every key under a prefix, or `[key, end)`. */
export interface KeyRange {
  readonly key: string;
  /** Every key that starts with `key`. */
  readonly prefix?: boolean;
  /** Every key from `key` up to, not including, `end`. */
  readonly end?: string;
}

/** A read. */
export interface RangeOptions extends KeyRange {
  /** At most this many keys (0: no limit); `more` says whether some were left out. */
  readonly limit?: number;
  /** Read the store as it was at this revision (must not be compacted). */
  readonly revision?: bigint;
  readonly sort?: { readonly by: "key" | "version" | "create" | "mod" | "value"; readonly order: "ascend" | "descend" };
  readonly keysOnly?: boolean;
  readonly countOnly?: boolean;
  /** Answer from the member's local state without a quorum read (may be stale). */
  readonly serializable?: boolean;
}

/** What a read found, at the store's `revision`. */
export interface RangeResult {
  readonly kvs: KeyValue[];
  /** True when `limit` left keys out. */
  readonly more: boolean;
  /** How many keys the range holds (all of them, whatever the limit). */
  readonly count: number;
  /** The store's revision the read saw: follow changes from `revision + 1n`. */
  readonly revision: bigint;
}

/** One condition of a transaction. Over a range, every key must meet it (a missing key counts as all zeros, but for `value`). */
export type TxnCompare = KeyRange & {
  readonly target: "version" | "create" | "mod" | "value" | "lease";
  readonly op: "==" | "!=" | "<" | ">";
  readonly against: bigint | string | Uint8Array;
};

/** One operation of a transaction. */
export type TxnOp =
  | { readonly put: { readonly key: string; readonly value: string | Uint8Array; readonly lease?: bigint } }
  | { readonly get: RangeOptions }
  | { readonly delete: KeyRange };

/** The result of one operation, in the order of the branch that ran. */
export type TxnOpResult = { readonly put: { readonly revision: bigint } } | { readonly get: RangeResult } | { readonly delete: { readonly deleted: number } };

/** A transaction: `success` runs when every compare holds, else `failure`. */
export interface TxnRequestInit {
  readonly compare: readonly TxnCompare[];
  readonly success: readonly TxnOp[];
  readonly failure?: readonly TxnOp[];
}

export interface TxnResult {
  readonly succeeded: boolean;
  /** The store's revision after the transaction (its own, if it wrote). */
  readonly revision: bigint;
  readonly results: TxnOpResult[];
}

/** Compares and operations, shortest to write. */
export const compare = {
  /** The key does not exist (version 0). */
  absent: (key: string): TxnCompare => ({ key, target: "version", op: "==", against: 0n }),
  version: (key: string, op: TxnCompare["op"], against: bigint): TxnCompare => ({ key, target: "version", op, against }),
  create: (key: string, op: TxnCompare["op"], against: bigint): TxnCompare => ({ key, target: "create", op, against }),
  mod: (key: string, op: TxnCompare["op"], against: bigint): TxnCompare => ({ key, target: "mod", op, against }),
  value: (key: string, op: TxnCompare["op"], against: string | Uint8Array): TxnCompare => ({ key, target: "value", op, against }),
  lease: (key: string, op: TxnCompare["op"], against: bigint): TxnCompare => ({ key, target: "lease", op, against }),
};

export const op = {
  put: (key: string, value: string | Uint8Array, lease?: bigint): TxnOp => ({ put: lease === undefined ? { key, value } : { key, value, lease } }),
  get: (range: RangeOptions): TxnOp => ({ get: range }),
  delete: (range: KeyRange): TxnOp => ({ delete: range }),
};

// --------------------------------------------------------------------------- to etcd's messages

/** `key` and `rangeEnd` of a range. */
export function rangeBytes(keys: KeySpace, range: KeyRange): { key: Uint8Array; rangeEnd: Uint8Array } {
  if (range.prefix && range.end !== undefined) throw new Error(`range of ${range.key}: prefix and end are exclusive`);
  const key = keys.encode(range.key);
  if (range.prefix) return { key, rangeEnd: keys.prefixEnd(range.key) };
  if (range.end !== undefined) return { key, rangeEnd: keys.encode(range.end) };
  return { key, rangeEnd: new Uint8Array(0) };
}

const SORT_TARGET: Record<NonNullable<RangeOptions["sort"]>["by"], RangeRequest_SortTarget> = {
  key: RangeRequest_SortTarget.KEY,
  version: RangeRequest_SortTarget.VERSION,
  create: RangeRequest_SortTarget.CREATE,
  mod: RangeRequest_SortTarget.MOD,
  value: RangeRequest_SortTarget.VALUE,
};

export function rangeRequest(keys: KeySpace, options: RangeOptions): RangeRequest {
  return create(RangeRequestSchema, {
    ...rangeBytes(keys, options),
    limit: BigInt(options.limit ?? 0),
    revision: options.revision ?? 0n,
    sortOrder: options.sort ? (options.sort.order === "ascend" ? RangeRequest_SortOrder.ASCEND : RangeRequest_SortOrder.DESCEND) : RangeRequest_SortOrder.NONE,
    sortTarget: options.sort ? SORT_TARGET[options.sort.by] : RangeRequest_SortTarget.KEY,
    keysOnly: options.keysOnly ?? false,
    countOnly: options.countOnly ?? false,
    serializable: options.serializable ?? false,
  });
}

export function putRequest(keys: KeySpace, put: Extract<TxnOp, { put: unknown }>["put"]): PutRequest {
  return create(PutRequestSchema, { key: keys.encode(put.key), value: valueBytes(put.value), lease: put.lease ?? 0n });
}

export function deleteRequest(keys: KeySpace, range: KeyRange): DeleteRangeRequest {
  return create(DeleteRangeRequestSchema, rangeBytes(keys, range));
}

const COMPARE_TARGET = {
  version: Compare_CompareTarget.VERSION,
  create: Compare_CompareTarget.CREATE,
  mod: Compare_CompareTarget.MOD,
  value: Compare_CompareTarget.VALUE,
  lease: Compare_CompareTarget.LEASE,
} as const;

const COMPARE_RESULT = {
  "==": Compare_CompareResult.EQUAL,
  "!=": Compare_CompareResult.NOT_EQUAL,
  "<": Compare_CompareResult.LESS,
  ">": Compare_CompareResult.GREATER,
} as const;

export function compareMessage(keys: KeySpace, c: TxnCompare): Compare {
  return create(CompareSchema, compareInit(keys, c));
}

function compareInit(keys: KeySpace, c: TxnCompare): MessageInitShape<typeof CompareSchema> {
  const { key, rangeEnd } = rangeBytes(keys, c);
  const base = { key, rangeEnd, target: COMPARE_TARGET[c.target], result: COMPARE_RESULT[c.op] };
  if (c.target === "value") {
    if (typeof c.against === "bigint") throw new Error(`compare value of ${c.key}: needs a string or bytes`);
    return { ...base, targetUnion: { case: "value", value: valueBytes(c.against) } };
  }
  if (typeof c.against !== "bigint") throw new Error(`compare ${c.target} of ${c.key}: needs a bigint`);
  const value = c.against;
  switch (c.target) {
    case "version":
      return { ...base, targetUnion: { case: "version", value } };
    case "create":
      return { ...base, targetUnion: { case: "createRevision", value } };
    case "mod":
      return { ...base, targetUnion: { case: "modRevision", value } };
    case "lease":
      return { ...base, targetUnion: { case: "lease", value } };
  }
}

export function requestOp(keys: KeySpace, o: TxnOp): RequestOp {
  if ("put" in o) return create(RequestOpSchema, { request: { case: "requestPut", value: putRequest(keys, o.put) } });
  if ("get" in o) return create(RequestOpSchema, { request: { case: "requestRange", value: rangeRequest(keys, o.get) } });
  return create(RequestOpSchema, { request: { case: "requestDeleteRange", value: deleteRequest(keys, o.delete) } });
}

// --------------------------------------------------------------------------- from etcd's messages

export function keyValue(keys: KeySpace, kv: PbKeyValue): KeyValue {
  return { key: keys.decode(kv.key), value: kv.value, createRevision: kv.createRevision, modRevision: kv.modRevision, version: kv.version, lease: kv.lease };
}

export function rangeResult(keys: KeySpace, response: RangeResponse, revision: bigint): RangeResult {
  return { kvs: response.kvs.map((kv) => keyValue(keys, kv)), more: response.more, count: Number(response.count), revision };
}

export function txnOpResult(keys: KeySpace, response: ResponseOp, revision: bigint): TxnOpResult {
  switch (response.response.case) {
    case "responsePut":
      return { put: { revision } };
    case "responseRange":
      return { get: rangeResult(keys, response.response.value, revision) };
    case "responseDeleteRange":
      return { delete: { deleted: Number(response.response.value.deleted) } };
    default:
      throw new Error(`etcd answered a transaction with an operation berth did not send (${response.response.case ?? "none"})`);
  }
}
