/**
 * What a session store remembers of a deleted session, and the rules it answers by — the same on
 * every store (the files keep it in `.deleted/`, etcd under `t/`).
 *
 * A session id's seqs never go back. Deleting a session leaves its tombstone: the last seq it
 * reached, kept for good, so that the session created again under the same id continues from the
 * next seq (as KurrentDB continues a deleted stream's revisions, and etcd's revisions never go
 * back). A client that last saw the old session can then never mistake the new one for it: its
 * `expected_seq` matches nothing the new session will reach, and a watcher resuming from an old
 * seq is told the entries before the new session's first are gone.
 *
 * For the idempotency window after the deletion the tombstone also keeps the deletion itself (its
 * seqs, when, and the idempotency key it was made with) and the keys of the deleted session's
 * appends, so that a retry answers as the rule for every keyed call says: the same request is
 * answered what became of it, a different one is refused IDEMPOTENCY_KEY_REUSED. A retried
 * DeleteSession answers its first answer; a retried append was written to a session that is gone,
 * which is what it is told (NOT_FOUND SESSION_DELETED, with the seqs it had), never written again.
 */
import type { Deletion, KeyRecord, Tombstone } from "./journal/journal-store.js";
import { keyReused, sessionDeletedUnder } from "./session-refusals.js";

// The tombstone's records are the journal seam's: every backend keeps them.
export type { Deletion } from "./journal/journal-store.js";

/** A key a deleted session knew: its append's record, or the deletion's own key. */
export type DeletedKey =
  | { readonly kind: "append"; readonly record: KeyRecord; readonly deletion: Deletion }
  | { readonly kind: "deletion"; readonly deletion: Deletion };

/** True while `deletion` is within the idempotency window at `now`. */
export function remembered(deletion: Deletion, now: number, windowMs: number): boolean {
  return now < deletion.deletedAt + windowMs;
}

/** The key a deletion of the session still remembered at `now` knew, newest deletion first. */
export function findDeletedKey(tombstone: Tombstone | undefined, key: string, now: number, windowMs: number): DeletedKey | undefined {
  if (tombstone === undefined) return undefined;
  for (let i = tombstone.deletions.length - 1; i >= 0; i--) {
    const deletion = tombstone.deletions[i]!;
    if (!remembered(deletion, now, windowMs)) continue;
    if (deletion.idempotencyKey === key) return { kind: "deletion", deletion };
    const record = deletion.keys.get(key);
    if (record !== undefined) return { kind: "append", record, deletion };
  }
  return undefined;
}

/**
 * The answer to an append whose key a deleted session knew (never a write): refused
 * IDEMPOTENCY_KEY_REUSED when the key named another request (the deletion, or an append of other
 * events), else NOT_FOUND SESSION_DELETED telling the seqs the append was written at.
 */
export function refuseAppendOfDeletedKey(sessionId: string, ikey: string, digest: string | undefined, known: DeletedKey): never {
  if (known.kind === "deletion") throw keyReused(sessionId, ikey, { firstSeq: known.deletion.lastSeq, lastSeq: known.deletion.lastSeq }, "deletion");
  const { record, deletion } = known;
  // A record without a digest (its events could not be read back) is taken at its word.
  if (digest !== undefined && record.digest !== undefined && record.digest !== digest) throw keyReused(sessionId, ikey, record);
  throw sessionDeletedUnder(sessionId, ikey, record, deletion);
}

/**
 * The answer to a DeleteSession whose key a deleted session knew: the first deletion's answer when
 * the key made it with the same `expected_seq`, else refused IDEMPOTENCY_KEY_REUSED (it named an
 * append, or a deletion that expected another seq).
 */
export function repeatedDeletion(sessionId: string, ikey: string, expectedSeq: number | undefined, known: DeletedKey): { lastSeq: number } {
  if (known.kind === "append") throw keyReused(sessionId, ikey, known.record);
  const { deletion } = known;
  if (deletion.expectedSeq !== expectedSeq) throw keyReused(sessionId, ikey, { firstSeq: deletion.lastSeq, lastSeq: deletion.lastSeq }, "deletion");
  return { lastSeq: deletion.lastSeq };
}
