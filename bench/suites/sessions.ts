/** The sessions benchmarks (issue text: `issues show`): not written yet. */
import { emit } from "../lib/report.js";

export async function run(): Promise<void> {
  emit({ suite: "sessions", skipped: true, reason: "not written yet" });
}
