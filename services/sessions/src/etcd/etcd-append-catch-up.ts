/**
 * The appends another instance wrote between the last one a caller knows of and its own, read in
 * the append's own transactions: the success branch reads those between the caller's seq and the
 * head it compared, the failure branch those up to the head it brings back. The caller (the session
 * store) then has what it needs to build the snapshot after its append without reading the session
 * back: an append after another instance's costs its transaction, not a rebuild.
 *
 * At most {@link CATCH_UP_APPENDS} appends are read so: a caller further behind rebuilds from etcd's
 * snapshot cache and the journal's tail, as before.
 */
import { op, type RangeResult, type TxnOp } from "@berth/etcd";
import type { JournalEntry } from "../reducer.js";
import type { EtcdKnownState } from "./etcd-journal-api.js";
import { decodeAppend, type Head } from "./etcd-journal-records.js";
import { entriesPrefix, entryKey } from "./store-keys.js";

/**
 * Appends read to catch up at most: as many as a rebuild reads after etcd's snapshot cache
 * (written every 100 appends), so that reading them never costs more than the rebuild would.
 */
const CATCH_UP_APPENDS = 100;

/** Where a caller's catching up stands: its state is through `seq` of `incarnation`, plus `appends`. */
export interface CatchUp {
  readonly seq: number;
  readonly incarnation: bigint;
  /** The appends read so far after the caller's own seq, in order (each its entries). */
  readonly appends: readonly (readonly JournalEntry[])[];
}

export function startCatchUp(known: EtcdKnownState | undefined): CatchUp | undefined {
  return known === undefined || known.incarnation === 0n ? undefined : { seq: known.seq, incarnation: known.incarnation, appends: [] };
}

/**
 * The read for an append's success branch: the appends between the caller's seq and `head` (the
 * one the append compares, so `head.seq` is the last of them). Undefined when none are missing or
 * the caller knows another incarnation.
 */
export function gapRead(sessionId: string, catchUp: CatchUp | undefined, head: Head): TxnOp | undefined {
  if (catchUp === undefined || head.mod === 0n || head.create !== catchUp.incarnation || catchUp.seq >= head.seq) return undefined;
  return op.get({ key: entryKey(sessionId, catchUp.seq + 1), end: entryKey(sessionId, head.seq + 1), limit: CATCH_UP_APPENDS });
}

/** The read for an append's failure branch: the appends after the caller's seq, up to whatever head the branch reads. */
export function tailRead(sessionId: string, catchUp: CatchUp | undefined): TxnOp | undefined {
  if (catchUp === undefined) return undefined;
  const prefix = entriesPrefix(sessionId);
  // `/` + 1: the end of the session's entry keys.
  return op.get({ key: entryKey(sessionId, catchUp.seq + 1), end: `${prefix.slice(0, -1)}0`, limit: CATCH_UP_APPENDS });
}

/**
 * The catch-up with what a read brought, read at the same revision as `head`: through `head.seq`
 * when the read holds every append up to it, in order and without a hole; undefined (give up:
 * the caller rebuilds) when the head is of another incarnation or more appends are missing than a
 * read takes.
 */
export function caughtUp(catchUp: CatchUp | undefined, read: RangeResult, head: Head): CatchUp | undefined {
  if (catchUp === undefined || head.create !== catchUp.incarnation || read.more) return undefined;
  let seq = catchUp.seq;
  const appends = [...catchUp.appends];
  for (const kv of read.kvs) {
    const entries = decodeAppend(kv.value).map((stored) => stored.entry);
    if (entries[0]?.seq !== seq + 1) return undefined;
    seq = entries.at(-1)!.seq;
    appends.push(entries);
  }
  return seq === head.seq ? { seq, incarnation: catchUp.incarnation, appends } : undefined;
}

/** The appends between the caller's seq and an append at `firstSeq` of `incarnation`, when all were read. */
export function precedingOf(catchUp: CatchUp | undefined, incarnation: bigint, firstSeq: number): CatchUp["appends"] | undefined {
  return catchUp !== undefined && catchUp.incarnation === incarnation && catchUp.seq === firstSeq - 1 ? catchUp.appends : undefined;
}
