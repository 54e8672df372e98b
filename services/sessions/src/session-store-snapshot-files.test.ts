import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import type { SessionSnapshot } from "./reducer.js";
import { createSessionStore } from "./create-session-store.js";
import type { SessionStore } from "./session-store.js";
import { clock, dir, journal, open, readAll, seedLine, temporaryStores } from "./session-store-fixtures.js";

temporaryStores();

describe("snapshot files", () => {
  const snapshotFile = (id: string) => path.join(dir, "sessions", `${id}.snapshot.json`);
  const flushed = async (store: SessionStore) => {
    await store.settled();
  };

  it("are written lazily: after N entries or when idle, never on every append", async () => {
    const store = open({ snapshotEveryEntries: 5, snapshotIdleMs: 1000 });
    for (let i = 0; i < 4; i++) await store.append("s1", [{ type: "checkpoint", revision: i }]);
    await flushed(store);
    expect(fs.existsSync(snapshotFile("s1"))).toBe(false);
    await store.append("s1", [{ type: "checkpoint", revision: 4 }]);
    await flushed(store);
    expect(JSON.parse(fs.readFileSync(snapshotFile("s1"), "utf8"))).toMatchObject({ __nextSeq: 6, browserCheckpointRevision: 4 });
    await store.append("s1", [{ type: "checkpoint", revision: 5 }]);
    clock.advance(500);
    await store.append("s1", [{ type: "checkpoint", revision: 6 }]);
    clock.advance(600); // 1100 ms after the first, 600 after the last: not idle long enough
    await flushed(store);
    expect(JSON.parse(fs.readFileSync(snapshotFile("s1"), "utf8")).__nextSeq).toBe(6);
    clock.advance(400);
    await flushed(store);
    const file = JSON.parse(fs.readFileSync(snapshotFile("s1"), "utf8"));
    expect(file.__nextSeq).toBe(8);
    expect(file.__journalBytes).toBe(fs.statSync(journal("s1")).size);
    expect(store.stats().snapshotWrites).toBe(2);
    // Atomic: written by rename, no temp file left behind.
    expect(fs.readdirSync(path.join(dir, "sessions")).sort()).toEqual(["s1.jsonl", "s1.snapshot.json", "s1.snapshot.meta.json"]);
    expect(clock.pendingTimers()).toBe(0);
  });

  it("the idle write waits for quiet on the monotonic clock; entries are stamped with the wall clock", async () => {
    const store = open({ snapshotEveryEntries: 1000, snapshotIdleMs: 1000 });
    await store.append("s1", [{ type: "checkpoint", revision: 1 }]);
    clock.stepWall(3_600_000);
    const stamped = new Date(clock.now()).toISOString();
    await store.append("s1", [{ type: "checkpoint", revision: 2 }]);
    // Stepped back right after the last append: still 1 s of quiet, not 1 h and 1 s.
    clock.stepWall(-7_200_000);
    clock.advance(999);
    await flushed(store);
    expect(fs.existsSync(snapshotFile("s1"))).toBe(false);
    clock.advance(1);
    await flushed(store);
    expect(JSON.parse(fs.readFileSync(snapshotFile("s1"), "utf8")).__nextSeq).toBe(3);
    const entries: unknown[] = [];
    for await (const { entry } of store.read("s1", 2)!.entries) entries.push(entry.ts);
    expect(entries).toEqual([stamped]);
  });

  it("a stale snapshot file without berth's sidecar (as the seed writes them) is ignored and the journal replayed", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    await store.flush("s1");
    fs.appendFileSync(journal("s1"), seedLine(2, "s1", { type: "agent_done" }));
    await store.close();
    fs.appendFileSync(journal("s1"), seedLine(3, "s1", { type: "steer" }));
    fs.rmSync(path.join(dir, "sessions", "s1.snapshot.meta.json"));
    const reopened = open();
    expect(reopened.getSnapshot("s1")).toMatchObject({ lastSeq: 3, snapshot: { phase: "steer_requested" } });
    expect(reopened.stats()).toMatchObject({ hydrations: 0, replays: 1 });
  });

  describe("of a journal that grew since", () => {
    /**
     * A journal whose snapshot file (and sidecar) describe its first 40 entries, with 20 more
     * after them: keyed batches on both sides of the fence, single events, a foreign seed line.
     */
    async function grownJournal(): Promise<{ expected: SessionSnapshot; prefixBytes: number }> {
      for (const sub of ["sessions", "replay-only"]) fs.rmSync(path.join(dir, sub), { recursive: true, force: true });
      const store = open();
      for (let i = 0; i < 4; i++) {
        await store.append(
          "s1",
          Array.from({ length: 10 }, (_, j) => ({ type: "checkpoint", revision: i * 10 + j })),
          { idempotencyKey: `before-${i}` },
        );
      }
      await store.flush("s1");
      const prefixBytes = fs.statSync(journal("s1")).size;
      const saved = ["s1.snapshot.json", "s1.snapshot.meta.json"].map((name) => [name, fs.readFileSync(path.join(dir, "sessions", name))] as const);
      await store.append(
        "s1",
        Array.from({ length: 10 }, (_, j) => ({ type: "agent_phase", phase: `p${j}` })),
        { idempotencyKey: "after" },
      );
      for (let i = 0; i < 9; i++) await store.append("s1", [{ type: "checkpoint", revision: 100 + i }]);
      await store.close();
      fs.appendFileSync(journal("s1"), seedLine(60, "s1", { type: "steer" }));
      for (const [name, bytes] of saved) fs.writeFileSync(path.join(dir, "sessions", name), bytes);
      const replaying = createSessionStore({ dir: path.join(dir, "replay-only"), clock, fsync: "none" });
      fs.mkdirSync(path.join(dir, "replay-only"), { recursive: true });
      fs.copyFileSync(journal("s1"), path.join(dir, "replay-only", "s1.jsonl"));
      const expected = replaying.getSnapshot("s1", { includeCompleted: true })!.snapshot;
      await replaying.close();
      return { expected, prefixBytes };
    }

    it("hydrates from the snapshot file and replays only the tail, to the state a full replay gives", async () => {
      const { expected } = await grownJournal();
      const reopened = open();
      const view = reopened.getSnapshot("s1", { includeCompleted: true })!;
      expect(reopened.stats()).toMatchObject({ hydrations: 1, tailReplays: 1, replays: 0 });
      expect(view.lastSeq).toBe(60);
      expect(view.snapshot).toEqual(expected);
      // Keys on both sides of the fence are known, with the seqs of their whole batch.
      const before2 = Array.from({ length: 10 }, (_, j) => ({ type: "checkpoint", revision: 20 + j }));
      expect(await reopened.append("s1", before2, { idempotencyKey: "before-2" })).toMatchObject({ duplicate: true, firstSeq: 21, lastSeq: 30 });
      const after = Array.from({ length: 10 }, (_, j) => ({ type: "agent_phase", phase: `p${j}` }));
      expect(await reopened.append("s1", after, { idempotencyKey: "after" })).toMatchObject({ duplicate: true, firstSeq: 41, lastSeq: 50 });
      const read = await readAll(reopened, "s1", 35, 20);
      expect(read.map((e) => e.entry.seq)).toEqual(Array.from({ length: 20 }, (_, i) => 35 + i));
      expect(read.map((e) => e.idempotencyKey)).toEqual([
        ...Array<string>(6).fill("before-3"),
        ...Array<string>(10).fill("after"),
        ...Array<undefined>(4).fill(undefined),
      ]);
      const next = await reopened.append("s1", [{ type: "agent_done" }]);
      expect(next.firstSeq).toBe(61);
    });

    it("replays in full when the journal's bytes at the fence changed, or the snapshot file is not the sidecar's", async () => {
      const { expected, prefixBytes } = await grownJournal();
      const text = fs.readFileSync(journal("s1"));
      // The same length, one byte changed in the line before the fence: not the prefix it was.
      const altered = Buffer.from(text);
      altered[prefixBytes - 3] = altered[prefixBytes - 3] === 0x30 ? 0x31 : 0x30;
      fs.writeFileSync(journal("s1"), altered);
      const first = open();
      first.getSnapshot("s1");
      expect(first.stats()).toMatchObject({ tailReplays: 0, replays: 1 });
      await first.close();

      await grownJournal();
      const snapshotText = fs.readFileSync(snapshotFile("s1"), "utf8");
      fs.writeFileSync(snapshotFile("s1"), snapshotText.replace('"phase":', '"phase" :'));
      const second = open();
      expect(second.getSnapshot("s1", { includeCompleted: true })!.snapshot).toEqual(expected);
      expect(second.stats()).toMatchObject({ tailReplays: 0, replays: 1 });
    });

    it("leaves a tail with a damaged line, a torn append or a torn last line to a full replay", async () => {
      for (const spoil of [
        (text: string) => text.replace('"phase":"p3"', '"phase":"p4"'),
        (text: string, prefixBytes: number) => text.slice(0, text.indexOf("\n", prefixBytes + 10) + 1),
        (text: string) => `${text}{"seq":61,"id":"s1","ty`,
      ]) {
        const { prefixBytes } = await grownJournal();
        fs.writeFileSync(journal("s1"), spoil(fs.readFileSync(journal("s1"), "utf8"), prefixBytes));
        const reopened = open();
        const view = reopened.getSnapshot("s1", { includeCompleted: true })!;
        expect(reopened.stats()).toMatchObject({ tailReplays: 0, replays: 1 });
        expect(view.snapshot.diagnostics.map((d) => d.error).filter((e) => e.startsWith("journal_"))).toHaveLength(1);
        await reopened.close();
      }
    });
  });
});

