/**
 * The sweep of the tombstones in etcd: what a deletion keeps for its idempotency window (the
 * deleted session's keys, the deletion itself) is forgotten once the window passed; each
 * tombstone keeps the session's last seq for good.
 */
import { compare, op, type EtcdClient } from "@berth/etcd";
import { remembered, type Deletion } from "../session-tombstones.js";
import { jsonOf, tombstoneOf, type TombstoneValue } from "./etcd-journal-records.js";
import { idempotencyPrefix, sessionOfTombstone, TOMBSTONES } from "./store-keys.js";

/** What a sweep goes by. */
export interface TombstoneSweepOptions {
  /** The time of the sweep (ms since the epoch). */
  readonly now: number;
  /** How long a deletion is remembered. */
  readonly windowMs: number;
  /** Keys per page read. */
  readonly pageSize: number;
}

/**
 * Forgets the deletions whose idempotency window passed: the deleted sessions' records under
 * `i/` and the deletions in their tombstones (each tombstone keeps its last seq for good). Every
 * write compares what it read, so a sweep racing an append or a deletion (from any instance)
 * leaves their writes alone. Resolves when the oldest deletion kept was made (Infinity: none).
 */
export async function sweepTombstones(client: EtcdClient, options: TombstoneSweepOptions): Promise<number> {
  const { now, windowMs, pageSize } = options;
  let oldest = Infinity;
  const end = `${TOMBSTONES.slice(0, -1)}0`;
  let from = TOMBSTONES;
  for (;;) {
    const page = await client.range({ key: from, end, limit: pageSize });
    for (const kv of page.kvs) {
      const tomb = tombstoneOf(kv);
      const kept = tomb.deletions.filter((d) => remembered(d, now, windowMs));
      for (const d of kept) oldest = Math.min(oldest, d.deletedAt);
      if (kept.length === tomb.deletions.length) continue;
      await forgetDeletedKeys(client, pageSize, sessionOfTombstone(kv.key), tomb, kept);
      await client.txn({
        compare: [compare.mod(kv.key, "==", kv.modRevision)],
        success: [op.put(kv.key, JSON.stringify({ lastSeq: tomb.lastSeq, deletions: kept }))],
      });
    }
    const last = page.kvs.at(-1);
    if (!page.more || last === undefined) return oldest;
    from = `${last.key}\0`;
  }
}

/** Deletes the records under `i/` of the session's deleted incarnations but those of the `kept` deletions. */
async function forgetDeletedKeys(client: EtcdClient, pageSize: number, sessionId: string, tomb: TombstoneValue, kept: readonly Deletion[]): Promise<void> {
  const prefix = idempotencyPrefix(sessionId);
  const end = `${prefix.slice(0, -1)}0`;
  let from = prefix;
  for (;;) {
    const page = await client.range({ key: from, end, limit: pageSize });
    for (const kv of page.kvs) {
      const record = jsonOf(kv)!;
      const lastSeq = Number(record.lastSeq);
      const firstSeq = Number(record.firstSeq ?? record.lastSeq);
      if (record.deletion !== true && lastSeq > tomb.lastSeq) continue; // the live session's
      const key = decodeURIComponent(kv.key.slice(prefix.length));
      const remembered = kept.some((d) =>
        record.deletion === true ? d.lastSeq === lastSeq && d.idempotencyKey === key : d.firstSeq <= firstSeq && lastSeq <= d.lastSeq,
      );
      if (remembered) continue;
      await client.txn({ compare: [compare.mod(kv.key, "==", kv.modRevision)], success: [op.delete({ key: kv.key })] });
    }
    const last = page.kvs.at(-1);
    if (!page.more || last === undefined) return;
    from = `${last.key}\0`;
  }
}
