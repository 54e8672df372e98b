import { describe, expect, it } from "vitest";
import { isBerthError, type BerthError } from "@berth/shared/errors";
import type { StoredEntry } from "./journal/journal-store.js";
import { baseSnapshot, type JournalEntry } from "./reducer.js";
import type { SessionChange } from "./session-store-api.js";
import { DEFAULT_MAX_BUFFERED, WatchHub } from "./watch-hub.js";
import type { WatchBacklog } from "./watch-hub-api.js";

const journalEntry = (seq: number): JournalEntry => ({ seq, id: "s1", type: "steer", ts: "t", event: { type: "steer" } });
/** The entry with seq `seq` as the journal reader hands it over (and the store publishes it). */
const stored = (seq: number): StoredEntry => ({ entry: journalEntry(seq), idempotencyKey: undefined, integrity: "verified" });

function backlog(lastSeq: number, from: number, gate?: Promise<void>): () => WatchBacklog {
  return () => ({
    lastSeq,
    snapshot: { ...baseSnapshot("s1"), phase: `at-${lastSeq}` },
    entries: async function* () {
      if (gate) await gate;
      for (let seq = from; seq <= lastSeq + 2; seq++) yield stored(seq); // a read may see entries past lastSeq
    },
  });
}

describe("WatchHub", () => {
  it("delivers backlog, marker, then live entries, dropping duplicates across the switch", async () => {
    const hub = new WatchHub();
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    const watcher = hub.watchSession("s1", 2, { includeSnapshot: true }, backlog(3, 2, gate));
    hub.publish("s1", [{ ...stored(4), snapshot: { ...baseSnapshot("s1"), phase: "p4" } }]);
    hub.publish("s1", [stored(5)]);
    open();
    const got: string[] = [];
    for (let i = 0; i < 5; i++) {
      const { value } = await watcher.next();
      got.push(
        value!.kind === "entry" ? `e${value!.entry.seq}${value!.snapshot ? `:${value!.snapshot.phase}` : ""}` : `up${value!.lastSeq}:${value!.snapshot?.phase}`,
      );
    }
    expect(got).toEqual(["e2", "e3", "up3:at-3", "e4:p4", "e5"]);
    hub.publish("s1", [stored(5), stored(6)]);
    expect((await watcher.next()).value).toMatchObject({ entry: { seq: 6 } });
    await watcher.return!();
    expect(hub.watcherCount).toBe(0);
  });

  it("ends a watcher that falls behind with the seq to resume from", async () => {
    const hub = new WatchHub(3);
    const watcher = hub.watchSession("s1", 1, {}, backlog(0, 1));
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 0 });
    hub.publish("s1", [stored(1)]);
    expect((await watcher.next()).value).toMatchObject({ entry: { seq: 1 } });
    hub.publish("s1", [2, 3, 4, 5].map(stored));
    expect(hub.watcherCount).toBe(0);
    const error = (await watcher.next().catch((e: unknown) => e)) as BerthError;
    expect(isBerthError(error) && error.code).toBe("resource_exhausted");
    expect(error.details).toMatchObject({ lastSeq: 1 });
    expect(await watcher.next()).toEqual({ value: undefined, done: true });
  });

  it("only watchers of the session get its entries; watchAll gets all", async () => {
    const hub = new WatchHub(DEFAULT_MAX_BUFFERED, 100);
    const other = hub.watchSession("s2", 1, {}, backlog(0, 1));
    const all = hub.watchAll();
    hub.publish("s1", [{ ...stored(1), snapshot: baseSnapshot("s1") }]);
    expect((await all.next()).value).toEqual({ sessionId: "s1", firstSeq: 1, lastSeq: 1, entry: journalEntry(1), deleted: false, revision: 101 });
    expect((await other.next()).value).toMatchObject({ kind: "caught_up" });
    const pending = other.next();
    hub.close();
    await expect(pending).rejects.toMatchObject({ code: "unavailable" });
    await expect(all.next()).rejects.toMatchObject({ code: "unavailable" });
    expect(() => hub.watchAll()).toThrow(/shutting down/);
  });

  it("gives watchers of every session one change per append, and watchers of the session every entry", async () => {
    const hub = new WatchHub(2, 100);
    const all = hub.watchAll({ includeSnapshot: true });
    const one = hub.watchSession("s1", 1, {}, backlog(0, 1));
    expect((await one.next()).value).toMatchObject({ kind: "caught_up" });
    const after = (seq: number) => ({ ...baseSnapshot("s1"), phase: `after-${seq}` });
    hub.publish(
      "s1",
      [3, 4].map((seq) => ({ ...stored(seq), snapshot: after(seq) })),
    );
    hub.publish("s1", [{ ...stored(5), snapshot: after(5) }]);
    expect(await all.next()).toEqual({
      done: false,
      value: { sessionId: "s1", firstSeq: 3, lastSeq: 4, entry: journalEntry(4), snapshot: after(4), deleted: false, revision: 101 },
    });
    expect(await all.next()).toEqual({
      done: false,
      value: { sessionId: "s1", firstSeq: 5, lastSeq: 5, entry: journalEntry(5), snapshot: after(5), deleted: false, revision: 102 },
    });
    // Three entries overflow a buffer of two for the session's watcher; two changes do not for `all`.
    await expect(one.next()).rejects.toMatchObject({ code: "resource_exhausted" });
    expect(hub.watcherCount).toBe(1);
    await all.return!();
  });

  describe("revisions of every session's changes", () => {
    /** The next `n` changes a watcher yields, as session@lastSeq#revision (deletions marked). */
    async function take(watcher: AsyncIterator<SessionChange>, n: number): Promise<string[]> {
      const got: string[] = [];
      for (let i = 0; i < n; i++) {
        const { value } = await watcher.next();
        got.push(`${value.sessionId}@${value.lastSeq}${value.deleted ? "x" : ""}#${value.revision}`);
      }
      return got;
    }

    it("number every append and deletion from the run's base, and replay the held ones after a start revision", async () => {
      const hub = new WatchHub(10, 500);
      const first = hub.watchAll();
      expect(await first.started).toEqual({ after: 500, caughtUpAt: 500, reset: false });
      hub.publish("a", [stored(1), stored(2)]);
      hub.publish("b", [stored(1)]);
      hub.sessionDeleted("a", 2);
      hub.publish("b", [stored(2)]);
      expect(await take(first, 4)).toEqual(["a@2#501", "b@1#502", "a@2x#503", "b@2#504"]);
      expect(first.progressRevision()).toBe(504);
      // A watcher that took up to 502 resumes with exactly what it missed, the deletion included.
      const resumed = hub.watchAll({ startRevision: 502 });
      expect(await resumed.started).toEqual({ after: 502, caughtUpAt: 504, reset: false });
      hub.publish("c", [stored(1)]);
      expect(await take(resumed, 3)).toEqual(["a@2x#503", "b@2#504", "c@1#505"]);
      expect(hub.revision).toBe(505);
    });

    it("reset a start revision they cannot replay: older than the history, of an earlier run, or ahead", async () => {
      // Four times a buffer of two: the last eight changes are held.
      const hub = new WatchHub(2, 1000);
      for (let seq = 1; seq <= 10; seq++) hub.publish("a", [stored(seq)]);
      expect(hub.revision).toBe(1010);
      for (const startRevision of [1001, 999, 7, 1011]) {
        const watcher = hub.watchAll({ startRevision });
        expect(await watcher.started).toEqual({ after: 1010, caughtUpAt: 1010, reset: true });
        await watcher.return!();
      }
      const held = hub.watchAll({ startRevision: 1002 });
      expect(await held.started).toMatchObject({ reset: false });
      expect(await take(held, 8)).toEqual(Array.from({ length: 8 }, (_, i) => `a@${i + 3}#${i + 1003}`));
    });

    it("end a lagged watcher naming the last revision it took, and a resume from it misses nothing", async () => {
      const hub = new WatchHub(100, 0);
      const slow = hub.watchAll({ maxBuffered: 2 });
      hub.publish("a", [stored(1)]);
      expect(await take(slow, 1)).toEqual(["a@1#1"]);
      for (let seq = 2; seq <= 4; seq++) hub.publish("a", [stored(seq)]);
      const error = (await slow.next().catch((e: unknown) => e)) as BerthError;
      expect(error).toMatchObject({ code: "resource_exhausted", reason: "WATCHER_LAGGED", details: { lastRevision: 1 } });
      const again = hub.watchAll({ startRevision: 1 });
      expect(await take(again, 3)).toEqual(["a@2#2", "a@3#3", "a@4#4"]);
    });

    it("replay a session's snapshot on its latest held change only, and hold no snapshot of a change the history let go", async () => {
      const hub = new WatchHub(2, 0);
      const withSnapshot = (sessionId: string, seq: number) => ({ ...stored(seq), snapshot: { ...baseSnapshot(sessionId), phase: `${sessionId}-${seq}` } });
      const live = hub.watchAll({ includeSnapshot: true, maxBuffered: 100 });
      hub.publish("a", [withSnapshot("a", 1)]);
      hub.publish("a", [withSnapshot("a", 2)]);
      hub.publish("b", [withSnapshot("b", 1)]);
      hub.publish("a", [stored(3)]); // no watcher asked for a snapshot of this one
      // Live watchers get every change's own snapshot.
      const liveSnapshots: Array<string | undefined> = [];
      for (let i = 0; i < 4; i++) liveSnapshots.push((await live.next()).value.snapshot?.phase);
      expect(liveSnapshots).toEqual(["a-1", "a-2", "b-1", undefined]);
      // A replay: b's only change keeps its snapshot; a's latest change had none, so none of a's has one.
      const replay = hub.watchAll({ includeSnapshot: true, startRevision: 1 });
      const replayed: Array<string | undefined> = [];
      for (let i = 0; i < 3; i++) replayed.push((await replay.next()).value.snapshot?.phase);
      expect(replayed).toEqual([undefined, "b-1", undefined]);
      hub.publish("a", [withSnapshot("a", 4)]);
      const again = hub.watchAll({ includeSnapshot: true, startRevision: 2 });
      const second: Array<string | undefined> = [];
      for (let i = 0; i < 3; i++) second.push((await again.next()).value.snapshot?.phase);
      expect(second).toEqual(["b-1", undefined, "a-4"]);
      // Many sessions, each changed once: only those the history holds (eight) keep a snapshot, whatever the count.
      for (let n = 0; n < 1000; n++) hub.publish(`s${n}`, [withSnapshot(`s${n}`, 1)]);
      expect(hub.heldSnapshotCount).toBeLessThanOrEqual(64 + 8);
    });

    it("forget the history when a journal changed in a way only a full replay follows: a resume from before it is a reset", async () => {
      const hub = new WatchHub(10, 0);
      hub.publish("a", [stored(1)]);
      const watcher = hub.watchAll();
      hub.resync("a", "rewritten by another process");
      await expect(watcher.next()).rejects.toMatchObject({ reason: "WATCHER_LAGGED", details: { lastRevision: 1 } });
      expect(await hub.watchAll({ startRevision: 1 }).started).toMatchObject({ reset: true });
      hub.publish("a", [stored(2)]);
      expect(hub.revision).toBeGreaterThan(1);
    });
  });
});
