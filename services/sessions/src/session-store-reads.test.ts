import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import type { JournalEntry } from "./reducer.js";
import type { SessionStore } from "./session-store.js";
import { dir, expectBerthError, journal, open, readAll, temporaryStores } from "./session-store-fixtures.js";

temporaryStores();

describe("reads and lists", () => {
  it("reads entries from a seq with a limit, without berth's bookkeeping fields", async () => {
    const store = open();
    for (let i = 0; i < 30; i++)
      await store.append(
        "s1",
        [
          { type: "checkpoint", revision: i },
          { type: "agent_phase", phase: `p${i}` },
        ],
        { idempotencyKey: `k${i}` },
      );
    const all = await readAll(store, "s1");
    expect(all.map((e) => e.entry.seq)).toEqual(Array.from({ length: 60 }, (_, i) => i + 1));
    expect(Object.keys(all[0]!.entry)).toEqual(["seq", "id", "type", "ts", "event"]);
    expect((await readAll(store, "s1", 41, 5)).map((e) => e.entry.seq)).toEqual([41, 42, 43, 44, 45]);
    expect(await readAll(store, "s1", 61)).toEqual([]);
    expect(store.read("nope")).toBeNull();
    expect(() => store.read("s1", -1)).toThrow(/from_seq/);
  });

  it("reads each entry with the key it was appended with, also from inside an append and after a hydration", async () => {
    const store = open();
    const batch = Array.from({ length: 700 }, (_, i) => ({ type: "checkpoint", revision: i }));
    await store.append("s1", batch, { idempotencyKey: "first" });
    await store.append("s1", batch, { idempotencyKey: "second" });
    await store.append("s1", [{ type: "steer" }]);
    const keysFrom = async (s: SessionStore, fromSeq: number, limit: number) =>
      (await readAll(s, "s1", fromSeq, limit)).map((e) => `${e.entry.seq}:${e.idempotencyKey ?? "-"}:${e.integrity}`);
    const expected = ["1000:second:verified", "1001:second:verified", "1400:second:verified", "1401:-:verified"];
    const pick = (all: string[]) => all.filter((_, i) => [0, 1, 400, 401].includes(i));
    expect(pick(await keysFrom(store, 1000, 0))).toEqual(expected);
    expect(await keysFrom(store, 699, 3)).toEqual(["699:first:verified", "700:first:verified", "701:second:verified"]);
    await store.close();
    const hydrated = open();
    expect(pick(await keysFrom(hydrated, 1000, 0))).toEqual(expected);
    expect(hydrated.stats().hydrations).toBe(1);
  });

  it("reads a long journal through the seek index, also after a hydration", async () => {
    const store = open();
    const batch = Array.from({ length: 1000 }, (_, i) => ({ type: "checkpoint", revision: i }));
    for (let i = 0; i < 3; i++) await store.append("s1", batch);
    expect((await readAll(store, "s1", 2500, 3)).map((e) => e.entry.seq)).toEqual([2500, 2501, 2502]);
    await store.close();
    const hydrated = open();
    expect((await readAll(hydrated, "s1", 1999, 2)).map((e) => e.entry.seq)).toEqual([1999, 2000]);
    expect(hydrated.stats().hydrations).toBe(1);
  });

  it("lists active sessions sorted by id, completed ones only when asked; has never creates", async () => {
    const store = open();
    await store.append("b", [{ type: "generate" }]);
    await store.append("a", [{ type: "generate" }]);
    await store.append("c", [{ type: "complete" }]);
    await store.append("d", [{ type: "discarded" }]);
    expect(store.list().map((v) => v.sessionId)).toEqual(["a", "b"]);
    expect(store.list({ includeCompleted: true }).map((v) => v.sessionId)).toEqual(["a", "b", "c", "d"]);
    expect(store.getSnapshot("c")).toBeNull();
    expect(store.getSnapshot("c", { includeCompleted: true })!.snapshot.phase).toBe("completed");
    expect(store.has("zz")).toBe(false);
    expect(store.getSnapshot("zz")).toMatchObject({ exists: false, lastSeq: 0, snapshot: { phase: "new" } });
    expect(fs.existsSync(journal("zz"))).toBe(false);
  });
});

