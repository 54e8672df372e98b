/**
 * One property over random sessions: the snapshot served right after the appends (incremental)
 * equals the one after a restart that replays the journal, the one after a restart that hydrates
 * from the snapshot file, a fold of the reducer over the entries read back, and — when the seeds
 * are there (see testing/seed-store.ts) — the snapshot the seed's own store derives from berth's
 * journal.
 */
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { applyEvent, baseSnapshot, type SessionSnapshot } from "./reducer.js";
import { createSessionStore } from "./create-session-store.js";
import { loadSeedStore, seedsAvailable, type SeedStoreHarness } from "./testing/seed-store.js";

const phase = fc.constantFrom("generating", "variants_ready", "idle", "accept_requested");
const event = fc.oneof(
  fc.record({ type: fc.constant("generate"), count: fc.integer({ min: 1, max: 4 }), pageUrl: fc.constantFrom("http://a/", "http://b/") }),
  fc.record({ type: fc.constant("variant_plan"), plan: fc.record({ n: fc.nat(5) }) }),
  fc.record({ type: fc.constant("agent_phase"), phase: fc.constantFrom("plan", "write"), durationMs: fc.nat(100) }),
  fc.record({ type: fc.constantFrom("variants_ready", "agent_done"), arrivedVariants: fc.nat(4), carbonize: fc.boolean() }),
  fc.record({ type: fc.constantFrom("variant_mounted", "variant_mount_failed"), variant: fc.integer({ min: 0, max: 4 }) }),
  fc.record(
    {
      type: fc.constant("checkpoint"),
      revision: fc.nat(6),
      phase,
      owner: fc.constantFrom("tab-1", "tab-2"),
      reason: fc.constantFrom("variants_progress", "user"),
      visibleVariant: fc.nat(3),
    },
    { requiredKeys: ["type", "revision"] },
  ),
  fc.record({ type: fc.constantFrom("accept", "discard", "steer", "steer_done", "complete", "discarded", "carbonize_cleanup", "manual_edit_apply") }),
  fc.record({ type: fc.constant("agent_error"), message: fc.constantFrom("x", "y"), sourceEventType: fc.constantFrom("generate", "steer") }),
  fc.record({ type: fc.constant("mystery") }),
);
const session = fc.array(fc.array(event, { minLength: 1, maxLength: 4 }), { minLength: 1, maxLength: 25 });

const plain = (snapshot: unknown) => JSON.parse(JSON.stringify(snapshot));

describe("replay == incremental == after restart == after hydration == the seed", () => {
  // Without the seeds the seed's side is left out, and the run says so once (test/harness/seeds-notice.ts).
  let seed: SeedStoreHarness | undefined;
  let root: string;
  beforeAll(async () => {
    if (seedsAvailable()) seed = await loadSeedStore();
    root = fs.mkdtempSync(path.join(os.tmpdir(), "berth-prop-"));
  });
  afterAll(() => {
    seed?.remove();
    fs.rmSync(root, { recursive: true, force: true });
  });

  it("holds for random sessions", async () => {
    let run = 0;
    await fc.assert(
      fc.asyncProperty(session, async (appends) => {
        const id = `p${run++}`;
        const dir = path.join(root, id);
        const clock = new ManualClock(Date.UTC(2026, 0, 1));
        const store = createSessionStore({ dir, clock, fsync: "none", snapshotIdleMs: 0 });
        for (const events of appends) {
          await store.append(id, events);
          clock.advance(1000);
        }
        const incremental = store.getSnapshot(id, { includeCompleted: true })!.snapshot;
        const entries = [];
        for await (const stored of store.read(id)!.entries) entries.push(stored.entry);
        const folded = entries.reduce<SessionSnapshot>((snapshot, entry) => applyEvent(snapshot, entry), baseSnapshot(id));
        await store.close();

        const hydrating = createSessionStore({ dir, clock, fsync: "none" });
        const hydrated = hydrating.getSnapshot(id, { includeCompleted: true })!.snapshot;
        expect(hydrating.stats().hydrations).toBe(1);
        await hydrating.close();

        fs.rmSync(path.join(dir, `${id}.snapshot.json`));
        const replaying = createSessionStore({ dir, clock, fsync: "none" });
        const replayed = replaying.getSnapshot(id, { includeCompleted: true })!.snapshot;
        await replaying.close();
        fs.rmSync(path.join(dir, `${id}.snapshot.json`));

        expect(plain(replayed)).toEqual(plain(incremental));
        expect(plain(hydrated)).toEqual(plain(incremental));
        expect(plain(folded)).toEqual(plain(incremental));
        if (seed !== undefined) {
          fs.mkdirSync(seed.sessionsDir, { recursive: true });
          fs.copyFileSync(path.join(dir, `${id}.jsonl`), path.join(seed.sessionsDir, `${id}.jsonl`));
          const bySeed = seed.store(id).getSnapshot(id, { includeCompleted: true });
          if (incremental.diagnostics.length < 100) expect(plain(bySeed)).toEqual(plain(incremental));
        }
      }),
      { numRuns: 40 },
    );
  });
});
