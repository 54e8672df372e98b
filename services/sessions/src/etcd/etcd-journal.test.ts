// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { eventsDigest } from "../event-digest.js";
import { applyEvent, baseSnapshot } from "../reducer.js";
import type { WatchEvent } from "../session-store-api.js";
import { EtcdJournal, type PreparedEvent } from "./etcd-journal.js";
import { EtcdLocks } from "./etcd-locks.js";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";

// One real etcd member for the file; each test gets a prefix of its own, and "two berth
// instances" are two journals with clients of their own under one prefix.
let etcd: EtcdCluster;
const clients: EtcdClient[] = [];
let prefixes = 0;

beforeAll(async () => {
  etcd = await startEtcd({ electionTimeoutMs: 500 });
});
afterAll(async () => {
  for (const c of clients) c.close();
  await etcd?.stop();
});

function client(prefix: string): EtcdClient {
  const c = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
  clients.push(c);
  return c;
}

/** `count` berth instances sharing one fresh prefix. */
function instances(count: number, options: { maxRequestBytes?: number; pageAppends?: number } = {}) {
  const prefix = `j${++prefixes}/`;
  return Array.from({ length: count }, () => {
    const c = client(prefix);
    return { client: c, journal: new EtcdJournal({ client: c, ...options }), locks: new EtcdLocks({ client: c }) };
  });
}

const ev = (type: string, extra: Record<string, unknown> = {}): PreparedEvent => ({ type, event: { type, ...extra } });

async function all<T>(source: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of source) out.push(item);
  return out;
}

async function readSeqs(journal: EtcdJournal, session: string, fromSeq = 1, limit = 0): Promise<number[]> {
  const read = await journal.read(session, fromSeq, limit);
  return (await all(read.entries())).map((s) => s.entry.seq);
}

/** Takes `count` items from a watcher, leaving it open. */
async function take(watcher: AsyncGenerator<WatchEvent>, count: number): Promise<WatchEvent[]> {
  const out: WatchEvent[] = [];
  while (out.length < count) {
    const step = await watcher.next();
    if (step.done) break;
    out.push(step.value);
  }
  return out;
}

const describeEvent = (e: WatchEvent) => (e.kind === "entry" ? `${e.entry.seq}:${e.entry.type}` : `caught_up@${e.lastSeq}`);

describe("appends and reads", () => {
  it("sequences appends, one key each, and reads from any seq, inside an append too", async () => {
    const [a] = instances(1);
    const first = await a!.journal.append("s1", [ev("one")]);
    expect(first).toMatchObject({ firstSeq: 1, lastSeq: 1, duplicate: false });
    const batch = await a!.journal.append("s1", [ev("two"), ev("three"), ev("four")], { idempotencyKey: "k" });
    expect(batch).toMatchObject({ firstSeq: 2, lastSeq: 4 });
    expect(batch.revision).toBeGreaterThan(first.revision);
    await a!.journal.append("s1", [ev("five")]);

    expect(await readSeqs(a!.journal, "s1")).toEqual([1, 2, 3, 4, 5]);
    expect(await readSeqs(a!.journal, "s1", 3)).toEqual([3, 4, 5]);
    expect(await readSeqs(a!.journal, "s1", 3, 2)).toEqual([3, 4]);
    expect(await readSeqs(a!.journal, "s1", 6)).toEqual([]);
    const read = await a!.journal.read("s1", 2);
    const entries = await all(read.entries());
    expect(read.lastSeq).toBe(5);
    // Every entry of a keyed append carries its key; the lines were checksummed by berth.
    expect(entries.map((s) => [s.entry.type, s.idempotencyKey, s.integrity])).toEqual([
      ["two", "k", "verified"],
      ["three", "k", "verified"],
      ["four", "k", "verified"],
      ["five", undefined, "verified"],
    ]);
    expect(entries[0]!.entry).toMatchObject({ seq: 2, id: "s1", type: "two", event: { type: "two" } });
    // One key per append: three appends, three entry keys.
    const keys = await a!.client.range({ key: "e/s1/", prefix: true, keysOnly: true });
    expect(keys.count).toBe(3);
  });

  it("reads a long journal in pages at one revision: appends made meanwhile are not in it", async () => {
    const [a] = instances(1, { pageAppends: 2 });
    for (let i = 1; i <= 7; i++) await a!.journal.append("long", [ev(`e${i}`)]);
    const read = await a!.journal.read("long", 1);
    const entries = read.entries();
    const seen: number[] = [];
    for await (const stored of entries) {
      seen.push(stored.entry.seq);
      // Written after the read's revision: a later page must not show it.
      if (stored.entry.seq === 1) await a!.journal.append("long", [ev("late")]);
    }
    expect(seen).toEqual([1, 2, 3, 4, 5, 6, 7]);
    expect(read.lastSeq).toBe(7);
    expect(await readSeqs(a!.journal, "long")).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
  });

  it("appends through two instances interleave into one contiguous sequence", async () => {
    const [a, b] = instances(2);
    const results = await Promise.all(
      Array.from({ length: 30 }, (_, i) => (i % 2 === 0 ? a! : b!).journal.append("shared", i % 3 === 0 ? [ev(`x${i}`), ev(`y${i}`)] : [ev(`x${i}`)])),
    );
    const seqs = results.flatMap((r) => Array.from({ length: r.lastSeq - r.firstSeq + 1 }, (_, i) => r.firstSeq + i)).sort((x, y) => x - y);
    const total = results.reduce((n, r) => n + r.lastSeq - r.firstSeq + 1, 0);
    expect(seqs).toEqual(Array.from({ length: total }, (_, i) => i + 1));
    expect(await readSeqs(b!.journal, "shared")).toEqual(seqs);
  });

  it("refuses an append over etcd's request size before sending it", async () => {
    const [a] = instances(1, { maxRequestBytes: 16 * 1024 });
    const error = await berthRefusal(a!.journal.append("big", [ev("huge", { blob: "x".repeat(20 * 1024) })]));
    expect(error).toMatchObject({ code: "invalid_argument", reason: "REQUEST_TOO_LARGE" });
    expect(error.message).toContain("--max-request-bytes");
    expect(await readSeqs(a!.journal, "big")).toEqual([]);
  });
});

