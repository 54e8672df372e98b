import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { Writable } from "node:stream";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { pino } from "pino";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { commonServerConfig, loadConfig } from "@berth/shared/config";
import type { RunningServer } from "@berth/shared/server/index";
import { createBudgetService } from "./service.js";
import { BUDGET_SETTINGS } from "./settings.js";
import { startItem } from "./testing.js";

const G = 1024 ** 3;
const root = mkdtempSync(path.join(tmpdir(), "berth-budget-service-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

/** A machine that is quiet and has 16G, whatever this one is doing. */
function fixtureProc(): string {
  const proc = path.join(root, "proc");
  mkdirSync(proc, { recursive: true });
  writeFileSync(path.join(proc, "meminfo"), "MemTotal:       16777216 kB\nMemFree:         8000000 kB\nMemAvailable:   16000000 kB\n");
  writeFileSync(path.join(proc, "loadavg"), "0.00 0.00 0.00 1/100 4242\n");
  return proc;
}

const running: RunningServer[] = [];
afterEach(async () => {
  await Promise.all(running.splice(0).map((s) => s.close(false)));
});

let count = 0;
async function start(options: { config?: Record<string, unknown>; stateDir?: string } = {}) {
  const dir = path.join(root, `run-${++count}`);
  mkdirSync(dir, { recursive: true });
  const configFile = path.join(dir, "berth.json");
  writeFileSync(configFile, JSON.stringify({ "budget-port": 0, ...options.config }));
  const argv = [
    `--config=${configFile}`,
    `--state-dir=${options.stateDir ?? path.join(dir, "state")}`,
    `--proc-root=${fixtureProc()}`,
    "--cgroup-root=/nonexistent",
    "--sample-interval=1h",
  ];
  const values = loadConfig({ ...commonServerConfig(), ...BUDGET_SETTINGS }, { argv, env: {} }).values;
  const lines: string[] = [];
  const logger = pino({ level: "info" }, new Writable({ write: (chunk, _enc, done) => (lines.push(String(chunk)), done()) }));
  const server = await createBudgetService({ reloadSources: () => ({ argv, env: {} }) }).start(values as never, logger);
  running.push(server);
  const client = createClient(BudgetService, createGrpcTransport({ baseUrl: server.url }));
  const rewrite = (config: Record<string, unknown>) => writeFileSync(configFile, JSON.stringify({ "budget-port": 0, ...config }));
  return { server, client, lines, rewrite };
}

const until = async (predicate: () => boolean) => {
  const end = Date.now() + 5000;
  while (!predicate() && Date.now() < end) await new Promise((resolve) => setTimeout(resolve, 5));
  return predicate();
};

describe("the budget service", () => {
  it("serves its policy from the settings and derives defaults from the (fixture) machine", async () => {
    const { client } = await start({ config: { cpu: 2 } });
    const { policy, machine } = await client.getState({});
    expect(policy?.memoryBytes).toBe(BigInt(12 * G)); // 75 % of the fixture's 16G
    expect(policy?.cpu).toBe(2);
    expect(policy?.defaultLeaseTtl?.seconds).toBe(30n);
    expect(policy?.sampleInterval?.seconds).toBe(3600n);
    expect(machine?.totalBytes).toBe(BigInt(16 * G));
  });

  it("SIGHUP reloads the policy and re-checks the queue; a bad reload keeps the policy in force", async () => {
    const { client, lines, rewrite } = await start({ config: { memory: "3G", cpu: 4 } });
    await client.reserve({ owner: "held", need: { items: [startItem("a", 2, 1)] } });
    const controller = new AbortController();
    const requests = (async function* () {
      yield { kind: { case: "start" as const, value: { owner: "waiting", need: { items: [startItem("b", 2, 1)] } } } };
      await new Promise((resolve) => controller.signal.addEventListener("abort", resolve));
    })();
    const seen: string[] = [];
    const reading = (async () => {
      try {
        for await (const response of client.admit(requests, { signal: controller.signal })) seen.push(response.kind.case ?? "");
      } catch {
        // cancelled at the end of the test
      }
    })();
    expect(await until(() => seen.includes("queued"))).toBe(true);

    rewrite({ memory: "4G", cpu: 4, "lease-ttl": "1m" });
    process.emit("SIGHUP", "SIGHUP");
    expect(await until(() => seen.includes("admitted"))).toBe(true);
    expect((await client.getState({})).policy?.defaultLeaseTtl?.seconds).toBe(60n);

    rewrite({ memory: "lots" });
    process.emit("SIGHUP", "SIGHUP");
    expect(lines.some((l) => l.includes("the policy was not reloaded") && l.includes("memory"))).toBe(true);
    expect((await client.getState({})).policy?.memoryBytes).toBe(BigInt(4 * G));
    controller.abort();
    await reading;
  });

  it("the longest lease is a setting (1h by default), reloaded on SIGHUP; a default lease above it is refused", async () => {
    const { client, lines, rewrite } = await start();
    expect((await client.getLimits({})).maxTtl?.seconds).toBe(3600n);
    const over = await client.reserve({ owner: "a", ttl: { seconds: 3601n, nanos: 0 } }).catch((e: unknown) => e as Error);
    expect((over as Error).message).toMatch(/ttl: must be at most 1h/);

    rewrite({ "max-lease-ttl": "2h" });
    process.emit("SIGHUP", "SIGHUP");
    expect((await client.getLimits({})).maxTtl?.seconds).toBe(7200n);
    expect((await client.reserve({ owner: "a", ttl: { seconds: 3601n, nanos: 0 } })).reservation?.id).toBeDefined();

    rewrite({ "max-lease-ttl": "10s" });
    process.emit("SIGHUP", "SIGHUP");
    expect(lines.some((l) => l.includes("the policy was not reloaded") && l.includes("lease-ttl: must be at most max-lease-ttl (10s)"))).toBe(true);
    expect((await client.getLimits({})).maxTtl?.seconds).toBe(7200n);
    await expect(start({ config: { "lease-ttl": "2h" } })).rejects.toThrow(/lease-ttl: must be at most max-lease-ttl \(1h\); got 2h/);
  });

  it("exports its gauges and removes its SIGHUP handler when it stops", async () => {
    const before = process.listenerCount("SIGHUP");
    const { server } = await start();
    expect(process.listenerCount("SIGHUP")).toBe(before + 1);
    const metrics = await (await fetch(`${server.url}/metrics`)).text();
    expect(metrics).toMatch(/berth_budget_queue_length 0/);
    expect(metrics).toMatch(/berth_budget_committed_memory_bytes 0/);
    await server.close();
    expect(process.listenerCount("SIGHUP")).toBe(before);
  });

  it("the running tally survives a restart", async () => {
    const stateDir = path.join(root, "restart-state");
    const first = await start({ stateDir });
    const { running: entry } = await first.client.registerRunning({ name: "db", pid: process.pid });
    await first.server.close();
    const second = await start({ stateDir });
    const { running: entries } = await second.client.getState({});
    expect(entries.map((e) => [e.id, e.name, e.pid])).toEqual([[entry!.id, "db", process.pid]]);
  });
});
