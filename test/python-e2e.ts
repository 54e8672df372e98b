/**
 * What the Python client tests share (python, python-locks and python-budget .test.ts): stubs
 * generated from proto/ for the run with Debian's protoc and gRPC's Python plugin (as a user would:
 * never taken from git), `examples/python/e2e.py` run on Debian's grpcio reporting each step as a
 * JSON line, and a sessions service with a bearer token.
 */
import { writeFileSync } from "node:fs";
import * as path from "node:path";
import { makeTempDir, repoPath, runCommand, runSteps, startService, type CommandResult, type StartedService, type StepRun } from "./harness.js";
import { DEBIAN_PYTHON } from "./harness/system-packages.js";

export const EXAMPLES = repoPath("examples/python");

/** The bearer token of the sessions service {@link startTokenedSessions} starts. */
export const PYTHON_TOKEN = "python-e2e-token";

export function runPython(args: readonly string[], env: Record<string, string>, cwd: string = EXAMPLES): StepRun {
  // Only what the script needs: no BERTH_* of the developer, and no PYTHONHOME/PYTHONPATH of
  // another interpreter (pyenv) that would break /usr/bin/python3's own modules.
  const base: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!/^(BERTH_|BACKLOT_|PYTHON)/.test(name)) base[name] = value;
  }
  return runSteps(DEBIAN_PYTHON, [path.join(EXAMPLES, "e2e.py"), ...args], {
    cwd,
    env: { ...base, PYTHONUNBUFFERED: "1", PYTHONDONTWRITEBYTECODE: "1", ...env },
    label: "e2e.py",
  });
}

/** The generated stubs of one run, and what protoc's plugin was handed (to check it got the real protos). */
export interface PythonStubs {
  /** The run's temp dir, for anything else the test needs beside the stubs. */
  root: string;
  stubs: string;
  generated: CommandResult;
  pluginRequests: string;
}

export async function generateStubs(): Promise<PythonStubs> {
  const root = makeTempDir("berth-python-e2e-");
  const stubs = path.join(root, "stubs");
  // The plugin is Debian's, through a wrapper that keeps the requests protoc hands it.
  const pluginRequests = path.join(root, "plugin-requests");
  const plugin = path.join(root, "grpc_python_plugin");
  writeFileSync(plugin, `#!/bin/sh\ntee -a "${pluginRequests}" | exec grpc_python_plugin "$@"\n`, { mode: 0o755 });
  const generated = await runCommand("bash", [path.join(EXAMPLES, "generate.sh"), stubs], { timeoutMs: 60_000, env: { GRPC_PYTHON_PLUGIN: plugin } });
  return { root, stubs, generated, pluginRequests };
}

/** A sessions service whose token is read from a file in `root`, with room for one waiter per lock: the Python side meets TOO_MANY_WAITERS once the test queues one. */
export function startTokenedSessions(root: string): Promise<StartedService> {
  const tokenFile = path.join(root, "token");
  writeFileSync(tokenFile, `${PYTHON_TOKEN}\n`, { mode: 0o600 });
  return startService("sessions", { args: ["--token-file", tokenFile, "--lock-max-waiters", "1"] });
}
