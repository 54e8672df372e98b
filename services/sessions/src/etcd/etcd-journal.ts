/**
 * Session journals in etcd: several berth instances on one cluster append to, read and watch the
 * same sessions, and etcd serialises them (no election, no in-memory authority).
 *
 * - An append is one transaction. It compares the session's head (the `h/` key's mod revision as
 *   this instance last saw it), the idempotency key's absence and, with a fence, that the lock's
 *   holder key still has the token as its create revision; it puts the append's entries (one key,
 *   the journal's lines), the new head and the idempotency key. When a compare fails, the failure
 *   branch reads back the head, the key's record and the lock's holder in the same round trip, so
 *   a retry on a moved head, a duplicate and a lost fence cost nothing more. A stale fence is
 *   refused by etcd itself, atomically with the write: a paused ex-holder can never write.
 * - The head compared is the one this instance last saw, kept current by a watch of every head
 *   (etcd-head-cache.ts), so that an append after another instance's usually compares the head as
 *   it is. Both branches also read the appends the caller has not seen yet
 *   (etcd-append-catch-up.ts): the caller builds its snapshot after the append without reading
 *   the session back.
 * - A read takes the append holding the seq asked for and those after it at one revision R (one
 *   transaction, then pages at R); a watch follows the entry keys from R + 1, so nothing falls
 *   between the read and the watch. A revision etcd has compacted ends the watch as
 *   WATCHER_LAGGED, resumable by seq, as the file store's watchers end when they fall behind.
 * - Snapshots are a cache under `s/`, written only while the head is the incarnation they were
 *   built from, and rebuilt from the journal's tail.
 *
 * Here: appends and deletions, and the head they compare. The reads are in etcd-journal-reads.ts,
 * the watches in etcd-journal-watches.ts, the snapshots in etcd-snapshots.ts, the tombstones'
 * sweep in etcd-tombstone-sweep.ts, what the keys hold in etcd-journal-records.ts, and what the
 * journal is asked and answers in etcd-journal-api.ts.
 */
import { systemClock, type Clock } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import { invalidArgument, isBerthError } from "@berth/shared/errors";
import {
  compare,
  EtcdReason,
  op,
  type EtcdClient,
  type KeyValue,
  type RangeResult,
  type TxnCompare,
  type TxnOp,
  type TxnRequestInit,
  type TxnResult,
} from "@berth/etcd";
import type { PreparedEvent } from "../append-input.js";
import { checkExpectation, expectationHolds } from "../append-rules.js";
import type { KeyRecord, Tombstone } from "../journal/journal-store.js";
import { encodeJournalLine } from "../journal/journal-format.js";
import type { JournalEntry, SessionSnapshot } from "../reducer.js";
import { keyReused, seqConflict, sessionNotFound } from "../session-refusals.js";
import type { SessionChange, WatchEvent } from "../session-store-api.js";
import { DEFAULT_IDEMPOTENCY_WINDOW_MS } from "@berth/shared/idempotency";
import { findDeletedKey, refuseAppendOfDeletedKey, repeatedDeletion, type Deletion, type DeletedKey } from "../session-tombstones.js";
import { appendRefusedByEtcd, appendTooLarge, fenceRejected, REQUEST_OVERHEAD_BYTES } from "./etcd-append-refusals.js";
import { ETCD_DEFAULT_MAX_REQUEST_BYTES } from "./etcd-defaults.js";
import { caughtUp, gapRead, precedingOf, startCatchUp, tailRead } from "./etcd-append-catch-up.js";
import { HeadCache } from "./etcd-head-cache.js";
import type { EtcdAppendOptions, EtcdAppendResult, EtcdKnownState, HeadChange, SessionState } from "./etcd-journal-api.js";
import { headOf, headValue, jsonOf, NO_HEAD, tombstoneOf, type Head, type TombstoneValue } from "./etcd-journal-records.js";
import { listSessions, readJournal, type JournalRead, type ListedSession } from "./etcd-journal-reads.js";
import { watchAllSessions, watchHeads, watchSession } from "./etcd-journal-watches.js";
import { readState, saveSnapshot } from "./etcd-snapshots.js";
import { sweepTombstones } from "./etcd-tombstone-sweep.js";
import { entriesPrefix, entryKey, headKey, idempotencyKey, lockWaitersPrefix, snapshotKey, tombstoneKey } from "./store-keys.js";

