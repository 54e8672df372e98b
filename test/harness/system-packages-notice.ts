/**
 * Once per run (vitest's global setup): says in one line per system package the config found
 * missing which tests were skipped and what to install; when one is required (`BERTH_REQUIRE_<NAME>=1`,
 * CI), fails the run instead. The config probed the machine; this reads what it found rather than
 * probing again (the config is bundled apart, so the two share no module).
 */
import type { TestProject } from "vitest/node";
import { missingPackagesNotice } from "./system-packages.js";

export default function systemPackagesNotice(project: TestProject): void {
  const notice = missingPackagesNotice(project.getProvidedContext().missingSystemPackages ?? []);
  if (notice.failure !== undefined) throw new Error(notice.failure);
  for (const line of notice.lines) console.warn(line);
}
