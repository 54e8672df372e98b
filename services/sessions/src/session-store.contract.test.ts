/**
 * What every session store promises its callers (SessionStoreApi), run against each: the file
 * store and the etcd store. One suite per rule, so that a rule one store keeps and the other drifts
 * from fails here. The etcd store's suites carry the etcd tag (skipped where etcd cannot run).
 */
import * as fs from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { berthRefusal } from "@berth/shared/testing/berth-refusal";
import { MAX_IDEMPOTENCY_KEY_LENGTH } from "./append-input.js";
import { createSessionStore } from "./create-session-store.js";
import { EtcdJournal } from "./etcd/etcd-journal.js";
import { EtcdSessionStore } from "./etcd/etcd-session-store.js";
import type { SessionStoreApi, WatchEvent } from "./session-store-api.js";

const STORES = ["file", "etcd"] as const;
type StoreKind = (typeof STORES)[number];

/** The etcd store's suites carry the etcd tag, so that they are skipped where etcd cannot run. */
function storeTags(store: StoreKind): { tags: string[] } {
  return { tags: store === "etcd" ? ["etcd"] : [] };
}

const LIMITS = { maxEventBytes: 1024, maxEventsPerAppend: 3, maxBuffered: 50, idempotencyWindowMs: 60_000 };

const opened: SessionStoreApi[] = [];
const dirs: string[] = [];
const clients: EtcdClient[] = [];
// Started by the first etcd store a test opens: never where the etcd suites are skipped.
let etcd: Promise<EtcdCluster> | undefined;
let prefixes = 0;

afterAll(async () => {
  for (const store of opened) await store.close();
  for (const client of clients) client.close();
  await (await etcd?.catch(() => undefined))?.stop();
  for (const dir of dirs) fs.rmSync(dir, { recursive: true, force: true });
});

/** A fresh, empty store of `kind`. */
async function openStore(kind: StoreKind): Promise<SessionStoreApi> {
  let store: SessionStoreApi;
  if (kind === "file") {
    const dir = fs.mkdtempSync(path.join(tmpdir(), "berth-contract-"));
    dirs.push(dir);
    store = createSessionStore({ dir, fsync: "none", ...LIMITS });
  } else {
    etcd ??= startEtcd();
    const client = createEtcdClient({ endpoints: (await etcd).clientUrls, prefix: `contract${++prefixes}/` });
    clients.push(client);
    store = new EtcdSessionStore({ journal: new EtcdJournal({ client, idempotencyWindowMs: LIMITS.idempotencyWindowMs }), client, ...LIMITS });
  }
  opened.push(store);
  return store;
}

const ev = (type: string, extra: Record<string, unknown> = {}) => ({ type, ...extra });

/** The next `count` events of `watcher`, as seqs (entries) and `caught_up@seq` markers. */
async function take(watcher: AsyncIterator<WatchEvent>, count: number): Promise<Array<number | string>> {
  const seen: Array<number | string> = [];
  while (seen.length < count) {
    const step = await watcher.next();
    if (step.done) break;
    seen.push(step.value.kind === "entry" ? step.value.entry.seq : `caught_up@${step.value.lastSeq}`);
  }
  return seen;
}