export type { PreparedEvent } from "../append-input.js";
export { decodeAppend } from "./etcd-journal-records.js";
export { fenceRejected } from "./etcd-append-refusals.js";
export type { JournalRead, ListedSession } from "./etcd-journal-reads.js";

/** Appends (entry keys) per page of a read. */
const DEFAULT_PAGE_APPENDS = 256;

export interface EtcdJournalOptions {
  readonly client: EtcdClient;
  readonly clock?: Clock;
  /** etcd's `--max-request-bytes` as its operator set it: a larger append is refused before it is sent. */
  readonly maxRequestBytes?: number;
  /** Appends per page of a read (default 256). */
  readonly pageAppends?: number;
  /** How long a deleted session's idempotency keys keep answering (default 1 h; see session-tombstones.ts). */
  readonly idempotencyWindowMs?: number;
}

/** Session journals in etcd; see the module comment. One per berth instance; any number per cluster. */
export class EtcdJournal {
  private readonly client: EtcdClient;
  private readonly clock: Clock;
  private readonly maxRequestBytes: number;
  private readonly pageAppends: number;
  private readonly idempotencyWindowMs: number;
  /** The last head this instance saw per session: what the next append compares (a miss costs one retry). */
  private readonly heads = new HeadCache();

  constructor(options: EtcdJournalOptions) {
    this.client = options.client;
    this.clock = options.clock ?? systemClock;
    this.maxRequestBytes = options.maxRequestBytes ?? ETCD_DEFAULT_MAX_REQUEST_BYTES;
    this.pageAppends = options.pageAppends ?? DEFAULT_PAGE_APPENDS;
    this.idempotencyWindowMs = options.idempotencyWindowMs ?? DEFAULT_IDEMPOTENCY_WINDOW_MS;
  }

  // ---------------------------------------------------------------- appends

