import * as fs from "node:fs";
import { createSessionStore } from "@berth/sessions/create-session-store";
import type { SeedStoreHarness } from "@berth/sessions/testing/seed-store";
import { emit, ratio } from "../../lib/report.js";
import { seedStoreForReference } from "./cold-open.js";
import { median, round, tempDir } from "./common.js";

/**
 * 4,000 stale checkpoints (each one records an ignored-checkpoint diagnostic): the append median of
 * the last 500 against the first 500. In-process, so the store's own cost is what is measured;
 * the reference is the seed's store doing the same in the same run (quadratic there).
 */
export async function staleCheckpoints(): Promise<void> {
  const count = 4000;
  const dir = tempDir("stale");
  let seed: SeedStoreHarness | undefined;
  try {
    const store = createSessionStore({ dir, fsync: "none", snapshotIdleMs: 0 });
    await store.append("stale", [{ type: "checkpoint", owner: "tab-a", revision: 1_000_000 }]);
    const berth: number[] = [];
    for (let i = 0; i < count; i++) {
      const t0 = performance.now();
      await store.append("stale", [{ type: "checkpoint", owner: "tab-a", revision: i + 1 }]);
      berth.push(performance.now() - t0);
    }
    const diagnostics = store.getSnapshot("stale")!.snapshot.diagnostics.length;
    await store.close();

    seed = await seedStoreForReference();
    const seedTimes: number[] = [];
    if (seed) {
      const seedStore = seed.store("stale");
      seedStore.appendEvent({ id: "stale", type: "checkpoint", owner: "tab-a", revision: 1_000_000 });
      for (let i = 0; i < count; i++) {
        const t0 = performance.now();
        seedStore.appendEvent({ id: "stale", type: "checkpoint", owner: "tab-a", revision: i + 1 });
        seedTimes.push(performance.now() - t0);
      }
    }

    const first = median(berth.slice(0, 500));
    const last = median(berth.slice(-500));
    const seedFirst = median(seedTimes.slice(0, 500));
    const seedLast = median(seedTimes.slice(-500));
    emit({
      suite: "sessions",
      figure: "stale_checkpoints_append",
      appends: count,
      first500_p50_ms: round(first),
      last500_p50_ms: round(last),
      growth: ratio(last, first),
      target_growth: 1.5,
      meets_target: last <= 1.5 * first,
      diagnostics_kept: diagnostics,
      ...(seed
        ? {
            ref_seed_first500_p50_ms: round(seedFirst),
            ref_seed_last500_p50_ms: round(seedLast),
            ref_seed_growth: ratio(seedLast, seedFirst),
          }
        : {}),
      note: seed ? "in-process store.append with fsync=none, the seed's appendEvent on the same events" : "in-process store.append with fsync=none",
    });
  } finally {
    seed?.remove();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
