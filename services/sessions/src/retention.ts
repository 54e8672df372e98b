/**
 * Retention of completed sessions: a completed or discarded session is deleted (as DeleteSession
 * does, so its watchers hear of it) once the retention period has passed since its completing
 * entry — the entry that last moved it into a completed phase, at that entry's `ts`; entries
 * appended after it that leave it completed (a late event the reducer ignores) do not push it back.
 *
 * The sessions on disk are swept at start and then by a timer (sweep-schedule.ts): when the next
 * known session falls due, and at least every hour, which finds sessions another process (a seed
 * process sharing a live directory) completed. Requests never look at the disk for it.
 * Between sweeps the completion times are kept in memory: learned from this process's own appends
 * as they complete a session, and otherwise worked out once per session by reading its journal.
 * A session revived before it is deleted (a later event moved it out of its completed phase) is
 * kept; a deletion that finds the session moved on since the sweep looked (its last seq) leaves it.
 *
 * The rule is on the wall clock, unlike leases and waits: the period runs from an entry's `ts`, a
 * wall-clock stamp kept in the journal, over days, across restarts and reboots, where no monotonic
 * reading survives. A step of the wall clock moves the due times with it (a step back keeps the
 * sessions longer, never shorter than the clock says). The timer only decides when to look again:
 * its delays are measured on the monotonic clock, and each sweep compares with the wall clock anew.
 */
import type { Clock } from "@berth/shared/clock";
import { isBerthError } from "@berth/shared/errors";
import type { Logger } from "@berth/shared/logger";
import type { StoredEntry } from "./journal/journal-store.js";
import { applyEvent, baseSnapshot, type JournalEntry, type SessionSnapshot } from "./reducer.js";
import { SweepSchedule } from "./sweep-schedule.js";
import { isCompletedPhase } from "./vocabulary.js";

/** What retention needs of the session store. */
export interface RetentionHost {
  /** The ids of every session on disk. */
  sessionIds(): string[];
  /** The session's durable last seq and snapshot; undefined when it has no journal. */
  view(id: string): { lastSeq: number; snapshot: SessionSnapshot } | undefined;
  /** The session's entries from its first to its durable end (as of this call). */
  entries(id: string): AsyncIterator<StoredEntry>;
  /** Deletes the session if its last seq is still `lastSeq`. */
  delete(id: string, lastSeq: number): Promise<unknown>;
}

/** Options of {@link CompletedRetention}. */
export interface RetentionOptions {
  /** How long a completed session is kept after its completing entry. */
  retentionMs: number;
  clock: Clock;
  logger?: Logger | undefined;
}

interface Completion {
  /** The session's last seq when the completion time was worked out (or last updated). */
  lastSeq: number;
  /** When its completing entry was appended (epoch ms). */
  completedAt: number;
}

/** An entry's `ts` in epoch ms; `now()` when it does not parse (the session is then kept longer, never shorter). */
export function entryTime(ts: unknown, now: () => number): number {
  const ms = typeof ts === "string" ? Date.parse(ts) : NaN;
  return Number.isFinite(ms) ? ms : now();
}

/**
 * When the session's completing entry was appended: `entries` (from the session's first) replayed,
 * noting where the phase last became completed. Undefined when they do not end completed.
 */
export async function completionTime(sessionId: string, entries: AsyncIterator<StoredEntry>, now: () => number): Promise<number | undefined> {
  let snapshot = baseSnapshot(sessionId);
  let since: number | undefined;
  try {
    for (let step = await entries.next(); !step.done; step = await entries.next()) {
      const entry = step.value.entry;
      const was = isCompletedPhase(snapshot.phase);
      snapshot = applyEvent(snapshot, entry, { now });
      const is = isCompletedPhase(snapshot.phase);
      if (is && !was) since = entryTime(entry.ts, now);
      else if (!is) since = undefined;
    }
  } finally {
    await entries.return?.();
  }
  return since;
}

/** The retention of one session store; see the module comment. */
export class CompletedRetention {
  private readonly known = new Map<string, Completion>();
  /** When sweeps run (one at a time); the stores sweep, wait for and ask about sweeps through it. */
  readonly schedule: SweepSchedule;
  private readonly now: () => number;

