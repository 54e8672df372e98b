import { mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { applyEvent, baseSnapshot, createReplay, MAX_DIAGNOSTICS, type SessionSnapshot } from "./reducer.js";
import { eventSequence, journalEntries, journalEntriesOf, journalText, noisyEvent } from "./fixtures/event-arbitraries.js";
import { boundedLikeBerth, foldJournalText, replayJournalText } from "./fixtures/journal-text.js";
import { loadSeedStore, seedsAvailable, type SeedSessionStoreModule } from "./testing/seed-store.js";

/** A clock that ticks on every read, so both paths must read it at the same points. */
function tickingClock(): () => number {
  let t = 1_750_000_000_000;
  return () => (t += 1000);
}

function fold(id: string, entries: Record<string, unknown>[], now: () => number): SessionSnapshot {
  let snapshot = baseSnapshot(id);
  for (const entry of entries) snapshot = applyEvent(snapshot, entry, { now });
  return snapshot;
}

function replay(id: string, entries: Record<string, unknown>[], now: () => number): SessionSnapshot {
  const r = createReplay(id, { now });
  for (const entry of entries) r.apply(entry);
  return r.snapshot();
}

describe("replay fast path", () => {
  it("equals the fold of applyEvent, key order included, and survives a JSON round trip", () => {
    fc.assert(
      fc.property(journalEntriesOf("s1", eventSequence), (entries) => {
        const folded = fold("s1", entries, tickingClock());
        const replayed = replay("s1", entries, tickingClock());
        expect(replayed).toStrictEqual(folded);
        const persisted = JSON.stringify(replayed);
        expect(persisted).toBe(JSON.stringify(folded));
        // What the journal store persists is what a reader gets back: JSON all the way down.
        expect(JSON.stringify(JSON.parse(persisted))).toBe(persisted);
      }),
      { numRuns: 400 },
    );
  });

  it("keeps the newest diagnostics and counts them all on long noisy journals", () => {
    fc.assert(
      fc.property(journalEntries("s1", noisyEvent, { minLength: 150, maxLength: 400 }), (entries) => {
        const now = tickingClock();
        const folded = fold("s1", entries, now);
        const replayed = replay("s1", entries, tickingClock());
        expect(replayed).toStrictEqual(folded);
        expect(JSON.stringify(replayed)).toBe(JSON.stringify(folded));
        expect(replayed.diagnostics.length).toBeLessThanOrEqual(MAX_DIAGNOSTICS);
        expect(replayed.diagnosticsTotal ?? replayed.diagnostics.length).toBeGreaterThanOrEqual(replayed.diagnostics.length);
      }),
      { numRuns: 30 },
    );
  });

  it("never mutates its inputs, nor a snapshot the replay handed out", () => {
    fc.assert(
      fc.property(journalEntriesOf("s1", eventSequence), fc.nat(40), (entries, cut) => {
        const now = (): number => 1_750_000_000_000;
        const frozen = structuredClone(entries);
        let snapshot = baseSnapshot("s1");
        for (const entry of entries) {
          const prior = snapshot;
          const priorCopy = structuredClone(prior);
          snapshot = applyEvent(prior, entry, { now });
          // toEqual, not toStrictEqual: fast-check makes some objects with a null prototype,
          // which a clone does not keep.
          expect(prior).toEqual(priorCopy);
        }
        expect(entries).toEqual(frozen);

        // A snapshot taken midway stays as it was while the replay goes on.
        const r = createReplay("s1", { now });
        entries.slice(0, cut).forEach((e) => r.apply(e));
        const midway = r.snapshot();
        const midwayCopy = structuredClone(midway);
        entries.slice(cut).forEach((e) => r.apply(e));
        expect(midway).toEqual(midwayCopy);
        expect(r.snapshot()).toStrictEqual(snapshot);
        expect(entries).toEqual(frozen);
      }),
      { numRuns: 300 },
    );
  });

  it("reads journal text the same through both paths, parse failures last", () => {
    fc.assert(
      fc.property(journalText("s1"), (text) => {
        expect(replayJournalText("s1", text, { now: tickingClock() })).toStrictEqual(foldJournalText("s1", text, { now: tickingClock() }));
      }),
      { numRuns: 300 },
    );
  });
});

// The seed's own store, run: berth must give the snapshot it gives, event for event.
// Without the seeds these are skipped, and the run says so once (test/harness/seeds-notice.ts).
const seedPresent = seedsAvailable() ? (await loadSeedStore()).module : null;

describe.skipIf(!seedPresent)("differential: berth's reducer against the seed's session store", () => {
  const seed = seedPresent as SeedSessionStoreModule;
  let project: string;
  let runs = 0;

  beforeAll(() => {
    project = mkdtempSync(join(tmpdir(), "berth-reducer-diff-"));
    seed.createLiveSessionStore({ cwd: project }); // creates the sessions directory
  });
  afterAll(() => {
    vi.useRealTimers();
    rmSync(project, { recursive: true, force: true });
  });

  function journalPath(id: string): string {
    return join(project, ".impeccable", "live", "sessions", `${id}.jsonl`);
  }

  /** Appends through the seed, then checks berth on the journal the seed wrote. */
  function checkAppends(events: Record<string, unknown>[]): void {
    const id = `run-${++runs}`;
    if (events.length === 0) return; // the seed writes no journal for no events
    const store = seed.createLiveSessionStore({ cwd: project, sessionId: id });
    let seedSnapshot: Record<string, unknown> = { ...baseSnapshot(id) };
    // Each event as the wire delivers it, parsed on its own: fast-check may hand two events the same
    // nested object, and the seed (which dedupes artifacts by ===) would see one where a client sends two.
    for (const event of events) seedSnapshot = store.appendEvent({ ...(JSON.parse(JSON.stringify(event)) as Record<string, unknown>), id });

    const text = readFileSync(journalPath(id), "utf8");
    const entries = text
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(entries.length).toBe(events.length);
    const expected = boundedLikeBerth(seedSnapshot);
    // The seed stamps entries with the wall clock; both sides read the same `ts` from the file,
    // and every entry has one, so no clock reading is left to differ.
    const never = (): number => {
      throw new Error("the clock was read although every entry has a ts");
    };
    expect(fold(id, entries, never)).toEqual(expected);
    expect(replay(id, entries, never)).toEqual(expected);

    // The seed's full replay (no snapshot file) gives the same, and so do berth's replays.
    unlinkSync(join(project, ".impeccable", "live", "sessions", `${id}.snapshot.json`));
    const rebuilt = seed.createLiveSessionStore({ cwd: project }).getSnapshot(id, { includeCompleted: true });
    expect(replayJournalText(id, text, { now: never })).toEqual(boundedLikeBerth(rebuilt ?? {}));
  }

  it("gives the seed's snapshot after every random sequence of appends", () => {
    fc.assert(
      fc.property(eventSequence, (events) => checkAppends(events)),
      { numRuns: 300 },
    );
  });

  it("gives the seed's snapshot, bounded, past the diagnostics bound", () => {
    fc.assert(
      fc.property(fc.array(noisyEvent, { minLength: 110, maxLength: 220 }), (events) => checkAppends(events)),
      { numRuns: 6 },
    );
  });

  it("reads any journal text as the seed's rebuild does, clock fallbacks included", () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    try {
      fc.assert(
        fc.property(journalText("text"), fc.integer({ min: 1_700_000_000_000, max: 1_800_000_000_000 }), (text, at) => {
          vi.setSystemTime(at);
          const id = `text-${++runs}`;
          writeFileSync(journalPath(id), text);
          const rebuilt = seed.createLiveSessionStore({ cwd: project }).getSnapshot(id, { includeCompleted: true });
          // Date is faked, so the seed's Date.now() and berth's default clock read the same time.
          expect(replayJournalText(id, text)).toEqual(boundedLikeBerth(rebuilt ?? {}));
          expect(foldJournalText(id, text)).toEqual(boundedLikeBerth(rebuilt ?? {}));
        }),
        { numRuns: 300 },
      );
    } finally {
      vi.useRealTimers();
    }
  });
});