  /** Appends `events` to the session in one transaction; see the module comment. */
  async append(sessionId: string, events: readonly PreparedEvent[], options: EtcdAppendOptions = {}): Promise<EtcdAppendResult> {
    if (events.length === 0) throw invalidArgument("events", "must hold at least one event");
    const ikey = options.idempotencyKey === "" ? undefined : options.idempotencyKey;
    let head = this.heads.get(sessionId) ?? NO_HEAD;
    let fresh = false;
    let catchUp = startCatchUp(options.known);
    /** The mod revision of a record of `ikey` left by a deletion whose window passed: overwritten, not answered. */
    let expiredKey: bigint | undefined;
    for (;;) {
      if (!expectationHolds(head.seq, options)) {
        // A cached head may be behind: only a head read now refutes the caller.
        if (!fresh) {
          head = await this.readHead(sessionId);
          fresh = true;
          continue;
        }
        // A retry of an append that landed answers its first result before anything else.
        if (ikey !== undefined) {
          const known = await this.client.get(idempotencyKey(sessionId, ikey));
          if (known && this.answerKnownKey(sessionId, ikey, known, head.tomb, options.digest) !== "expired") {
            return duplicate(sessionId, ikey, known, options.digest);
          }
        }
        throw seqConflict(sessionId, head.seq, options.expectedSeq, options.expectedState);
      }
      const creating = head.mod === 0n;
      // An id's seqs never go back: a session created again continues after its tombstone.
      const firstSeq = (creating ? head.tomb.lastSeq : head.seq) + 1;
      const ts = new Date(this.clock.now()).toISOString();
      const entries: JournalEntry[] = events.map((e, i) => ({ seq: firstSeq + i, id: sessionId, type: e.type, ts, event: e.event }));
      const lastSeq = firstSeq + entries.length - 1;
      const marks = { ...(ikey !== undefined ? { ikey } : {}), ...(entries.length > 1 ? { n: entries.length } : {}) };
      const lines = entries.map((entry, i) => encodeJournalLine(entry, i === 0 ? marks : undefined)).join("");
      const bytes = Buffer.byteLength(lines);
      if (bytes + REQUEST_OVERHEAD_BYTES > this.maxRequestBytes) throw appendTooLarge(sessionId, bytes, this.maxRequestBytes);

      const compares: TxnCompare[] = [compare.mod(headKey(sessionId), "==", head.mod)];
      // Creating compares the tombstone too: a deletion meanwhile moves where the seqs start.
      if (creating) compares.push(compare.mod(tombstoneKey(sessionId), "==", head.tomb.mod));
      const success: TxnOp[] = [
        op.put(entryKey(sessionId, firstSeq), lines),
        op.put(headKey(sessionId), headValue(lastSeq, entries.length, creating ? firstSeq : head.first)),
      ];
      const failure: TxnOp[] = [op.get({ key: headKey(sessionId) }), op.get({ key: tombstoneKey(sessionId) })];
      const gap = creating ? undefined : gapRead(sessionId, catchUp, head);
      if (gap !== undefined) success.push(gap);
      if (ikey !== undefined) {
        compares.push(
          expiredKey === undefined ? compare.absent(idempotencyKey(sessionId, ikey)) : compare.mod(idempotencyKey(sessionId, ikey), "==", expiredKey),
        );
        success.push(
          op.put(idempotencyKey(sessionId, ikey), JSON.stringify({ firstSeq, lastSeq, ...(options.digest !== undefined ? { digest: options.digest } : {}) })),
        );
        failure.push(op.get({ key: idempotencyKey(sessionId, ikey) }));
      }
      if (options.fence !== undefined) {
        compares.push(compare.create(options.fence.key, "==", options.fence.token));
        // The oldest waiter is the holder: its create revision is the current token.
        failure.push(op.get({ key: lockWaitersPrefix(options.fence.file), prefix: true, sort: { by: "create", order: "ascend" }, limit: 1, keysOnly: true }));
      }
      const tail = tailRead(sessionId, catchUp);
      if (tail !== undefined) failure.push(tail);
      const result = await this.appendTxn(sessionId, bytes, { compare: compares, success, failure });
      const got = (i: number): RangeResult => {
        const r = result.results[i];
        if (r === undefined || !("get" in r)) throw new Error("etcd answered an append without its reads");
        return r.get;
      };
      if (result.succeeded) {
        // The head key was written by this transaction: its mod revision is the transaction's.
        const create = creating ? result.revision : head.create;
        this.heads.remember(sessionId, { seq: lastSeq, mod: result.revision, create, first: creating ? firstSeq : head.first, tomb: head.tomb });
        if (gap !== undefined) catchUp = caughtUp(catchUp, got(2), head);
        const preceding = creating ? undefined : precedingOf(catchUp, create, firstSeq);
        return {
          firstSeq,
          lastSeq,
          entries,
          revision: result.revision,
          duplicate: false,
          incarnation: create,
          created: creating,
          ...(preceding !== undefined ? { preceding } : {}),
        };
      }
      const read = headOf(got(0).kvs[0], tombstoneOf(got(1).kvs[0]));
      head = read;
      fresh = true;
      const kept = this.heads.remember(sessionId, read);
      let next = 2;
      if (ikey !== undefined) {
        const known = got(next++).kvs[0];
        expiredKey = undefined;
        if (known) {
          if (this.answerKnownKey(sessionId, ikey, known, head.tomb, options.digest) === "expired") expiredKey = known.modRevision;
          else return duplicate(sessionId, ikey, known, options.digest, result.revision);
        }
      }
      if (options.fence !== undefined) {
        const holder = got(next++).kvs[0];
        const current = holder?.createRevision ?? 0n;
        if (current !== options.fence.token) throw fenceRejected(options.fence, current);
      }
      if (tail !== undefined) catchUp = caughtUp(catchUp, got(next++), read);
      // The head moved (another instance appended, or the session was deleted): sequence again
      // after it, or after a later one the watch brought meanwhile.
      head = kept;
    }
  }

  /**
   * What to make of the record of `ikey` an append found: nothing to object to when it is the live
   * session's (the caller answers it as a duplicate); `expired` when it is a deleted session's
   * whose idempotency window passed (the key is free again); else the deleted session's answer,
   * thrown (see session-tombstones.ts).
   */
  private answerKnownKey(sessionId: string, ikey: string, kv: KeyValue, tomb: TombstoneValue, digest: string | undefined): "live" | "expired" {
    const record = jsonOf(kv)!;
    const deletion = record.deletion === true;
    const lastSeq = Number(record.lastSeq);
    if (!deletion && lastSeq > tomb.lastSeq) return "live";
    const known = this.deletedKey(ikey, record, tomb);
    if (known === undefined) return "expired";
    refuseAppendOfDeletedKey(sessionId, ikey, digest, known);
  }

