import { fileURLToPath } from "node:url";
import { defineConfig } from "vitest/config";

const here = (p: string) => fileURLToPath(new URL(p, import.meta.url));

// Tests run against the TypeScript sources of sibling workspaces, not their dist/, so a unit test
// never depends on a stale build. End-to-end tests that spawn services use dist/ (npm test builds).
const workspaces: Record<string, string> = {
  api: "packages/api/src",
  shared: "packages/shared/src",
  sessions: "services/sessions/src",
  budget: "services/budget/src",
  cli: "packages/cli/src",
};

/** How every berth test config resolves `@berth/*` (also used by vitest.chaos.config.ts). */
export const workspaceResolve = {
  alias: Object.entries(workspaces).flatMap(([name, dir]) => [
    { find: new RegExp(`^@berth/${name}$`), replacement: here(`${dir}/index.ts`) },
    { find: new RegExp(`^@berth/${name}/(.*)$`), replacement: here(`${dir}/$1`) },
  ]),
};

export default defineConfig({
  resolve: workspaceResolve,
  test: {
    include: ["packages/*/src/**/*.test.ts", "services/*/src/**/*.test.ts", "test/**/*.test.ts"],
    // The reliability suites are long; `npm run test:chaos` runs them (vitest.chaos.config.ts).
    exclude: ["**/node_modules/**", "**/dist/**", "test/chaos/**"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
