import { defineConfig } from "vitest/config";
import { systemPackageTags } from "./test/harness/system-packages.js";
import { workspaceResolve } from "./vitest.config.js";

// The reliability suites (`npm run test:chaos`): real processes killed, paused and flooded. They
// run one file at a time so that no suite's timing is distorted by another's load on two cores.
export default defineConfig({
  resolve: workspaceResolve,
  test: {
    include: ["test/chaos/**/*.test.ts"],
    exclude: ["**/node_modules/**", "**/dist/**"],
    fileParallelism: false,
    testTimeout: 600_000,
    hookTimeout: 120_000,
    // Of the system packages, only etcd: the etcd suites start real members.
    ...systemPackageTags(["etcd"]),
    globalSetup: ["test/harness/system-packages-notice.ts"],
  },
});
