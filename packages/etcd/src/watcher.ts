/**
 * Following changes from a revision. Each watch has its own stream; when the stream breaks (the
 * member died, was paused, lost the quorum) the watch reopens on the next member from the revision
 * after the last one it delivered, so nothing is missed or repeated. What etcd no longer has ends
 * the watch with {@link EtcdCompactedError}.
 *
 * The resume point is the last event's own revision, not the response header's: while a watcher
 * catches up, etcd sends its history in chunks whose header names the store's current revision,
 * ahead of the chunk's events (mvcc's syncWatchers). Periodic progress notifications are safe
 * resume points (etcd sends them only to watchers that are caught up); in etcd 3.4 the answers to
 * an on-demand progress request are not (they come by another channel than the events), so this
 * watcher never asks for one.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Clock } from "@berth/shared/clock";
import { WatchCreateRequest_FilterType, WatchRequestSchema, type WatchRequest } from "./gen/etcd/etcdserver/etcdserverpb/rpc_pb.js";
import { Event_EventType } from "./gen/etcd/mvcc/mvccpb/kv_pb.js";
import type { Connections } from "./connections.js";
import { EtcdCompactedError, EtcdReason, toBerthError } from "./etcd-errors.js";
import type { KeySpace } from "./etcd-keys.js";
import { keyValue, rangeBytes, type KeyRange, type KeyValue } from "./etcd-kv.js";
import { createRequestQueue } from "./request-queue.js";

export interface WatchOptions extends KeyRange {
  /** The first revision to deliver; default: changes after the watch starts. */
  readonly startRevision?: bigint;
  /** Also deliver each key's previous state. */
  readonly prevKv?: boolean;
  /** Only puts, or only deletes. */
  readonly only?: "put" | "delete";
  /**
   * Deliver etcd's periodic progress notifications as empty batches (etcd sends them every
   * `--experimental-watch-progress-notify-interval`, 10 minutes by default).
   */
  readonly progressNotify?: boolean;
  /** Ends the watch (the iteration returns). */
  readonly signal?: AbortSignal;
  /** How long the watch keeps trying to reopen on some member before failing UNAVAILABLE (default 30 s). */
  readonly reconnectWithinMs?: number;
}

export interface WatchEvent {
  readonly type: "put" | "delete";
  /** After the change (a delete: the key and the delete's revision, no value). */
  readonly kv: KeyValue;
  readonly prevKv?: KeyValue;
}

/** Changes delivered together: every change up to and including `revision` has been delivered. */
export interface WatchBatch {
  readonly revision: bigint;
  /** Empty for a progress notification. */
  readonly events: WatchEvent[];
}

const FIRST_BACKOFF_MS = 50;
const MAX_BACKOFF_MS = 1_000;

export async function* watchChanges(
  connections: Connections,
  keys: KeySpace,
  clock: Clock,
  options: WatchOptions,
): AsyncGenerator<WatchBatch, void, undefined> {
  const signal = options.signal;
  const reconnectWithinMs = options.reconnectWithinMs ?? 30_000;
  /** The next revision to deliver; 0n until etcd says where "now" is. */
  let next = options.startRevision ?? 0n;
  let failingSince: number | undefined;
  let backoff = FIRST_BACKOFF_MS;
  const range = rangeBytes(keys, options);
  while (!signal?.aborted) {
    const endpoint = connections.current();
    const requests = createRequestQueue<WatchRequest>();
    const stream = new AbortController();
    const stop = () => stream.abort(signal?.reason);
    signal?.addEventListener("abort", stop, { once: true });
    requests.push(
      create(WatchRequestSchema, {
        requestUnion: {
          case: "createRequest",
          value: {
            ...range,
            startRevision: next,
            prevKv: options.prevKv ?? false,
            progressNotify: options.progressNotify ?? false,
            filters: options.only === "put" ? [WatchCreateRequest_FilterType.NODELETE] : options.only === "delete" ? [WatchCreateRequest_FilterType.NOPUT] : [],
          },
        },
      }),
    );
    let watchId: bigint | undefined;
    try {
      const headers = await connections.headers(endpoint);
      for await (const response of endpoint.watch.watch(requests, { signal: stream.signal, headers })) {
        if (response.compactRevision > 0n) throw new EtcdCompactedError(next, response.compactRevision);
        if (response.created) {
          watchId = response.watchId;
          if (next === 0n) next = (response.header?.revision ?? 0n) + 1n;
          failingSince = undefined;
          backoff = FIRST_BACKOFF_MS;
        }
        // Cancelled for another reason than compaction: the rights to the range, or a bad range.
        if (response.canceled)
          throw new ConnectError(
            response.cancelReason || "etcd cancelled the watch",
            /permission denied/.test(response.cancelReason) ? Code.PermissionDenied : Code.Unknown,
          );
        // Answers to on-demand progress requests (another client's, on a shared stream) carry no watch id of ours.
        if (response.created || response.watchId !== watchId) continue;
        if (response.events.length > 0) {
          const events = response.events.map((event) => ({
            type: event.type === Event_EventType.DELETE ? ("delete" as const) : ("put" as const),
            kv: keyValue(keys, event.kv!),
            ...(event.prevKv ? { prevKv: keyValue(keys, event.prevKv) } : {}),
          }));
          const revision = events[events.length - 1]!.kv.modRevision;
          next = revision + 1n;
          yield { revision, events };
        } else if (options.progressNotify && response.header) {
          const revision = response.header.revision;
          if (revision >= next) next = revision + 1n;
          yield { revision, events: [] };
        }
      }
      // The member ended the stream (it is shutting down): reopen elsewhere, as after a failure.
      throw new ConnectError("etcd ended the watch stream", Code.Unavailable);
    } catch (error) {
      if (signal?.aborted) return;
      const mapped = toBerthError(error, { op: "watch", endpoint: endpoint.url, write: false, revision: next });
      if (mapped.reason === EtcdReason.COMPACTED) throw new EtcdCompactedError(next, mapped instanceof EtcdCompactedError ? mapped.compactRevision : undefined);
      if (mapped.reason !== EtcdReason.UNAVAILABLE) throw mapped;
      connections.failed(endpoint);
      failingSince ??= clock.monotonicNow();
      if (clock.monotonicNow() - failingSince >= reconnectWithinMs) throw mapped;
      await pause(clock, backoff, signal);
      backoff = Math.min(backoff * 2, MAX_BACKOFF_MS);
    } finally {
      signal?.removeEventListener("abort", stop);
      requests.end();
      stream.abort();
    }
  }
}

/** Waits `ms` on `clock`, or less if `signal` aborts. */
function pause(clock: Clock, ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clock.clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = clock.setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
