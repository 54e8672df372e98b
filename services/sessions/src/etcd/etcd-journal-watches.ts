/**
 * The watches of the journal in etcd: of a session (its entries read at one revision, then etcd's
 * watch from the next: nothing falls between), of every session's appends and deletions, and of
 * every session's head. A revision etcd compacted away ends a watch WATCHER_LAGGED, resumable.
 */
import { BerthError } from "@berth/shared/errors";
import { isEtcdCompacted, type EtcdClient } from "@berth/etcd";
import { refuseDeletedSeqs, sessionWatcherLagged, watchedSessionDeleted } from "../session-refusals.js";
import type { SessionChange, WatchEvent } from "../session-store-api.js";
import type { HeadChange } from "./etcd-journal-api.js";
import type { JournalRead } from "./etcd-journal-reads.js";
import { decodeAppend } from "./etcd-journal-records.js";
import { entriesPrefix, HEADS, sessionOfHead } from "./store-keys.js";

/** What a session's watch reads its backlog from: the journal's reads. */
export interface BacklogSource {
  read(sessionId: string, fromSeq: number): Promise<JournalRead>;
}

/**
 * Watches a session from `fromSeq`: the entries already there, a caught-up marker, then every new
 * entry as it commits, in order, whichever instance appended it. Ends (returns) when
 * `signal` aborts; a deleted session ends it with not_found SESSION_DELETED, and a revision etcd
 * compacted away with resource_exhausted WATCHER_LAGGED naming the seq to resume from.
 */
export async function* watchSession(
  journal: BacklogSource,
  client: EtcdClient,
  sessionId: string,
  fromSeq = 1,
  options: { readonly signal?: AbortSignal } = {},
): AsyncGenerator<WatchEvent, void, undefined> {
  let lastDelivered = Math.max(0, fromSeq - 1);
  try {
    const backlog = await journal.read(sessionId, fromSeq);
    refuseDeletedSeqs(sessionId, fromSeq, backlog.deletedThrough);
    for await (const stored of backlog.entries()) {
      lastDelivered = stored.entry.seq;
      yield { kind: "entry", ...stored };
    }
    lastDelivered = Math.max(lastDelivered, backlog.lastSeq);
    yield { kind: "caught_up", lastSeq: backlog.lastSeq };
    for await (const batch of client.watch({
      key: entriesPrefix(sessionId),
      prefix: true,
      startRevision: backlog.revision + 1n,
      ...(options.signal ? { signal: options.signal } : {}),
    })) {
      for (const event of batch.events) {
        if (event.type === "delete") {
          throw watchedSessionDeleted(sessionId, lastDelivered);
        }
        for (const stored of decodeAppend(event.kv.value)) {
          if (stored.entry.seq <= lastDelivered) continue;
          lastDelivered = stored.entry.seq;
          yield { kind: "entry", ...stored };
        }
      }
    }
  } catch (error) {
    if (isEtcdCompacted(error)) throw sessionWatcherLagged(`watcher of session ${sessionId} fell behind etcd's compaction`, sessionId, lastDelivered);
    throw error;
  }
}

/**
 * Watches every session: one change per append (first..last seq, its last entry), or a session's
 * deletion (at its last seq), from `startRevision` (default: from now), in revision order. The
 * changes one transaction made share its revision; `endsRevision` marks the last of them, so a
 * watcher that stops after it knows its revision is complete.
 */
export async function* watchAllSessions(
  client: EtcdClient,
  options: { readonly signal?: AbortSignal; readonly startRevision?: bigint } = {},
): AsyncGenerator<SessionChange & { endsRevision: boolean }, void, undefined> {
  try {
    for await (const batch of client.watch({
      key: "e/",
      prefix: true,
      // A deletion's events carry what was deleted: the session's last seq. Entry keys are
      // written once, so their puts have no previous value to carry.
      prevKv: true,
      ...(options.startRevision !== undefined ? { startRevision: options.startRevision } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
    })) {
      // A deletion removes many keys at one revision: one change per session and revision.
      const changes: SessionChange[] = [];
      const deletions = new Map<string, SessionChange>();
      for (const event of batch.events) {
        const sessionId = event.kv.key.slice(2, event.kv.key.lastIndexOf("/"));
        const revision = Number(event.kv.modRevision);
        if (event.type === "put") {
          const entries = decodeAppend(event.kv.value).map((s) => s.entry);
          const last = entries.at(-1);
          if (last === undefined) continue;
          changes.push({ sessionId, firstSeq: entries[0]!.seq, lastSeq: last.seq, entry: last, deleted: false, revision });
        } else {
          const lastSeq = (event.prevKv ? decodeAppend(event.prevKv.value).at(-1)?.entry.seq : undefined) ?? 0;
          const key = `${revision}/${sessionId}`;
          const known = deletions.get(key);
          if (known) {
            known.lastSeq = Math.max(known.lastSeq, lastSeq);
            known.firstSeq = known.lastSeq;
          } else {
            const change: SessionChange = { sessionId, firstSeq: lastSeq, lastSeq, entry: undefined, deleted: true, revision };
            deletions.set(key, change);
            changes.push(change);
          }
        }
      }
      for (const [i, change] of changes.entries()) yield { ...change, endsRevision: changes[i + 1]?.revision !== change.revision };
    }
  } catch (error) {
    if (isEtcdCompacted(error))
      throw new BerthError("resource_exhausted", "watcher of all sessions fell behind etcd's compaction", {}, { reason: "WATCHER_LAGGED" });
    throw error;
  }
}

/**
 * Watches the heads of every session from `startRevision`: one change per append transaction
 * (however many appends it wrote), and one per deletion. Carries no entries: what a follower
 * that reads a session only when it needs to (the retention of completed sessions) watches.
 */
export async function* watchHeads(
  client: EtcdClient,
  options: { readonly signal?: AbortSignal; readonly startRevision: bigint },
): AsyncGenerator<HeadChange, void, undefined> {
  for await (const batch of client.watch({
    key: HEADS,
    prefix: true,
    startRevision: options.startRevision,
    ...(options.signal ? { signal: options.signal } : {}),
  })) {
    for (const event of batch.events) yield { sessionId: sessionOfHead(event.kv.key), revision: event.kv.modRevision, deleted: event.type === "delete" };
  }
}