describe.each(STORES)("the session store contract: %s store", (store) => {
  describe("expected seq", storeTags(store), () => {
    it("takes an append at the seq the caller saw, and refuses any other aborted SEQ_CONFLICT naming the current seq", async () => {
      const s = await openStore(store);
      expect(await s.append("a", [ev("generate")], { expectedSeq: 0 })).toMatchObject({ firstSeq: 1, lastSeq: 1, duplicate: false });
      expect(await s.append("a", [ev("generate"), ev("generate")], { expectedSeq: 1 })).toMatchObject({ firstSeq: 2, lastSeq: 3 });
      const conflict = await berthRefusal(s.append("a", [ev("generate")], { expectedSeq: 1 }));
      expect(conflict).toMatchObject({ code: "aborted", reason: "SEQ_CONFLICT", details: { sessionId: "a", expectedSeq: 1, currentSeq: 3 } });
      expect(conflict.message).toBe("session a: expected seq 1 but the session is at seq 3; read it again, redo the change and retry with expected_seq=3");
      expect((await s.getSnapshot("a"))?.lastSeq).toBe(3);
    });

    it("refuses an expected seq that is not a whole number ≥ 0 before anything is written", async () => {
      const s = await openStore(store);
      for (const expectedSeq of [-1, 1.5, Number.NaN]) {
        const refused = await berthRefusal(s.append("a", [ev("generate")], { expectedSeq }));
        expect(refused).toMatchObject({ code: "invalid_argument", details: { field: "expected_seq" } });
      }
      expect(await s.read("a")).toBeNull();
    });
  });

  describe("expected state", storeTags(store), () => {
    it("takes no_session only for a session with no entry, and exists only for one with some", async () => {
      const s = await openStore(store);
      const absent = await berthRefusal(s.append("b", [ev("generate")], { expectedState: "exists" }));
      expect(absent).toMatchObject({ reason: "SEQ_CONFLICT", details: { currentSeq: 0, expectedState: "exists" } });
      expect(absent.message).toBe(
        "session b: expected an existing session but the session is at seq 0; read it again, redo the change and it has no entry yet",
      );
      expect(await s.append("b", [ev("generate")], { expectedState: "no_session" })).toMatchObject({ firstSeq: 1 });
      const present = await berthRefusal(s.append("b", [ev("generate")], { expectedState: "no_session" }));
      expect(present).toMatchObject({ reason: "SEQ_CONFLICT", details: { currentSeq: 1, expectedState: "no_session" } });
      expect(present.message).toBe(
        "session b: expected no session yet but the session is at seq 1; read it again, redo the change and retry with expected_seq=1",
      );
      expect(await s.append("b", [ev("generate")], { expectedState: "exists" })).toMatchObject({ firstSeq: 2 });
      // An exact seq outranks the state.
      expect(await s.append("b", [ev("generate")], { expectedSeq: 2, expectedState: "no_session" })).toMatchObject({ firstSeq: 3 });
    });
  });

  describe("limits", storeTags(store), () => {
    it("reports the limits it was given, and refuses an append over them with nothing written", async () => {
      const s = await openStore(store);
      expect(s.limits()).toEqual({
        maxEventBytes: 1024,
        maxEventsPerAppend: 3,
        maxBuffered: 50,
        maxIdempotencyKeyLength: MAX_IDEMPOTENCY_KEY_LENGTH,
        completedRetentionMs: undefined,
        idempotencyWindowMs: 60_000,
      });
      const many = await berthRefusal(s.append("c", [ev("a"), ev("b"), ev("c"), ev("d")]));
      expect(many).toMatchObject({ code: "invalid_argument", reason: "TOO_MANY_EVENTS", details: { limit: 3, count: 4 } });
      const large = await berthRefusal(s.append("c", [ev("a"), ev("big", { padding: "x".repeat(1024) })]));
      expect(large).toMatchObject({ code: "invalid_argument", reason: "EVENT_TOO_LARGE", details: { field: "events[1]", limit: 1024 } });
      const key = await berthRefusal(s.append("c", [ev("a")], { idempotencyKey: "k".repeat(MAX_IDEMPOTENCY_KEY_LENGTH + 1) }));
      expect(key).toMatchObject({ code: "invalid_argument", details: { field: "idempotency_key" } });
      expect(await berthRefusal(s.append("c", []))).toMatchObject({ code: "invalid_argument", details: { field: "events" } });
      expect(await s.read("c")).toBeNull();
    });
  });

  describe("idempotency key", storeTags(store), () => {
    it("answers a retry with the same events (in any key order) with the first result, and writes nothing again", async () => {
      const s = await openStore(store);
      const first = await s.append("d", [ev("generate", { a: 1, b: 2 }), ev("generate")], { idempotencyKey: "req-1" });
      expect(first).toMatchObject({ firstSeq: 1, lastSeq: 2, duplicate: false });
      const retry = await s.append("d", [{ b: 2, a: 1, type: "generate" }, ev("generate")], { idempotencyKey: "req-1" });
      expect(retry).toEqual({ ...first, duplicate: true });
      expect((await s.getSnapshot("d"))?.lastSeq).toBe(2);
      // "" is no key: written every time.
      expect(await s.append("d", [ev("generate")], { idempotencyKey: "" })).toMatchObject({ firstSeq: 3, duplicate: false });
      expect(await s.append("d", [ev("generate")], { idempotencyKey: "" })).toMatchObject({ firstSeq: 4, duplicate: false });
    });

    it("refuses the key with other events already_exists IDEMPOTENCY_KEY_REUSED, naming what it was used for", async () => {
      const s = await openStore(store);
      await s.append("d", [ev("generate")], { idempotencyKey: "req-1" });
      const reused = await berthRefusal(s.append("d", [ev("accept")], { idempotencyKey: "req-1" }));
      expect(reused).toMatchObject({ code: "already_exists", reason: "IDEMPOTENCY_KEY_REUSED", details: { idempotencyKey: "req-1", firstSeq: 1, lastSeq: 1 } });
      expect(reused.message).toBe(
        'session d: idempotency key "req-1" was used for a different append (seq 1); nothing was done — use a new key for a new request',
      );
      expect((await s.getSnapshot("d"))?.lastSeq).toBe(1);
    });
  });

  describe("read after append", storeTags(store), () => {
    it("reads what an append wrote as soon as it resolves: the last seq and the entries from a seq, at most a limit", async () => {
      const s = await openStore(store);
      expect(await s.read("e")).toBeNull();
      await s.append("e", [ev("generate", { n: 1 }), ev("generate", { n: 2 })]);
      await s.append("e", [ev("generate", { n: 3 })], { idempotencyKey: "k" });
      const all = (await s.read("e"))!;
      expect(all.lastSeq).toBe(3);
      const entries = [];
      for await (const stored of all.entries) entries.push(stored);
      expect(entries.map((stored) => [stored.entry.seq, stored.entry.id, stored.entry.event.n, stored.idempotencyKey])).toEqual([
        [1, "e", 1, undefined],
        [2, "e", 2, undefined],
        [3, "e", 3, "k"],
      ]);
      const page = (await s.read("e", 2, 1))!;
      const seqs = [];
      for await (const stored of page.entries) seqs.push(stored.entry.seq);
      expect(seqs).toEqual([2]);
      expect(await s.getSnapshot("e")).toMatchObject({ sessionId: "e", lastSeq: 3, exists: true });
      expect(await s.getSnapshot("none")).toMatchObject({ sessionId: "none", lastSeq: 0, exists: false });
      expect((await s.list()).map((view) => view.sessionId)).toEqual(["e"]);
    });
  });

  describe("pages", storeTags(store), () => {
    it("gives every session once, sorted by id, in pages of at most the size asked, leaving out one deleted before its page is read", async () => {
      const s = await openStore(store);
      for (const id of ["p4", "p1", "p5", "p3", "p2"]) await s.append(id, [ev("generate")]);
      const pages: string[][] = [];
      for await (const page of s.pages({ pageSize: 2 })) {
        pages.push(page.map((view) => view.sessionId));
        expect(page.every((view) => view.exists && view.lastSeq === 1)).toBe(true);
        if (pages.length === 1) await s.delete("p4");
      }
      // Where a page ends is the store's (the file store's pages are slices of one listing, etcd's
      // each fill up from the last id); none is empty or over the size.
      expect(pages.flat()).toEqual(["p1", "p2", "p3", "p5"]);
      expect(pages.every((page) => page.length > 0 && page.length <= 2)).toBe(true);
      const none: string[][] = [];
      for await (const page of (await openStore(store)).pages({ pageSize: 2 })) none.push(page.map((view) => view.sessionId));
      expect(none.flat()).toEqual([]);
    });
  });

  describe("delete", storeTags(store), () => {
    it("deletes a session at its expected seq, leaves its seqs behind it, and refuses a session it has not", async () => {
      const s = await openStore(store);
      await s.append("f", [ev("generate"), ev("generate")]);
      expect(await berthRefusal(s.delete("f", { expectedSeq: 1 }))).toMatchObject({ code: "aborted", reason: "SEQ_CONFLICT", details: { currentSeq: 2 } });
      expect(await s.delete("f", { expectedSeq: 2, idempotencyKey: "del-1" })).toEqual({ lastSeq: 2, duplicate: false });
      expect(await s.delete("f", { expectedSeq: 2, idempotencyKey: "del-1" })).toEqual({ lastSeq: 2, duplicate: true });
      expect(await berthRefusal(s.delete("f"))).toMatchObject({ code: "not_found", reason: "SESSION_NOT_FOUND" });
      expect(await s.getSnapshot("f")).toMatchObject({ lastSeq: 0, exists: false });
      expect(await s.read("f")).toBeNull();
      // A session created again under the id continues after the deleted one's seqs.
      expect(await s.append("f", [ev("generate")], { expectedState: "no_session" })).toMatchObject({ firstSeq: 3, lastSeq: 3 });
      // A read from a seq of the deleted session is refused, by the call or by its entries.
      const refused = await berthRefusal(
        (async () => {
          for await (const _ of (await s.read("f", 2))!.entries);
        })(),
      );
      expect(refused).toMatchObject({ code: "not_found", reason: "SESSION_DELETED", details: { fromSeq: 2, firstSeq: 3 } });
    });
  });

  describe("watch from a seq", storeTags(store), () => {
    it("gives the entries from the seq asked for, a caught-up marker at the last seq, then every new entry", async () => {
      const s = await openStore(store);
      await s.append("g", [ev("generate"), ev("generate"), ev("generate")]);
      const watcher = s.watch("g", 2, { includeSnapshot: true });
      try {
        expect(await take(watcher, 3)).toEqual([2, 3, "caught_up@3"]);
        await s.append("g", [ev("generate"), ev("generate")]);
        const live = await watcher.next();
        expect(live.value).toMatchObject({ kind: "entry", entry: { seq: 4 }, snapshot: { id: "g" } });
        expect(await take(watcher, 1)).toEqual([5]);
      } finally {
        await watcher.return?.();
      }
      const fresh = s.watch("h", 1);
      try {
        expect(await take(fresh, 1)).toEqual(["caught_up@0"]);
        await s.append("h", [ev("generate")]);
        expect(await take(fresh, 1)).toEqual([1]);
      } finally {
        await fresh.return?.();
      }
    });
  });
});
