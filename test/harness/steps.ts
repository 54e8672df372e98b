/**
 * A client program in another language driven step by step (examples/python/e2e.py,
 * examples/go's berth-go-demo -e2e): it prints one JSON line `{"step": NAME, ...facts}` per step on
 * stdout, `{"step": "failed", "error": ...}` when it fails, and where the test has to check or act
 * first, waits for `{"go": NAME}` on its stdin.
 */
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { createInterface } from "node:readline";
import { onStopAll } from "./processes.js";

/** One JSON line of a stepped program. */
export type Step = Record<string, unknown> & { step: string };

/** A running stepped program: its reports, awaited by name, and the go-aheads it waits for. */
export interface StepRun {
  /** The first report named `name` (already printed or still to come); rejects on a `failed` report, an exit or the timeout (default 20 s). */
  step(name: string, timeoutMs?: number): Promise<Step>;
  go(name: string): void;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** stdout and stderr, labelled, for failure messages. */
  output(): string;
}

/** Options of {@link runSteps}. */
export interface StepOptions {
  /** The whole environment of the program (nothing is inherited beyond it). */
  env: NodeJS.ProcessEnv;
  cwd: string;
  /** The program's name in messages (`e2e.py`). */
  label: string;
}

/** Starts `command args…`; SIGKILLed by stopAll if still running. */
export function runSteps(command: string, args: readonly string[], options: StepOptions): StepRun {
  const { label } = options;
  const child: ChildProcessWithoutNullStreams = spawn(command, args, { cwd: options.cwd, env: options.env, stdio: ["pipe", "pipe", "pipe"] });
  let running = true;
  const stopKill = onStopAll(() => {
    if (running) child.kill("SIGKILL");
  });
  const steps: Step[] = [];
  const waiters = new Set<() => void>();
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
  createInterface({ input: child.stdout }).on("line", (line) => {
    try {
      steps.push(JSON.parse(line) as Step);
    } catch {
      // not a report: kept in the output for the failure message
    }
    for (const wake of waiters) wake();
  });
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
  child.stdin.on("error", () => {});
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    child.once("close", (code, signal) => {
      running = false;
      stopKill();
      for (const wake of waiters) wake();
      resolve({ code, signal });
    });
  });
  const output = () => `--- ${label} stdout\n${stdout}--- ${label} stderr\n${stderr}`;
  return {
    step(name, timeoutMs = 20_000) {
      return new Promise((resolve, reject) => {
        const timer = setTimeout(() => finish(new Error(`no "${name}" step from ${label} within ${timeoutMs} ms`)), timeoutMs);
        const check = () => {
          const found = steps.find((s) => s.step === name);
          if (found) return finish(undefined, found);
          const failed = steps.find((s) => s.step === "failed");
          if (failed) return finish(new Error(`${label} failed before "${name}": ${String(failed.error)}`));
          if (!running) finish(new Error(`${label} exited before "${name}"`));
        };
        const finish = (error: Error | undefined, step?: Step) => {
          clearTimeout(timer);
          waiters.delete(check);
          if (error) reject(error);
          else resolve(step!);
        };
        waiters.add(check);
        check();
      });
    },
    go(name) {
      child.stdin.write(`${JSON.stringify({ go: name })}\n`);
    },
    exited,
    output,
  };
}
