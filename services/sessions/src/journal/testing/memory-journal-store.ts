/**
 * Session journals in memory (a test double of journal-store.ts): the store's rules run on it
 * without a file. A batch becomes durable on a later turn, in submission order; `failNext` refuses
 * the next batches as a backend that cannot write would; `appendAsOther` plays another writer.
 */
import { BerthError } from "@berth/shared/errors";
import { checkSessionId } from "@berth/shared/safe-id";
import type { JournalEntry, SessionReducer, SessionSnapshot } from "../../reducer.js";
import type { JournalBatch, JournalListener, JournalStore, JournalStoreStats, KeyRecord, SessionJournal, StoredEntry, Tombstone } from "../journal-store.js";

interface Stored {
  entry: JournalEntry;
  idempotencyKey: string | undefined;
}

export interface MemoryJournalStore extends JournalStore {
  /** Refuses the next `count` batches with `error` (and nothing of them is kept). */
  failNext(count: number, error?: BerthError): void;
  /** Another writer appends `events` to the session: the store hears of it as of a foreign append. */
  appendAsOther(sessionId: string, events: Array<Record<string, unknown>>): void;
}

class MemoryJournal implements SessionJournal {
  entries: Stored[] = [];
  keyRecords = new Map<string, KeyRecord>();
  snapshot: SessionSnapshot;
  nextSeq = 1;
  exists = false;
  private inFlight = 0;
  private queue: Promise<void> = Promise.resolve();

  constructor(
    readonly id: string,
    private readonly owner: { failing: { count: number; error: BerthError }; now: () => number; reducer: SessionReducer },
  ) {
    this.snapshot = owner.reducer.baseSnapshot(id);
  }

  get busy(): boolean {
    return this.inFlight > 0;
  }

  get writing(): boolean {
    return this.busy;
  }

  async idle(): Promise<void> {
    while (this.busy) await this.queue;
  }

  prepareAppend(): void {}

  append(batch: JournalBatch): void {
    this.inFlight++;
    this.queue = this.queue.then(() => {
      this.inFlight--;
      const { failing } = this.owner;
      if (failing.count > 0) {
        failing.count--;
        batch.failed(failing.error);
        return;
      }
      const previous = this.snapshot;
      const first = batch.entries[0]!.seq;
      const last = batch.entries[batch.entries.length - 1]!.seq;
      for (const entry of batch.entries) this.entries.push({ entry, idempotencyKey: batch.idempotencyKey });
      this.snapshot = batch.snapshots[batch.snapshots.length - 1]!;
      this.nextSeq = last + 1;
      this.exists = true;
      if (batch.idempotencyKey !== undefined)
        this.keyRecords.set(batch.idempotencyKey, { firstSeq: first, lastSeq: last, ...(batch.digest !== undefined ? { digest: batch.digest } : {}) });
      batch.durable(previous);
    });
  }

  findKey(idempotencyKey: string): KeyRecord | undefined {
    return this.keyRecords.get(idempotencyKey);
  }

  keyedAppends(): ReadonlyMap<string, KeyRecord> {
    return this.keyRecords;
  }

  reader(fromSeq: number, limit = 0): () => AsyncIterableIterator<StoredEntry> {
    const picked = this.entries.filter((s) => s.entry.seq >= fromSeq);
    const slice = limit > 0 ? picked.slice(0, limit) : picked;
    return async function* () {
      for (const { entry, idempotencyKey } of slice) yield { entry, idempotencyKey, integrity: "verified" as const };
    };
  }

  snapshotAt(lastSeq: number): SessionSnapshot {
    const replay = this.owner.reducer.createReplay(this.id, { now: this.owner.now });
    for (const { entry } of this.entries) if (entry.seq <= lastSeq) replay.apply(entry);
    return replay.snapshot();
  }

  flush(): Promise<void> {
    return Promise.resolve();
  }
}

export function createMemoryJournalStore(options: { reducer: SessionReducer; now?: () => number }): MemoryJournalStore {
  const owner = {
    failing: {
      count: 0,
      error: new BerthError("unavailable", "the memory journal refused the write", undefined, { reason: "STATE_READ_ONLY", retryAfterMs: 1000 }),
    },
    now: options.now ?? Date.now,
    reducer: options.reducer,
  };
  const journals = new Map<string, MemoryJournal>();
  const tombstones = new Map<string, Tombstone>();
  let listener: JournalListener | undefined;
  const stats: JournalStoreStats = { openSessions: 0, openJournals: 0, replays: 0, hydrations: 0, tailReplays: 0, snapshotWrites: 0 };
  const busy = () => [...journals.values()].some((j) => j.busy);
  return {
    location: "memory",
    listen(l) {
      listener = l;
    },
    open(sessionId) {
      const journal = journals.get(sessionId);
      return journal?.exists ? journal : undefined;
    },
    openForAppend(sessionId) {
      let journal = journals.get(sessionId);
      if (journal === undefined) {
        journal = new MemoryJournal(sessionId, owner);
        journal.nextSeq = (tombstones.get(sessionId)?.lastSeq ?? 0) + 1;
        journals.set(sessionId, journal);
      }
      return journal;
    },
    tombstone: (sessionId) => tombstones.get(sessionId),
    pruneTombstones(before) {
      let oldest = Infinity;
      for (const [sessionId, tombstone] of tombstones) {
        const deletions = tombstone.deletions.filter((d) => d.deletedAt >= before);
        tombstones.set(sessionId, { lastSeq: tombstone.lastSeq, deletions });
        if (deletions[0] !== undefined) oldest = Math.min(oldest, deletions[0].deletedAt);
      }
      return oldest;
    },
    has: (sessionId) => journals.get(sessionId)?.exists ?? false,
    sessionIds: () =>
      [...journals.values()]
        .filter((j) => j.exists)
        .map((j) => j.id)
        .sort(),
    remove(journal, burial) {
      const before = tombstones.get(journal.id);
      tombstones.set(journal.id, {
        lastSeq: Math.max(before?.lastSeq ?? 0, burial.deletion.lastSeq),
        deletions: [...(before?.deletions ?? []), { ...burial.deletion, keys: burial.keys }],
      });
      journals.delete(journal.id);
    },
    follow() {},
    stats: () => ({ ...stats, openSessions: journals.size }),
    get busy() {
      return busy();
    },
    async settled() {
      while (busy()) await Promise.all([...journals.values()].map((j) => j.idle()));
    },
    async close() {},
    failNext(count, error) {
      owner.failing.count = count;
      if (error !== undefined) owner.failing.error = error;
    },
    appendAsOther(sessionId, events) {
      const journal = this.openForAppend(checkSessionId(sessionId)) as MemoryJournal;
      const ts = new Date(owner.now()).toISOString();
      const appended: Array<StoredEntry & { snapshot: SessionSnapshot }> = [];
      for (const event of events) {
        const entry: JournalEntry = { seq: journal.nextSeq++, id: sessionId, type: String(event.type), ts, event: { ...event, id: sessionId } };
        journal.snapshot = owner.reducer.applyEvent(journal.snapshot, entry, { now: owner.now });
        journal.entries.push({ entry, idempotencyKey: undefined });
        appended.push({ entry, idempotencyKey: undefined, integrity: "unchecked", snapshot: journal.snapshot });
      }
      journal.exists = true;
      listener?.appended(sessionId, [appended]);
    },
  };
}
