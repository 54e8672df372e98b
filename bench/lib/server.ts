/**
 * Starts a berth service for a benchmark as a child process (its own event loop, as in production),
 * on an ephemeral port with a fresh state directory, and stops it afterwards.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import * as grpc from "@grpc/grpc-js";
import { grpcServiceClient, target, unary } from "./grpc-clients.js";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ENTRY: Record<"sessions" | "budget", string> = {
  sessions: fileURLToPath(new URL("../../../services/sessions/dist/main.js", import.meta.url)),
  budget: fileURLToPath(new URL("../../../services/budget/dist/main.js", import.meta.url)),
};
const BERTH = fileURLToPath(new URL("../../../packages/cli/bin/berth.js", import.meta.url));

/** A berth process a benchmark started: its pid, its state directory and what /proc says of it. */
export interface BenchProcess {
  readonly pid: number;
  readonly stateDir: string;
  /** CPU time (user + system, ms) the process has used so far, from /proc. */
  cpuMs(): number;
  /** Resident memory of the process in bytes, from /proc. */
  rssBytes(): number;
  stop(): Promise<void>;
}

export interface BenchServer extends BenchProcess {
  readonly url: string;
}

/** Options of `startBenchServer`. */
export interface BenchServerOptions {
  /** The service's log level; default `info` (one line per RPC, as in production). */
  readonly logLevel?: string;
  /** The Node binary the service runs on; default this one. */
  readonly node?: string;
}

export async function startBenchServer(
  kind: "sessions" | "budget",
  args: string[] = [],
  env: NodeJS.ProcessEnv = {},
  options: BenchServerOptions = {},
): Promise<BenchServer> {
  // The port is chosen here and the service found by health, so that it is found at any log level.
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const server = await startBenchProcess(
    { name: kind, command: [ENTRY[kind], `--${kind}-port=${port}`], args, env, logLevel: options.logLevel, node: options.node },
    (child) => waitUntilServing(kind, child, port, url),
  );
  return { url, ...server };
}

/** Both services, each in its own process, as the command suites call them. */
export interface BenchServices {
  readonly sessions: BenchServer;
  readonly budget: BenchServer;
  stop(): Promise<void>;
}

/** Starts the sessions service, then the budget (stopping the first when the second fails to start). */
export async function startBenchServices(options: BenchServerOptions = {}): Promise<BenchServices> {
  const sessions = await startBenchServer("sessions", [], {}, options);
  let budget: BenchServer;
  try {
    budget = await startBenchServer("budget", [], {}, options);
  } catch (error) {
    await sessions.stop();
    throw error;
  }
  return {
    sessions,
    budget,
    async stop() {
      await sessions.stop();
      await budget.stop();
    },
  };
}

/** `berth up --ui` started by {@link startBerthUp}: both services and the live page. */
export interface BerthUp {
  readonly sessionsUrl: string;
  readonly budgetUrl: string;
  /** The live page, `http://127.0.0.1:PORT/`. */
  readonly pageUrl: string;
  readonly pid: number;
  /** CPU time (user + system, ms) the process has used so far, from /proc. */
  cpuMs(): number;
  stop(): Promise<void>;
}

/** Options of `startBerthUp`. */
export interface BerthUpOptions extends BenchServerOptions {
  /** Without the live page (`berth up` alone); default with it (`berth up --ui`). */
  readonly ui?: boolean;
}

/**
 * Starts `berth up --ui` (both services in one process, and the live page; without the page with
 * `ui: false`) as a child process on ephemeral ports with a fresh state directory, its log lines
 * discarded as a collector would take them; resolves once both services answer health and the
 * page's server answers.
 */
export async function startBerthUp(args: string[] = [], options: BerthUpOptions = {}): Promise<BerthUp> {
  const ui = options.ui ?? true;
  const [sessionsPort, budgetPort, pagePort] = [await freePort(), await freePort(), await freePort()];
  const sessionsUrl = `http://127.0.0.1:${sessionsPort}`;
  const budgetUrl = `http://127.0.0.1:${budgetPort}`;
  const pageUrl = `http://127.0.0.1:${pagePort}/`;
  const up = await startBenchProcess(
    {
      name: "up",
      command: [BERTH, "up", ...(ui ? ["--ui", `--ui-port=${pagePort}`] : []), `--sessions-port=${sessionsPort}`, `--budget-port=${budgetPort}`],
      args,
      logLevel: options.logLevel,
      node: options.node,
    },
    async (child) => {
      await waitUntilServing("berth up (sessions)", child, sessionsPort, sessionsUrl);
      await waitUntilServing("berth up (budget)", child, budgetPort, budgetUrl);
      if (ui && !(await fetch(`${pageUrl}config.json`)).ok) throw new Error(`the live page's server did not answer /config.json at ${pageUrl}`);
    },
  );
  return { sessionsUrl, budgetUrl, pageUrl, ...up };
}