describe("watchers", () => {
  it("catch up and go live with no gap or repeat across a concurrent append", async () => {
    const store = open();
    for (let i = 1; i <= 5; i++) await store.append("s1", [{ type: "checkpoint", revision: i }]);
    const watcher = store.watch("s1", 3, { includeSnapshot: true });
    // Appends racing the backlog read: some land before the watcher has read the file.
    const racing = [store.append("s1", [{ type: "checkpoint", revision: 6 }]), store.append("s1", [{ type: "checkpoint", revision: 7 }, { type: "steer" }])];
    const items: Array<{ kind: string; seq?: number; lastSeq?: number; phase?: string }> = [];
    for await (const item of watcher) {
      items.push(
        item.kind === "entry"
          ? { kind: "entry", seq: item.entry.seq, ...(item.snapshot ? { phase: item.snapshot.phase } : {}) }
          : { kind: item.kind, lastSeq: item.lastSeq },
      );
      if (item.kind === "entry" && item.entry.seq === 8) break;
    }
    await Promise.all(racing);
    expect(items).toEqual([
      { kind: "entry", seq: 3 },
      { kind: "entry", seq: 4 },
      { kind: "entry", seq: 5 },
      { kind: "caught_up", lastSeq: 5 },
      { kind: "entry", seq: 6, phase: "new" },
      { kind: "entry", seq: 7, phase: "new" },
      { kind: "entry", seq: 8, phase: "steer_requested" },
    ]);
    expect(store.stats().watchers).toBe(0);
  });

  it("hand live entries over with the key they were appended with", async () => {
    const store = open();
    const watcher = store.watch("s1", 1);
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 0 });
    await store.append("s1", [{ type: "generate" }, { type: "steer" }], { idempotencyKey: "k" });
    await store.append("s1", [{ type: "agent_done" }]);
    const got = [];
    for (let i = 0; i < 3; i++) got.push((await watcher.next()).value);
    expect(got).toMatchObject([
      { kind: "entry", entry: { seq: 1 }, idempotencyKey: "k", integrity: "verified" },
      { kind: "entry", entry: { seq: 2 }, idempotencyKey: "k", integrity: "verified" },
      { kind: "entry", entry: { seq: 3 }, idempotencyKey: undefined, integrity: "verified" },
    ]);
    await watcher.return!();
  });

  it("a slow watcher is ended with resource_exhausted and resumes from its last seq without loss", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    const watcher = store.watch("s1", 1, { maxBuffered: 5 });
    const seen: number[] = [];
    const first = await watcher.next();
    expect(first.value).toMatchObject({ kind: "entry", entry: { seq: 1 } });
    seen.push(1);
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 1 });
    await store.append("s1", [{ type: "checkpoint", revision: 1 }]);
    const second = await watcher.next();
    seen.push((second.value as { entry: JournalEntry }).entry.seq);
    for (let i = 0; i < 10; i++) await store.append("s1", [{ type: "checkpoint", revision: i + 2 }]);
    const error = await expectBerthError(() => watcher.next(), "resource_exhausted");
    expect(error.message).toContain("fell behind at seq 2; resume with from_seq=3");
    expect(error.details).toMatchObject({ lastSeq: 2 });
    expect(await watcher.next()).toEqual({ value: undefined, done: true });
    expect(store.stats().watchers).toBe(0);
    for await (const item of store.watch("s1", (error.details!.lastSeq as number) + 1)) {
      if (item.kind === "caught_up") break;
      seen.push(item.entry.seq);
    }
    expect(seen).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
  });

  it("watchAll sees one change per append of every session; cancelling unsubscribes at once", async () => {
    const store = open();
    const all = store.watchAll({ includeSnapshot: true });
    const pending = all.next();
    await store.append("a", [{ type: "generate" }]);
    await store.append("b", [{ type: "steer" }, { type: "agent_phase", phase: "plan" }, { type: "agent_done" }]);
    const firstChange = (await pending).value;
    expect(firstChange).toMatchObject({ sessionId: "a", firstSeq: 1, lastSeq: 1, entry: { seq: 1 }, snapshot: { phase: "generate_requested" } });
    const batch = (await all.next()).value!;
    expect(batch).toMatchObject({ sessionId: "b", firstSeq: 1, lastSeq: 3, entry: { seq: 3, type: "agent_done" } });
    expect(batch.snapshot).toBe(store.getSnapshot("b", { includeCompleted: true })!.snapshot);
    const waiting = all.next();
    expect(store.stats().watchers).toBe(1);
    await all.return!();
    expect(await waiting).toEqual({ value: undefined, done: true });
    expect(store.stats().watchers).toBe(0);
  });

  it("close ends watchers with unavailable", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    const watcher = store.watch("s1", 2);
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up" });
    const waiting = watcher.next();
    await store.close();
    await expectBerthError(waiting, "unavailable");
    expect(() => store.getSnapshot("s1")).toThrow(/closed/);
  });
});

describe("input checks", () => {
  it("refuse bad session ids on every call before touching the filesystem", async () => {
    const store = open();
    for (const bad of ["", "..", "a/b", "a b", "x".repeat(129), "a\0b"]) {
      expect(() => store.has(bad)).toThrow(/session_id/);
      expect(() => store.getSnapshot(bad)).toThrow(/session_id/);
      expect(() => store.read(bad)).toThrow(/session_id/);
      expect(() => store.watch(bad)).toThrow(/session_id/);
      await expectBerthError(store.flush(bad), "invalid_argument");
      await expectBerthError(store.append(bad, [{ type: "x" }]), "invalid_argument");
    }
    expect(fs.readdirSync(path.join(dir, "sessions"))).toEqual([]);
    expect(store.stats().watchers).toBe(0);
  });

  it("a watcher of a session that does not exist yet sees its first entries", async () => {
    const store = open();
    const watcher = store.watch("later", 1, { includeSnapshot: true });
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 0, snapshot: { phase: "new" } });
    expect(store.has("later")).toBe(false);
    await store.append("later", [{ type: "generate" }, { type: "agent_done" }]);
    expect((await watcher.next()).value).toMatchObject({ entry: { seq: 1 }, snapshot: { phase: "generate_requested" } });
    expect((await watcher.next()).value).toMatchObject({ entry: { seq: 2 }, snapshot: { phase: "variants_ready" } });
    await watcher.return!();
  });
});
