/**
 * berth's etcd client: the reads, writes, transactions, leases and watches berth's stores need,
 * typed (relative string keys, bigint revisions), under one key prefix, with every failure a
 * BerthError (see etcd-errors.ts). Calls go to one member at a time and move to the next when it
 * fails; a call is retried on the next member only when it cannot have been applied twice (a read,
 * or a write etcd never received).
 */
import { create, toBinary } from "@bufbuild/protobuf";
import type { CallOptions } from "@connectrpc/connect";
import { systemClock, type Clock } from "@berth/shared/clock";
import type { BerthError } from "@berth/shared/errors";
import {
  DeleteRangeRequestSchema,
  PutRequestSchema,
  RangeRequestSchema,
  TxnRequestSchema,
  type TxnRequest,
} from "./gen/etcd/etcdserver/etcdserverpb/rpc_pb.js";
import { Connections, type Endpoint, type EtcdConnectionOptions } from "./connections.js";
import { EtcdReason, toBerthError } from "./etcd-errors.js";
import { createKeySpace, type KeySpace } from "./etcd-keys.js";
import {
  compareMessage,
  deleteRequest,
  putRequest,
  rangeRequest,
  rangeResult,
  requestOp,
  txnOpResult,
  type KeyRange,
  type KeyValue,
  type RangeOptions,
  type RangeResult,
  type TxnRequestInit,
  type TxnResult,
} from "./etcd-kv.js";
import { LeaseKeeper, type EtcdLease } from "./lease-keeper.js";
import { watchChanges, type WatchBatch, type WatchOptions } from "./watcher.js";

export interface EtcdClientOptions extends EtcdConnectionOptions {
  /** Every key berth reads or writes is under this prefix (default `berth/`). */
  readonly prefix?: string;
  /** Time for lease deadlines and watch reconnections (tests pass a ManualClock). */
  readonly clock?: Clock;
}

/** What a member says of itself and the cluster. */
export interface EtcdStatus {
  readonly endpoint: string;
  readonly version: string;
  readonly memberId: bigint;
  /** The leader's member id (0n: none). */
  readonly leader: bigint;
  readonly revision: bigint;
  readonly dbSizeBytes: number;
}

export interface EtcdClient {
  readonly keys: KeySpace;
  /** One key, or undefined when it does not exist. */
  get(key: string, options?: Pick<RangeOptions, "revision" | "serializable">): Promise<KeyValue | undefined>;
  range(options: RangeOptions): Promise<RangeResult>;
  /** Puts a value; with `lease`, the key is deleted when the lease ends. Resolves with the put's revision. */
  put(key: string, value: string | Uint8Array, options?: { readonly lease?: bigint }): Promise<{ revision: bigint }>;
  delete(range: KeyRange): Promise<{ deleted: number; revision: bigint }>;
  /** One atomic transaction. */
  txn(request: TxnRequestInit): Promise<TxnResult>;
  /** Grants a lease of `ttlSeconds` (etcd may raise it to its minimum) and keeps it alive until revoked or lost. */
  grantLease(ttlSeconds: number): Promise<EtcdLease>;
  /** Revokes a lease by id, whoever holds it: its keys are deleted at once. A lease already gone is no error. */
  revokeLease(id: bigint): Promise<void>;
  /** Changes of a key or range from a revision, as they happen; ends when `signal` aborts. */
  watch(options: WatchOptions): AsyncIterable<WatchBatch>;
  /** Drops the history before `revision` (reads and watches of older revisions fail as compacted). */
  compact(revision: bigint, options?: { readonly physical?: boolean }): Promise<void>;
  /** The member the client talks to now, as it describes itself. */
  status(): Promise<EtcdStatus>;
  /** Closes every connection; leases are no longer kept alive (they expire within their TTL). */
  close(): void;
}

/** A client of the etcd cluster at `options.endpoints`. Connects lazily, on the first call. */
export function createEtcdClient(options: EtcdClientOptions): EtcdClient {
  return new Client(options);
}

/** How a call may be repeated on another member after a failure. */
type Retry = "safe" | "if-not-applied";

class Client implements EtcdClient {
  readonly keys: KeySpace;
  private readonly connections: Connections;
  private readonly clock: Clock;
  private readonly leases: LeaseKeeper;

  constructor(options: EtcdClientOptions) {
    this.keys = createKeySpace(options.prefix ?? "berth/");
    this.connections = new Connections(options);
    this.clock = options.clock ?? systemClock;
    this.leases = new LeaseKeeper(this.connections, this.clock, (id) => this.revokeLease(id));
  }

  async get(key: string, options: Pick<RangeOptions, "revision" | "serializable"> = {}): Promise<KeyValue | undefined> {
    const result = await this.range({ ...options, key });
    return result.kvs[0];
  }

  async range(options: RangeOptions): Promise<RangeResult> {
    const request = rangeRequest(this.keys, options);
    const response = await this.call("range", "safe", (e, o) => e.kv.range(request, o), {
      revision: options.revision,
      size: () => toBinary(RangeRequestSchema, request).length,
    });
    return rangeResult(this.keys, response, response.header?.revision ?? 0n);
  }

