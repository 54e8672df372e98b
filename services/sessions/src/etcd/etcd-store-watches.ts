/**
 * The watchers of the etcd session store: of one session (etcd's watch of its entries, with the
 * snapshot after each live entry when asked), and of every session at etcd's revisions. Each is a
 * PumpedWatcher the store keeps until it ends, so that closing the store ends them.
 */
import { isBerthError } from "@berth/shared/errors";
import { isEtcdCompacted, type EtcdClient } from "@berth/etcd";
import { applyEvent } from "../reducer.js";
import { refuseDeletedSeqs, sessionsLagged, sessionWatcherLagged } from "../session-refusals.js";
import type { EventWatcher, SessionChange, SessionsWatcher, SessionsWatchStart, WatchAllOptions, WatchEvent, WatchOptions } from "../session-store-api.js";
import type { EtcdJournal } from "./etcd-journal.js";
import type { SessionState } from "./etcd-journal-api.js";
import { PumpedWatcher } from "./pumped-watcher.js";
import { HEADS } from "./store-keys.js";

/** What the store's watchers are made of. */
export interface EtcdWatchContext {
  readonly journal: EtcdJournal;
  /** The journal's client: the revision a watcher of every session starts after. */
  readonly client: EtcdClient;
  readonly now: () => number;
  /** A watcher's buffer bound unless it asks for another. */
  readonly maxBuffered: number;
  /** The store's open watchers: each is added on creation and removed when it ends. */
  readonly watchers: Set<PumpedWatcher<unknown>>;
  /** Watchers of every session not yet sure of their start revision: a list waits for them. */
  readonly watchStarts: Set<Promise<void>>;
  /** The session's state right after `seq`. */
  stateAt(sessionId: string, seq: number): Promise<SessionState>;
}

/** A watcher of one session (see {@link EtcdSessionStore.watch}), its input checked. */
export function watchSession(context: EtcdWatchContext, sessionId: string, fromSeq: number, options: WatchOptions): EventWatcher<WatchEvent> {
  let lastDelivered = Math.max(0, fromSeq - 1);
  let live = false;
  const watcher: PumpedWatcher<WatchEvent> = new PumpedWatcher<WatchEvent>({
    source: (signal) => (options.includeSnapshot ? withSnapshots(context, sessionId, fromSeq, signal) : context.journal.watch(sessionId, fromSeq, { signal })),
    maxBuffered: options.maxBuffered ?? context.maxBuffered,
    isLive: (event) => {
      if (event.kind === "caught_up") {
        live = true;
        return false;
      }
      return live;
    },
    delivered: (event) => {
      lastDelivered = Math.max(lastDelivered, event.kind === "entry" ? event.entry.seq : event.lastSeq);
    },
    lagged: () => sessionWatcherLagged(`watcher of session ${sessionId} fell behind`, sessionId, lastDelivered),
    ended: () => context.watchers.delete(watcher as PumpedWatcher<unknown>),
  });
  context.watchers.add(watcher as PumpedWatcher<unknown>);
  return watcher;
}

/**
 * A session's watch with the snapshot each live entry produced (and the current one on the
 * caught-up marker): the state read first, and every entry after it applied to it, backlog
 * included, whatever `fromSeq` the watcher asked for.
 */
async function* withSnapshots(context: EtcdWatchContext, sessionId: string, fromSeq: number, signal: AbortSignal): AsyncGenerator<WatchEvent, void, undefined> {
  const base = await context.journal.state(sessionId, { now: context.now });
  refuseDeletedSeqs(sessionId, fromSeq, base.deletedThrough);
  let snapshot = base.snapshot;
  let seq = base.lastSeq;
  let live = false;
  for await (const event of context.journal.watch(sessionId, Math.min(fromSeq, seq + 1), { signal })) {
    if (event.kind === "caught_up") {
      live = true;
      yield { ...event, snapshot };
      continue;
    }
    if (event.entry.seq > seq) {
      snapshot = applyEvent(snapshot, event.entry, { now: context.now });
      seq = event.entry.seq;
    }
    if (event.entry.seq < fromSeq) continue;
    yield live ? { ...event, snapshot } : event;
  }
}

/**
 * Watches every session at etcd's revisions. With `startRevision`, etcd's watch from the
 * revision after it replays what followed, unless etcd compacted it or it is ahead of the current
 * revision: then the watch starts at the current revision with `reset`. A watcher that falls
 * behind names the last revision all of whose changes it took (the changes of one transaction
 * share a revision).
 */
export function watchAllSessions(context: EtcdWatchContext, options: WatchAllOptions): SessionsWatcher {
  let delivered = 0;
  let complete = 0;
  let started!: (start: SessionsWatchStart) => void;
  let failed!: (error: unknown) => void;
  const startedWatch = new Promise<SessionsWatchStart>((resolve, reject) => {
    started = resolve;
    failed = reject;
  });
  // A watcher nobody asks where it started must not leave an unhandled rejection.
  startedWatch.catch(() => undefined);
  const start = startedWatch.then(
    () => undefined,
    () => undefined,
  );
  context.watchStarts.add(start);
  void start.then(() => context.watchStarts.delete(start));
  const asked = BigInt(options.startRevision ?? 0);
  const watcher: PumpedWatcher<SessionChange & { endsRevision: boolean }> = new PumpedWatcher({
    async *source(signal) {
      let from: bigint;
      let reset = false;
      try {
        from = (await context.client.range({ key: HEADS, prefix: true, limit: 1, keysOnly: true })).revision;
        if (asked > 0n && asked <= from) {
          try {
            // A read at a compacted revision fails as the watch from it would.
            await context.client.range({ key: HEADS, prefix: true, limit: 1, keysOnly: true, revision: asked });
            from = asked;
          } catch (error) {
            if (!isEtcdCompacted(error)) throw error;
            reset = true;
          }
        } else if (asked > 0n) reset = true;
      } catch (error) {
        failed(error);
        throw error;
      }
      complete = Number(from);
      started({ after: Number(from), caughtUpAt: Number(from), reset });
      // The last revision whose changes were all handed on: where a compaction's lag resumes.
      let pulled = Number(from);
      try {
        for await (const change of context.journal.watchAll({ signal, startRevision: from + 1n })) {
          if (options.includeSnapshot && !change.deleted) {
            const snapshot = await context.stateAt(change.sessionId, change.lastSeq).then(
              (state) => state.snapshot,
              () => undefined,
            );
            if (snapshot !== undefined) change.snapshot = snapshot;
          }
          yield change;
          if (change.endsRevision) pulled = change.revision;
        }
      } catch (error) {
        // etcd compacted what the watch had still to send: the reader resumes (a reset) after what it got.
        if (isBerthError(error) && error.reason === "WATCHER_LAGGED") throw sessionsLagged("watcher of all sessions fell behind etcd's compaction", pulled);
        throw error;
      }
    },
    maxBuffered: options.maxBuffered ?? context.maxBuffered,
    isLive: () => true,
    delivered: (change) => {
      delivered++;
      complete = change.endsRevision ? change.revision : Math.max(complete, change.revision - 1);
    },
    lagged: () => sessionsLagged(`watcher of all sessions fell behind after ${delivered} changes`, complete),
    ended: () => context.watchers.delete(watcher as PumpedWatcher<unknown>),
  });
  context.watchers.add(watcher as PumpedWatcher<unknown>);
  const withRevision = watcher as unknown as SessionsWatcher & { started: Promise<SessionsWatchStart> };
  return Object.assign(withRevision, { started: startedWatch, progressRevision: () => complete });
}
