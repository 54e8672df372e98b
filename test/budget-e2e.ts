/**
 * What the budget's end-to-end tests share: a budget service on a fixture machine (a `--proc-root`
 * with a quiet 16G box, no cgroup), so that no verdict depends on how busy this machine is; a
 * Connect gRPC client of it; and the `berth` CLI as a child process whose JSON-line events can be
 * awaited one by one.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { createInterface } from "node:readline";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { Client } from "@connectrpc/connect";
import {
  connectClient,
  makeTempDir,
  onStopAll,
  repoPath,
  runCommand,
  startService,
  type CommandOptions,
  type CommandResult,
  type StartedService,
} from "./harness.js";

export const G = 1024 ** 3;

/** A proc tree of a quiet 16G machine: meminfo and loadavg, no PSI, no cgroup. */
export function fixtureProc(): string {
  const proc = path.join(makeTempDir("berth-budget-proc-"), "proc");
  mkdirSync(proc, { recursive: true });
  writeFileSync(path.join(proc, "meminfo"), "MemTotal:       16777216 kB\nMemFree:         8000000 kB\nMemAvailable:   16000000 kB\n");
  writeFileSync(path.join(proc, "loadavg"), "0.00 0.00 0.00 1/100 4242\n");
  return proc;
}

/** The flags that put a budget on the fixture machine, sampled every 200 ms, with a 4G / 4 cpu budget unless `budgetFlags` is false. */
export function fixtureArgs(budgetFlags = true): string[] {
  return [`--proc-root=${fixtureProc()}`, "--cgroup-root=/nonexistent", "--sample-interval=200ms", ...(budgetFlags ? ["--memory=4G", "--cpu=4"] : [])];
}

/** A started budget service and a client of it. */
export interface BudgetUnderTest {
  service: StartedService;
  url: string;
  client: Client<typeof BudgetService>;
}

/** Starts a budget service on the fixture machine (`args` come after the fixture's: they win). */
export async function startBudget(
  options: { args?: readonly string[]; stateDir?: string; env?: Record<string, string>; budgetFlags?: boolean } = {},
): Promise<BudgetUnderTest> {
  const service = await startService("budget", {
    args: [...fixtureArgs(options.budgetFlags), ...(options.args ?? [])],
    stateDir: options.stateDir,
    env: options.env,
  });
  const url = service.url("budget");
  // Streams here live as long as a test needs them: no default deadline.
  const client = connectClient(BudgetService, url, { protocol: "grpc", defaultTimeoutMs: 60_000 });
  return { service, url, client };
}

/** Polls `predicate` (every 10 ms, up to `timeoutMs`) until it holds; returns whether it did. */
export async function until(predicate: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<boolean> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await predicate()) return true;
    if (Date.now() > end) return false;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** The built CLI. */
export const CLI = repoPath("packages/cli/bin/berth.js");

/** Runs `berth ARGS…` to completion against `url`. */
export function berth(url: string, args: readonly string[], options: CommandOptions = {}): Promise<CommandResult> {
  return runCommand(process.execPath, [CLI, ...args], {
    ...options,
    env: { BERTH_BUDGET_URL: url, BERTH_TOKEN: undefined, BERTH_TOKEN_FILE: undefined, ...options.env },
  });
}

/** A JSON-line event of `berth admit`. */
export type AdmitEvent = Record<string, unknown> & { event: string };

/** A `berth` process running in the background, its stderr read as JSON-line events. */
export interface BerthProcess {
  child: ChildProcess;
  pid: number;
  events: AdmitEvent[];
  stdout(): string;
  stderr(): string;
  /** Resolves with the first event named `name` (already seen or still to come); rejects after `timeoutMs`. */
  event(name: string, timeoutMs?: number): Promise<AdmitEvent>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/** Starts `berth ARGS…` against `url` without waiting for it; it is SIGKILLed by stopAll if still running. */
export function spawnBerth(url: string, args: readonly string[], env: Record<string, string> = {}): BerthProcess {
  const child = spawn(process.execPath, [CLI, ...args], {
    cwd: repoPath(),
    env: { ...process.env, BERTH_BUDGET_URL: url, ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  const events: AdmitEvent[] = [];
  let stdout = "";
  let stderr = "";
  const waiters = new Set<{ name: string; resolve: (event: AdmitEvent) => void }>();
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
  createInterface({ input: child.stderr! }).on("line", (line) => {
    let event: AdmitEvent;
    try {
      event = JSON.parse(line) as AdmitEvent;
    } catch {
      return; // not an event line
    }
    events.push(event);
    for (const waiter of waiters) {
      if (waiter.name === event.event) {
        waiters.delete(waiter);
        waiter.resolve(event);
      }
    }
  });
  let done = false;
  // 'exit', not 'close': the command berth runs inherits its stdio, so the pipes may outlive berth.
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => {
      done = true;
      resolve({ code, signal });
    }),
  );
  onStopAll(() => {
    if (!done) child.kill("SIGKILL");
  });
  return {
    child,
    pid: child.pid!,
    events,
    stdout: () => stdout,
    stderr: () => stderr,
    exited,
    event(name, timeoutMs = 10_000) {
      const seen = events.find((e) => e.event === name);
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve, reject) => {
        const waiter = { name, resolve };
        waiters.add(waiter);
        setTimeout(() => {
          if (!waiters.delete(waiter)) return;
          reject(new Error(`no '${name}' event within ${timeoutMs} ms; stderr:\n${stderr}`));
        }, timeoutMs);
        // Its last lines may still be in the pipe when the process has exited: give them a moment.
        void exited.then(() => {
          setTimeout(() => {
            if (waiters.delete(waiter)) reject(new Error(`berth exited without a '${name}' event; stderr:\n${stderr}`));
          }, 1_000);
        });
      });
    },
  };
}
