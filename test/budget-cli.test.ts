/**
 * `berth admit` and `berth budget …` as a user runs them: the built binary, in a pipe (JSON-line
 * events on stderr), against a budget service on the fixture machine; and once under a
 * pseudo-terminal (`script`), where the status line is rewritten in place.
 */
import { execFileSync } from "node:child_process";
import { mkdirSync, unlinkSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, describe, expect, it, vi } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService, type AdmitRequest } from "@berth/api/berth/budget/v1/budget_service_pb";
import { EXIT } from "@berth/cli/command";
import { implement, startServer } from "@berth/shared/server/index";
import { CLI, G, berth, spawnBerth, startBudget, until, type BudgetUnderTest } from "./budget-e2e.js";
import { curl, makeTempDir, stopAll } from "./harness.js";
import { runInTerminal, screen, startInTerminal } from "./pty.js";

afterAll(stopAll);

const hold = (budget: BudgetUnderTest, memoryGb: number) =>
  budget.client.reserve({
    owner: "holder",
    need: { items: [{ kind: NeedItemKind.START, name: "h", costSource: { case: "cost", value: { memoryBytes: BigInt(memoryGb * G), cpu: 1 } } }] },
  });

const node = process.execPath;

let shared: BudgetUnderTest | undefined;
/** One service for the tests that leave it as they found it. */
async function service(): Promise<BudgetUnderTest> {
  shared ??= await startBudget();
  return shared;
}

