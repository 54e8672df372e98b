import * as fs from "node:fs";
import * as path from "node:path";
import { Code } from "@connectrpc/connect";
import { ERROR_DETAILS_HEADER } from "@berth/shared/server/index";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  big,
  clientFor,
  closeStores,
  codeAndReason,
  collect,
  complete,
  dir,
  failure,
  generate,
  openStore,
  phase,
  setUpStores,
} from "./session-handler-fixtures.js";

beforeEach(setUpStores);
afterEach(closeStores);

describe("reads", () => {
  it("GetSnapshot answers every existing session, completed ones too; a missing one is NOT_FOUND SESSION_NOT_FOUND", async () => {
    const store = openStore();
    const client = clientFor(store);
    const none = await failure(client.getSnapshot({ sessionId: "none" }));
    expect(codeAndReason(none)).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
    expect(JSON.parse(none.metadata.get(ERROR_DETAILS_HEADER)!)).toEqual({ reason: "SESSION_NOT_FOUND", sessionId: "none" });
    expect(store.has("none")).toBe(false);
    await client.appendEvent({ sessionId: "done", event: generate() });
    await client.appendEvent({ sessionId: "done", event: complete() });
    const shown = await client.getSnapshot({ sessionId: "done" });
    expect(shown.lastSeq).toBe(2n);
    expect(shown.snapshot?.phase).toBe("completed");
    const bad = await failure(client.getSnapshot({ sessionId: "a b" }));
    expect(codeAndReason(bad)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
  });

  it("ListSessions sorts by id and hides completed sessions unless asked", async () => {
    const store = openStore();
    const client = clientFor(store);
    for (const id of ["c", "a", "b"]) await client.appendEvent({ sessionId: id, event: generate() });
    await client.appendEvent({ sessionId: "b", event: complete() });
    expect(await client.listSessions({})).toMatchObject({ sessions: [{ id: "a" }, { id: "c" }], nextPageToken: "" });
    expect((await client.listSessions({ includeCompleted: true })).sessions.map((s) => s.id)).toEqual(["a", "b", "c"]);
  });

  it("ListSessions pages by id: every session once, whatever is created or deleted meanwhile", async () => {
    const store = openStore();
    const client = clientFor(store);
    for (let i = 0; i < 10; i++) await client.appendEvent({ sessionId: `s${i}`, event: generate() });
    await client.appendEvent({ sessionId: "s4", event: complete() });
    const first = await client.listSessions({ pageSize: 3 });
    expect(first.sessions.map((s) => s.id)).toEqual(["s0", "s1", "s2"]);
    expect(first.nextPageToken).toMatch(/^[A-Za-z0-9_-]+$/);
    // Created before the page token's id: not in a later page; after it: in one. Deleted: gone.
    await client.appendEvent({ sessionId: "r", event: generate() });
    await client.appendEvent({ sessionId: "s35", event: generate() });
    await client.deleteSession({ sessionId: "s5" });
    const ids: string[] = first.sessions.map((s) => s.id);
    let token = first.nextPageToken;
    while (token !== "") {
      const page = await client.listSessions({ pageSize: 3, pageToken: token });
      expect(page.sessions.length).toBeGreaterThan(0);
      ids.push(...page.sessions.map((s) => s.id));
      token = page.nextPageToken;
    }
    expect(ids).toEqual(["s0", "s1", "s2", "s3", "s35", "s6", "s7", "s8", "s9"]);
    // The last page says so, even when it is full.
    expect((await client.listSessions({ pageSize: 9 })).nextPageToken).not.toBe("");
    expect((await client.listSessions({ pageSize: 10 })).nextPageToken).toBe("");
    expect((await client.listSessions({ pageSize: 5000 })).sessions).toHaveLength(10);
    // A token belongs to its include_completed; anything else is no token.
    for (const [request, message] of [
      [{ pageToken: first.nextPageToken, includeCompleted: true }, /^page_token: was given for include_completed=false/],
      [{ pageToken: "bm90IGEgdG9rZW4" }, /^page_token: is not a token/],
      [{ pageToken: "%%%" }, /^page_token: is not a token/],
      [{ pageSize: -1 }, /^page_size: /],
    ] as const) {
      const error = await failure(client.listSessions(request));
      expect(codeAndReason(error)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
      expect(error.rawMessage).toMatch(message);
    }
  });

  it("FlushSnapshot writes the snapshot file; NOT_FOUND without a journal", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "f", event: generate() });
    const flushed = await client.flushSnapshot({ sessionId: "f" });
    expect(flushed.lastSeq).toBe(1n);
    expect(flushed.snapshot?.phase).toBe("generate_requested");
    const file = JSON.parse(fs.readFileSync(path.join(dir, "sessions", "f.snapshot.json"), "utf8")) as Record<string, unknown>;
    expect(file.__nextSeq).toBe(2);
    const missing = await failure(client.flushSnapshot({ sessionId: "g" }));
    expect(codeAndReason(missing)).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
    expect(store.has("g")).toBe(false);
  });

  it("ReadJournal streams entries in bounded batches from a seq, up to a limit, and says where it ended", async () => {
    const store = openStore();
    const client = clientFor(store, { readBatchEntries: 4 });
    await client.appendEvents({ sessionId: "r", events: Array.from({ length: 10 }, (_, i) => phase(`p${i}`)) });
    const all = await collect(client.readJournal({ sessionId: "r" }));
    expect(all.map((m) => m.entries.length)).toEqual([4, 4, 2]);
    expect(all.map((m) => m.end)).toEqual([undefined, undefined, expect.objectContaining({ lastSeq: 10n, nextSeq: 11n, more: false })]);
    expect(all.flatMap((m) => m.entries.map((e) => e.seq))).toEqual(Array.from({ length: 10 }, (_, i) => BigInt(i + 1)));
    const first = all[0]!.entries[0]!;
    expect(first).toMatchObject({ sessionId: "r", type: "agent_phase" });
    expect(first.appendTime?.seconds).toBe(BigInt(Date.UTC(2026, 0, 1) / 1000));
    const part = await collect(client.readJournal({ sessionId: "r", fromSeq: 3n, limit: 5 }));
    expect(part.flatMap((m) => m.entries.map((e) => Number(e.seq)))).toEqual([3, 4, 5, 6, 7]);
    expect(part.at(-1)!.end).toMatchObject({ lastSeq: 10n, nextSeq: 8n, more: true });
    // A limit that reaches the end exactly: nothing more.
    expect((await collect(client.readJournal({ sessionId: "r", fromSeq: 8n, limit: 3 }))).at(-1)!.end).toMatchObject({ nextSeq: 11n, more: false });
    // last_seq + 1 is an empty read that ends at once; beyond is OUT_OF_RANGE.
    const empty = await collect(client.readJournal({ sessionId: "r", fromSeq: 11n }));
    expect(empty).toHaveLength(1);
    expect(empty[0]).toMatchObject({ entries: [], end: { lastSeq: 10n, nextSeq: 11n, more: false } });
    const past = await failure(collect(client.readJournal({ sessionId: "r", fromSeq: 12n })));
    expect(codeAndReason(past)).toEqual([Code.OutOfRange, "SEQ_OUT_OF_RANGE"]);
    expect(past.rawMessage).toMatch(/^from_seq: 12 is past the end of session r, whose last seq is 10/);
    const missing = await failure(collect(client.readJournal({ sessionId: "nope" })));
    expect(codeAndReason(missing)).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
    for (const [request, message] of [
      [{ sessionId: "r", fromSeq: 2n ** 63n - 1n }, /^from_seq: must be at most/],
      [{ sessionId: "r", fromSeq: -1n }, /^from_seq: must not be negative/],
      [{ sessionId: "r", limit: -1 }, /^limit: /],
    ] as const) {
      const bad = await failure(collect(client.readJournal(request)));
      expect(codeAndReason(bad)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
      expect(bad.rawMessage).toMatch(message);
    }
  });

  it("ReadJournal closes a message once its events reach the byte bound", async () => {
    const store = openStore();
    const client = clientFor(store, { readBatchBytes: 1000 });
    await client.appendEvents({ sessionId: "r", events: Array.from({ length: 6 }, () => big(400)) });
    const batches = await collect(client.readJournal({ sessionId: "r" }));
    expect(batches.map((b) => b.entries.length)).toEqual([2, 2, 2, 0]);
    expect(batches.at(-1)!.end).toMatchObject({ lastSeq: 6n, nextSeq: 7n });
  });
});

describe("GetLimits", () => {
  it("reports the limits the service enforces", async () => {
    const store = openStore({ maxEventBytes: 4096, maxEventsPerAppend: 7, maxBuffered: 11, completedRetentionMs: 90_000 });
    const limits = await clientFor(store, { maxMessageBytes: 65536 }).getLimits({});
    expect(limits).toMatchObject({
      maxEventBytes: 4096n,
      maxEventsPerAppend: 7,
      maxMessageBytes: 65536n,
      watchBuffer: 11,
      maxIdempotencyKeyLength: 128,
      maxPageSize: 1000,
      completedRetention: { seconds: 90n, nanos: 0 },
    });
    expect((await clientFor(openStore({ dir: path.join(dir, "other") })).getLimits({})).completedRetention).toBeUndefined();
  });
});