describe("expectations and idempotency", () => {
  it("refuses an expected seq that does not hold, naming the current one, with nothing written", async () => {
    const [a, b] = instances(2);
    await a!.journal.append("c", [ev("one")]);
    // b has never seen the session: its guess (no session) is checked against etcd before refusing.
    expect(await berthRefusal(b!.journal.append("c", [ev("two")], { expectedSeq: 0 }))).toMatchObject({
      reason: "SEQ_CONFLICT",
      details: { currentSeq: 1, expectedSeq: 0 },
    });
    expect(await berthRefusal(b!.journal.append("c", [ev("two")], { expectedState: "no_session" }))).toMatchObject({ reason: "SEQ_CONFLICT" });
    expect(await b!.journal.append("c", [ev("two")], { expectedSeq: 1 })).toMatchObject({ firstSeq: 2 });
    // a's cached head (seq 1) is stale: the transaction's compare fails, its failure branch
    // brings the head back, and the expectation is judged against that.
    expect(await berthRefusal(a!.journal.append("c", [ev("three")], { expectedSeq: 1 }))).toMatchObject({ reason: "SEQ_CONFLICT", details: { currentSeq: 2 } });
    expect(await a!.journal.append("c", [ev("three")], { expectedSeq: 2 })).toMatchObject({ firstSeq: 3 });
    expect(await a!.journal.append("c", [ev("four")], { expectedState: "exists" })).toMatchObject({ firstSeq: 4 });
    expect(await readSeqs(a!.journal, "c")).toEqual([1, 2, 3, 4]);
  });

  it("answers a retry with its key through another instance with the first result, and refuses a reuse", async () => {
    const [a, b] = instances(2);
    const events = [ev("one"), ev("two")];
    const digest = eventsDigest(events.map((e) => e.event));
    const first = await a!.journal.append("ik", events, { idempotencyKey: "req-1", digest });
    expect(first).toMatchObject({ firstSeq: 1, lastSeq: 2, duplicate: false });
    await a!.journal.append("ik", [ev("three")]);
    // b's cached head is absent (stale): one transaction fails on both the head and the key; the
    // failure branch answers the key.
    const retry = await b!.journal.append("ik", events, { idempotencyKey: "req-1", digest });
    expect(retry).toMatchObject({ firstSeq: 1, lastSeq: 2, duplicate: true });
    // With an expected seq that no longer holds, the retry is still answered (it landed).
    expect(await b!.journal.append("ik", events, { idempotencyKey: "req-1", digest, expectedSeq: 0 })).toMatchObject({ firstSeq: 1, duplicate: true });
    const other = [ev("other")];
    const reused = await berthRefusal(b!.journal.append("ik", other, { idempotencyKey: "req-1", digest: eventsDigest(other.map((e) => e.event)) }));
    expect(reused).toMatchObject({ code: "already_exists", reason: "IDEMPOTENCY_KEY_REUSED", details: { firstSeq: 1, lastSeq: 2 } });
    expect(await readSeqs(a!.journal, "ik")).toEqual([1, 2, 3]);
  });

  it("writes one append for many concurrent retries of one key through two instances", async () => {
    const [a, b] = instances(2);
    const events = [ev("once")];
    const digest = eventsDigest(events.map((e) => e.event));
    const results = await Promise.all(
      Array.from({ length: 10 }, (_, i) => (i % 2 ? a! : b!).journal.append("race", events, { idempotencyKey: "same", digest })),
    );
    expect(results.filter((r) => !r.duplicate)).toHaveLength(1);
    expect(new Set(results.map((r) => r.firstSeq))).toEqual(new Set([1]));
    expect(await readSeqs(a!.journal, "race")).toEqual([1]);
  });
});