describe("berth admit", () => {
  it("runs the command once admitted, passes its output and exit code through, and releases", async () => {
    const budget = await service();
    const result = await berth(budget.url, [
      "admit",
      "--memory",
      "1G",
      "--cpu",
      "1",
      "--",
      node,
      "-e",
      "console.log('out:' + process.env.BERTH_RESERVATION_ID); process.exit(3)",
    ]);
    expect(result.code).toBe(3);
    const events = result.stderr
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(events.map((e) => e["event"])).toEqual(["admitted", "started", "exited", "released"]);
    expect(result.stdout).toBe(`out:${events[0]!["reservation_id"]}\n`);
    expect(events[2]).toMatchObject({ code: 3, signal: null });
    const state = await budget.client.getState({});
    expect(state.reservations).toHaveLength(0);
    expect(state.running).toHaveLength(0);
  });

  it("tells admitted, started, exited, released in that order, run after run, even when the service answers started after the command is gone", async () => {
    // A budget service whose answer to `started` comes only once the command has exited and been
    // reaped by berth: what a slow or busy service does to a short command.
    const gone = (pid: number) => {
      try {
        process.kill(pid, 0);
        return false;
      } catch {
        return true;
      }
    };
    const slow = await startServer({
      name: "slow-budget",
      logger: { debug() {}, info() {}, warn() {}, error() {} },
      services: [
        implement(BudgetService, {
          async *admit(requests: AsyncIterable<AdmitRequest>) {
            for await (const request of requests) {
              const kind = request.kind;
              if (kind.case === "start") yield { kind: { case: "admitted", value: { reservation: { id: "r-1", owner: kind.value.owner } } } };
              if (kind.case === "started") {
                expect(await until(() => gone(kind.value.pid!), 10_000)).toBe(true);
                yield {
                  kind: { case: "updated", value: { reservation: { id: "r-1" }, running: { id: "run-1", name: kind.value.name, pid: kind.value.pid } } },
                };
              }
              if (kind.case === "release") return yield { kind: { case: "released", value: { reservationId: "r-1" } } };
            }
          },
          stopRunning: () => ({ stopped: true }),
        }),
      ],
    });
    try {
      for (let run = 0; run < 5; run++) {
        const result = await berth(slow.url, ["admit", "--json", "--memory", "256M", "--", "true"]);
        expect(result.code).toBe(0);
        const events = result.stderr
          .trim()
          .split("\n")
          .map((l) => JSON.parse(l) as Record<string, unknown>);
        expect(
          events.map((e) => e["event"]),
          `run ${run}`,
        ).toEqual(["admitted", "started", "exited", "released"]);
        expect(events[1]).toMatchObject({ running_id: "run-1" });
      }
    } finally {
      await slow.close(false);
    }
    // And against the real service, with a command as short as it gets.
    const budget = await service();
    for (let run = 0; run < 5; run++) {
      const result = await berth(budget.url, ["admit", "--json", "--memory", "256M", "--cpu", "0.25", "--", "true"]);
      expect(
        result.stderr
          .trim()
          .split("\n")
          .map((l) => (JSON.parse(l) as { event: string }).event),
        `run ${run}`,
      ).toEqual(["admitted", "started", "exited", "released"]);
    }
  });

  it("waits in the queue with JSON-line updates, then runs when the holder lets go", async () => {
    const budget = await service();
    const { reservation } = await hold(budget, 3);
    const admit = spawnBerth(budget.url, ["admit", "--memory", "2G", "--owner", "second", "--", node, "-e", ""]);
    const queued = await admit.event("queued");
    expect(queued).toMatchObject({ position: 1, gates: ["memory_budget"] });
    expect(String(queued["wait_for"])).toContain("memory: needs 2G");
    expect(Date.parse(String(queued["wait_expire_time"]))).toBeGreaterThan(Date.now());
    expect((await budget.client.getState({})).queue.map((q) => q.owner)).toEqual(["second"]);
    await budget.client.release({ reservationId: reservation!.id });
    expect(await admit.exited).toEqual({ code: 0, signal: null });
    expect(Number((await admit.event("admitted"))["waited_ms"])).toBeGreaterThan(0);
  });

  it("reports the command's pid as started, so the budget counts it while it runs", async () => {
    const budget = await service();
    const admit = spawnBerth(budget.url, ["admit", "--memory", "1G", "--name", "sleeper", "--", node, "-e", "setTimeout(() => {}, 1500)"]);
    const started = await admit.event("started");
    const state = await budget.client.getState({});
    expect(state.running.map((r) => [r.name, r.pid])).toEqual([["sleeper", started["pid"]]]);
    expect(state.committed?.memoryBytes).toBe(BigInt(G));
    expect(await admit.exited).toEqual({ code: 0, signal: null });
    expect((await budget.client.getState({})).running).toHaveLength(0);
  });

  it("passes SIGTERM on to the command and exits with the command's code", async () => {
    const budget = await service();
    const admit = spawnBerth(budget.url, [
      "admit",
      "--memory",
      "1G",
      "--",
      node,
      "-e",
      "process.on('SIGTERM', () => process.exit(42)); console.log('ready'); setInterval(() => {}, 1000)",
    ]);
    await admit.event("started");
    // Until the command has set its handler, SIGTERM would simply kill it.
    expect(await until(() => admit.stdout().includes("ready"))).toBe(true);
    admit.child.kill("SIGTERM");
    expect(await admit.exited).toEqual({ code: 42, signal: null });
    expect(await until(async () => (await budget.client.getState({})).reservations.length === 0)).toBe(true);
  });

  it("withdraws the request when interrupted while waiting", async () => {
    const budget = await service();
    const { reservation } = await hold(budget, 3);
    const admit = spawnBerth(budget.url, ["admit", "--memory", "2G", "--", node, "-e", ""]);
    await admit.event("queued");
    admit.child.kill("SIGINT");
    expect(await admit.exited).toEqual({ code: 130, signal: null });
    expect((await budget.client.getState({})).queue).toHaveLength(0);
    await budget.client.release({ reservationId: reservation!.id });
  });

  it("exits with a distinct code for each refusal, for an unreachable service and bad flags", async () => {
    const budget = await startBudget({ args: ["--max-queue=1"] });
    const impossible = await berth(budget.url, ["admit", "--memory", "5G", "--", "true"]);
    expect(impossible.code).toBe(EXIT.impossible);
    expect(JSON.parse(impossible.stderr)).toMatchObject({ event: "refused", kind: "impossible", settings: ["BERTH_BUDGET_MEMORY"] });

    await hold(budget, 3);
    // The queue's one place stays taken for as long as the second CLI needs to start.
    const waiting = spawnBerth(budget.url, ["admit", "--memory", "2G", "--max-wait", "60s", "--", "true"]);
    await waiting.event("queued");
    const full = await berth(budget.url, ["admit", "--memory", "2G", "--", "true"]);
    expect(full.code).toBe(EXIT.queueFull);
    expect(JSON.parse(full.stderr)).toMatchObject({ event: "refused", kind: "queue_full" });
    waiting.child.kill("SIGINT");
    expect((await waiting.exited).code).toBe(130);

    const shortWait = spawnBerth(budget.url, ["admit", "--memory", "2G", "--max-wait", "300ms", "--", "true"]);
    expect(await shortWait.event("refused")).toMatchObject({ kind: "wait_exhausted" });
    expect((await shortWait.exited).code).toBe(EXIT.timedOut);

    // --max-wait 0: refused at once, never queued (no queued event).
    const noWait = await berth(budget.url, ["admit", "--memory", "2G", "--max-wait", "0", "--", "true"]);
    expect(noWait.code).toBe(EXIT.timedOut);
    expect(
      noWait.stderr
        .trim()
        .split("\n")
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    ).toEqual([expect.objectContaining({ event: "refused", kind: "wait_exhausted", waited_ms: 0, retry_after_ms: expect.any(Number) })]);

    const unreachable = await berth("http://127.0.0.1:1", ["admit", "--memory", "1G", "--", "true"]);
    expect(unreachable.code).toBe(EXIT.unreachable);
    expect(unreachable.stderr).toContain("cannot reach the budget service");

    const usage = await berth(budget.url, ["admit", "--memory", "2 gigs", "--", "true"]);
    expect(usage.code).toBe(EXIT.usage);
    expect(usage.stderr).toContain("--memory");
    // Longer than the service takes: refused before it is asked, in the unit typed.
    const tooLong = await berth(budget.url, ["admit", "--memory", "1G", "--max-wait", "1000h", "--", "true"]);
    expect(tooLong.code).toBe(EXIT.usage);
    expect(tooLong.stderr).toContain("--max-wait: must be at most 576h, got 1000h");
    expect((await berth(budget.url, ["admit", "--memory", "1G"])).code).toBe(EXIT.usage);
  });

  it("looks CMD up before asking the service: a missing one exits 127, one that cannot run 126, in words, and nothing is queued or reserved", async () => {
    const budget = await startBudget();
    const dir = makeTempDir("berth-admit-cmd-");
    writeFileSync(path.join(dir, "not-executable.sh"), "#!/bin/sh\n", { mode: 0o644 });
    mkdirSync(path.join(dir, "a-directory"));
    // The budget is full: a need the service heard of would be refused at once (--max-wait 0: 75).
    const { reservation } = await hold(budget, 3);
    const cases = [
      { cmd: "no-such-cmd", exit: EXIT.commandNotFound, code: "command_not_found", message: "command not found: no-such-cmd" },
      { cmd: "./no-such-script.sh", exit: EXIT.commandNotFound, code: "command_not_found", message: "command not found: ./no-such-script.sh (no such file)" },
      {
        cmd: "./not-executable.sh",
        exit: EXIT.cannotRun,
        code: "cannot_run",
        message: "cannot run ./not-executable.sh: it is not executable (no execute permission)",
      },
      { cmd: "./a-directory", exit: EXIT.cannotRun, code: "cannot_run", message: "cannot run ./a-directory: it is a directory" },
    ];
    for (const { cmd, exit, code, message } of cases) {
      const result = await berth(budget.url, ["admit", "--memory", "2G", "--max-wait", "0", "--", cmd, "--flag"], { cwd: dir });
      expect(result.code, cmd).toBe(exit);
      expect(
        result.stderr
          .trim()
          .split("\n")
          .map((line) => JSON.parse(line)),
      ).toEqual([{ event: "error", code, exit, message }]);
    }
    // On a terminal: the words, named by the command.
    const tty = await runInTerminal(["admit", "--memory", "2G", "--", "no-such-cmd"], { cwd: dir, env: { BERTH_BUDGET_URL: budget.url } });
    expect(tty.code).toBe(EXIT.commandNotFound);
    expect(screen(tty.output)).toMatch(/^berth admit: command not found: no-such-cmd$/m);

    // Nothing was asked: no request queued or reserved, and no Admit stream came to the service at all.
    const state = await budget.client.getState({});
    expect(state.queue).toEqual([]);
    expect(state.reservations.map((r) => r.id)).toEqual([reservation!.id]);
    // Counted as each call's answer is written, which may be a moment after the client has it.
    const metrics = await vi.waitFor(async () => {
      const body = (await curl(budget.url, "/metrics")).body;
      expect(body).toContain(`berth_rpc_requests_total{method="/berth.budget.v1.BudgetService/GetState"`);
      return body;
    });
    expect(metrics).not.toContain(`berth_rpc_requests_total{method="/berth.budget.v1.BudgetService/Admit"`);
  });

  it("looks CMD up again once admitted: one gone meanwhile is told in words (127) and the reservation released", async () => {
    const budget = await startBudget();
    const script = path.join(makeTempDir("berth-admit-gone-"), "vanishing.sh");
    writeFileSync(script, "#!/bin/sh\n", { mode: 0o755 });
    const { reservation } = await hold(budget, 3);
    const admit = spawnBerth(budget.url, ["admit", "--memory", "2G", "--", script]);
    await admit.event("queued");
    unlinkSync(script);
    await budget.client.release({ reservationId: reservation!.id });
    expect(await admit.exited).toEqual({ code: EXIT.commandNotFound, signal: null });
    expect(admit.events.filter((e) => e.event !== "queued").map((e) => e.event)).toEqual(["admitted", "error", "released"]);
    expect(admit.events.find((e) => e.event === "error")).toEqual({
      event: "error",
      code: "command_not_found",
      exit: EXIT.commandNotFound,
      message: `command not found: ${script} (no such file)`,
    });
    expect((await budget.client.getState({})).reservations).toEqual([]);
  });

  it("keeps the command running when the service goes away, and says so", async () => {
    const budget = await startBudget();
    const admit = spawnBerth(budget.url, ["admit", "--memory", "1G", "--", node, "-e", "setTimeout(() => process.exit(7), 1500)"]);
    await admit.event("started");
    await budget.service.kill();
    expect(String((await admit.event("lost"))["message"])).toContain("keeps running");
    expect(await admit.exited).toEqual({ code: 7, signal: null });
  });

  it("lets the command end its build phase with 'berth budget build-done'", async () => {
    const budget = await service();
    const script = `
      const { execFileSync } = require("node:child_process");
      execFileSync(process.execPath, [${JSON.stringify(CLI)}, "budget", "build-done", "--json"], { stdio: "inherit" });
      setTimeout(() => {}, 1500);`;
    const admit = spawnBerth(budget.url, ["admit", "--memory", "1G", "--build-memory", "2G", "--build-cpu", "2", "--", node, "-e", script]);
    await admit.event("started");
    expect(await until(async () => (await budget.client.getState({})).committed?.memoryBytes === BigInt(G))).toBe(true);
    expect(await admit.exited).toEqual({ code: 0, signal: null });
    expect(JSON.parse(admit.stdout()).reservation.build).toEqual({});
  });

  it("counts the service's ETA down while the line stays up, with what it rests on, as 'berth budget state' shows it", async () => {
    const budget = await startBudget();
    // A leased reservation with no past runs: its lease running out is the basis.
    const { reservation } = await budget.client.reserve({
      owner: "leased",
      need: { items: [{ kind: NeedItemKind.START, name: "h", costSource: { case: "cost", value: { memoryBytes: BigInt(3 * G), cpu: 1 } } }] },
      ttl: { seconds: 60n },
    });
    const terminal = startInTerminal(["admit", "--memory", "2G", "--owner", "eta", "--", "true"], { env: { BERTH_BUDGET_URL: budget.url }, timeoutMs: 15_000 });
    await terminal.waitFor(/waiting: #1 in queue/);
    const state = JSON.parse((await berth(budget.url, ["budget", "state", "--json"])).stdout) as {
      queue: Array<{ owner: string; eta: string; etaBasis: string }>;
    };
    expect(state.queue).toMatchObject([{ owner: "eta", etaBasis: "when 'leased' ends (its lease runs out unless renewed)" }]);
    expect(Number.parseFloat(state.queue[0]!.eta)).toBeGreaterThan(50);
    // The line is drawn again every second, its ETA counted down from what the service said.
    await terminal.waitFor(/waited [2-9]s/);
    await budget.client.release({ reservationId: reservation!.id });
    const result = await terminal.exited;
    expect(result.code).toBe(0);
    // The line is cut to the terminal's width: what it waits for stays, the ETA's basis (at its end) goes.
    const etas = [...result.output.matchAll(/ETA ~(\d+)s, waited/g)].map((m) => Number(m[1]));
    expect(etas.length).toBeGreaterThan(1);
    expect(etas.at(-1)!).toBeLessThan(etas[0]!);
  });

  it("says the ETA is unknown, and why, when nothing predicts the wait", async () => {
    const budget = await service();
    // Running work with no lease, no process and no past runs: nothing says when it ends.
    const { running } = await budget.client.registerRunning({ name: "db", costSource: { case: "cost", value: { memoryBytes: BigInt(7 * G), cpu: 1 } } });
    const admit = spawnBerth(budget.url, ["admit", "--memory", "2G", "--owner", "unknown eta", "--", "true"]);
    const queued = (await admit.event("queued")) as unknown as { eta_ms?: number; eta_basis: string };
    expect(queued.eta_ms).toBeUndefined();
    expect(queued.eta_basis).toBe("unknown: it waits for 'db' (7G, 1 cpu) to end, and nothing says when: no lease, no past runs");
    await budget.client.stopRunning({ id: running!.id });
    expect((await admit.exited).code).toBe(0);
  });

  it("shows the live status line in place on a terminal", async () => {
    const budget = await service();
    const { reservation } = await hold(budget, 3);
    const terminal = startInTerminal(["admit", "--memory", "2G", "--owner", "tty", "--", "true"], { env: { BERTH_BUDGET_URL: budget.url }, timeoutMs: 15_000 });
    // Released once the terminal shows the queued line, however long the CLI took to start.
    await terminal.waitFor(/waiting: #1 in queue/);
    await budget.client.release({ reservationId: reservation!.id });
    const result = await terminal.exited;
    expect(result.code).toBe(0);
    expect(result.output).toContain("\r\x1b[Kberth admit: waiting: #1 in queue, ETA ");
    expect(result.output).toContain("memory: needs 2G");
    expect(result.output).toMatch(/berth admit: admitted after \d/);
    expect(result.output).not.toContain('"event"');
    // The status line is gone from the screen once admitted.
    expect(screen(result.output)).not.toContain("waiting: #1");
  });
});

describe("berth budget", () => {
  it("check says fits, would wait or impossible, with exit codes to match", async () => {
    const budget = await service();
    const fits = await berth(budget.url, ["budget", "check", "--memory", "1G", "--cpu", "1"]);
    expect(fits.code).toBe(0);
    expect(fits.stdout).toMatch(/^fits: 1G, 1 cpu can be admitted now/);

    const { reservation } = await hold(budget, 3);
    const wait = await berth(budget.url, ["budget", "check", "--memory", "2G"]);
    expect(wait.code).toBe(EXIT.wouldWait);
    expect(wait.stdout).toContain("would wait");
    expect(wait.stdout).toContain("held by: in flight: holder (3G, 1 cpu)");
    const json = await berth(budget.url, ["budget", "check", "--memory", "2G", "--json"]);
    expect(JSON.parse(json.stdout).verdict.waitFor[0].gate).toBe("GATE_MEMORY_BUDGET");
    await budget.client.release({ reservationId: reservation!.id });

    const never = await berth(budget.url, ["budget", "check", "--memory", "64G"]);
    expect(never.code).toBe(EXIT.impossible);
    expect(never.stdout).toContain("BERTH_BUDGET_MEMORY");
  });

  it("state shows the budget, the machine and tables of what is committed, queued, reserved and running", async () => {
    const budget = await service();
    const { reservation } = await hold(budget, 3);
    // --label is the flag's former name, kept as the same flag.
    const admit = spawnBerth(budget.url, ["admit", "--memory", "2G", "--label", "queued one", "--", "true"]);
    await admit.event("queued");
    const running = await budget.client.registerRunning({ name: "db", pid: process.pid });

    const state = await berth(budget.url, ["budget", "state"]);
    expect(state.code).toBe(0);
    expect(state.stdout).toMatch(/^budget\s+3\.5G of 4G memory, 1\.5 of 4 cpu committed/m);
    expect(state.stdout).toMatch(/^machine\s+15\.3G available of 16G/m);
    expect(state.stdout).toContain("queue (1 waiting)");
    expect(state.stdout).toMatch(/1\s+queued one\s+2G, 0\.5 cpu/);
    expect(state.stdout).toMatch(/in flight: holder\s+3G/);
    expect(state.stdout).toMatch(/db\s+512M, 0\.5 cpu\s+\d+/);

    expect(state.stdout).not.toContain("more (--all lists them)");

    const json = JSON.parse((await berth(budget.url, ["budget", "state", "--json"])).stdout);
    expect(json.queue[0].owner).toBe("queued one");
    expect([json.queueSize, json.reservationCount, json.runningCount]).toEqual([1, 1, 1]);
    expect(json.running[0].name).toBe("db");

    admit.child.kill("SIGINT");
    await admit.exited;
    await budget.client.stopRunning({ id: running.running!.id });
    await budget.client.release({ reservationId: reservation!.id });
  });

  it("state shows how many there are and a first page; --all fetches every page", async () => {
    const budget = await startBudget({ args: ["--memory=64G", "--cpu=64"] });
    for (let i = 0; i < 5; i++)
      await budget.client.reserve({
        owner: `r${i}`,
        need: { items: [{ kind: NeedItemKind.START, name: "a", costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 0 } } }] },
      });
    for (let i = 0; i < 3; i++) await budget.client.registerRunning({ name: `s${i}`, costSource: { case: "cost", value: { memoryBytes: BigInt(G), cpu: 0 } } });

    const page = await berth(budget.url, ["budget", "state", "--page-size", "2"]);
    expect(page.code).toBe(0);
    expect(page.stdout).toContain("reservations (5)");
    expect(page.stdout).toContain("  … and 3 more (--all lists them)");
    expect(page.stdout).toContain("running (3)");
    expect(page.stdout).toContain("  … and 1 more (--all lists them)");
    expect(page.stdout).toContain("committed (8)");
    expect(page.stdout).toContain("  … and 6 smaller (reservations and running work)");

    const all = await berth(budget.url, ["budget", "state", "--all", "--page-size", "2", "--json"]);
    const json = JSON.parse(all.stdout);
    expect(json.reservations.map((r: { owner: string }) => r.owner)).toEqual(["r0", "r1", "r2", "r3", "r4"]);
    expect(json.running.map((r: { name: string }) => r.name)).toEqual(["s0", "s1", "s2"]);
    expect([json.reservationsNextPageToken, json.runningNextPageToken]).toEqual([undefined, undefined]);
    const human = await berth(budget.url, ["budget", "state", "--all", "--page-size", "2"]);
    expect(human.stdout).toMatch(/^\s+r4\s/m);
    expect(human.stdout).not.toContain("more (--all lists them)");
    expect(human.stdout).toContain("  … and 6 smaller (reservations and running work)");

    expect((await berth(budget.url, ["budget", "state", "--page-size", "0"])).code).toBe(EXIT.usage);
    expect((await berth(budget.url, ["budget", "state", "--page-size", "1001"])).code).toBe(EXIT.usage);
  });

  it("limits says the leases, the longest wait and the queue's size", async () => {
    const budget = await startBudget({ args: ["--lease-ttl=45s", "--max-lease-ttl=2h", "--wait=5m", "--max-queue=7"] });
    const limits = await berth(budget.url, ["budget", "limits"]);
    expect(limits.code).toBe(0);
    expect(limits.stdout).toMatch(/^lease\s+45s unless asked, at most 2h$/m);
    expect(limits.stdout).toMatch(/^wait\s+at most 5m in the queue/m);
    expect(limits.stdout).toMatch(/^queue\s+at most 7 requests$/m);
    expect(JSON.parse((await berth(budget.url, ["budget", "limits", "--json"])).stdout)).toEqual({
      defaultTtl: "45s",
      maxTtl: "7200s",
      maxWait: "300s",
      heartbeatInterval: "5s",
      maxQueue: 7,
      maxOwnerLength: 256,
      idempotencyWindow: "3600s",
      admitResumeGrace: "15s",
    });
  });

  it("machine and watch show the samples", async () => {
    const budget = await service();
    const machine = await berth(budget.url, ["budget", "machine"]);
    expect(machine.code).toBe(0);
    expect(machine.stdout).toMatch(/^memory\s+15\.3G available of 16G \(host\)/m);
    expect(machine.stdout).toMatch(/^cpu psi\s+not available/m);
    expect(JSON.parse((await berth(budget.url, ["budget", "machine", "--json"])).stdout).machine.totalBytes).toBe(16 * G);

    const watch = spawnBerth(budget.url, ["budget", "watch", "--json"]);
    expect(
      await until(
        () =>
          watch
            .stdout()
            .split("\n")
            .filter((l) => l.startsWith("{")).length >= 2,
        5000,
      ),
    ).toBe(true);
    watch.child.kill("SIGINT");
    expect(await watch.exited).toEqual({ code: 0, signal: null });
    expect(JSON.parse(watch.stdout().split("\n")[0]!).machine.cores).toBeGreaterThan(0);
  });

  it("has help with examples, and refuses unknown subcommands and flags", async () => {
    const budget = await service();
    for (const args of [
      ["admit", "--help"],
      ["budget", "--help"],
    ]) {
      const help = await berth(budget.url, args);
      expect(help.code).toBe(0);
      expect(help.stdout).toContain("Examples:");
    }
    // A --help after `--` is the command's.
    expect((await berth(budget.url, ["admit", "--memory", "1M", "--", "sh", "-c", 'echo "$1"', "sh", "--help"])).stdout).toBe("--help\n");
    expect((await berth(budget.url, ["budget", "frobnicate"])).code).toBe(EXIT.usage);
    expect((await berth(budget.url, ["budget", "state", "--bogus"])).code).toBe(EXIT.usage);
    expect((await berth("http://127.0.0.1:1", ["budget", "state"])).code).toBe(EXIT.unreachable);
    expect(execFileSync(node, [CLI, "--help"], { encoding: "utf8" })).toMatch(/admit\s+wait for room/);
  });
});