  /** The key `ikey` of a deleted session (its record under `i/`), while its deletion is remembered. */
  private deletedKey(ikey: string, record: Record<string, unknown>, tomb: TombstoneValue): DeletedKey | undefined {
    const keyRecord: KeyRecord = {
      firstSeq: Number(record.firstSeq ?? record.lastSeq),
      lastSeq: Number(record.lastSeq),
      ...(typeof record.digest === "string" ? { digest: record.digest } : {}),
    };
    const tombstone: Tombstone = {
      lastSeq: tomb.lastSeq,
      deletions: tomb.deletions.map((d) => ({
        ...d,
        keys:
          record.deletion !== true && d.firstSeq <= keyRecord.firstSeq && keyRecord.lastSeq <= d.lastSeq
            ? new Map([[ikey, keyRecord]])
            : new Map<string, KeyRecord>(),
      })),
    };
    return findDeletedKey(tombstone, ikey, this.clock.now(), this.idempotencyWindowMs);
  }

  /**
   * Appends several plain appends (no expectation, idempotency key or fence) to the session in one
   * transaction, in order: each its own entry key (so each is still one change to watchers), one
   * head after the last. What an instance's appends queued behind each other on one session cost
   * together: one round trip, not one each. With `known`, the first result carries the appends
   * before them that the caller had not seen (`preceding`), when the transactions read them all.
   */
  async appendGroup(sessionId: string, groups: ReadonlyArray<readonly PreparedEvent[]>, known?: EtcdKnownState): Promise<EtcdAppendResult[]> {
    if (groups.length === 0 || groups.some((events) => events.length === 0)) throw invalidArgument("events", "must hold at least one event");
    let head = this.heads.get(sessionId) ?? NO_HEAD;
    let catchUp = startCatchUp(known);
    for (;;) {
      const ts = new Date(this.clock.now()).toISOString();
      const written: Array<{ firstSeq: number; lastSeq: number; entries: JournalEntry[] }> = [];
      const success: TxnOp[] = [];
      const creating = head.mod === 0n;
      // An id's seqs never go back: a session created again continues after its tombstone.
      let seq = creating ? head.tomb.lastSeq : head.seq;
      let bytes = 0;
      for (const events of groups) {
        const firstSeq = seq + 1;
        const entries: JournalEntry[] = events.map((e, i) => ({ seq: firstSeq + i, id: sessionId, type: e.type, ts, event: e.event }));
        seq = firstSeq + entries.length - 1;
        const marks = entries.length > 1 ? { n: entries.length } : {};
        const lines = entries.map((entry, i) => encodeJournalLine(entry, i === 0 ? marks : undefined)).join("");
        bytes += Buffer.byteLength(lines);
        success.push(op.put(entryKey(sessionId, firstSeq), lines));
        written.push({ firstSeq, lastSeq: seq, entries });
      }
      if (bytes + REQUEST_OVERHEAD_BYTES > this.maxRequestBytes) throw appendTooLarge(sessionId, bytes, this.maxRequestBytes);
      const first = creating ? head.tomb.lastSeq + 1 : head.first;
      success.push(op.put(headKey(sessionId), headValue(seq, written.at(-1)!.entries.length, first)));
      const compares: TxnCompare[] = [compare.mod(headKey(sessionId), "==", head.mod)];
      if (creating) compares.push(compare.mod(tombstoneKey(sessionId), "==", head.tomb.mod));
      const gap = creating ? undefined : gapRead(sessionId, catchUp, head);
      if (gap !== undefined) success.push(gap);
      const failure: TxnOp[] = [op.get({ key: headKey(sessionId) }), op.get({ key: tombstoneKey(sessionId) })];
      const tail = tailRead(sessionId, catchUp);
      if (tail !== undefined) failure.push(tail);
      const result = await this.appendTxn(sessionId, bytes, { compare: compares, success, failure });
      const reads = result.results.map((r) => ("get" in r ? r.get : undefined));
      if (result.succeeded) {
        const incarnation = creating ? result.revision : head.create;
        this.heads.remember(sessionId, { seq, mod: result.revision, create: incarnation, first, tomb: head.tomb });
        if (gap !== undefined) catchUp = reads.at(-1) === undefined ? undefined : caughtUp(catchUp, reads.at(-1)!, head);
        const preceding = creating ? undefined : precedingOf(catchUp, incarnation, written[0]!.firstSeq);
        return written.map((w, i) => ({
          ...w,
          revision: result.revision,
          duplicate: false,
          incarnation,
          created: creating && i === 0,
          ...(i === 0 && preceding !== undefined ? { preceding } : {}),
        }));
      }
      const [headRead, tombRead, tailRange] = reads;
      if (headRead === undefined || tombRead === undefined || (tail !== undefined && tailRange === undefined))
        throw new Error("etcd answered a failed append without its reads");
      const read = headOf(headRead.kvs[0], tombstoneOf(tombRead.kvs[0]));
      if (tail !== undefined) catchUp = caughtUp(catchUp, tailRange!, read);
      // Sequence again after the head read, or after a later one the watch brought meanwhile.
      head = this.heads.remember(sessionId, read);
    }
  }

