/**
 * What the etcd journal (etcd-journal.ts) is asked and answers: an append's options and result,
 * a session's state, a change of its head. Here, so that the modules the journal delegates to
 * (its refusals, watches and snapshots) and its callers need not import the journal for them.
 */
import type { JournalEntry, SessionSnapshot } from "../reducer.js";
import type { ExpectedState } from "../session-refusals.js";

/**
 * A fence resolved against etcd: `key` is the lock's holder key whose create revision is `token`
 * (see etcd-locks.ts, {@link EtcdLocks.fence}). The append compares it; nothing else is trusted.
 */
export interface EtcdFence {
  /** The canonical path of the locked file. */
  readonly file: string;
  readonly key: string;
  readonly token: bigint;
}

export interface EtcdAppendOptions {
  /** The last seq the caller saw (0: no entry yet); anything else is aborted SEQ_CONFLICT. */
  readonly expectedSeq?: number;
  readonly expectedState?: ExpectedState;
  /** A retry with the same key answers the first append (nothing is written). */
  readonly idempotencyKey?: string;
  /** The digest of the events (event-digest.ts), kept with the key to tell a retry from a reuse. */
  readonly digest?: string;
  readonly fence?: EtcdFence;
  /** What the caller knows of the session: the append brings back what came after it (see {@link EtcdKnownState}). */
  readonly known?: EtcdKnownState;
}

/**
 * The state a caller of an append has of the session: through `seq` of incarnation `incarnation`.
 * The append reads the appends after it up to its own in its transactions, when they are few
 * (see etcd-append-catch-up.ts), and answers them as `preceding`.
 */
export interface EtcdKnownState {
  readonly seq: number;
  readonly incarnation: bigint;
}

export interface EtcdAppendResult {
  readonly firstSeq: number;
  readonly lastSeq: number;
  /** The entries written; empty for a duplicate. */
  readonly entries: JournalEntry[];
  /** The revision of the transaction that wrote them (for a duplicate: the one that found the key). */
  readonly revision: bigint;
  readonly duplicate: boolean;
  /** The head's create revision the append was written after (the session's incarnation); 0n for a duplicate. */
  readonly incarnation: bigint;
  /** True when the append created its session (no head before it): nothing of this incarnation came before. */
  readonly created: boolean;
  /**
   * The appends between the caller's known seq and this one, in order, each its entries, when the
   * caller named one of this incarnation and the append's transactions read them all; else absent.
   */
  readonly preceding?: readonly (readonly JournalEntry[])[];
}

/** A session's state rebuilt from etcd: the cached snapshot plus the journal after it. */
export interface SessionState {
  readonly sessionId: string;
  readonly snapshot: SessionSnapshot;
  readonly lastSeq: number;
  readonly exists: boolean;
  readonly revision: bigint;
  readonly incarnation: bigint;
  /** The head's mod revision the state was read at (0n: no session). */
  readonly headRevision: bigint;
  /** As in {@link JournalRead} (etcd-journal-reads.ts). */
  readonly deletedThrough: number;
}

/** A change of a session's head: an append (its transaction's revision) or the session's deletion. */
export interface HeadChange {
  readonly sessionId: string;
  readonly revision: bigint;
  readonly deleted: boolean;
}
