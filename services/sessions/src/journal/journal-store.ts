/**
 * The journal seam: what the session store needs of a place that keeps session journals durably.
 * The store (session-store.ts) depends on these interfaces only. The file backend — the seed's
 * JSON-lines journals, berth's snapshot files, group commit, the follower of other processes'
 * writes — is file-journal-store.ts and the files beside it; an in-memory double for the store's
 * tests is testing/memory-journal-store.ts. See docs/architecture.md, "Storage seams".
 *
 * The division of work: the store checks an append (ids, sizes, idempotency key, fence, expected
 * seq), gives it its sequence numbers and applies it to the reducer at once, in call order (one
 * writer per journal store is the election's promise, so memory is the authority for the next
 * seq); the backend makes the batch durable, all of it or none, in submission order, and only then
 * moves the session's *durable* state, which is all readers and watchers ever see. The backend
 * also opens a session cheaply (from a snapshot of it, not a replay, when it can), keeps its
 * idempotency keys, reads its entries from a seq, and tells the store what other writers appended.
 */
import type { SessionId } from "@berth/shared/safe-id";
import type { JournalEntry, SessionSnapshot } from "../reducer.js";

/**
 * What the reader could verify about an entry's line: `verified` — the line carries berth's
 * checksum and it matches; `unchecked` — the line carries none (the seed's library or another
 * program wrote it), it parsed and nothing more is known. A damaged line is never an entry a
 * reader gets: it is skipped, and the snapshot records it as `journal_checksum_mismatch`.
 */
export type EntryIntegrity = "verified" | "unchecked";

/** A journal entry as readers get it: the seed's fields, and the facts berth's line told about it. */
export interface StoredEntry {
  /** The entry as the seed wrote it (and any foreign extras), without berth's bookkeeping fields. */
  entry: JournalEntry;
  /**
   * The idempotency key of the append that wrote the entry — on every entry of a keyed append of
   * several events, though the journal records it on the append's first line only.
   */
  idempotencyKey: string | undefined;
  integrity: EntryIntegrity;
}

/** Where the entries of one keyed append sit. */
export interface KeyRecord {
  firstSeq: number;
  lastSeq: number;
  /**
   * The digest of the append's events (event-digest.ts): set by the store when it made the
   * append, or when the key is first used again after being read back from the journal.
   */
  digest?: string;
}

/** One append, sequenced and applied by the store, for the backend to make durable. */
export interface JournalBatch {
  /** Its entries, with consecutive seqs from the session's head. */
  readonly entries: readonly JournalEntry[];
  /** The snapshot after each entry. */
  readonly snapshots: readonly SessionSnapshot[];
  /** The idempotency key the append was made with, recorded with its first entry. */
  readonly idempotencyKey: string | undefined;
  /** The digest of its events, kept with the key (see event-digest.ts). */
  readonly digest: string | undefined;
  /**
   * Called once the whole batch is durable, after the session's durable state moved past it, with
   * the durable snapshot before it. Batches become durable in submission order.
   */
  durable(previous: SessionSnapshot): void;
  /**
   * Called when the batch was refused: nothing of it is kept (unless `error` says its outcome is
   * unknown). The batches submitted after it fail with it. `error` is a BerthError for the caller.
   */
  failed(error: unknown): void;
}

/**
 * One session's journal, open. The durable state never includes a batch before its `durable`
 * call. An object stays valid until the backend drops it (it evicted the session, or could no
 * longer trust its state); the store gets it again from {@link JournalStore.open}.
 */
export interface SessionJournal {
  readonly id: string;
  /** True when the journal has entries (or a file) to read; false for a session not created yet. */
  readonly exists: boolean;
  /** The durable snapshot. Shared: treat it as read-only. */
  readonly snapshot: SessionSnapshot;
  /** The seq the next durable entry gets (the last durable seq + 1). */
  readonly nextSeq: number;
  /** True while batches are on their way to durability. */
  readonly busy: boolean;
  /** True while anything of the session is being written (batches, or its snapshot). */
  readonly writing: boolean;
  /** Resolves once nothing of the session is being written. */
  idle(): Promise<void>;
  /**
   * Gets the journal ready to take a batch (creating it, copying a legacy journal over) and
   * throws the refusal (a BerthError) when it cannot. May catch the durable state up first; call
   * it before sequencing a batch on that state.
   */
  prepareAppend(): void;
  /** Submits a batch after {@link prepareAppend}; its outcome arrives through its callbacks. */
  append(batch: JournalBatch): void;
  /** The durable append made with `idempotencyKey`, if any. */
  findKey(idempotencyKey: string): KeyRecord | undefined;
  /** Every durable keyed append, by key. */
  keyedAppends(): ReadonlyMap<string, KeyRecord>;
  /**
   * A reader of the durable entries with seq ≥ `fromSeq`, at most `limit` (0: all), in journal
   * order, as of this call: entries that become durable later are not in it.
   */
  reader(fromSeq: number, limit?: number): () => AsyncIterableIterator<StoredEntry>;
  /** The session's snapshot right after seq `lastSeq` (an earlier durable state). */
  snapshotAt(lastSeq: number): SessionSnapshot;
  /** Writes the backend's snapshot of the durable state now (so the next open is cheap). */
  flush(): Promise<void>;
}

