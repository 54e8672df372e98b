import { execFileSync } from "node:child_process";
import { availableParallelism } from "node:os";
import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";
import { systemPackageTags } from "./test/harness/system-packages.js";

const here = (p: string) => fileURLToPath(new URL(p, import.meta.url));

// Tests run against the TypeScript sources of sibling workspaces, not their dist/, so a unit test
// never depends on a stale build. End-to-end tests that spawn services use dist/ (npm test builds).
const workspaces: Record<string, string> = {
  api: "packages/api/src",
  wire: "packages/wire/src",
  client: "packages/client/src",
  mcp: "packages/mcp/src",
  shared: "packages/shared/src",
  etcd: "packages/etcd/src",
  sessions: "services/sessions/src",
  budget: "services/budget/src",
  cli: "packages/cli/src",
  ui: "packages/ui/src",
};

/** How every berth test config resolves `@berth/*` (also used by vitest.chaos.config.ts). */
export const workspaceResolve = {
  alias: Object.entries(workspaces).flatMap(([name, dir]) => [
    { find: new RegExp(`^@berth/${name}$`), replacement: here(`${dir}/index.ts`) },
    { find: new RegExp(`^@berth/${name}/(.*)$`), replacement: here(`${dir}/$1`) },
  ]),
};

/**
 * The property tests' seed (test/harness/fast-check-seed.ts): `BERTH_FC_SEED` if given, else one
 * derived from the commit checked out, else a constant.
 */
function propertySeed(): string {
  if (process.env.BERTH_FC_SEED) return process.env.BERTH_FC_SEED;
  try {
    const head = execFileSync("git", ["rev-parse", "HEAD"], { cwd: here("."), encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
    return String(Number.parseInt(head.slice(0, 8), 16) | 0);
  } catch {
    return "20261130";
  }
}

// A function, so that vitest.chaos.config.ts, which imports this module for workspaceResolve, does
// not run this config's probes.
export default defineConfig(() => ({
  resolve: workspaceResolve,
  test: {
    include: ["packages/*/src/**/*.test.ts", "services/*/src/**/*.test.ts", "test/**/*.test.ts"],
    // The reliability suites are long; `npm run test:chaos` runs them (vitest.chaos.config.ts).
    exclude: ["**/node_modules/**", "**/dist/**", "test/chaos/**"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    // Most files spend their time waiting on the service processes they start, so one worker per
    // core (vitest leaves one core free by default: a single worker on two cores) keeps the cores
    // busy: the suite took 447 s instead of 622 s on two.
    maxWorkers: Math.max(2, availableParallelism() - 1),
    env: { BERTH_FC_SEED: propertySeed() },
    setupFiles: ["test/harness/fast-check-seed.ts"],
    // The tests that need etcd, Debian's Python or Go gRPC packages or its Chromium, each skipped where this
    // machine lacks it unless `BERTH_REQUIRE_<NAME>=1` (CI).
    ...systemPackageTags(["etcd", "python", "go", "chromium"]),
    // One line per run for what is skipped (the seeds' comparisons, the files that need a system package), or a failure when it is required.
    globalSetup: ["test/harness/seeds-notice.ts", "test/harness/system-packages-notice.ts"],
  },
}));
