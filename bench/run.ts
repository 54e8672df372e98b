#!/usr/bin/env node
/**
 * `npm run bench -- [suite…]`: runs the named benchmark suites (all when none is named). Each
 * figure is one JSON line on stdout, so results can be compared across runs and machines.
 */
/** Every suite by name; each module exports `run(): Promise<void>`. */
const SUITES: Record<string, () => Promise<{ run(args: string[]): Promise<void> }>> = {
  sessions: () => import("./suites/sessions.js"),
  locks: () => import("./suites/locks.js"),
  budget: () => import("./suites/budget.js"),
  eta: () => import("./suites/eta.js"),
  etcd: () => import("./suites/etcd.js"),
  cli: () => import("./suites/cli.js"),
  "web-client": () => import("./suites/web-client.js"),
  mcp: () => import("./suites/mcp.js"),
  ui: () => import("./suites/ui.js"),
  idle: () => import("./suites/idle.js"),
};

const [first, ...rest] = process.argv.slice(2);
const names = first && !first.startsWith("-") ? [first] : Object.keys(SUITES);
const args = first && !first.startsWith("-") ? rest : process.argv.slice(2);
for (const name of names) {
  const load = SUITES[name];
  if (!load) {
    process.stderr.write(`unknown suite '${name}'; suites: ${Object.keys(SUITES).join(", ")}\n`);
    process.exit(2);
  }
  const suite = await load();
  await suite.run(args);
}
