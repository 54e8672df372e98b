/**
 * Retention of completed sessions on etcd (`--completed-retention` with `--store etcd`): the file
 * store's rule (retention.ts): a completed or discarded session is deleted once the period has
 * passed since its completing entry's `ts`, kept by each instance of a cluster on its own, without
 * polling etcd.
 *
 * What an instance knows comes from the sessions' heads: at start one range read of them (every
 * session is looked at once, as the file store's first sweep does), then a watch of them from
 * that read's revision on, one change per append transaction or deletion, whichever instance wrote
 * it. A session that changed is looked at again one period after the change: a completing entry
 * the change brought cannot fall due sooner. A look reads the session's state (etcd's snapshot
 * cache and the tail) and, when it is completed, replays its journal for the completing entry's
 * time, then the session waits in memory for that time plus the period. Sessions that do not
 * change cost nothing more.
 *
 * The deletion is DeleteSession's transaction, compared with the head's mod revision the look
 * found (EtcdJournal.deleteUnchanged): an append that lands after the look, through any instance,
 * keeps the session (it is looked at again), and when two instances delete one session at once,
 * one transaction deletes it and the other finds it gone. Watchers and readers see a DeleteSession.
 *
 * On the wall clock, as retention.ts; sweep-schedule.ts runs one sweep at a time, when the next
 * session falls due. A watch that ends (etcd out of reach beyond the client's reconnection, or
 * compacted past) starts over from a new range read.
 */
