/**
 * The budget's fleet view on a real etcd member: budgets started with `--store etcd` each publish
 * their machine, GetFleet (through any of them) lists every live one with its figures, a budget
 * that stops leaves the list at once and one SIGKILLed when its lease expires; on the file store
 * GetFleet is FAILED_PRECONDITION naming --store etcd. `berth budget fleet` prints the table and
 * --json.
 */
import { Code } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { G, berth, startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import { stopAll, callFailure } from "./harness.js";

// Set by the etcd suite's beforeAll; stopped after every budget is (a budget outliving its etcd would only log failures).
let etcd: EtcdCluster;
let watcher: EtcdClient;
afterAll(async () => {
  watcher?.close();
  await stopAll();
  await etcd?.stop();
});

// Everything but the file store's refusals needs a real etcd member: a machine without etcd skips only this.
describe("on etcd", { tags: ["etcd"] }, () => {
  beforeAll(async () => {
    etcd = await startEtcd();
    watcher = createEtcdClient({ endpoints: etcd.clientUrls, prefix: "" });
  });

  /** A budget on the fixture machine (4G, 4 cpu) publishing as `machine` under `prefix`. */
  function fleetBudget(prefix: string, machine: string, more: string[] = []): Promise<BudgetUnderTest> {
    return startBudget({
      args: [
        "--store",
        "etcd",
        "--etcd-endpoints",
        etcd.clientUrls.join(","),
        "--etcd-prefix",
        prefix,
        "--machine-name",
        machine,
        "--fleet-ttl",
        "2s",
        ...more,
      ],
    });
  }

  /** The next change of `key` (relative to no prefix) that satisfies `matches`, from the watch's start. */
  async function nextChange(key: string, matches: (type: "put" | "delete", value: string) => boolean, startRevision?: bigint): Promise<bigint> {
    const abort = new AbortController();
    try {
      for await (const batch of watcher.watch({ key, signal: abort.signal, ...(startRevision === undefined ? {} : { startRevision }) })) {
        for (const event of batch.events) if (matches(event.type, new TextDecoder().decode(event.kv.value))) return event.kv.modRevision;
      }
    } finally {
      abort.abort();
    }
    throw new Error(`the watch of ${key} ended`);
  }

  const machinesOf = async (budget: BudgetUnderTest) => (await budget.client.getFleet({})).machines.map((m) => m.machine);

  describe("GetFleet on etcd", () => {
    let a: BudgetUnderTest;
    let b: BudgetUnderTest;
    beforeAll(async () => {
      [a, b] = await Promise.all([fleetBudget("fleet/", "box-a"), fleetBudget("fleet/", "box-b")]);
    });

    it("lists both machines through either budget, with what each has committed and the room left", async () => {
      expect(await machinesOf(a)).toEqual(["box-a", "box-b"]);
      expect(await machinesOf(b)).toEqual(["box-a", "box-b"]);
      const fresh = (await b.client.getFleet({})).machines[0]!;
      expect(fresh).toMatchObject({ machine: "box-a", pid: a.service.pid, enabled: true, cpuBusy: false, queueLength: 0 });
      expect(fresh.budget).toMatchObject({ memoryBytes: BigInt(4 * G), cpu: 4 });
      expect(fresh.room).toMatchObject({ memoryBytes: BigInt(4 * G), cpu: 4 });
      expect(fresh.sample?.totalBytes).toBe(BigInt(16 * G));

      // A reservation on a reaches b's view with a's next publication (a watch of a's key, no sleep).
      const since = (await watcher.status()).revision;
      await a.client.reserve({
        owner: "holder",
        need: { items: [{ kind: NeedItemKind.START, name: "h", costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 1 } } }] },
      });
      await nextChange("fleet/f/box-a", (type, value) => type === "put" && (JSON.parse(value) as { committed: { cpu: number } }).committed.cpu === 1, since);
      const held = (await b.client.getFleet({})).machines.find((m) => m.machine === "box-a")!;
      expect(held.committed).toMatchObject({ memoryBytes: BigInt(G), cpu: 1 });
      expect(held.room).toMatchObject({ memoryBytes: BigInt(3 * G), cpu: 3 });
      expect(held.reservationCount).toBe(1);
    });

    it("pages in machine-name order and checks its request", async () => {
      const first = await a.client.getFleet({ pageSize: 1 });
      expect(first.machines.map((m) => m.machine)).toEqual(["box-a"]);
      expect(first.nextPageToken).not.toBe("");
      const second = await a.client.getFleet({ pageSize: 1, pageToken: first.nextPageToken });
      expect(second.machines.map((m) => m.machine)).toEqual(["box-b"]);
      expect(second.nextPageToken).toBe("");
      // A token outlives the budget that issued it: it names a machine, not a place in one process's memory.
      expect((await b.client.getFleet({ pageSize: 1, pageToken: first.nextPageToken })).machines.map((m) => m.machine)).toEqual(["box-b"]);
      for (const request of [{ pageSize: -1 }, { pageToken: "not a token" }, { pageToken: Buffer.from('{"l":"queue","a":1}').toString("base64url") }]) {
        const error = await callFailure(a.client.getFleet(request));
        expect(error.code, JSON.stringify(request)).toBe(Code.InvalidArgument);
        expect(error.message).toMatch(/page_(size|token)/);
      }
    });

    it("prints the table, the roomiest machine first, and --json", async () => {
      const table = await berth(a.url, ["budget", "fleet"]);
      expect(table.code, table.stderr).toBe(0);
      const lines = table.stdout.trimEnd().split("\n");
      expect(lines[0]).toMatch(/MACHINE\s+STATUS\s+ROOM MEM\s+ROOM CPU\s+COMMITTED\s+AVAILABLE\s+LOAD\s+PUBLISHED/);
      // b has all of its 4G and 4 cpu free; a holds 1G, 1 cpu from the first test.
      expect(lines[1]).toMatch(/^\s+box-b\s+room\s+4G\s+4\s+0B\/4G, 0\/4 cpu\s+15\.3G\/16G\s+0\.00\/\d+\s+\S+ ago$/);
      expect(lines[2]).toMatch(/^\s+box-a\s+room\s+3G\s+3\s+1G\/4G, 1\/4 cpu/);
      expect(lines.at(-1)).toBe("room now: box-b (4G, 4 cpu free in its budget)");

      const json = await berth(a.url, ["budget", "fleet", "--json", "--page-size", "1"]);
      expect(json.code, json.stderr).toBe(0);
      const parsed = JSON.parse(json.stdout) as { machines: Array<{ machine: string; room: { memoryBytes: number }; queueLength?: number }> };
      // Every page in one object, in the service's (name) order, integers as numbers.
      expect(parsed.machines.map((m) => m.machine)).toEqual(["box-a", "box-b"]);
      expect(parsed.machines[1]!.room.memoryBytes).toBe(4 * G);
    });
  });

  describe("a budget that goes", () => {
    it("leaves the list at once when it stops, and when its lease expires when it is killed", async () => {
      const [stays, stops, dies] = await Promise.all([fleetBudget("going/", "stays"), fleetBudget("going/", "stops"), fleetBudget("going/", "dies")]);
      expect(await machinesOf(stays)).toEqual(["dies", "stays", "stops"]);

      // SIGTERM: its lease is revoked before it exits.
      expect((await stops.service.stop()).code).toBe(0);
      expect(await machinesOf(stays)).toEqual(["dies", "stays"]);

      // SIGKILL: nobody revokes; the entry stays until etcd expires the lease (2 s), then goes.
      const since = (await watcher.status()).revision + 1n;
      const killedAt = Date.now();
      await dies.service.kill();
      expect(await machinesOf(stays)).toEqual(["dies", "stays"]);
      await nextChange("going/f/dies", (type) => type === "delete", since);
      const goneAfterMs = Date.now() - killedAt;
      expect(await machinesOf(stays)).toEqual(["stays"]);
      // Kept alive every third of its TTL: it expires between two thirds of the TTL and the TTL after the kill (plus slack for a loaded machine).
      expect(goneAfterMs).toBeGreaterThan(1000);
      expect(goneAfterMs).toBeLessThan(10_000);
    }, 30_000);
  });

  describe("one budget per machine name", () => {
    it("refuses to start a second budget under a name a live budget publishes, naming --machine-name", async () => {
      const first = await fleetBudget("names/", "shared");
      const { launchService } = await import("./harness.js");
      const second = launchService("budget", {
        args: ["--store", "etcd", "--etcd-endpoints", etcd.clientUrls.join(","), "--etcd-prefix", "names/", "--machine-name", "shared", "--budget-port", "0"],
      });
      expect((await second.exited).code).toBe(1);
      expect(second.stderr()).toContain(`published in the fleet view by another budget (pid ${first.service.pid}`);
      expect(second.stderr()).toContain("--machine-name");
      // The first one's entry is untouched.
      expect((await first.client.getFleet({})).machines.map((m) => [m.machine, m.pid])).toEqual([["shared", first.service.pid]]);
    });
  });
});

describe("GetFleet on the file store", () => {
  it("is FAILED_PRECONDITION naming --store etcd, and berth budget fleet says so", async () => {
    const budget = await startBudget();
    const error = await callFailure(budget.client.getFleet({}));
    expect(error.code).toBe(Code.FailedPrecondition);
    expect(error.message).toContain("--store etcd");
    expect(error.findDetails(ErrorInfoSchema)[0]?.reason).toBe("FLEET_NEEDS_ETCD");
    const cli = await berth(budget.url, ["budget", "fleet"]);
    expect(cli.code).not.toBe(0);
    expect(cli.stderr).toContain("--store etcd");
  });

  it("refuses etcd settings without --store etcd, naming the flag", async () => {
    const { launchService } = await import("./harness.js");
    const refused = launchService("budget", { args: ["--etcd-endpoints", "http://127.0.0.1:2379"] });
    const status = await refused.exited;
    expect(status.code).toBe(1);
    expect(refused.stderr()).toContain("--etcd-endpoints is for --store etcd");
  });
});
