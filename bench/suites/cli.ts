/**
 * How fast the `berth` command starts: each command's wall time, from spawn to exit, beside a bare
 * `node -e 0` measured in the same rounds (the machine is shared: only the ratio means anything).
 *
 * - `--version` and `--help` load no RPC code (target ≤ 1.5 × `node -e 0`);
 * - `sessions list`, `lock inspect FILE` and `budget state` each call their service, running here
 *   as child processes (target ≤ 2 ×).
 *
 * Every round runs each command once, in turn, so that a noisy moment hits all of them alike; the
 * first round warms the file cache and is not counted. One JSON line per command: the median, the
 * reference's median, their ratio and the target.
 *
 * `npm run bench -- cli [--runs=10] [--node=PATH]` (`--node` runs the command, and the reference,
 * on another Node binary; the services stay on this one).
 */
import { fileURLToPath } from "node:url";
import { emit, ratio } from "../lib/report.js";
import { startBenchServices } from "../lib/server.js";
import { processOutput, timeInRounds, timeToExit } from "../lib/startup-timing.js";

const BERTH = fileURLToPath(new URL("../../../packages/cli/bin/berth.js", import.meta.url));

interface Settings {
  runs: number;
  node: string;
}

/** A command measured, with its target as a multiple of `node -e 0`. */
interface Case {
  readonly name: string;
  readonly args: readonly string[];
  readonly target: number | undefined;
}

/** Runs the suite. */
export async function run(args: string[] = []): Promise<void> {
  const settings: Settings = { runs: 10, node: process.execPath };
  for (const arg of args) {
    const [name, value] = arg.replace(/^--/, "").split("=", 2) as [string, string | undefined];
    if (name === "runs" && Number(value) > 0) settings.runs = Math.floor(Number(value));
    else if (name === "node" && value) settings.node = value;
    else throw new Error(`unknown flag ${arg}; flags: --runs=N --node=PATH`);
  }
  const services = await startBenchServices({ logLevel: "warn" });
  try {
    const env = { ...withoutBerthVariables(process.env), BERTH_SESSIONS_URL: services.sessions.url, BERTH_BUDGET_URL: services.budget.url };
    // A few sessions, so that the list is not empty.
    for (const id of ["bench-a", "bench-b", "bench-c"])
      await timeToExit(settings.node, [BERTH, "sessions", "append", id, "generate", "--field", "count=3"], env);

    const cases: Case[] = [
      { name: "node -e 0", args: ["-e", "0"], target: undefined },
      { name: "berth --version", args: [BERTH, "--version"], target: 1.5 },
      { name: "berth --help", args: [BERTH, "--help"], target: 1.5 },
      { name: "berth sessions list", args: [BERTH, "sessions", "list"], target: 2 },
      { name: "berth lock inspect", args: [BERTH, "lock", "inspect", "src/app.css"], target: 2 },
      { name: "berth budget state", args: [BERTH, "budget", "state"], target: 2 },
    ];
    const samples = await timeInRounds(new Map(cases.map((c) => [c.name, () => timeToExit(settings.node, c.args, env)])), settings.runs);
    const reference = median(samples.get("node -e 0")!);
    const version = (await processOutput(settings.node, ["--version"])).trim();
    for (const c of cases) {
      const ms = median(samples.get(c.name)!);
      emit({
        suite: "cli",
        command: c.name,
        node: version,
        runs: settings.runs,
        median_ms: round3(ms),
        node_e_0_median_ms: round3(reference),
        ratio: ratio(ms, reference),
        ...(c.target === undefined ? {} : { target: c.target, met: ms <= c.target * reference }),
      });
    }
  } finally {
    await services.stop();
  }
}

/** The environment without the developer's own berth settings. */
function withoutBerthVariables(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  return Object.fromEntries(Object.entries(env).filter(([name]) => !name.startsWith("BERTH_")));
}

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

function round3(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}
