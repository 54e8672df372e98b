/**
 * What `berth mcp` costs an agent:
 *
 * - a tool call's overhead over the RPC it makes: `session_snapshot` and `lock_inspect` called
 *   through the built `berth mcp` over stdio (the MCP SDK's own client), beside GetSnapshot and
 *   Inspect called directly with @berth/client, in the same rounds (p50 of each, the difference
 *   and the ratio);
 * - start-up: from spawning `berth mcp` to its answer to `initialize`, beside a bare `node -e 0`
 *   from spawn to exit, in the same rounds (medians, and their ratio).
 *
 * The services run as child processes on this machine (it is shared: quote the ratios).
 *
 * `npm run bench -- mcp [--calls=500] [--starts=10]`
 */
import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { Berth } from "@berth/client";
import { emit, percentiles, ratio } from "../lib/report.js";
import { startBenchServices } from "../lib/server.js";
import { timeInRounds, timeToExit } from "../lib/startup-timing.js";

const BERTH = fileURLToPath(new URL("../../../packages/cli/bin/berth.js", import.meta.url));

interface Settings {
  calls: number;
  starts: number;
}

/** Runs the suite. */
export async function run(args: string[] = []): Promise<void> {
  const settings: Settings = { calls: 500, starts: 10 };
  for (const arg of args) {
    const [name, value] = arg.replace(/^--/, "").split("=", 2) as [string, string | undefined];
    if (name === "calls" && Number(value) > 0) settings.calls = Math.floor(Number(value));
    else if (name === "starts" && Number(value) > 0) settings.starts = Math.floor(Number(value));
    else throw new Error(`unknown flag ${arg}; flags: --calls=N --starts=N`);
  }
  const services = await startBenchServices({ logLevel: "warn" });
  try {
    const env = { PATH: process.env.PATH ?? "", BERTH_SESSIONS_URL: services.sessions.url, BERTH_BUDGET_URL: services.budget.url };
    await toolOverhead(settings, env);
    await startUp(settings, env);
  } finally {
    await services.stop();
  }
}

async function toolOverhead(settings: Settings, env: Record<string, string>): Promise<void> {
  const cwd = mkdtempSync(path.join(tmpdir(), "berth-bench-mcp-"));
  const berth = new Berth({ sessionsUrl: env.BERTH_SESSIONS_URL, budgetUrl: env.BERTH_BUDGET_URL });
  const file = path.join(cwd, "app.css");
  await berth.sessions.appendMany("bench-mcp", [
    { type: "generate", pageUrl: "/pricing", count: 3 },
    { type: "agent_phase", phase: "writing" },
  ]);
  const transport = new StdioClientTransport({ command: process.execPath, args: [BERTH, "mcp"], cwd, env, stderr: "ignore" });
  const client = new Client({ name: "bench", version: "1" });
  await client.connect(transport);
  try {
    const cases = [
      {
        name: "session_snapshot",
        rpc: "GetSnapshot",
        direct: () => berth.sessions.snapshot("bench-mcp"),
        tool: () => client.callTool({ name: "session_snapshot", arguments: { sessionId: "bench-mcp" } }),
      },
      {
        name: "lock_inspect",
        rpc: "Inspect",
        direct: () => berth.locks.inspect(file),
        tool: () => client.callTool({ name: "lock_inspect", arguments: { file } }),
      },
    ];
    const samples = new Map(
      cases.flatMap((c) => [
        [`${c.name}:direct`, [] as number[]],
        [`${c.name}:tool`, [] as number[]],
      ]),
    );
    // Warm both paths (connections, compiled code), then alternate them call by call so that a busy
    // moment of the machine hits both alike.
    for (const c of cases) for (let i = 0; i < 20; i++) await Promise.all([c.direct(), c.tool()]);
    for (let i = 0; i < settings.calls; i++) {
      for (const c of cases) {
        let started = performance.now();
        await c.direct();
        samples.get(`${c.name}:direct`)!.push(performance.now() - started);
        started = performance.now();
        const result = await c.tool();
        samples.get(`${c.name}:tool`)!.push(performance.now() - started);
        if (result.isError) throw new Error(`${c.name}: ${JSON.stringify(result.content)}`);
      }
    }
    for (const c of cases) {
      const direct = percentiles(samples.get(`${c.name}:direct`)!, [50, 99]);
      const tool = percentiles(samples.get(`${c.name}:tool`)!, [50, 99]);
      emit({
        suite: "mcp",
        figure: "tool call over its RPC",
        tool: c.name,
        rpc: c.rpc,
        calls: settings.calls,
        tool_p50_ms: tool.p50_ms,
        tool_p99_ms: tool.p99_ms,
        rpc_p50_ms: direct.p50_ms,
        rpc_p99_ms: direct.p99_ms,
        overhead_p50_ms: Math.round((tool.p50_ms! - direct.p50_ms!) * 1000) / 1000,
        ratio_p50: ratio(tool.p50_ms!, direct.p50_ms!),
      });
    }
  } finally {
    await client.close();
  }
}

async function startUp(settings: Settings, env: Record<string, string>): Promise<void> {
  const samples = await timeInRounds(
    new Map([
      ["berth mcp", () => timeToInitialize(env)],
      ["node -e 0", () => timeToExit(process.execPath, ["-e", "0"])],
    ]),
    settings.starts,
  );
  const [mcp, bare] = [samples.get("berth mcp")!, samples.get("node -e 0")!];
  const median = (values: number[]) => percentiles(values, [50]).p50_ms!;
  emit({
    suite: "mcp",
    figure: "berth mcp start-up to its initialize answer",
    node: process.version,
    runs: settings.starts,
    median_ms: median(mcp),
    node_e_0_median_ms: median(bare),
    ratio: ratio(median(mcp), median(bare)),
  });
}

/** Spawns `berth mcp`, sends initialize at once, and resolves with the time to the answer's first byte on stdout. */
function timeToInitialize(env: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const child = spawn(process.execPath, [BERTH, "mcp"], { env, stdio: ["pipe", "pipe", "ignore"] });
    const initialize = {
      jsonrpc: "2.0",
      id: 1,
      method: "initialize",
      params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "bench", version: "1" } },
    };
    child.stdin.write(`${JSON.stringify(initialize)}\n`);
    child.stdout.once("data", () => {
      const ms = performance.now() - started;
      child.stdin.end();
      child.once("exit", () => resolve(ms));
    });
    child.once("error", reject);
  });
}