  /** The most an append's journal lines may take (what `--etcd-max-request-bytes` leaves). */
  get maxAppendBytes(): number {
    return this.maxRequestBytes - REQUEST_OVERHEAD_BYTES;
  }

  /**
   * An append's transaction. etcd's own refusal of its size (its `--max-request-bytes` is lower
   * than this journal was told) is the caller's, as the check before sending would have said.
   */
  private async appendTxn(sessionId: string, bytes: number, request: TxnRequestInit): Promise<TxnResult> {
    try {
      return await this.client.txn(request);
    } catch (error) {
      if (isBerthError(error) && error.reason === EtcdReason.REQUEST_TOO_LARGE) throw appendRefusedByEtcd(sessionId, bytes, this.maxRequestBytes, error);
      throw error;
    }
  }

  /** The session's last seq and incarnation (the head's create revision; 0n: no session), read now. */
  async head(sessionId: string): Promise<{ seq: number; incarnation: bigint }> {
    const head = await this.readHead(sessionId);
    return { seq: head.seq, incarnation: head.create };
  }

  /** The session's head and tombstone, read now (one round trip). */
  private async readHead(sessionId: string): Promise<Head> {
    const read = await this.client.txn({ compare: [], success: [op.get({ key: headKey(sessionId) }), op.get({ key: tombstoneKey(sessionId) })] });
    const [headRead, tombRead] = read.results.map((r) => ("get" in r ? r.get : undefined));
    const head = headOf(headRead?.kvs[0], tombstoneOf(tombRead?.kvs[0]));
    this.heads.remember(sessionId, head);
    return head;
  }

  /** The last seq of the head the next append to the session compares, when this instance keeps one (tests). */
  cachedHeadSeq(sessionId: string): number | undefined {
    return this.heads.get(sessionId)?.seq;
  }

  /**
   * Keeps this instance's heads current from a watch of every head until `signal` aborts (see
   * etcd-head-cache.ts): resolves once it ended.
   */
  followHeads(options: { readonly signal: AbortSignal; readonly logger?: Logger | undefined }): Promise<void> {
    return this.heads.follow(this.client, { ...options, clock: this.clock });
  }

  // ---------------------------------------------------------------- reads

  /**
   * The entries with seq ≥ `fromSeq`, read at one revision: the append holding `fromSeq` and every
   * later one, in pages (see etcd-journal-reads.ts). The first page is read before this resolves.
   */
  read(sessionId: string, fromSeq = 1, limit = 0): Promise<JournalRead> {
    return readJournal(this.client, this.pageAppends, sessionId, fromSeq, limit);
  }

  /**
   * Watches a session from `fromSeq`: the entries already there, a caught-up marker, then every new
   * entry as it commits (see etcd-journal-watches.ts).
   */
  watch(sessionId: string, fromSeq = 1, options: { readonly signal?: AbortSignal } = {}): AsyncGenerator<WatchEvent, void, undefined> {
    return watchSession(this, this.client, sessionId, fromSeq, options);
  }

