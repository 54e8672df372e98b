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

export default defineConfig({
  resolve: {
    alias: Object.entries(workspaces).flatMap(([name, dir]) => [
      { find: new RegExp(`^@berth/${name}$`), replacement: here(`${dir}/index.ts`) },
      { find: new RegExp(`^@berth/${name}/(.*)$`), replacement: here(`${dir}/$1`) },
    ]),
  },
  test: {
    include: ["packages/*/src/**/*.test.ts", "services/*/src/**/*.test.ts", "test/**/*.test.ts"],
    exclude: ["**/node_modules/**", "**/dist/**"],
    testTimeout: 30_000,
    hookTimeout: 30_000,
  },
});