describe("fences", () => {
  it("writes under the current token and refuses a stale one in the same transaction, whatever was checked before", async () => {
    const [a, b] = instances(2);
    const file = "/src/app.ts";
    const held = await a!.locks.acquire({ file, owner: "agent-a", kind: "stream", ttlSeconds: 5, waitMs: 0 });
    // Resolved while the token holds: the fence b would use if it checked and then paused.
    const fence = await b!.locks.fence(file, held.token);
    expect(await b!.journal.append("f", [ev("fenced")], { fence })).toMatchObject({ firstSeq: 1 });

    await held.release();
    const next = await b!.locks.acquire({ file, owner: "agent-b", kind: "stream", ttlSeconds: 5, waitMs: 0 });
    expect(next.token).toBeGreaterThan(held.token);
    // The ex-holder's write arrives after the handoff with the fence it resolved before: etcd's
    // compare refuses it, and the failure branch names the new token.
    const refused = await berthRefusal(b!.journal.append("f", [ev("stale")], { fence }));
    expect(refused).toMatchObject({ code: "failed_precondition", reason: "FENCE_REJECTED", details: { currentToken: Number(next.token) } });
    // The instance that granted the token forgot its fence when the grant ended: resolving it fails at once.
    expect(await berthRefusal(a!.locks.fence(file, held.token))).toMatchObject({ reason: "FENCE_REJECTED" });
    expect(await a!.journal.append("f", [ev("current")], { fence: next.fence })).toMatchObject({ firstSeq: 2 });
    expect(await readSeqs(a!.journal, "f")).toEqual([1, 2]);
    const read = await a!.journal.read("f");
    expect((await all(read.entries())).map((s) => s.entry.type)).toEqual(["fenced", "current"]);
    await next.release();
  });
});