/** What {@link startBenchProcess} runs: `node command… --state-dir=… --log-level=… args…`. */
interface BenchProcessOptions extends BenchServerOptions {
  /** Names its state directory. */
  readonly name: string;
  /** The entry point and the ports it listens on. */
  readonly command: readonly string[];
  /** The benchmark's own flags, last. */
  readonly args: readonly string[];
  /** Over this process's environment. */
  readonly env?: NodeJS.ProcessEnv;
}

/**
 * `BERTH_BENCH_CPU_PROF=DIR`: each service a benchmark starts writes a V8 CPU profile of its whole
 * run into DIR (`node --cpu-prof`; NODE_OPTIONS may not carry it), to see where a figure's server
 * time goes.
 */
function profiling(): string[] {
  const dir = process.env.BERTH_BENCH_CPU_PROF;
  return dir ? ["--cpu-prof", `--cpu-prof-dir=${path.resolve(dir)}`] : [];
}

/**
 * Spawns a berth process (its own event loop, as in production) with a fresh state directory, its
 * log lines sent where a log collector would take them: away, at once. Resolves once `serving`
 * does; when that fails, the process is killed and its state directory removed.
 */
async function startBenchProcess(options: BenchProcessOptions, serving: (child: ChildProcess) => Promise<void>): Promise<BenchProcess> {
  const stateDir = mkdtempSync(path.join(tmpdir(), `berth-bench-${options.name}-`));
  const child = spawn(
    options.node ?? process.execPath,
    [...profiling(), ...options.command, `--state-dir=${stateDir}`, `--log-level=${options.logLevel ?? "info"}`, ...options.args],
    {
      env: { ...process.env, ...options.env },
      stdio: ["ignore", "ignore", "inherit"],
    },
  );
  try {
    await serving(child);
  } catch (error) {
    child.kill("SIGKILL");
    rmSync(stateDir, { recursive: true, force: true });
    throw error;
  }
  const pid = child.pid!;
  return {
    pid,
    stateDir,
    cpuMs: () => processCpuMs(pid),
    rssBytes: () => processRssBytes(pid),
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = new Promise((resolve) => child.once("exit", resolve));
        child.kill("SIGTERM");
        await exited;
      }
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

/** Waits for the service to accept connections and answer health SERVING (30 s at most). */
async function waitUntilServing(kind: string, child: ChildProcess, port: number, url: string): Promise<void> {
  // A TCP connect first: grpc-js backs off for seconds after a refused connection.
  const deadline = performance.now() + 30_000;
  while (!(await accepts(port))) {
    if (child.exitCode !== null) throw new Error(`${kind} exited with ${child.exitCode} before listening`);
    if (performance.now() > deadline) throw new Error(`${kind} did not listen within 30 s`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  const Health = grpcServiceClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
  const health = new Health(target(url), grpc.credentials.createInsecure());
  try {
    await unary(health, "check", { service: "" });
  } finally {
    health.close();
  }
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => resolve(false));
  });
}

/** A port free right now on loopback. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as net.AddressInfo;
      server.close(() => resolve(port));
    });
  });
}

export function processCpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(fields[11]) + Number(fields[12]);
  return (ticks * 1000) / 100; // USER_HZ is 100 on Linux
}

/** Resident memory of process `pid` in bytes now (VmRSS), from /proc/PID/status. */
export function processRssBytes(pid: number): number {
  return statusKb(pid, "VmRSS") * 1024;
}

/** The most resident memory process `pid` ever had, in bytes (VmHWM), from /proc/PID/status. */
export function processPeakRssBytes(pid: number): number {
  return statusKb(pid, "VmHWM") * 1024;
}

/** Resident memory of process `pid` in bytes, split as /proc/PID/status does: its own (RssAnon) and files' pages (RssFile: most of it the node binary's, shared by every node process). */
export function processRssSplit(pid: number): { anonBytes: number; fileBytes: number } {
  return { anonBytes: statusKb(pid, "RssAnon") * 1024, fileBytes: statusKb(pid, "RssFile") * 1024 };
}

function statusKb(pid: number, field: string): number {
  const match = new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return match ? Number(match[1]) : NaN;
}
