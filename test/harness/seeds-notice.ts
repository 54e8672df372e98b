/**
 * Once per run (vitest's global setup): without the seeds, says in one line which comparisons
 * against the seed's own store are skipped and how to run them; with `BERTH_REQUIRE_SEEDS=1` (CI),
 * fails the run instead. Everything else runs without the seeds.
 */
import { missingSeedsNotice, seedsAvailable } from "@berth/sessions/testing/seed-store";

export default function seedsNotice(): void {
  if (!seedsAvailable()) console.warn(`NOTE: ${missingSeedsNotice()}`);
}