  constructor(
    private readonly host: RetentionHost,
    private readonly options: RetentionOptions,
  ) {
    this.now = () => options.clock.now();
    this.schedule = new SweepSchedule({ clock: options.clock, logger: options.logger, sweepOnce: () => this.sweepOnce() });
  }

  /** The first sweep (on the next turn: the store is still being built when this is called). */
  start(): Promise<void> {
    return Promise.resolve().then(() => this.schedule.sweep());
  }

  /** Stops the timer; resolves once a sweep in progress has ended. */
  stop(): Promise<void> {
    return this.schedule.stop();
  }

  /**
   * An append of this process became durable: its entries and the snapshot after each, and the
   * snapshot before them. A completion it brings is known at once (and scheduled); a revival
   * forgets the session.
   */
  appended(id: string, before: SessionSnapshot, entries: readonly JournalEntry[], snapshots: readonly SessionSnapshot[]): void {
    let completed = isCompletedPhase(before.phase);
    let record = this.known.get(id);
    for (let i = 0; i < entries.length; i++) {
      const entry = entries[i]!;
      const now = isCompletedPhase(snapshots[i]!.phase);
      if (now && !completed) record = { lastSeq: entry.seq, completedAt: entryTime(entry.ts, this.now) };
      else if (!now) record = undefined;
      else if (record !== undefined) record = { lastSeq: entry.seq, completedAt: record.completedAt };
      completed = now;
    }
    if (record === undefined) {
      this.known.delete(id);
      return;
    }
    this.known.set(id, record);
    this.schedule.due(record.completedAt + this.options.retentionMs);
  }

  /** The session was deleted. */
  forget(id: string): void {
    this.known.delete(id);
  }

  private async sweepOnce(): Promise<void> {
    const { clock, retentionMs, logger } = this.options;
    for (const id of this.host.sessionIds()) {
      if (this.schedule.stopped) return;
      let view: { lastSeq: number; snapshot: SessionSnapshot } | undefined;
      try {
        view = this.host.view(id);
      } catch (error) {
        logger?.warn({ sessionId: id, err: error }, "retention could not read a session");
        continue;
      }
      if (view === undefined || !isCompletedPhase(view.snapshot.phase)) {
        this.known.delete(id);
        continue;
      }
      let record = this.known.get(id);
      if (record === undefined || record.lastSeq !== view.lastSeq) {
        const completedAt = await this.completedSince(id, view);
        if (this.schedule.stopped) return;
        record = { lastSeq: view.lastSeq, completedAt };
        this.known.set(id, record);
      }
      if (record.completedAt + retentionMs > clock.now()) continue;
      try {
        await this.host.delete(id, record.lastSeq);
        logger?.info(
          { sessionId: id, lastSeq: record.lastSeq, completedAt: new Date(record.completedAt).toISOString() },
          "deleted a completed session past its retention",
        );
      } catch (error) {
        // Moved on since it was looked at (revived, or deleted by someone else): the next sweep sees it as it is.
        const expected = isBerthError(error) && (error.reason === "SEQ_CONFLICT" || error.reason === "SESSION_NOT_FOUND");
        if (!expected && !this.schedule.stopped) logger?.warn({ sessionId: id, err: error }, "could not delete a completed session past its retention");
      }
      this.known.delete(id);
    }
    // Every completed session is known now, including any an append completed during the sweep.
    let next = Infinity;
    for (const record of this.known.values()) next = Math.min(next, record.completedAt + retentionMs);
    this.schedule.rearm(next);
  }

  /**
   * When the session's completing entry was appended: the journal replayed up to the durable end
   * `view` describes. When the reader's entries do not end completed (lines only the full replay
   * applies, such as ones without a seq), the time of the last entry stands in: the session is
   * kept at least as long as it should be.
   */
  private async completedSince(id: string, view: { lastSeq: number; snapshot: SessionSnapshot }): Promise<number> {
    return (await completionTime(id, this.host.entries(id), this.now)) ?? entryTime(view.snapshot.updatedAt, this.now);
  }
}
