/**
 * The TypeScript example (examples/typescript/) runs as written against live services: `berth up`
 * as a process, the example as another, finding them through the environment as a user's shell
 * would (the README's "Finding the services"), from a project directory of its own.
 */
import { afterAll, expect, it } from "vitest";
import { makeTempDir, repoPath, runCommand, startService, stopAll } from "./harness.js";
import { fixtureArgs } from "./budget-e2e.js";

afterAll(stopAll);

it("examples/typescript: append, watch (backlog, caught-up, live), a typed error, a held lock, an admission", { timeout: 60_000 }, async () => {
  const up = await startService("up", { args: fixtureArgs() });
  const project = makeTempDir("berth-example-ts-");
  const run = await runCommand(process.execPath, [repoPath("examples/typescript/dist/demo.js"), "tour"], {
    cwd: project,
    env: { BERTH_SESSIONS_URL: up.url("sessions"), BERTH_BUDGET_URL: up.url("budget"), BERTH_TOKEN: undefined, BERTH_TOKEN_FILE: undefined },
    timeoutMs: 45_000,
  });
  expect(run.code, `${run.stdout}\n${run.stderr}`).toBe(0);
  const lines = run.stdout.trim().split("\n");
  expect(lines).toEqual([
    "appended seq 1 (phase generate_requested)",
    "backlog entry #1 generate",
    "caught up at seq 1",
    "live entry #2 steer (phase steer_requested)",
    "refused: SEQ_CONFLICT, the last seq is 2",
    `holding ${project}/src/app.css, fencing token 1`,
    "fenced append: seq 3",
    "lock released",
    expect.stringMatching(/^admitted [0-9a-f-]{36} after \d+ ms$/),
    expect.stringMatching(/^released [0-9a-f-]{36}$/),
    "done: tour ends at seq 3",
  ]);
  expect(run.stderr).toBe("");
});