describe("the session cache", () => {
  it("is bounded: evicting closes the journal and a later access re-opens from the snapshot file", async () => {
    const store = open({ cacheSize: 2 });
    await store.append("a", [{ type: "generate" }]);
    await store.append("b", [{ type: "generate" }]);
    await store.append("c", [{ type: "steer" }]);
    expect(store.stats().openSessions).toBe(2);
    await store.settled();
    expect(fs.existsSync(path.join(dir, "sessions", "a.snapshot.json"))).toBe(true);
    expect(store.getSnapshot("a")).toMatchObject({ lastSeq: 1, snapshot: { phase: "generate_requested" } });
    expect(store.stats()).toMatchObject({ openSessions: 2, hydrations: 1, replays: 0 });
    expect((await store.append("a", [{ type: "agent_done" }])).firstSeq).toBe(2);
  });
});

describe("a session's snapshot does not change with unrelated traffic", () => {
  it("a NaN visibleVariant (the seed's Number of a non-numeric variantId) stays NaN when the session is evicted and re-opened, and after a restart", async () => {
    const store = open({ cacheSize: 1 });
    await store.append("s1", [{ type: "accept", variantId: "x" }]);
    expect(store.getSnapshot("s1")!.snapshot.visibleVariant).toBeNaN();
    await store.append("other", [{ type: "generate" }]); // evicts s1, which writes its snapshot file
    await store.settled();
    expect(store.getSnapshot("s1")!.snapshot.visibleVariant).toBeNaN();
    expect(store.stats().hydrations).toBe(1);
    // An accept without a variant keeps the number it finds: NaN stays NaN, where null became 0.
    expect((await store.append("s1", [{ type: "accept" }])).snapshot.visibleVariant).toBeNaN();
    await store.close();
    const restarted = open();
    expect(restarted.getSnapshot("s1")!.snapshot.visibleVariant).toBeNaN();
    expect(restarted.stats().hydrations).toBe(1);
    // The seed's own reader takes the file's null, as the seed does after a restart of its own.
    expect(JSON.parse(fs.readFileSync(path.join(dir, "sessions", "s1.snapshot.json"), "utf8")).visibleVariant).toBeNull();
  });
});
