/**
 * Starts a berth service for a benchmark as a child process (its own event loop, as in production),
 * on an ephemeral port with a fresh state directory, and stops it afterwards.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ENTRY: Record<"sessions" | "budget", string> = {
  sessions: fileURLToPath(new URL("../../../services/sessions/dist/main.js", import.meta.url)),
  budget: fileURLToPath(new URL("../../../services/budget/dist/main.js", import.meta.url)),
};

export interface BenchServer {
  url: string;
  pid: number;
  stateDir: string;
  /** CPU time (user + system, ms) the server process has used so far, from /proc. */
  cpuMs(): number;
  /** Resident memory of the server process in bytes, from /proc. */
  rssBytes(): number;
  stop(): Promise<void>;
}

export async function startBenchServer(kind: "sessions" | "budget", args: string[] = [], env: NodeJS.ProcessEnv = {}): Promise<BenchServer> {
  const stateDir = mkdtempSync(path.join(tmpdir(), `berth-bench-${kind}-`));
  const child: ChildProcess = spawn(process.execPath, [ENTRY[kind], `--state-dir=${stateDir}`, `--${kind}-port=0`, "--log-level=info", ...args], {
    env: { ...process.env, ...env },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let buffered = "";
    const timer = setTimeout(() => reject(new Error(`${kind} did not start within 15 s`)), 15_000);
    child.once("exit", (code) => reject(new Error(`${kind} exited with ${code} before listening`)));
    // The per-RPC log lines keep flowing after start: read and drop them, as a log collector would.
    let listening = false;
    child.stdout!.on("data", (chunk: Buffer) => {
      if (listening) return;
      buffered += chunk.toString("utf8");
      const match = /"url":"(http:\/\/[^"]+)"/.exec(buffered);
      if (match) {
        clearTimeout(timer);
        listening = true;
        buffered = "";
        resolve(match[1]!);
      } else if (buffered.length > 65_536) buffered = buffered.slice(-4096);
    });
  });
  const pid = child.pid!;
  return {
    url,
    pid,
    stateDir,
    cpuMs: () => processCpuMs(pid),
    rssBytes: () => processRssBytes(pid),
    async stop() {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
      rmSync(stateDir, { recursive: true, force: true });
    },
  };
}

function processCpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  const ticks = Number(fields[11]) + Number(fields[12]);
  return (ticks * 1000) / 100; // USER_HZ is 100 on Linux
}

function processRssBytes(pid: number): number {
  const match = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return match ? Number(match[1]) * 1024 : NaN;
}