describe("watches", () => {
  it("delivers the backlog, a caught-up marker, then appends made through another instance, in order", async () => {
    const [a, b] = instances(2);
    await a!.journal.append("w", [ev("one"), ev("two"), ev("three")]);
    const stop = new AbortController();
    // From inside the first append: only seqs 2 and 3 of it.
    const watcher = b!.journal.watch("w", 2, { signal: stop.signal });
    expect((await take(watcher, 3)).map(describeEvent)).toEqual(["2:two", "3:three", "caught_up@3"]);
    await a!.journal.append("w", [ev("four")]);
    await a!.journal.append("w", [ev("five"), ev("six")]);
    await b!.journal.append("w", [ev("seven")]);
    const live = await take(watcher, 4);
    expect(live.map(describeEvent)).toEqual(["4:four", "5:five", "6:six", "7:seven"]);
    stop.abort();
    expect((await watcher.next()).done).toBe(true);
  });

  it("loses nothing between the read and the watch", async () => {
    const [a, b] = instances(2);
    await a!.journal.append("gap", [ev("one")]);
    const watcher = b!.journal.watch("gap", 1);
    // The backlog's read is done once its first entry is out; the watch opens only after the marker.
    expect((await take(watcher, 1)).map(describeEvent)).toEqual(["1:one"]);
    await a!.journal.append("gap", [ev("two")]);
    expect((await take(watcher, 2)).map(describeEvent)).toEqual(["caught_up@1", "2:two"]);
    await watcher.return();
  });

  it("ends a watcher whose revision etcd compacted as WATCHER_LAGGED, naming the seq to resume from", async () => {
    const [a, b] = instances(2);
    await a!.journal.append("lag", [ev("one")]);
    await a!.journal.append("lag", [ev("two")]);
    const watcher = b!.journal.watch("lag", 1);
    expect((await take(watcher, 1)).map(describeEvent)).toEqual(["1:one"]);
    // While the watcher has read its backlog but not opened its watch, history moves on and is compacted.
    await a!.journal.append("lag", [ev("three")]);
    const later = await a!.journal.append("lag", [ev("four")]);
    await a!.client.compact(later.revision);
    expect((await take(watcher, 2)).map(describeEvent)).toEqual(["2:two", "caught_up@2"]);
    const error = await berthRefusal(watcher.next());
    expect(error).toMatchObject({ code: "resource_exhausted", reason: "WATCHER_LAGGED", details: { sessionId: "lag", lastSeq: 2 } });
    expect(error.message).toContain("from_seq=3");
    // Resumed by seq, it gets the rest.
    const resumed = b!.journal.watch("lag", 3);
    expect((await take(resumed, 3)).map(describeEvent)).toEqual(["3:three", "4:four", "caught_up@4"]);
    await resumed.return();
  });

  it("ends a session's watchers when it is deleted, and a new session under the id continues after its last seq", async () => {
    const [a, b] = instances(2);
    // b appends first, so that it remembers the session's head.
    await b!.journal.append("del", [ev("one")]);
    const watcher = b!.journal.watch("del", 1);
    expect((await take(watcher, 2)).map(describeEvent)).toEqual(["1:one", "caught_up@1"]);
    expect(await berthRefusal(a!.journal.delete("del", { expectedSeq: 0 }))).toMatchObject({ reason: "SEQ_CONFLICT" });
    expect(await a!.journal.delete("del", { expectedSeq: 1 })).toMatchObject({ lastSeq: 1 });
    expect(await berthRefusal(watcher.next())).toMatchObject({ code: "not_found", reason: "SESSION_DELETED" });
    expect(await berthRefusal(a!.journal.delete("del"))).toMatchObject({ reason: "SESSION_NOT_FOUND" });
    // b's remembered head is the deleted session's: the compare fails, and it starts over after
    // the tombstone's last seq (an id's seqs never go back).
    expect(await b!.journal.append("del", [ev("other")])).toMatchObject({ firstSeq: 2, lastSeq: 2, created: true });
    expect(await readSeqs(a!.journal, "del")).toEqual([2]);
    const reborn = await a!.journal.read("del");
    expect((await all(reborn.entries())).map((s) => s.entry.type)).toEqual(["other"]);
  });

  it("tells the watchers of every session each append and deletion, in commit order, from another instance", async () => {
    const [a, b] = instances(2);
    const stop = new AbortController();
    const start = (await a!.client.status()).revision + 1n;
    const changes = b!.journal.watchAll({ signal: stop.signal, startRevision: start });
    await a!.journal.append("x", [ev("one"), ev("two")]);
    await a!.journal.append("y", [ev("one")]);
    await b!.journal.append("x", [ev("three")]);
    await a!.journal.delete("y");
    const seen: string[] = [];
    for await (const change of changes) {
      seen.push(
        change.deleted ? `${change.sessionId} deleted@${change.lastSeq}` : `${change.sessionId} ${change.firstSeq}-${change.lastSeq} ${change.entry?.type}`,
      );
      if (seen.length === 4) stop.abort();
    }
    expect(seen).toEqual(["x 1-2 two", "y 1-1 one", "x 3-3 three", "y deleted@1"]);
  });

  it("deletes a session only while its head is the one a read found: an append after the read keeps it", async () => {
    const [a, b] = instances(2);
    await a!.journal.append("kept", [ev("one")]);
    const read = await a!.journal.read("kept");
    expect(read.headRevision).toBeGreaterThan(0n);
    await b!.journal.append("kept", [ev("two")]);
    expect(await a!.journal.deleteUnchanged("kept", read.headRevision)).toBeUndefined();
    expect(await readSeqs(a!.journal, "kept")).toEqual([1, 2]);
    const state = await a!.journal.state("kept");
    expect(state.headRevision).toBeGreaterThan(read.headRevision);
    const watcher = b!.journal.watch("kept", 1);
    expect((await take(watcher, 3)).map(describeEvent)).toEqual(["1:one", "2:two", "caught_up@2"]);
    // Unchanged since: deleted as DeleteSession deletes, and its watchers are told so.
    expect(await a!.journal.deleteUnchanged("kept", state.headRevision)).toBeGreaterThan(state.headRevision);
    expect(await berthRefusal(watcher.next())).toMatchObject({ code: "not_found", reason: "SESSION_DELETED" });
    // Nothing left but its tombstone.
    expect((await a!.client.range({ key: "", prefix: true, keysOnly: true })).kvs.map((kv) => kv.key)).toEqual(["t/kept"]);
    // Gone: a second deletion finds nothing to compare with.
    expect(await b!.journal.deleteUnchanged("kept", state.headRevision)).toBeUndefined();
  });

  it("tells a watcher of heads one change per append transaction and each deletion", async () => {
    const [a, b] = instances(2);
    const stop = new AbortController();
    const start = (await a!.client.status()).revision + 1n;
    const changes = b!.journal.watchHeads({ signal: stop.signal, startRevision: start });
    const x = await a!.journal.append("x", [ev("one"), ev("two")]);
    const grouped = await a!.journal.appendGroup("y", [[ev("one")], [ev("two")]]);
    const deletion = await a!.journal.delete("x");
    const seen: unknown[] = [];
    for await (const change of changes) {
      seen.push(change);
      if (seen.length === 3) stop.abort();
    }
    expect(seen).toEqual([
      { sessionId: "x", revision: x.revision, deleted: false },
      { sessionId: "y", revision: grouped[1]!.revision, deleted: false },
      { sessionId: "x", revision: deletion.revision, deleted: true },
    ]);
    expect((await a!.journal.list()).sessions).toEqual([{ sessionId: "y", lastSeq: 2, incarnation: grouped[0]!.revision, headRevision: grouped[0]!.revision }]);
  });
});

