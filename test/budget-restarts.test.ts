/**
 * The budget service's state across restarts and reloads (budget-requests.ts): the running tally
 * survives a restart, and SIGHUP reloads the policy from the config file.
 * The service runs on a fixture machine (`--proc-root`), so nothing here depends on this box's
 * load.
 */
import { spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { G, startBudget, until } from "./budget-e2e.js";
import { admit, start } from "./budget-requests.js";
import { makeTempDir, stopAll } from "./harness.js";

afterAll(stopAll);

describe("budget service: state across restarts and reloads", () => {
  it("the running tally survives a restart, without the work that ended meanwhile", async () => {
    const stateDir = path.join(makeTempDir(), "state");
    const first = await startBudget({ stateDir });
    const sleeper = spawn(process.execPath, ["-e", "setTimeout(() => {}, 30000)"], { stdio: "ignore" });
    const short = spawn(process.execPath, ["-e", "setTimeout(() => {}, 30000)"], { stdio: "ignore" });
    try {
      const kept = await first.client.registerRunning({ name: "kept", pid: sleeper.pid! });
      await first.client.registerRunning({ name: "ends", pid: short.pid! });
      await first.client.registerRunning({ name: "no pid", costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } } });
      expect(await first.service.stop()).toEqual({ code: 0, signal: null });
      short.kill("SIGKILL");
      await new Promise((resolve) => short.once("exit", resolve));

      const second = await startBudget({ stateDir });
      const { running, committed } = await second.client.getState({});
      expect(running.map((r) => r.name).sort()).toEqual(["kept", "no pid"]);
      expect(running.find((r) => r.name === "kept")?.id).toBe(kept.running?.id);
      expect(committed?.memoryBytes).toBe(BigInt(G + 512 * 1024 ** 2));
    } finally {
      sleeper.kill("SIGKILL");
      short.kill("SIGKILL");
    }
  });

  it("SIGHUP reloads the policy from the config file and re-checks the queue; flags still win; a bad file keeps the policy in force", async () => {
    const config = path.join(makeTempDir(), "budget.json");
    writeFileSync(config, JSON.stringify({ memory: "3G", cpu: 1 }));
    // The budget comes from the file (no --memory), except cpu, which a flag sets.
    const budget = await startBudget({ budgetFlags: false, args: [`--config=${config}`, "--cpu=4"] });
    expect((await budget.client.getState({})).policy).toMatchObject({ memoryBytes: BigInt(3 * G), cpu: 4 });
    const holder = admit(budget, "holder", [start("a", 2, 1)]);
    expect(await until(() => holder.has("admitted"))).toBe(true);
    const waiting = admit(budget, "waiting", [start("b", 2, 1)]);
    expect(await until(() => waiting.has("queued"))).toBe(true);

    writeFileSync(config, JSON.stringify({ memory: "5G", cpu: 1, "max-queue": 3, "lease-ttl": "2m" }));
    process.kill(budget.service.pid, "SIGHUP");
    expect(await until(() => waiting.has("admitted"))).toBe(true);
    const policy = (await budget.client.getState({})).policy!;
    expect(policy).toMatchObject({ memoryBytes: BigInt(5 * G), cpu: 4, maxQueue: 3 });
    expect(policy.defaultLeaseTtl?.seconds).toBe(120n);

    writeFileSync(config, JSON.stringify({ "max-queue": "many" }));
    process.kill(budget.service.pid, "SIGHUP");
    await budget.service.waitForLog((entry) => String(entry.msg).includes("the policy was not reloaded"));
    expect((await budget.client.getState({})).policy).toMatchObject({ memoryBytes: BigInt(5 * G), maxQueue: 3 });
    holder.cancel();
    waiting.cancel();
    await Promise.all([holder.done, waiting.done]);
    expect(await budget.service.stop()).toEqual({ code: 0, signal: null });
  });
});