  /** Watches every session: one change per append, or a session's deletion (see etcd-journal-watches.ts). */
  watchAll(
    options: { readonly signal?: AbortSignal; readonly startRevision?: bigint } = {},
  ): AsyncGenerator<SessionChange & { endsRevision: boolean }, void, undefined> {
    return watchAllSessions(this.client, options);
  }

  /** Watches the heads of every session from `startRevision` (see etcd-journal-watches.ts). */
  watchHeads(options: { readonly signal?: AbortSignal; readonly startRevision: bigint }): AsyncGenerator<HeadChange, void, undefined> {
    return watchHeads(this.client, options);
  }

  /**
   * The sessions with a head (at least one entry), sorted by id, with their last seq: a page after
   * `after`, of at most `limit` (0: all), read at one revision.
   */
  list(options: { readonly after?: string; readonly limit?: number } = {}): Promise<{ sessions: ListedSession[]; revision: bigint }> {
    return listSessions(this.client, this.pageAppends, options);
  }

  /**
   * Deletes a session: its entries, snapshot and head, in one transaction that compares the head
   * and the tombstone read (so an append that lands first is not lost silently: the deletion
   * retries and takes it too, unless `expectedSeq` no longer holds), and leaves its tombstone
   * (session-tombstones.ts): the session's last seq for good, this deletion for the idempotency
   * window, and the deleted session's idempotency keys where they were. not_found
   * SESSION_NOT_FOUND for a session with no head. A repeat of a keyed deletion answers the first
   * (`duplicate`), even once the session was created again.
   */
  async delete(
    sessionId: string,
    options: { readonly expectedSeq?: number; readonly idempotencyKey?: string } = {},
  ): Promise<{ lastSeq: number; revision: bigint; duplicate: boolean }> {
    const ikey = options.idempotencyKey === "" ? undefined : options.idempotencyKey;
    for (;;) {
      const reads: TxnOp[] = [op.get({ key: headKey(sessionId) }), op.get({ key: tombstoneKey(sessionId) })];
      if (ikey !== undefined) reads.push(op.get({ key: idempotencyKey(sessionId, ikey) }));
      const read = await this.client.txn({ compare: [], success: reads });
      const [headRead, tombRead, keyRead] = read.results.map((r) => ("get" in r ? r.get : undefined));
      const head = headOf(headRead?.kvs[0], tombstoneOf(tombRead?.kvs[0]));
      this.heads.remember(sessionId, head);
      let keyCompare: TxnCompare | undefined;
      if (ikey !== undefined) {
        const kv = keyRead?.kvs[0];
        keyCompare = kv === undefined ? compare.absent(idempotencyKey(sessionId, ikey)) : compare.mod(idempotencyKey(sessionId, ikey), "==", kv.modRevision);
        if (kv !== undefined) {
          const record = jsonOf(kv)!;
          if (record.deletion !== true && Number(record.lastSeq) > head.tomb.lastSeq) {
            throw keyReused(sessionId, ikey, { firstSeq: Number(record.firstSeq), lastSeq: Number(record.lastSeq) });
          }
          const known = this.deletedKey(ikey, record, head.tomb);
          if (known !== undefined) return { ...repeatedDeletion(sessionId, ikey, options.expectedSeq, known), revision: read.revision, duplicate: true };
        }
      }
      if (head.mod === 0n) throw sessionNotFound(sessionId);
      checkExpectation(sessionId, head.seq, { expectedSeq: options.expectedSeq });
      const revision = await this.bury(sessionId, head, {
        ...(ikey !== undefined ? { idempotencyKey: ikey } : {}),
        ...(options.expectedSeq !== undefined ? { expectedSeq: options.expectedSeq } : {}),
        ...(keyCompare !== undefined ? { keyCompare } : {}),
      });
      if (revision !== undefined) return { lastSeq: head.seq, revision, duplicate: false };
    }
  }

  /**
   * Deletes the session as {@link delete} does, only if its head is still the one whose mod
   * revision is `headRevision` (as a read found it): no retry, so an append that landed after that
   * read keeps the session. Resolves the deletion's revision, or undefined when the head moved or
   * is gone.
   */
  async deleteUnchanged(sessionId: string, headRevision: bigint): Promise<bigint | undefined> {
    const head = await this.readHead(sessionId);
    if (head.mod === 0n || head.mod !== headRevision) return undefined;
    return this.bury(sessionId, head, {});
  }

