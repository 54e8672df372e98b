import * as fs from "node:fs";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { dir, journal, open, temporaryStores } from "./session-store-fixtures.js";
import { loadSeedStore, seedsAvailable, type SeedStoreHarness } from "./testing/seed-store.js";
import { seedAppend, seedDirsOf, seedReadState } from "./testing/seed-writer.js";

temporaryStores();

/** A session's life, for the comparisons with the seed. */
const script: Array<Record<string, unknown>> = [
  { type: "generate", count: 2, pageUrl: "http://localhost/", token: "t" },
  { type: "agent_phase", phase: "plan", at: 5, durationMs: 3 },
  { type: "checkpoint", revision: 1, phase: "generating", owner: "tab", paramValues: { a: 1 } },
  { type: "variants_ready", arrivedVariants: 2, at: 1000 },
  { type: "variant_mounted", variant: 2 },
  { type: "checkpoint", revision: 0, phase: "old" },
  { type: "discard", at: 2000 },
  { type: "agent_done", at: 3000 },
];

describe.skipIf(!seedsAvailable())("the seed's own store and berth read each other's journals", () => {
  let seed: SeedStoreHarness;
  beforeEach(async () => {
    seed = await loadSeedStore();
  });
  afterEach(() => seed.remove());

  /** The snapshot without the fields that hold wall-clock times the seed takes from Date. */
  const timeless = (snapshot: Record<string, unknown> | null) => {
    const { updatedAt: _u, generationCompletedAt: _g, generationCanceledAt: _c, ...rest } = snapshot ?? {};
    return JSON.parse(JSON.stringify(rest));
  };

  it("berth serves a journal the seed wrote", () => {
    const seedStore = seed.store("s1");
    let expected: Record<string, unknown> | null = null;
    for (const event of script) expected = seedStore.appendEvent(event);
    const store = open({ dir: seed.sessionsDir, legacyDir: seed.legacySessionsDir });
    const view = store.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(script.length);
    expect(JSON.parse(JSON.stringify(view.snapshot))).toEqual(JSON.parse(JSON.stringify(expected)));
    // The seed wrote a current snapshot file on its last append: berth hydrated from it.
    expect(store.stats().hydrations).toBe(1);
    fs.rmSync(path.join(seed.sessionsDir, "s1.snapshot.json"));
    const replaying = open({ dir: seed.sessionsDir });
    expect(JSON.parse(JSON.stringify(replaying.getSnapshot("s1")!.snapshot))).toEqual(JSON.parse(JSON.stringify(expected)));
  });

  it("the seed's store reads berth's journal and snapshot file and gets the same snapshot", async () => {
    const store = open({ dir: seed.sessionsDir, legacyDir: seed.legacySessionsDir });
    for (const event of script) await store.append("s1", [event]);
    const berthSnapshot = store.getSnapshot("s1", { includeCompleted: true })!.snapshot;
    // Lazily written: nothing yet.
    expect(fs.existsSync(path.join(seed.sessionsDir, "s1.snapshot.json"))).toBe(false);
    await store.flush("s1");
    const file = JSON.parse(fs.readFileSync(path.join(seed.sessionsDir, "s1.snapshot.json"), "utf8"));
    expect(file.__journalBytes).toBe(fs.statSync(journal("s1", seed.sessionsDir)).size);
    expect(file.__nextSeq).toBe(script.length + 1);
    // The seed hydrates from berth's snapshot file...
    const fromFile = seed.store("s1").getSnapshot("s1", { includeCompleted: true });
    expect(JSON.parse(JSON.stringify(fromFile))).toEqual(JSON.parse(JSON.stringify(berthSnapshot)));
    // ...and a replay of berth's journal by the seed gives the same snapshot (timestamps aside).
    fs.rmSync(path.join(seed.sessionsDir, "s1.snapshot.json"));
    const replayed = seed.store("s1").getSnapshot("s1", { includeCompleted: true });
    expect(timeless(replayed)).toEqual(timeless(berthSnapshot));
    expect(replayed!.updatedAt).toBe(berthSnapshot.updatedAt);
    // The seed appends after berth's lines at the right seq.
    seed.store("s1").appendEvent({ type: "steer", id: "s1" });
    const lines = fs
      .readFileSync(journal("s1", seed.sessionsDir), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.at(-1)).toMatchObject({ seq: script.length + 1, type: "steer" });
  });

  it("a session berth deleted is gone for the seed's store too, legacy copy included", async () => {
    const seedStore = seed.store("s1");
    for (const event of script) seedStore.appendEvent(event);
    fs.mkdirSync(seed.legacySessionsDir, { recursive: true });
    fs.copyFileSync(journal("s1", seed.sessionsDir), journal("s1", seed.legacySessionsDir));
    const store = open({ dir: seed.sessionsDir, legacyDir: seed.legacySessionsDir });
    await store.append("s1", [{ type: "steer" }]);
    await store.flush("s1");
    expect(seed.store("s1").has("s1")).toBe(true);
    expect(await store.delete("s1")).toEqual({ lastSeq: script.length + 1, duplicate: false });
    const after = seed.store("s1");
    expect(after.has("s1")).toBe(false);
    expect(after.listActiveSessions()).toEqual([]);
    expect(after.getSnapshot("s1", { includeCompleted: true })).toMatchObject({ id: "s1", phase: "new" });
  });

  it("the stand-in for a seed process in the tests below writes what the seed's store writes", () => {
    const project = fs.mkdtempSync(path.join(dir, "stand-in-"));
    const standIn = seedDirsOf(project);
    const ts = "2026-01-01T00:00:00.000Z";
    const events = [...script, ...Array.from({ length: 105 }, (_, i) => ({ type: "mystery", n: i }))];
    let expected: Record<string, unknown> | null = null;
    let written: Record<string, unknown> = {};
    for (const event of events) {
      expected = seed.store("s1").appendEvent({ ...event, id: "s1" });
      written = seedAppend(standIn, "s1", event, { snapshotFile: true, ts }).snapshot;
    }
    const lines = (file: string) =>
      fs
        .readFileSync(file, "utf8")
        .trim()
        .split("\n")
        .map((l) => ({ ...JSON.parse(l), ts }));
    expect(lines(journal("s1", standIn.dir))).toEqual(lines(journal("s1", seed.sessionsDir)));
    expect(timeless(written)).toEqual(timeless(expected));
    const file = (d: string) => timeless(JSON.parse(fs.readFileSync(path.join(d, "s1.snapshot.json"), "utf8")));
    expect(file(standIn.dir)).toEqual(file(seed.sessionsDir));
    // Its replay (no snapshot file) and its seq rule too.
    for (const d of [standIn.dir, seed.sessionsDir]) fs.rmSync(path.join(d, "s1.snapshot.json"));
    expect(timeless(seedReadState(standIn, "s1").snapshot)).toEqual(timeless(seed.store("s1").getSnapshot("s1", { includeCompleted: true })));
    expect(seedAppend(standIn, "s1", { type: "steer" }).seq).toBe(
      (seed.store("s1").appendEvent({ type: "steer", id: "s1" }) as { pendingEventSeq: number }).pendingEventSeq,
    );
  });
});
