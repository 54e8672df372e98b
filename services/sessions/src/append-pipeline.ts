/**
 * The append pipeline of the session store: an append is checked (ids, events, sizes, idempotency
 * key and expected seq by append-rules.ts, as every store does; then the fence and the
 * expectation at sequencing), given its sequence numbers and applied to the reducer at once, in
 * call order — the *head* of the session, ahead of its durable state by the appends on their way.
 * One writer per journal store is the election's promise, so memory is the authority for the next
 * seq. The journal backend then makes the batch durable; only then does the durable state (what
 * readers and watchers see) move, watchers hear of it and the append resolves. A refused batch
 * (and every one behind it) rolls the head back to the durable state.
 */
import type { Clock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import type { PreparedEvent } from "./append-input.js";
import { checkAppend, checkExpectation, type AppendLimits } from "./append-rules.js";
import { eventsDigest } from "./event-digest.js";
import type { JournalStore, KeyRecord, SessionJournal } from "./journal/journal-store.js";
import { applyEvent, type JournalEntry, type SessionSnapshot } from "./reducer.js";
import type { CompletedRetention } from "./retention.js";
import { keyReused } from "./session-refusals.js";
import { findDeletedKey, refuseAppendOfDeletedKey } from "./session-tombstones.js";
import type { AppendOptions, AppendResult } from "./session-store-api.js";
import type { WatchHub } from "./watch-hub.js";

/** A keyed append on its way to durability: what a retry with its key waits for, or is refused by. */
interface InflightKey {
  result: Promise<AppendResult>;
  digest: string;
  firstSeq: number;
  lastSeq: number;
}

/** What the pipeline keeps per open journal beside the backend's durable state. */
interface AppendState {
  /** Appends submitted and not yet durable or refused; the head is the durable state when 0. */
  pending: number;
  headSnapshot: SessionSnapshot;
  headNextSeq: number;
  inflightKeys: Map<string, InflightKey>;
  /** The results of the newest keyed appends, so that a prompt retry costs no replay. */
  recentResults: Map<string, AppendResult>;
}

// Per open session; older keys rebuild their snapshot by a replay up to the append's last seq.
const RECENT_RESULTS = 8;

export interface AppendPipelineHost {
  readonly journals: JournalStore;
  readonly hub: WatchHub;
  readonly retention: CompletedRetention | undefined;
  readonly clock: Clock;
  readonly logger: Logger | undefined;
  readonly limits: AppendLimits;
  /** Deletions in progress, per session: appends to the session wait for them. */
  readonly deletions: ReadonlyMap<string, Promise<unknown>>;
  /** How long a deleted session's keys keep answering. */
  readonly idempotencyWindowMs: number;
  assertOpen(): void;
}

export class AppendPipeline {
  /** Per journal object: dropped with it when the backend drops the journal. */
  private readonly states = new WeakMap<SessionJournal, AppendState>();
  private readonly now: () => number;

  constructor(private readonly host: AppendPipelineHost) {
    this.now = () => host.clock.now();
  }

  /**
   * The session's last seq with the appends on their way (its head); 0 for a session with no entry
   * and none on its way, whatever seq its first will get (one past a deleted session's).
   */
  headSeq(journal: SessionJournal): number {
    const state = this.states.get(journal);
    if (state !== undefined && state.pending > 0) return state.headNextSeq - 1;
    return journal.exists ? journal.nextSeq - 1 : 0;
  }

  /**
   * Appends `events` to the session, atomically (one batch: all or none), and resolves once they
   * are durable. See {@link AppendOptions}.
   */
  async append(requestedId: string, events: readonly unknown[], options: AppendOptions = {}): Promise<AppendResult> {
    const { host } = this;
    host.assertOpen();
    const { sessionId, events: prepared, idempotencyKey: ikey, digest } = checkAppend(requestedId, events, options, host.limits);
    for (;;) {
      // A deletion of the session in progress: this append comes after it, to a new session.
      const deleting = host.deletions.get(sessionId);
      if (deleting !== undefined) {
        await deleting.catch(() => undefined);
        host.assertOpen();
        continue;
      }
      const journal = host.journals.openForAppend(sessionId);
      if (ikey !== undefined && digest !== undefined) {
        const inflight = this.stateOf(journal).inflightKeys.get(ikey);
        if (inflight) {
          if (inflight.digest !== digest) throw keyReused(sessionId, ikey, inflight);
          // The first attempt is still on its way to disk: answer with its outcome. If it fails,
          // this retry is a fresh attempt.
          try {
            return { ...(await inflight.result), duplicate: true };
          } catch {
            continue;
          }
        }
        let known = journal.findKey(ikey);
        let holder = journal;
        if (known?.digest === undefined && known !== undefined) {
          // A key read back from the journal: its digest comes from its entries, once.
          const recovered = await this.recoverDigest(journal, ikey, known);
          if (host.deletions.has(sessionId)) continue;
          // Evicted and opened again meanwhile (its keys read again), the session is still the
          // same journal if it still has the key where it was; deleted, it does not.
          const current = host.journals.open(sessionId);
          const record = current === undefined ? undefined : current.findKey(ikey);
          if (current === undefined || record === undefined || record.firstSeq !== known.firstSeq) continue;
          // Entries that can no longer be read (a damaged line) leave nothing to compare: the
          // key is taken at its word, as before digests.
          record.digest ??= recovered ?? digest;
          known = record;
          holder = current;
        }
        if (known !== undefined) {
          if (known.digest !== digest) throw keyReused(sessionId, ikey, known);
          return this.duplicateResult(holder, ikey, known);
        }
        // A key of a session deleted since: never written again (see session-tombstones.ts).
        const deleted = findDeletedKey(host.journals.tombstone(sessionId), ikey, host.clock.now(), host.idempotencyWindowMs);
        if (deleted !== undefined) refuseAppendOfDeletedKey(sessionId, ikey, digest, deleted);
      }
      options.fenceCheck?.();
      checkExpectation(sessionId, this.headSeq(journal), options);
      return this.enqueue(journal, prepared, ikey, digest);
    }
  }

  private stateOf(journal: SessionJournal): AppendState {
    let state = this.states.get(journal);
    if (state === undefined) {
      state = { pending: 0, headSnapshot: journal.snapshot, headNextSeq: journal.nextSeq, inflightKeys: new Map(), recentResults: new Map() };
      this.states.set(journal, state);
    }
    return state;
  }

  /**
   * The digest of the events a key's append wrote, read from the journal (the key's entries are
   * the entries from its first, where the key is recorded, through its last seq); undefined when
   * they cannot all be read.
   */
  private async recoverDigest(journal: SessionJournal, ikey: string, record: KeyRecord): Promise<string | undefined> {
    const events: unknown[] = [];
    const entries = journal.reader(record.firstSeq)();
    try {
      for await (const stored of entries) {
        if (stored.idempotencyKey !== ikey) continue;
        if (stored.entry.seq > record.lastSeq) break;
        events.push(stored.entry.event);
        if (stored.entry.seq === record.lastSeq) break;
      }
    } catch (error) {
      this.host.logger?.warn({ sessionId: journal.id, err: error }, "could not read an idempotency key's entries back");
      return undefined;
    } finally {
      await entries.return?.();
    }
    return events.length === record.lastSeq - record.firstSeq + 1 ? eventsDigest(events) : undefined;
  }

  private duplicateResult(journal: SessionJournal, ikey: string, record: KeyRecord): AppendResult {
    const state = this.stateOf(journal);
    const recent = state.recentResults.get(ikey);
    if (recent) return { ...recent, duplicate: true };
    // An older key: rebuild the snapshot as of that append by replaying up to its last entry.
    const snapshot = journal.snapshotAt(record.lastSeq);
    const result: AppendResult = { firstSeq: record.firstSeq, lastSeq: record.lastSeq, snapshot, duplicate: false };
    rememberResult(state, ikey, result);
    return { ...result, duplicate: true };
  }

  private enqueue(journal: SessionJournal, prepared: PreparedEvent[], ikey: string | undefined, digest: string | undefined): Promise<AppendResult> {
    journal.prepareAppend();
    const state = this.stateOf(journal);
    if (state.pending === 0) {
      state.headSnapshot = journal.snapshot;
      state.headNextSeq = journal.nextSeq;
    }
    const ts = new Date(this.host.clock.now()).toISOString();
    const entries: JournalEntry[] = [];
    const snapshots: SessionSnapshot[] = [];
    let snapshot = state.headSnapshot;
    for (let i = 0; i < prepared.length; i++) {
      const { type, event } = prepared[i]!;
      const entry: JournalEntry = { seq: state.headNextSeq + i, id: journal.id, type, ts, event };
      snapshot = applyEvent(snapshot, entry, { now: this.now });
      entries.push(entry);
      snapshots.push(snapshot);
    }
    const firstSeq = state.headNextSeq;
    const lastSeq = firstSeq + prepared.length - 1;
    state.headSnapshot = snapshot;
    state.headNextSeq += prepared.length;
    state.pending++;
    const { hub, retention } = this.host;
    let settle!: { resolve(result: AppendResult): void; reject(error: unknown): void };
    const promise = new Promise<AppendResult>((resolve, reject) => {
      settle = { resolve, reject };
    });
    if (ikey !== undefined && digest !== undefined) {
      state.inflightKeys.set(ikey, { result: promise, digest, firstSeq, lastSeq });
      promise.catch(() => undefined);
    }
    journal.append({
      entries,
      snapshots,
      idempotencyKey: ikey,
      digest,
      durable: (previous) => {
        state.pending--;
        retention?.appended(journal.id, previous, entries, snapshots);
        const result: AppendResult = { firstSeq, lastSeq, snapshot, duplicate: false };
        if (ikey !== undefined) {
          state.inflightKeys.delete(ikey);
          rememberResult(state, ikey, result);
        }
        // Checksummed lines of our own, so `verified`: a read of them later says the same.
        hub.publish(
          journal.id,
          entries.map((entry, i) => ({ entry, idempotencyKey: ikey, integrity: "verified", snapshot: snapshots[i]! })),
        );
        settle.resolve(result);
      },
      failed: (error) => {
        state.pending--;
        if (ikey !== undefined) state.inflightKeys.delete(ikey);
        settle.reject(error);
      },
    });
    return promise;
  }
}

function rememberResult(state: AppendState, ikey: string, result: AppendResult): void {
  state.recentResults.delete(ikey);
  state.recentResults.set(ikey, result);
  if (state.recentResults.size > RECENT_RESULTS) {
    const oldest = state.recentResults.keys().next().value;
    if (oldest !== undefined) state.recentResults.delete(oldest);
  }
}
