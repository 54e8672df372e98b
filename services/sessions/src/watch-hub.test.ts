import { describe, expect, it } from "vitest";
import { isBerthError, type BerthError } from "@berth/shared/errors";
import type { StoredEntry } from "./journal/journal-store.js";
import { baseSnapshot, type JournalEntry } from "./reducer.js";
import { WatchHub, type WatchBacklog } from "./watch-hub.js";

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
    const hub = new WatchHub();
    const other = hub.watchSession("s2", 1, {}, backlog(0, 1));
    const all = hub.watchAll();
    hub.publish("s1", [{ ...stored(1), snapshot: baseSnapshot("s1") }]);
    expect((await all.next()).value).toEqual({ sessionId: "s1", firstSeq: 1, lastSeq: 1, entry: journalEntry(1), deleted: false });
    expect((await other.next()).value).toMatchObject({ kind: "caught_up" });
    const pending = other.next();
    hub.close();
    await expect(pending).rejects.toMatchObject({ code: "unavailable" });
    await expect(all.next()).rejects.toMatchObject({ code: "unavailable" });
    expect(() => hub.watchAll()).toThrow(/shutting down/);
  });

  it("gives watchers of every session one change per append, and watchers of the session every entry", async () => {
    const hub = new WatchHub(2);
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
      value: { sessionId: "s1", firstSeq: 3, lastSeq: 4, entry: journalEntry(4), snapshot: after(4), deleted: false },
    });
    expect(await all.next()).toEqual({
      done: false,
      value: { sessionId: "s1", firstSeq: 5, lastSeq: 5, entry: journalEntry(5), snapshot: after(5), deleted: false },
    });
    // Three entries overflow a buffer of two for the session's watcher; two changes do not for `all`.
    await expect(one.next()).rejects.toMatchObject({ code: "resource_exhausted" });
    expect(hub.watcherCount).toBe(1);
    await all.return!();
  });
});
