/**
 * What berth costs while nothing happens: each service alone (`node services/NAME/dist/main.js`,
 * as a container runs it) and `berth up` (both in one process), each on a fresh state directory
 * with its default settings. Once all serve (health answers), they are left alone: the resident
 * memory after --settle (VmRSS, and the peak so far, VmHWM, from /proc/PID/status), then the CPU
 * each uses over the next --window (user + system, from /proc/PID/stat). VmRSS is split as the
 * kernel counts it: the process's own pages (RssAnon: its heaps, stacks, threads) and files'
 * (RssFile: mostly the pages of the node binary the process has touched, which every node
 * process on the machine shares).
 *
 * The reference is a bare `node -e "setInterval(() => {}, 1000)"` on the same binary, started
 * and measured in the same run: what any Node process costs. Each line carries its figures and
 * the process's cost over that floor.
 *
 * `npm run bench -- idle [--node=PATH]… [--settle=10s] [--window=30s]`: one JSON line per process
 * and Node binary (--node may be given more than once; default the one running the bench).
 */
import { spawn } from "node:child_process";
import { setTimeout as sleep } from "node:timers/promises";
import { emit } from "../lib/report.js";
import { processOutput } from "../lib/startup-timing.js";
import { processCpuMs, processPeakRssBytes, processRssBytes, processRssSplit, startBenchServer, startBerthUp } from "../lib/server.js";

interface Settings {
  nodes: string[];
  settleMs: number;
  windowMs: number;
}

/** A process measured: its name in the figures, its pid, and how to stop it. */
interface Subject {
  readonly name: string;
  readonly pid: number;
  stop(): Promise<void>;
}

const MB = 1024 * 1024;
const mb = (bytes: number) => Math.round((bytes / MB) * 10) / 10;

/** Runs the suite. */
export async function run(args: string[] = []): Promise<void> {
  const settings: Settings = { nodes: [], settleMs: 10_000, windowMs: 30_000 };
  for (const arg of args) {
    const [name, value] = arg.replace(/^--/, "").split("=", 2) as [string, string | undefined];
    if (name === "node" && value) settings.nodes.push(value);
    else if (name === "settle" && durationMs(value) !== undefined) settings.settleMs = durationMs(value)!;
    else if (name === "window" && durationMs(value) !== undefined && durationMs(value)! > 0) settings.windowMs = durationMs(value)!;
    else throw new Error(`unknown flag ${arg}; flags: --node=PATH (repeatable) --settle=10s --window=30s`);
  }
  if (settings.nodes.length === 0) settings.nodes.push(process.execPath);
  for (const node of settings.nodes) await measure(node, settings);
}

/** Starts the reference and berth's three idle processes on `node`, measures them side by side, stops them. */
async function measure(node: string, settings: Settings): Promise<void> {
  const version = (await processOutput(node, ["--version"])).trim();
  const subjects: Subject[] = [];
  try {
    subjects.push(startReference(node));
    const sessions = await startBenchServer("sessions", [], {}, { node });
    subjects.push({ name: "sessions", pid: sessions.pid, stop: () => sessions.stop() });
    const budget = await startBenchServer("budget", [], {}, { node });
    subjects.push({ name: "budget", pid: budget.pid, stop: () => budget.stop() });
    const up = await startBerthUp([], { node, ui: false });
    subjects.push({ name: "berth up", pid: up.pid, stop: () => up.stop() });

    await sleep(settings.settleMs);
    const memory = subjects.map((s) => ({ rss: processRssBytes(s.pid), peak: processPeakRssBytes(s.pid), ...processRssSplit(s.pid) }));
    const cpuBefore = subjects.map((s) => processCpuMs(s.pid));
    const started = performance.now();
    await sleep(settings.windowMs);
    const seconds = (performance.now() - started) / 1000;
    const cpuPerS = subjects.map((s, i) => (processCpuMs(s.pid) - cpuBefore[i]!) / seconds);

    const reference = { ...memory[0]!, cpuPerS: cpuPerS[0]! };
    subjects.forEach((subject, i) => {
      emit({
        suite: "idle",
        process: subject.name,
        node: version,
        settle_s: settings.settleMs / 1000,
        window_s: Math.round(seconds * 10) / 10,
        rss_mb: mb(memory[i]!.rss),
        peak_rss_mb: mb(memory[i]!.peak),
        rss_anon_mb: mb(memory[i]!.anonBytes),
        rss_file_mb: mb(memory[i]!.fileBytes),
        cpu_ms_per_s: round2(cpuPerS[i]!),
        reference: "node -e setInterval",
        reference_rss_mb: mb(reference.rss),
        reference_peak_rss_mb: mb(reference.peak),
        reference_rss_anon_mb: mb(reference.anonBytes),
        reference_cpu_ms_per_s: round2(reference.cpuPerS),
        rss_over_reference_mb: mb(memory[i]!.rss - reference.rss),
        rss_anon_over_reference_mb: mb(memory[i]!.anonBytes - reference.anonBytes),
      });
    });
  } finally {
    for (const subject of subjects.reverse()) await subject.stop();
  }
}

/** `node -e "setInterval(() => {}, 1000)"`: a Node process that stays up and does nothing. */
function startReference(node: string): Subject {
  const child = spawn(node, ["-e", "setInterval(() => {}, 1000)"], { stdio: "ignore" });
  const exited = new Promise((resolve) => child.once("exit", resolve));
  return {
    name: "node -e setInterval",
    pid: child.pid!,
    async stop() {
      child.kill("SIGTERM");
      await exited;
    },
  };
}

/** "10s", "1.5s", "500ms" in ms; undefined when it is not one. */
function durationMs(value: string | undefined): number | undefined {
  const match = /^(\d+(?:\.\d+)?)(ms|s)$/.exec(value ?? "");
  if (match === null) return undefined;
  return Number(match[1]) * (match[2] === "s" ? 1000 : 1);
}

function round2(value: number): number {
  return Math.round(value * 100) / 100;
}