describe("listing and snapshots", () => {
  it("lists the sessions with their last seq, in pages", async () => {
    const [a] = instances(1, { pageAppends: 2 });
    for (const id of ["c", "a", "e", "b", "d"]) await a!.journal.append(id, [ev("one")]);
    await a!.journal.append("b", [ev("two")]);
    const all = await a!.journal.list();
    expect(all.sessions.map(({ sessionId, lastSeq }) => ({ sessionId, lastSeq }))).toEqual([
      { sessionId: "a", lastSeq: 1 },
      { sessionId: "b", lastSeq: 2 },
      { sessionId: "c", lastSeq: 1 },
      { sessionId: "d", lastSeq: 1 },
      { sessionId: "e", lastSeq: 1 },
    ]);
    expect((await a!.journal.list({ after: "b", limit: 2 })).sessions.map((s) => s.sessionId)).toEqual(["c", "d"]);
    // Each with its incarnation: the head's create revision, which a deletion and a new first append change.
    const before = all.sessions.find((s) => s.sessionId === "a")!.incarnation;
    await a!.journal.delete("a");
    await a!.journal.append("a", [ev("again")]);
    const after = (await a!.journal.list({ limit: 1 })).sessions[0]!;
    expect(after).toMatchObject({ sessionId: "a", lastSeq: 2 });
    expect(after.incarnation).toBeGreaterThan(before);
  });

  it("rebuilds a session's state from its cached snapshot and the tail, and never uses a deleted session's", async () => {
    const [a, b] = instances(2);
    const now = () => 0;
    const events = [ev("session_started", { pageUrl: "https://x" }), ev("generation_started", { expectedVariants: 2 }), ev("variant_ready", { variant: 1 })];
    await a!.journal.append("snap", events.slice(0, 2));
    const early = await a!.journal.state("snap", { now });
    expect(early).toMatchObject({ lastSeq: 2, exists: true });
    expect(await a!.journal.saveSnapshot("snap", { seq: early.lastSeq, incarnation: early.incarnation, snapshot: early.snapshot })).toBe(true);
    await a!.journal.append("snap", events.slice(2));
    // Expected: the reducer over every entry, as a file replay would build it.
    const read = await a!.journal.read("snap");
    let expected = baseSnapshot("snap");
    for await (const stored of read.entries()) expected = applyEvent(expected, stored.entry, { now });
    const state = await b!.journal.state("snap", { now });
    expect(state).toMatchObject({ lastSeq: 3, exists: true });
    expect(state.snapshot).toEqual(expected);

    // Deleted and re-created: the old incarnation's snapshot can no longer be written…
    await a!.journal.delete("snap");
    await a!.journal.append("snap", [ev("session_started", { pageUrl: "https://y" })]);
    expect(await a!.journal.saveSnapshot("snap", { seq: state.lastSeq, incarnation: state.incarnation, snapshot: state.snapshot })).toBe(false);
    const reborn = await b!.journal.state("snap", { now });
    expect(reborn.lastSeq).toBe(4);
    let fresh = baseSnapshot("snap");
    for await (const stored of (await a!.journal.read("snap")).entries()) fresh = applyEvent(fresh, stored.entry, { now });
    expect(reborn.snapshot).toEqual(fresh);
    // A session that never was: the base snapshot.
    expect(await a!.journal.state("never")).toMatchObject({ exists: false, lastSeq: 0, snapshot: baseSnapshot("never") });
  });
});
