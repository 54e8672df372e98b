/**
 * Snapshots of sessions in etcd: a cache under `s/`, written only while the head is the
 * incarnation they were built from, and a session's state rebuilt from it plus the journal's tail.
 */
import type { Clock } from "@berth/shared/clock";
import { compare, op, type EtcdClient } from "@berth/etcd";
import { applyEvent, baseSnapshot, type SessionSnapshot } from "../reducer.js";
import type { SessionState } from "./etcd-journal-api.js";
import type { JournalRead } from "./etcd-journal-reads.js";
import { jsonOf } from "./etcd-journal-records.js";
import { headKey, snapshotKey } from "./store-keys.js";

/** What a state is read from: the journal's client, clock and reads. */
export interface SnapshotSource {
  readonly client: EtcdClient;
  readonly clock: Clock;
  read(sessionId: string, fromSeq?: number, limit?: number): Promise<JournalRead>;
}

/**
 * The session's state: its cached snapshot (when there is one) with the entries after it applied.
 * A session with no head gets the base snapshot and `exists: false`. With `untilSeq`, the state
 * right after that seq (an earlier append's result).
 */
export async function readState(
  source: SnapshotSource,
  sessionId: string,
  options: { readonly now?: () => number; readonly untilSeq?: number } = {},
): Promise<SessionState> {
  const until = options.untilSeq;
  if (until !== undefined) {
    if (!Number.isInteger(until) || until < 1) throw new RangeError(`untilSeq must be a positive seq, got ${until}`);
    return rebuild(source, sessionId, options, until);
  }
  const cachedKv = await source.client.get(snapshotKey(sessionId));
  const cached = jsonOf(cachedKv);
  let snapshot = baseSnapshot(sessionId);
  let seq = 0;
  if (cached !== undefined && typeof cached.seq === "number" && cached.snapshot !== null && typeof cached.snapshot === "object") {
    snapshot = { ...snapshot, ...(cached.snapshot as SessionSnapshot) };
    seq = cached.seq;
  }
  const read = await source.read(sessionId, seq + 1);
  // The cache is only written while its incarnation's head lives (see saveSnapshot); a session
  // deleted and re-created since (or a cache ahead of the head) is rebuilt from its first entry.
  if (seq > 0 && (read.incarnation !== BigInt(String(cached?.incarnation ?? -1)) || seq > read.lastSeq)) return rebuild(source, sessionId, options);
  const now = options.now ?? (() => source.clock.now());
  for await (const stored of read.entries()) snapshot = applyEvent(snapshot, stored.entry, { now });
  return {
    sessionId,
    snapshot,
    lastSeq: read.lastSeq,
    exists: read.lastSeq > 0,
    revision: read.revision,
    incarnation: read.incarnation,
    headRevision: read.headRevision,
    deletedThrough: read.deletedThrough,
  };
}

/** The state from the first entry, up to `untilSeq` when given. */
async function rebuild(source: SnapshotSource, sessionId: string, options: { readonly now?: () => number }, untilSeq?: number): Promise<SessionState> {
  const read = await source.read(sessionId, 1, untilSeq ?? 0);
  const now = options.now ?? (() => source.clock.now());
  let snapshot = baseSnapshot(sessionId);
  for await (const stored of read.entries()) snapshot = applyEvent(snapshot, stored.entry, { now });
  const lastSeq = untilSeq === undefined ? read.lastSeq : Math.min(untilSeq, read.lastSeq);
  return {
    sessionId,
    snapshot,
    lastSeq,
    exists: lastSeq > 0,
    revision: read.revision,
    incarnation: read.incarnation,
    headRevision: read.headRevision,
    deletedThrough: read.deletedThrough,
  };
}

/**
 * Caches `snapshot` (the state at `seq` of incarnation `incarnation`) under `s/`, only while that
 * incarnation's head still exists: a deleted session's snapshot never outlives it. A snapshot
 * holding numbers JSON cannot write (NaN, ±Infinity) is not cached: it is rebuilt when needed.
 * Resolves false when nothing was written.
 */
export async function saveSnapshot(
  client: EtcdClient,
  sessionId: string,
  state: { readonly seq: number; readonly incarnation: bigint; readonly snapshot: SessionSnapshot },
): Promise<boolean> {
  if (state.seq <= 0 || state.incarnation <= 0n) return false;
  let exact = true;
  const text = JSON.stringify({ seq: state.seq, incarnation: String(state.incarnation), snapshot: state.snapshot }, (_key, value: unknown) => {
    if (typeof value === "number" && (!Number.isFinite(value) || Object.is(value, -0))) exact = false;
    return value;
  });
  if (!exact) return false;
  const result = await client.txn({
    compare: [compare.create(headKey(sessionId), "==", state.incarnation)],
    success: [op.put(snapshotKey(sessionId), text)],
  });
  return result.succeeded;
}