  /**
   * The deletion's transaction: removes the session's entries, snapshot and head, and writes its
   * tombstone with this deletion added (and the deletion's own key under `i/`), if the head and the
   * tombstone are still as read. Resolves its revision, or undefined when either moved.
   */
  private async bury(
    sessionId: string,
    head: Head,
    request: { readonly idempotencyKey?: string; readonly expectedSeq?: number; readonly keyCompare?: TxnCompare },
  ): Promise<bigint | undefined> {
    const deletedAt = this.clock.now();
    const deletion: Deletion = {
      firstSeq: head.first,
      lastSeq: head.seq,
      deletedAt,
      ...(request.idempotencyKey !== undefined ? { idempotencyKey: request.idempotencyKey } : {}),
      ...(request.expectedSeq !== undefined ? { expectedSeq: request.expectedSeq } : {}),
    };
    const success: TxnOp[] = [
      op.delete({ key: entriesPrefix(sessionId), prefix: true }),
      op.delete({ key: snapshotKey(sessionId) }),
      op.delete({ key: headKey(sessionId) }),
      op.put(tombstoneKey(sessionId), JSON.stringify({ lastSeq: head.seq, deletions: [...head.tomb.deletions, deletion] })),
    ];
    if (request.idempotencyKey !== undefined) {
      const record = { deletion: true, lastSeq: head.seq, deletedAt, ...(request.expectedSeq !== undefined ? { expectedSeq: request.expectedSeq } : {}) };
      success.push(op.put(idempotencyKey(sessionId, request.idempotencyKey), JSON.stringify(record)));
    }
    const result = await this.client.txn({
      compare: [
        compare.mod(headKey(sessionId), "==", head.mod),
        compare.mod(tombstoneKey(sessionId), "==", head.tomb.mod),
        ...(request.keyCompare !== undefined ? [request.keyCompare] : []),
      ],
      success,
    });
    if (!result.succeeded) {
      this.heads.forget(sessionId);
      return undefined;
    }
    // What the next append (creating the session again) compares: no head, this tombstone.
    const deletions = [...head.tomb.deletions, deletion];
    this.heads.remember(sessionId, { ...NO_HEAD, tomb: { mod: result.revision, lastSeq: head.seq, deletions } });
    return result.revision;
  }

  /**
   * Forgets the deletions whose idempotency window passed (see etcd-tombstone-sweep.ts). Resolves
   * when the oldest deletion kept was made (Infinity: none).
   */
  sweepTombstones(): Promise<number> {
    return sweepTombstones(this.client, { now: this.clock.now(), windowMs: this.idempotencyWindowMs, pageSize: this.pageAppends });
  }

  // ---------------------------------------------------------------- snapshots

  /**
   * The session's state: its cached snapshot (when there is one) with the entries after it applied.
   * A session with no head gets the base snapshot and `exists: false`. With `untilSeq`, the state
   * right after that seq (an earlier append's result).
   */
  state(sessionId: string, options: { readonly now?: () => number; readonly untilSeq?: number } = {}): Promise<SessionState> {
    return readState({ client: this.client, clock: this.clock, read: (id, fromSeq, limit) => this.read(id, fromSeq, limit) }, sessionId, options);
  }

  /**
   * Caches `snapshot` (the state at `seq` of incarnation `incarnation`) under `s/` while that
   * incarnation's head still exists (see etcd-snapshots.ts). Resolves false when nothing was written.
   */
  saveSnapshot(sessionId: string, state: { readonly seq: number; readonly incarnation: bigint; readonly snapshot: SessionSnapshot }): Promise<boolean> {
    return saveSnapshot(this.client, sessionId, state);
  }
}

/** The answer to a retry whose idempotency key is already in etcd. */
function duplicate(sessionId: string, ikey: string, kv: KeyValue, digest: string | undefined, revision = kv.modRevision): EtcdAppendResult {
  const record = jsonOf(kv)!;
  const firstSeq = Number(record.firstSeq);
  const lastSeq = Number(record.lastSeq);
  if (digest !== undefined && typeof record.digest === "string" && record.digest !== digest) throw keyReused(sessionId, ikey, { firstSeq, lastSeq });
  return { firstSeq, lastSeq, entries: [], revision, duplicate: true, incarnation: 0n, created: false };
}