  async put(key: string, value: string | Uint8Array, options: { readonly lease?: bigint } = {}): Promise<{ revision: bigint }> {
    const request = putRequest(this.keys, { key, value, ...(options.lease === undefined ? {} : { lease: options.lease }) });
    const response = await this.call("put", "if-not-applied", (e, o) => e.kv.put(request, o), {
      write: true,
      size: () => toBinary(PutRequestSchema, request).length,
    });
    return { revision: response.header?.revision ?? 0n };
  }

  async delete(range: KeyRange): Promise<{ deleted: number; revision: bigint }> {
    const request = deleteRequest(this.keys, range);
    const response = await this.call("delete", "if-not-applied", (e, o) => e.kv.deleteRange(request, o), {
      write: true,
      size: () => toBinary(DeleteRangeRequestSchema, request).length,
    });
    return { deleted: Number(response.deleted), revision: response.header?.revision ?? 0n };
  }

  async txn(init: TxnRequestInit): Promise<TxnResult> {
    const request: TxnRequest = create(TxnRequestSchema, {
      compare: init.compare.map((c) => compareMessage(this.keys, c)),
      success: init.success.map((o) => requestOp(this.keys, o)),
      failure: (init.failure ?? []).map((o) => requestOp(this.keys, o)),
    });
    const writes = [...init.success, ...(init.failure ?? [])].some((o) => !("get" in o));
    const response = await this.call("txn", writes ? "if-not-applied" : "safe", (e, o) => e.kv.txn(request, o), {
      write: writes,
      size: () => toBinary(TxnRequestSchema, request).length,
    });
    const revision = response.header?.revision ?? 0n;
    return { succeeded: response.succeeded, revision, results: response.responses.map((r) => txnOpResult(this.keys, r, revision)) };
  }

  async grantLease(ttlSeconds: number): Promise<EtcdLease> {
    if (!Number.isInteger(ttlSeconds) || ttlSeconds < 1) throw new Error(`lease TTL: must be a whole number of seconds ≥ 1, got ${ttlSeconds}`);
    const sentAt = this.clock.monotonicNow();
    // A grant whose answer was lost leaves a lease nobody keeps alive: it expires by itself, so a
    // retry on another member is harmless.
    const response = await this.call("lease grant", "safe", (e, o) => e.lease.leaseGrant({ TTL: BigInt(ttlSeconds) }, o), { write: true });
    if (response.error) throw toBerthError(new Error(response.error), { op: "lease grant", endpoint: this.connections.current().url, write: true });
    return this.leases.keep(response.ID, Number(response.TTL), sentAt);
  }

  watch(options: WatchOptions): AsyncIterable<WatchBatch> {
    return watchChanges(this.connections, this.keys, this.clock, options);
  }

  async compact(revision: bigint, options: { readonly physical?: boolean } = {}): Promise<void> {
    await this.call("compact", "safe", (e, o) => e.kv.compact({ revision, physical: options.physical ?? false }, o), { write: true, revision });
  }

  async status(): Promise<EtcdStatus> {
    let endpoint = "";
    const response = await this.call("status", "safe", (e, o) => {
      endpoint = e.url;
      return e.maintenance.status({}, o);
    });
    return {
      endpoint,
      version: response.version,
      memberId: response.header?.memberId ?? 0n,
      leader: response.leader,
      revision: response.header?.revision ?? 0n,
      dbSizeBytes: Number(response.dbSize),
    };
  }

  close(): void {
    this.leases.close();
    this.connections.close();
  }

  async revokeLease(id: bigint): Promise<void> {
    try {
      await this.call("lease revoke", "safe", (e, o) => e.lease.leaseRevoke({ ID: id }, o), { write: true });
    } catch (error) {
      // Revoked already, or expired: what the caller wanted.
      if ((error as BerthError).reason === EtcdReason.LEASE_LOST) return;
      throw error;
    }
  }

  /**
   * Runs `run` against the current member. On UNAVAILABLE the client moves to the next member and,
   * when `retry` allows, runs it there, once per member. A refused auth token is renewed once.
   */
  private async call<T>(
    op: string,
    retry: Retry,
    run: (endpoint: Endpoint, options: CallOptions) => Promise<T>,
    context: { readonly write?: boolean; readonly revision?: bigint | undefined; readonly size?: () => number } = {},
  ): Promise<T> {
    let renewedToken = false;
    for (let attempt = 1; ; attempt++) {
      const endpoint = this.connections.current();
      try {
        const headers = await this.connections.headers(endpoint);
        return await run(endpoint, { timeoutMs: this.connections.requestTimeoutMs, ...(headers ? { headers } : {}) });
      } catch (error) {
        const mapped = toBerthError(error, {
          op,
          endpoint: endpoint.url,
          write: context.write ?? false,
          ...(context.revision === undefined ? {} : { revision: context.revision }),
          ...(context.size ? { requestBytes: context.size } : {}),
        });
        if (mapped.reason === EtcdReason.AUTH && /invalid auth token/.test(String(mapped.details?.etcd)) && !renewedToken) {
          this.connections.dropToken();
          renewedToken = true;
          attempt--;
          continue;
        }
        if (mapped.reason === EtcdReason.UNAVAILABLE) {
          this.connections.failed(endpoint);
          const again = retry === "safe" || mapped.details?.outcome === "not_applied";
          if (again && attempt < this.connections.size) continue;
        }
        throw mapped;
      }
    }
  }
}