/** What the store hears from the backend about changes it did not make. */
export interface JournalListener {
  /** Entries another writer appended, append by append, each entry with the snapshot after it. */
  appended(sessionId: string, appends: ReadonlyArray<ReadonlyArray<StoredEntry & { snapshot: SessionSnapshot }>>): void;
  /** The journal changed in a way only a fresh read follows: watchers must start over. */
  resync(sessionId: string, reason: string): void;
  /** Whether anyone watches the session (only watched sessions are followed). */
  watched(sessionId: string): boolean;
  /** Whether anyone watches anything. */
  watching(): boolean;
}

/** Counters of a journal store. */
export interface JournalStoreStats {
  openSessions: number;
  /** Journal files held open (for appending); at most the store's bound. */
  openJournals: number;
  /** Full journal replays done (opens without a current snapshot, and catch-ups after foreign writes). */
  replays: number;
  /** Opens served from a snapshot (current, or of a prefix: see `tailReplays`). */
  hydrations: number;
  /** Opens from a snapshot of the journal's prefix plus a replay of the rest. */
  tailReplays: number;
  snapshotWrites: number;
}

/* Deletions: what the store hands the backend to keep (the rules are session-tombstones.ts). */

/** One deletion of a session, as its tombstone keeps it for the idempotency window. */
export interface Deletion {
  /** The seq of the deleted session's first entry. */
  readonly firstSeq: number;
  /** Its last seq when it was deleted. */
  readonly lastSeq: number;
  /** When it was deleted (wall clock, epoch ms): the window runs from here. */
  readonly deletedAt: number;
  /** The idempotency key of the DeleteSession that deleted it; none for a deletion by retention or without one. */
  readonly idempotencyKey?: string | undefined;
  /** The `expected_seq` that DeleteSession gave, if any: part of the request its key names. */
  readonly expectedSeq?: number | undefined;
}

/** What the store hands the backend to keep when it deletes a session. */
export interface Burial {
  readonly deletion: Deletion;
  /** The keyed appends of the deleted session, each with the digest of its events where known. */
  readonly keys: ReadonlyMap<string, KeyRecord>;
}

/** A deletion as a tombstone keeps it for the idempotency window: with the keys of the deleted session's appends. */
export interface BuriedDeletion extends Deletion {
  readonly keys: ReadonlyMap<string, KeyRecord>;
}

/** What a session's deletions left (see session-tombstones.ts). */
export interface Tombstone {
  /** The last seq the session reached before its last deletion: a new journal of the id continues after it. */
  readonly lastSeq: number;
  /** The deletions not pruned yet (see {@link JournalStore.pruneTombstones}), oldest first. */
  readonly deletions: readonly BuriedDeletion[];
}

/**
 * Where the session journals are: opens them, lists them, deletes them. The session ids it is given
 * were checked at the store's entry (`checkSessionId`, a `SessionId`); a backend trusts them and
 * does not check them again (the file backend's paths take a `SessionId`).
 */
export interface JournalStore {
  /** Where the journals are, for messages (a directory, an endpoint). */
  readonly location: string;
  /** Set once, before anything else: where changes made by other writers go. */
  listen(listener: JournalListener): void;
  /** The session's journal, opened (and caught up with other writers); undefined when it has none. */
  open(sessionId: SessionId): SessionJournal | undefined;
  /**
   * The session's journal, or a new empty one (created by its first append), whose `nextSeq` is
   * one past its tombstone's last seq: an id's seqs never go back.
   */
  openForAppend(sessionId: SessionId): SessionJournal;
  /** What the session's deletions left; undefined when it was never deleted. */
  tombstone(sessionId: SessionId): Tombstone | undefined;
  /** True when the session has a journal. Creates nothing. */
  has(sessionId: SessionId): boolean;
  /** The ids of the sessions with a journal, sorted (code unit order). */
  sessionIds(): string[];
  /**
   * Deletes the session's journal and snapshots, leaving its tombstone with `burial` in it; the
   * journal object is dropped. The tombstone is durable before the journal goes. Throws a
   * BerthError when it cannot (the session then still exists).
   */
  remove(journal: SessionJournal, burial: Burial): void;
  /**
   * Forgets the deletions made before `before` (wall clock, epoch ms), keeping each tombstone's
   * last seq; returns when the oldest deletion kept was made (Infinity: none is kept).
   */
  pruneTombstones(before: number): number;
  /** Starts following other writers' appends to watched sessions (idempotent). */
  follow(): void;
  stats(): JournalStoreStats;
  /** True while a batch or a background write is in flight. */
  readonly busy: boolean;
  /** Resolves once no batch and no background write is in flight. */
  settled(): Promise<void>;
  /**
   * Takes no new work from the moment it is called (synchronously), then settles, writes what is
   * behind and closes every journal. The store is not used afterwards.
   */
  close(): Promise<void>;
}
