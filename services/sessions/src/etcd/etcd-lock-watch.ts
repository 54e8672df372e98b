/**
 * WatchLocks on etcd: the lock changes derived from etcd's own watch of the lock keys (`l/`), at
 * etcd's revisions, without polling. The queue of each file is kept as a model (waiter keys in
 * create-revision order, as etcd-locks.ts serves them): a new key first in its queue is a grant,
 * behind others a waiter joining; a deleted first key is a release (an expiry too: the granting
 * instance revokes it), and the next key in the queue is granted at the same revision; any other
 * deleted key is a waiter leaving. A start revision etcd compacted away, or ahead of its current
 * revision, is answered with the current state and a reset marker. What comes up to the revision
 * the watch opened at (the current state, a resume's replay) is a backlog, pulled as the reader
 * takes it; only the changes after it count against the watcher's bound, or a watcher resumed
 * after a lag, whose replay is longer than the bound, would be ended lagged again at once.
 * The changes of one etcd revision (a release and the grant it hands on; the keys one transaction
 * wrote) share it, so a watcher that lags names the last revision all of whose changes it took:
 * one that lagged part way through a revision is sent that revision's changes again.
 */
import type { Clock } from "@berth/shared/clock";
import { isEtcdCompacted, type EtcdClient, type KeyValue } from "@berth/etcd";
import { locksWatcherLagged } from "../locks/lock-changes.js";
import type { LockChange, LockWatcher, LockWatchItem, LockWatchRequest } from "../locks/source-locks-api.js";
import { PumpedWatcher } from "./pumped-watcher.js";
import { partyOf } from "./etcd-lock-party.js";

const LOCKS = "l/";

interface Queued {
  readonly key: string;
  readonly createRevision: bigint;
  readonly owner: string;
  readonly kind: "lease" | "stream";
}

/** The file a waiter key `l/<file>/w/<lease>` belongs to. */
function fileOfKey(key: string): string {
  return decodeURIComponent(key.slice(LOCKS.length, key.lastIndexOf("/w/")));
}

/** An item, and whether it is the last of its revision this watch is handed. */
type RevisionItem = LockWatchItem & { readonly endsRevision: boolean };

/** A lock watcher on etcd, which its store ends with an error of its own (a shutdown). */
export interface EtcdLockWatcher extends LockWatcher {
  fail(error: unknown): void;
  return(): Promise<IteratorResult<LockWatchItem>>;
}

/** A watcher of the locks on etcd; see the module comment. */
export function watchEtcdLocks(client: EtcdClient, clock: Clock, request: LockWatchRequest, maxBuffered: number): EtcdLockWatcher {
  // The last revision all of whose changes the reader took. Before its `caught_up` (the current
  // state, which is no revision's changes) a watcher that lags resumes as it was asked: again from
  // the start revision, or afresh; from it on, from where its view starts, also when that is below
  // a start revision ahead of etcd's (a reset).
  let complete = request.startRevision;
  let caughtUp = false;
  let openedAt: bigint | undefined;
  const watcher = new PumpedWatcher<RevisionItem>({
    source: (signal) => lockItems(client, clock, request, signal, (revision) => (openedAt = revision)),
    maxBuffered,
    isLive: (item) => openedAt !== undefined && item.revision > openedAt,
    delivered: (item) => {
      if (item.kind === "caught_up") {
        caughtUp = true;
        complete = item.revision;
      } else if (caughtUp) {
        const whole = item.endsRevision ? item.revision : item.revision - 1n;
        if (whole > complete) complete = whole;
      }
    },
    lagged: () => locksWatcherLagged(complete),
  });
  return Object.assign(watcher, { progressRevision: () => complete });
}

/** The watch's items; `opened` is told the revision it opened at, before the first item. */
async function* lockItems(
  client: EtcdClient,
  clock: Clock,
  request: LockWatchRequest,
  signal: AbortSignal,
  opened: (revision: bigint) => void,
): AsyncGenerator<RevisionItem> {
  const queues = new Map<string, Queued[]>();
  const accept = (file: string) => request.file === undefined || request.file === file;
  const load = (kvs: KeyValue[]) => {
    queues.clear();
    for (const kv of [...kvs].sort((a, b) => (a.createRevision < b.createRevision ? -1 : 1))) add(kv);
  };
  const add = (kv: KeyValue): Queued[] => {
    const file = fileOfKey(kv.key);
    const party = partyOf(kv);
    const queue = queues.get(file) ?? [];
    queue.push({ key: kv.key, createRevision: kv.createRevision, owner: party.owner, kind: party.kind });
    queues.set(file, queue);
    return queue;
  };
  const current = await client.range({ key: LOCKS, prefix: true });
  opened(current.revision);
  let from = current.revision;
  let reset = false;
  const resume = request.startRevision > 0n;
  if (resume && request.startRevision <= current.revision) {
    try {
      load((await client.range({ key: LOCKS, prefix: true, revision: request.startRevision })).kvs);
      from = request.startRevision;
    } catch (error) {
      if (!isEtcdCompacted(error)) throw error;
      reset = true;
    }
  } else if (resume) reset = true;
  if (!resume || reset) {
    load(current.kvs);
    if (request.includeCurrent || reset) {
      const at = clock.now();
      for (const [file, queue] of queues) {
        if (!accept(file)) continue;
        for (const [index, party] of queue.entries()) {
          const kind = index === 0 ? "current_holder" : "current_waiter";
          yield { kind: "change", revision: from, change: change(file, kind, party, index, at), endsRevision: false };
        }
      }
    }
  }
  yield { kind: "caught_up", revision: from, reset, endsRevision: true };
  for await (const batch of client.watch({ key: LOCKS, prefix: true, startRevision: from + 1n, signal })) {
    // etcd sends every event of a revision in one batch: the last change of each revision ends it.
    const changes: Array<{ revision: bigint; change: LockChange }> = [];
    for (const event of batch.events) {
      const file = fileOfKey(event.kv.key);
      const revision = event.kv.modRevision;
      const at = clock.now();
      const out: LockChange[] = [];
      if (event.type === "put") {
        const queue = queues.get(file);
        if (queue?.some((q) => q.key === event.kv.key)) continue; // its turn taken: no news
        const after = add(event.kv);
        const place = after.length - 1;
        out.push(change(file, place === 0 ? "granted" : "waiter_joined", after[place]!, place, at));
      } else {
        const queue = queues.get(file) ?? [];
        const index = queue.findIndex((q) => q.key === event.kv.key);
        if (index < 0) continue;
        const [gone] = queue.splice(index, 1);
        if (queue.length === 0) queues.delete(file);
        if (index === 0) {
          out.push(change(file, "released", gone!, 0, at));
          if (queue[0] !== undefined) out.push(change(file, "granted", queue[0], 0, at));
        } else out.push(change(file, "waiter_left", gone!, index, at));
      }
      if (!accept(file)) continue;
      for (const one of out) changes.push({ revision, change: one });
    }
    for (const [i, one] of changes.entries()) yield { kind: "change", ...one, endsRevision: changes[i + 1]?.revision !== one.revision };
  }
}

function change(file: string, kind: LockChange["kind"], party: Queued, index: number, at: number): LockChange {
  const holder = kind === "granted" || kind === "released" || kind === "current_holder";
  return {
    file,
    kind,
    owner: party.owner,
    fencingToken: holder ? Number(party.createRevision) : 0,
    expiresAt: null,
    position: holder ? 0 : index,
    at,
    holderKind: party.kind,
  };
}