import type { Clock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import { completionTime } from "../retention.js";
import { SweepSchedule } from "../sweep-schedule.js";
import { isCompletedPhase } from "../vocabulary.js";
import type { EtcdJournal } from "./etcd-journal.js";

/** How long after its watch or its first read failed the retention reads the heads again. */
const RESTART_AFTER_MS = 5_000;
/** How long after a failed look a session is looked at again. */
const RETRY_AFTER_MS = 60_000;

export interface EtcdRetentionOptions {
  readonly journal: EtcdJournal;
  /** How long a completed session is kept after its completing entry. */
  readonly retentionMs: number;
  readonly clock: Clock;
  readonly logger?: Logger | undefined;
  /** Told of each session this retention deleted (the store forgets what it kept of it). */
  readonly deleted?: (sessionId: string, lastSeq: number) => void;
}

/** What this instance knows of a session that may fall due. Replaced, never changed. */
interface Tracked {
  /** The highest head mod revision known of it. */
  readonly seen: bigint;
  /** When to look at it, or when completed, to delete it (wall clock, epoch ms). */
  readonly dueAt: number;
  /** A look found it completed at head `seen`, its completing entry at `completedAt`. */
  readonly completed?: { readonly lastSeq: number; readonly completedAt: number };
}

/** The retention of one etcd session store; see the module comment. */
export class EtcdRetention {
  private readonly tracked = new Map<string, Tracked>();
  /** When sweeps run (one at a time); the stores sweep, wait for and ask about sweeps through it. */
  readonly schedule: SweepSchedule;
  private readonly abort = new AbortController();
  private following: Promise<void> | undefined;
  /** The highest head revision the range read or the watch has brought. */
  private reached = 0n;
  private readonly waiters = new Set<{ revision: bigint; resolve: () => void }>();
  private readonly now: () => number;

  constructor(private readonly options: EtcdRetentionOptions) {
    this.now = () => options.clock.now();
    this.schedule = new SweepSchedule({ clock: options.clock, logger: options.logger, sweepOnce: () => this.sweepOnce() });
  }

  /** Reads the heads, starts the watch, and resolves once the first sweep has run (or failed). */
  start(): Promise<void> {
    return new Promise((started) => {
      this.following = this.follow(started);
    });
  }

  /** Ends the watch and the timer; resolves once a sweep in progress has ended. */
  async stop(): Promise<void> {
    this.abort.abort();
    await this.schedule.stop();
    await this.following;
    for (const waiter of this.waiters) waiter.resolve();
  }

  /** Resolves once the range read or the watch has brought every head change up to `revision` (tests). */
  seen(revision: bigint): Promise<void> {
    if (revision <= this.reached || this.abort.signal.aborted) return Promise.resolve();
    return new Promise((resolve) => this.waiters.add({ revision, resolve }));
  }

  private async follow(started: () => void): Promise<void> {
    const { journal, clock, retentionMs, logger } = this.options;
    const signal = this.abort.signal;
    while (!signal.aborted) {
      try {
        const listed = await journal.list();
        for (const session of listed.sessions) this.changed(session.sessionId, session.headRevision, -Infinity);
        this.reach(listed.revision);
        const watching = (async () => {
          for await (const change of journal.watchHeads({ signal, startRevision: listed.revision + 1n })) {
            if (change.deleted) {
              if ((this.tracked.get(change.sessionId)?.seen ?? 0n) < change.revision) this.tracked.delete(change.sessionId);
            } else {
              this.changed(change.sessionId, change.revision, clock.now() + retentionMs);
            }
            this.reach(change.revision);
          }
          if (!signal.aborted) throw new Error("the watch of the sessions' heads ended");
        })();
        await Promise.all([this.schedule.sweep().then(started), watching]);
      } catch (error) {
        started();
        if (signal.aborted) return;
        logger?.warn({ err: error }, "the retention of completed sessions lost its view of etcd; it reads the sessions' heads again shortly");
        await new Promise<void>((resolve) => {
          const timer = clock.setTimeout(resolve, RESTART_AFTER_MS);
          signal.addEventListener(
            "abort",
            () => {
              clock.clearTimeout(timer);
              resolve();
            },
            { once: true },
          );
        });
      }
    }
  }

  /** The session's head moved to `revision`: it is looked at by `lookAt`, unless that is already known. */
  private changed(sessionId: string, revision: bigint, lookAt: number): void {
    const known = this.tracked.get(sessionId);
    if (known !== undefined && known.seen >= revision) return;
    const dueAt = Math.min(known?.dueAt ?? Infinity, lookAt);
    this.tracked.set(sessionId, { seen: revision, dueAt });
    this.schedule.due(dueAt);
  }

  private reach(revision: bigint): void {
    if (revision > this.reached) this.reached = revision;
    for (const waiter of this.waiters) {
      if (waiter.revision > this.reached) continue;
      this.waiters.delete(waiter);
      waiter.resolve();
    }
  }

  /** Replaces what is known of a session, unless a newer change replaced it since `was` was read. */
  private settle(sessionId: string, was: Tracked, next: Tracked | undefined): void {
    if (this.tracked.get(sessionId) !== was) return;
    if (next === undefined) this.tracked.delete(sessionId);
    else this.tracked.set(sessionId, next);
  }

  private async sweepOnce(): Promise<void> {
    const { clock, logger } = this.options;
    for (const [sessionId, known] of [...this.tracked]) {
      if (this.schedule.stopped) return;
      if (known.dueAt > clock.now() || this.tracked.get(sessionId) !== known) continue;
      try {
        const completed = known.completed === undefined ? await this.look(sessionId, known) : known;
        if (completed !== undefined && completed.dueAt <= clock.now()) await this.delete(sessionId, completed);
      } catch (error) {
        if (this.schedule.stopped) return;
        logger?.warn({ sessionId, err: error }, "retention could not read a session; it looks again later");
        const current = this.tracked.get(sessionId);
        if (current !== undefined) this.settle(sessionId, current, { ...current, dueAt: clock.now() + RETRY_AFTER_MS });
      }
    }
    let next = Infinity;
    for (const known of this.tracked.values()) next = Math.min(next, known.dueAt);
    this.schedule.rearm(next);
  }

  /** Reads the session: what is known of it now, when it is completed (undefined: forgotten until it changes). */
  private async look(sessionId: string, known: Tracked): Promise<Tracked | undefined> {
    const { journal, retentionMs } = this.options;
    const state = await journal.state(sessionId, { now: this.now });
    if (!state.exists || !isCompletedPhase(state.snapshot.phase)) {
      this.settle(sessionId, known, undefined);
      return undefined;
    }
    // The replay's own read is what the deletion compares: its head, its last seq.
    const read = await journal.read(sessionId, 1);
    const completedAt = await completionTime(sessionId, read.entries(), this.now);
    // Revived or deleted between the two reads: the watch brings that change.
    if (completedAt === undefined) {
      this.settle(sessionId, known, undefined);
      return undefined;
    }
    const completed: Tracked = { seen: read.headRevision, dueAt: completedAt + retentionMs, completed: { lastSeq: read.lastSeq, completedAt } };
    this.settle(sessionId, known, completed);
    return this.tracked.get(sessionId) === completed ? completed : undefined;
  }

  private async delete(sessionId: string, known: Tracked): Promise<void> {
    const { journal, clock, logger } = this.options;
    const { lastSeq, completedAt } = known.completed!;
    const revision = await journal.deleteUnchanged(sessionId, known.seen);
    if (revision === undefined) {
      // Appended to since the look (or deleted by another instance): looked at again in the next sweep.
      this.settle(sessionId, known, { seen: known.seen, dueAt: clock.now() });
      return;
    }
    this.settle(sessionId, known, undefined);
    logger?.info({ sessionId, lastSeq, completedAt: new Date(completedAt).toISOString() }, "deleted a completed session past its retention");
    this.options.deleted?.(sessionId, lastSeq);
  }
}
