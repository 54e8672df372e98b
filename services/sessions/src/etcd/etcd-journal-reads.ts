/**
 * The reads of the journal in etcd: a session's entries from a seq with its head, at one revision
 * (the head and the first page in one transaction, the other pages at its revision: the last seq
 * and the entries agree), and the sessions that exist, a page at a time.
 */
import { op, type EtcdClient, type KeyValue } from "@berth/etcd";
import type { StoredEntry } from "../journal/journal-store.js";
import { decodeAppend, headOf, NO_TOMBSTONE, tombstoneOf } from "./etcd-journal-records.js";
import { entriesPrefix, entryKey, headKey, HEADS, sessionOfHead, tombstoneKey } from "./store-keys.js";

/** A session's entries from a seq, read at one revision. */
export interface JournalRead {
  /** The store's revision the read saw: follow from `revision + 1n`. */
  readonly revision: bigint;
  /** The session's last seq at `revision` (0: no session). */
  readonly lastSeq: number;
  /** The head's create revision at `revision` (0n: no session). */
  readonly incarnation: bigint;
  /** The head's mod revision at `revision` (0n: no session): what a deletion decided on this read compares. */
  readonly headRevision: bigint;
  /** The last seq of the session's deleted incarnations (0: never deleted): seqs up to it are gone for good. */
  readonly deletedThrough: number;
  /** The entries with seq ≥ the one asked for, in order (pages read at `revision`). */
  entries(): AsyncGenerator<StoredEntry, void, undefined>;
}

/** A session as a list finds it. */
export interface ListedSession {
  readonly sessionId: string;
  readonly lastSeq: number;
  /** The head's create revision. */
  readonly incarnation: bigint;
  /** The head's mod revision (the last append's). */
  readonly headRevision: bigint;
}

/**
 * The entries with seq ≥ `fromSeq`, read at one revision: the append holding `fromSeq` and every
 * later one, in pages. The first page is read before this resolves (so `revision` is known).
 */
export async function readJournal(client: EtcdClient, pageAppends: number, sessionId: string, fromSeq = 1, limit = 0): Promise<JournalRead> {
  const prefix = entriesPrefix(sessionId);
  const prefixEnd = `${prefix.slice(0, -1)}0`; // `/` + 1: the end of the session's entry keys
  const from = Math.max(1, fromSeq);
  const first = await client.txn({
    compare: [],
    success: [
      op.get({ key: headKey(sessionId) }),
      op.get({ key: tombstoneKey(sessionId) }),
      // The append that starts before `from` and may hold it…
      op.get({ key: prefix, end: entryKey(sessionId, from), sort: { by: "key", order: "descend" }, limit: 1 }),
      // …and the appends that start at or after it.
      op.get({ key: entryKey(sessionId, from), end: prefixEnd, sort: { by: "key", order: "ascend" }, limit: pageAppends }),
    ],
  });
  const [headResult, tombResult, before, after] = first.results.map((r) => ("get" in r ? r.get : undefined));
  const revision = first.revision;
  const head = headOf(headResult?.kvs[0], tombstoneOf(tombResult?.kvs[0]));
  async function* entries(): AsyncGenerator<StoredEntry, void, undefined> {
    let given = 0;
    const take = function* (kvs: KeyValue[]): Generator<StoredEntry, boolean> {
      for (const kv of kvs) {
        for (const stored of decodeAppend(kv.value)) {
          if (stored.entry.seq < from) continue;
          if (stored.entry.seq > head.seq) return false;
          yield stored;
          if (limit > 0 && ++given >= limit) return false;
        }
      }
      return true;
    };
    if (!(yield* take(before?.kvs ?? []))) return;
    let page = after;
    while (page !== undefined) {
      if (!(yield* take(page.kvs))) return;
      const last = page.kvs.at(-1);
      if (!page.more || last === undefined) return;
      page = await client.range({ key: `${last.key}\0`, end: prefixEnd, sort: { by: "key", order: "ascend" }, limit: pageAppends, revision });
    }
  }
  return { revision, lastSeq: head.seq, incarnation: head.create, headRevision: head.mod, deletedThrough: head.tomb.lastSeq, entries };
}

/**
 * The sessions with a head (at least one entry), sorted by id, with their last seq: a page after
 * `after`, of at most `limit` (0: all), read at one revision.
 */
export async function listSessions(
  client: EtcdClient,
  pageAppends: number,
  options: { readonly after?: string; readonly limit?: number } = {},
): Promise<{ sessions: ListedSession[]; revision: bigint }> {
  const end = `${HEADS.slice(0, -1)}0`;
  const sessions: ListedSession[] = [];
  let key = options.after === undefined ? HEADS : `${headKey(options.after)}\0`;
  let revision: bigint | undefined;
  const limit = options.limit ?? 0;
  for (;;) {
    const want = limit > 0 ? Math.min(pageAppends, limit - sessions.length) : pageAppends;
    const page = await client.range({ key, end, limit: want, ...(revision !== undefined ? { revision } : {}) });
    revision ??= page.revision;
    for (const kv of page.kvs)
      sessions.push({
        sessionId: sessionOfHead(kv.key),
        lastSeq: headOf(kv, NO_TOMBSTONE).seq,
        incarnation: kv.createRevision,
        headRevision: kv.modRevision,
      });
    const last = page.kvs.at(-1);
    if (!page.more || last === undefined || (limit > 0 && sessions.length >= limit)) return { sessions, revision };
    key = `${last.key}\0`;
  }
}
