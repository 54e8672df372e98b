/**
 * Where the sessions service keeps its state in etcd, relative to the client's prefix (`berth/`
 * by default). Session ids (`[A-Za-z0-9_-]{1,128}`) are always followed by `/` inside a key, and a
 * locked file's canonical path is percent-encoded (`/` included), so no session's or file's range
 * holds another's.
 *
 * | key | value |
 * |---|---|
 * | `h/<session>` | the head: last seq, entries of the last append, the append's write id |
 * | `e/<session>/<first seq, 20 digits>` | one append's entries, as the journal's lines |
 * | `i/<session>/<idempotency key>` | first and last seq of the append that used it, its digest; or the deletion that used it |
 * | `s/<session>` | a cached snapshot and the seq it is at |
 * | `t/<session>` | the tombstone of a deleted session: its last seq, its deletions in the idempotency window |
 * | `l/<file>/w/<lease id, hex>` | a waiter for, or the holder of, a source lock; under its lease |
 * | `lt/<file>` | the last fencing token granted on a source lock (outside `l/`, so lock reads and watches do not see it) |
 * | `el/<scope>/<name>` | the claim of an election's winner; under its lease |
 */

/** Digits of a seq in an entry key: zero-padded so that key order is seq order. */
const SEQ_DIGITS = 20;

export const HEADS = "h/";
export const SNAPSHOTS = "s/";
export const TOMBSTONES = "t/";

export const headKey = (session: string): string => `${HEADS}${session}`;
export const snapshotKey = (session: string): string => `${SNAPSHOTS}${session}`;
export const tombstoneKey = (session: string): string => `${TOMBSTONES}${session}`;

/** The session a `t/` key names. */
export function sessionOfTombstone(key: string): string {
  if (!key.startsWith(TOMBSTONES)) throw new Error(`${key} is not a tombstone key`);
  return key.slice(TOMBSTONES.length);
}
/** Every entry key of a session starts with this. */
export const entriesPrefix = (session: string): string => `e/${session}/`;
export const entryKey = (session: string, firstSeq: number): string => `${entriesPrefix(session)}${String(firstSeq).padStart(SEQ_DIGITS, "0")}`;
/** Every idempotency key of a session starts with this. */
export const idempotencyPrefix = (session: string): string => `i/${session}/`;
/** Idempotency keys are any string up to 128 characters: encoded so that one cannot reach into another key. */
export const idempotencyKey = (session: string, key: string): string => `${idempotencyPrefix(session)}${encodeURIComponent(key)}`;

/** The session an `h/` key names. */
export function sessionOfHead(key: string): string {
  if (!key.startsWith(HEADS)) throw new Error(`${key} is not a head key`);
  return key.slice(HEADS.length);
}

/** The first seq of the append an `e/` key holds. */
export function firstSeqOfEntryKey(key: string): number {
  return Number(key.slice(key.lastIndexOf("/") + 1));
}

/** Every waiter key of the lock of `file` (a canonical absolute path) starts with this. */
export const lockWaitersPrefix = (file: string): string => `l/${encodeURIComponent(file)}/w/`;
/** The waiter key of an Acquire or Hold of `file` under etcd lease `leaseId`. */
export const lockWaiterKey = (file: string, leaseId: bigint): string => `${lockWaitersPrefix(file)}${leaseId.toString(16).padStart(16, "0")}`;

/**
 * The key of the last fencing token granted on `file`, written by the transaction that grants:
 * outside `l/`, so that a lock's range reads and watches see only its waiters.
 */
export const lastTokenKey = (file: string): string => `lt/${encodeURIComponent(file)}`;

/** The key of election `name` of `scope` (any string, percent-encoded). */
export const electionKey = (scope: string, name: string): string => `el/${encodeURIComponent(scope)}/${name}`;
