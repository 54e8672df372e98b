/**
 * Budget chaos (docs/architecture.md, "Tests and benchmarks"): a budget service as a real process on a fixture machine (a quiet
 * 16G box behind `--proc-root`, so no verdict depends on this machine's load) with a 4G / 4 cpu
 * budget, and many clients doing everything a client can, at random, for a bounded time:
 *
 * - Admit streams (Connect gRPC): wait in the queue, then BuildDone, Started{name, cost, pid} of
 *   `sleep` children, and an end by Release, by cancelling the stream, or by closing the request
 *   side; some cancel or withdraw (Release) while still queued, some ask the impossible; the queue
 *   holds at most 30, so full queues and exhausted waits are refused (clients back off by the
 *   refusal's retry_after);
 * - leased reservations (unary Reserve / KeepAlive / ReleaseBuild / RegisterRunning / Release) with
 *   short ttls, some released, some left to expire, running entries with and without leases; some
 *   Reserves and RegisterRunnings carry a request id and are sent twice at once (a retry), some
 *   Admits ask not to wait at all (max_wait 0);
 * - child processes holding an Admit stream (reported as running under their own pid) killed with
 *   SIGKILL while queued, admitted or started;
 * - the `sleep` children are killed or stopped (StopRunning) at random; a few are kept to the end;
 * - Admit streams with a request id on a connection of their own, cut under them (the TCP
 *   connection destroyed, as a network drops it) while queued or admitted, then resumed on another
 *   connection with the same id within the resume grace (2 s here), or abandoned to it.
 *
 * Meanwhile GetState is sampled continuously; a sample must never show more committed than the
 * budget (memory or cpu), committed must equal what the reservations and running entries add up
 * to, queue positions must run 1..n, and every acknowledged, unleased entry of a process that still
 * runs and was never stopped must be in the tally. A pager walks ListQueue, ListReservations and
 * ListRunning a few entries at a time: no entry may appear twice, and every one there before the
 * first page and after the last must appear. A request id repeated must answer the same
 * reservation or entry, never a second one. A resumed Admit must be told the reservation it had
 * (when it had one) and hold one reservation at most; an abandoned one must be let go by the
 * grace. At the end (every client gone, every lease
 * expired) the queue and the reservations are empty and the tally holds exactly the survivors;
 * once they are killed it is empty and nothing is committed. Violations are counted, not thrown,
 * so the summary says everything that went wrong.
 *
 * The clients' sessions are budget-admit-sessions.ts (Admit streams) and budget-lease-sessions.ts
 * (leases, pages, reads); the run's bookkeeping and its violations are budget-run.ts's.
 *
 * Knobs: BERTH_CHAOS_BUDGET_CLIENTS (200), BERTH_CHAOS_BUDGET_SECONDS (60),
 * BERTH_CHAOS_BUDGET_KILLED (3 slots of killed client processes), BERTH_CHAOS_SEED.
 */
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { createInterface } from "node:readline";
import { afterAll, expect, it } from "vitest";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { GetStateResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { formatSize } from "@berth/shared/units";
import { startBudget, until } from "../../budget-e2e.js";
import { connectClient, onStopAll, repoPath, stopAll, type LogEntry } from "../../harness.js";
import { seededRandom } from "../common/seeded-random.js";
import { chaosSetting, reportSuite } from "../common/summary.js";
import { admitSession, resumeSession } from "./budget-admit-sessions.js";
import { leaseSession, lookSession, pagerSession } from "./budget-lease-sessions.js";
import { ANSWER_MS, BUDGET_CPU, BUDGET_MEMORY, budgetRun, delay, M, POLICY_WAIT_MS, RESUME_GRACE_MS } from "./budget-run.js";

afterAll(stopAll);

const CLIENTS = chaosSetting("BUDGET_CLIENTS", 200);
const SECONDS = chaosSetting("BUDGET_SECONDS", 60);
const KILLED_SLOTS = chaosSetting("BUDGET_KILLED", 3);

/** A client's sessions, each drawn with one random number: the first kind whose bound is above it. */
const SESSION_KINDS = [
  { below: 0.6, kind: "admit", session: admitSession },
  { below: 0.66, kind: "resume", session: resumeSession },
  { below: 0.91, kind: "lease", session: leaseSession },
  { below: 0.95, kind: "pager", session: pagerSession },
  { below: Infinity, kind: "look", session: lookSession },
] as const;

const SEED = chaosSetting("SEED", Math.floor(Math.random() * 2 ** 31));
const KILLED_CLIENT = repoPath("test/dist/chaos/budget/budget-killed-client.js");

const rng = seededRandom(SEED);

/** p50 / p99 / max of a list of milliseconds, rounded. */
function percentiles(values: number[]): { p50: number; p99: number; max: number } {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (q: number) => Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0);
  return { p50: at(0.5), p99: at(0.99), max: Math.round(sorted.at(-1) ?? 0) };
}

/** The cpu time a process has used so far (utime + stime of /proc/PID/stat), in ms; undefined when unreadable. */
function cpuMsOf(pid: number): number | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    // utime and stime are fields 14 and 15, in clock ticks (100 a second on Linux).
    return (Number(fields[11]) + Number(fields[12])) * 10;
  } catch {
    return undefined;
  }
}

it(`budget chaos: ${CLIENTS} clients for ${SECONDS} s against a 4G / 4 cpu budget`, async () => {
  const startedAt = performance.now();
  const testCpuAtStart = process.cpuUsage();
  const loopDelay = monitorEventLoopDelay({ resolution: 20 });
  loopDelay.enable();
  const budget = await startBudget({
    args: ["--max-queue=30", `--wait=${POLICY_WAIT_MS / 1000}s`, "--heartbeat=1s", "--lease-ttl=1s", `--admit-resume-grace=${RESUME_GRACE_MS / 1000}s`],
  });
  const { url } = budget;
  // A few connections, as separate programs would have; streams of one client share one.
  const clients = Array.from({ length: 4 }, () => connectClient(BudgetService, url, { protocol: "grpc", defaultTimeoutMs: 120_000 }));
  const stateClient = connectClient(BudgetService, url, { protocol: "grpc", defaultTimeoutMs: 60_000 });
  const run = budgetRun(url, rng, startedAt, SECONDS);
  const { between, upTo, sleepers, survivors, stop, background, stats, violations, retryAfterMs, violation, op } = run;

  /** Each client's session under way (its label and kind): what a run that does not drain names. */
  const inFlight = new Map<string, string>();

  async function worker(index: number): Promise<void> {
    const client = clients[index % clients.length]!;
    // Clients arrive over the first seconds, not all in one burst.
    await delay(between(0, 5000), stop.signal);
    for (let n = 0; !stop.signal.aborted; n++) {
      const label = `c${index}-${n}`;
      try {
        const choice = rng();
        const { kind, session } = SESSION_KINDS.find((k) => choice < k.below)!;
        inFlight.set(label, kind);
        await session(run, client, label);
      } catch (error) {
        violation(`${label}: ${error instanceof Error ? error.message : String(error)}`);
      } finally {
        inFlight.delete(label);
      }
      // A refused client waits as it was told to (capped), then thinks a while before its next session.
      const backoff = Math.min(retryAfterMs.get(label) ?? 0, 10_000);
      retryAfterMs.delete(label);
      await delay(backoff + between(500, 6000), stop.signal);
    }
  }

  /** Child processes holding an Admit stream, killed with SIGKILL while queued, admitted or started. */
  async function killedClients(slot: number): Promise<void> {
    for (let n = 0; !stop.signal.aborted; n++) {
      const label = `killed-${slot}-${n}`;
      inFlight.set(label, "killed client");
      const memory = upTo(8) * 256 * M;
      const child = spawn(process.execPath, [KILLED_CLIENT, url, label, String(memory), String(upTo(4) * 0.25)], { stdio: ["pipe", "pipe", "inherit"] });
      const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
      const forget = onStopAll(() => void child.kill("SIGKILL"));
      let stage = "connecting";
      const reached = new AbortController();
      const target = ["queued", "admitted", "started"][Math.floor(rng() * 3)]!;
      createInterface({ input: child.stdout! }).on("line", (line) => {
        try {
          const event = (JSON.parse(line) as { event: string }).event;
          stage = event === "ended" ? stage : event;
          if (event === target || event === "refused" || (target === "queued" && event === "admitted")) reached.abort();
        } catch {
          // not an event
        }
      });
      // A client far back in the queue may never get there: it is killed anyway, where it stands.
      await delay(between(3000, 25_000), AbortSignal.any([reached.signal, stop.signal]));
      await delay(between(0, 500), stop.signal);
      child.kill("SIGKILL");
      await exited;
      forget();
      inFlight.delete(label);
      op();
      stats.killedClients++;
      stats.killedAt[stage] = (stats.killedAt[stage] ?? 0) + 1;
    }
  }

  /** Samples GetState until told to stop; every sample must keep the promises. */
  let sampling = true;
  const stateLatencies: number[] = [];
  const checkState = (state: GetStateResponse, sentAt: number, final = false) => {
    const memory = Number(state.committed?.memoryBytes ?? 0n);
    const cpu = state.committed?.cpu ?? 0;
    stats.maxCommittedMemory = Math.max(stats.maxCommittedMemory, memory);
    stats.maxCommittedCpu = Math.max(stats.maxCommittedCpu, cpu);
    stats.maxQueue = Math.max(stats.maxQueue, state.queueSize);
    // The sample asks for pages of 1000: the whole of every list, which the checks below need.
    if (state.queue.length !== state.queueSize || state.reservations.length !== state.reservationCount || state.running.length !== state.runningCount) {
      violation(
        `counts ${stats.stateSamples}`,
        `GetState's counts ${state.queueSize}/${state.reservationCount}/${state.runningCount} differ from its lists ${state.queue.length}/${state.reservations.length}/${state.running.length}`,
      );
    }
    if ((state.committed?.itemCount ?? 0) !== (state.committed?.items.length ?? 0))
      violation(`item count ${stats.stateSamples}`, `committed item_count ${state.committed?.itemCount} for ${state.committed?.items.length} items`);
    const holders = () => (state.committed?.items ?? []).map((i) => `${i.what} ${formatSize(Number(i.memoryBytes))}/${i.cpu}`).join(", ");
    if (memory > BUDGET_MEMORY)
      violation(
        `over budget (memory) ${stats.stateSamples}`,
        `committed memory ${formatSize(memory)} over the ${formatSize(BUDGET_MEMORY)} budget: ${holders()}`,
      );
    if (cpu > BUDGET_CPU + 1e-9) violation(`over budget (cpu) ${stats.stateSamples}`, `committed cpu ${cpu} over the ${BUDGET_CPU} cpu budget: ${holders()}`);
    let sumMemory = 0;
    let sumCpu = 0;
    for (const r of state.reservations) {
      sumMemory += Number(r.start?.memoryBytes ?? 0n) + Number(r.build?.memoryBytes ?? 0n);
      sumCpu += (r.start?.cpu ?? 0) + (r.build?.cpu ?? 0);
    }
    for (const e of state.running) {
      sumMemory += Number(e.cost?.memoryBytes ?? 0n);
      sumCpu += e.cost?.cpu ?? 0;
    }
    const itemsMemory = (state.committed?.items ?? []).reduce((sum, i) => sum + Number(i.memoryBytes), 0);
    if (sumMemory !== memory || Math.abs(sumCpu - cpu) > 1e-9 || itemsMemory !== memory) {
      violation(
        `inconsistent committed ${stats.stateSamples}`,
        `committed ${memory}/${cpu} but reservations + running add up to ${sumMemory}/${sumCpu} and the items to ${itemsMemory}`,
      );
    }
    state.queue.forEach((entry, index) => {
      if (entry.position !== index + 1)
        violation(`queue positions ${stats.stateSamples}`, `queue entry ${entry.owner} at index ${index} has position ${entry.position}`);
    });
    const counted = new Set(state.running.map((e) => e.id));
    for (const sleeper of sleepers.mustBeCounted(sentAt)) {
      if (!counted.has(sleeper.entryId!))
        violation(
          `lost entry ${sleeper.entryId}`,
          `${final ? "at the end: " : ""}the entry of pid ${sleeper.pid} (${sleeper.entryId}), still running and never stopped, is missing from the tally`,
        );
    }
  };
  const sampler = (async () => {
    while (sampling) {
      const sentAt = performance.now();
      op();
      try {
        const state = await stateClient.getState({ pageSize: 1000 });
        stateLatencies.push(performance.now() - sentAt);
        stats.stateSamples++;
        checkState(state, sentAt);
      } catch (error) {
        violation(`GetState failed: ${String(error)}`);
      }
      await delay(50);
    }
  })();

  // The run.
  const workers = Array.from({ length: CLIENTS }, (_, i) => worker(i));
  const killers = Array.from({ length: KILLED_SLOTS }, (_, i) => killedClients(i));
  await delay(SECONDS * 1000);
  const runMs = performance.now() - startedAt;
  stop.abort();
  const drained = await Promise.race([Promise.all([...workers, ...killers]).then(() => true), delay(2 * ANSWER_MS).then(() => false)]);
  if (!drained) {
    const left = [...inFlight].map(([label, kind]) => `${label} (${kind})`);
    violation(`the clients did not finish within ${2 * ANSWER_MS} ms of the end; still in a session: ${left.slice(0, 10).join(", ")}`);
  }
  while (background.size > 0) await Promise.race([Promise.all([...background]), delay(ANSWER_MS)]);
  sampling = false;
  await sampler;

  // Every client is gone. Kill every process but the survivors, wait out the leases, and the
  // service must hold exactly the survivors' entries and nothing else.
  for (const sleeper of sleepers.all) if (!survivors.has(sleeper) && !sleeper.hasExited) await sleepers.kill(sleeper);
  const expected = new Map([...survivors].map((s) => [s.entryId!, s]));
  let final: GetStateResponse | undefined;
  const settled = await until(async () => {
    final = await stateClient.getState({ pageSize: 1000 });
    return (
      final.queue.length === 0 && final.reservations.length === 0 && final.running.length === expected.size && final.running.every((e) => expected.has(e.id))
    );
  }, 20_000);
  if (!settled && final !== undefined) {
    for (const q of final.queue) violation(`at the end: ${q.owner} is still queued`);
    for (const r of final.reservations)
      violation(
        `at the end: reservation ${r.owner} (${r.id}) is still held: ${formatSize(Number(r.start?.memoryBytes ?? 0n))} start, ${formatSize(Number(r.build?.memoryBytes ?? 0n))} build`,
      );
    for (const e of final.running) {
      if (expected.has(e.id)) continue;
      const known = e.pid === undefined ? undefined : sleepers.all.find((s) => s.pid === e.pid);
      violation(
        `at the end: running entry ${e.name} (${e.id}, pid ${e.pid}) is still counted; its process ${known === undefined ? "is not a sleeper" : known.hasExited ? "has exited" : "still runs"}`,
      );
    }
  }
  if (final !== undefined) {
    checkState(final, performance.now(), true);
    const survivorMemory = [...survivors].reduce((sum, s) => sum + s.memoryBytes, 0);
    const survivorCpu = [...survivors].reduce((sum, s) => sum + s.cpu, 0);
    if (Number(final.committed?.memoryBytes ?? 0n) !== survivorMemory || Math.abs((final.committed?.cpu ?? 0) - survivorCpu) > 1e-9) {
      violation(`at the end: committed ${final.committed?.memoryBytes}/${final.committed?.cpu}, the survivors add up to ${survivorMemory}/${survivorCpu}`);
    }
  }
  // Then the survivors end, and nothing is left.
  for (const sleeper of survivors) await sleepers.kill(sleeper);
  let last: GetStateResponse | undefined;
  const empty = await until(async () => {
    last = await stateClient.getState({ pageSize: 1000 });
    return last.running.length === 0 && last.reservations.length === 0 && (last.committed?.memoryBytes ?? 1n) === 0n && (last.committed?.cpu ?? 1) === 0;
  }, 10_000);
  if (!empty) {
    violation(
      `at the end, once the survivors were killed: ${last?.running.length} running entries, ${last?.reservations.length} reservations and ${formatSize(Number(last?.committed?.memoryBytes ?? 0n))} / ${last?.committed?.cpu} cpu committed remain`,
    );
  }

  const serviceCpuMs = cpuMsOf(budget.service.pid);
  const testCpu = process.cpuUsage(testCpuAtStart);
  loopDelay.disable();
  const stopped = await budget.service.stop();
  if (stopped.code !== 0) violation(`the service exited with ${JSON.stringify(stopped)} on SIGTERM`);
  // What the service logged per RPC, for the summary. Not a verdict: a stream the client cancels
  // while the server writes to it is logged as unknown (the write fails), and one the client resets
  // with INTERNAL_ERROR as internal; no client ever receives either.
  const serverCodes: Record<string, number> = {};
  for (const entry of budget.service.entries() as LogEntry[]) {
    if ((entry.level ?? 0) >= 50) violation(`server error log: ${entry.msg} ${JSON.stringify(entry.err ?? "")}`);
    if (entry.msg === "rpc" && typeof entry.code === "string") {
      serverCodes[entry.code] = (serverCodes[entry.code] ?? 0) + 1;
    }
  }

  const summary = {
    suite: "budget",
    rounds: stats.sessions + stats.killedClients,
    operations: stats.operations,
    violations: violations.size,
    seed: SEED,
    clients: CLIENTS,
    budget: `${formatSize(BUDGET_MEMORY)} / ${BUDGET_CPU} cpu`,
    admitted: stats.admitted,
    admittedByReserve: stats.admittedByReserve,
    queued: stats.queued,
    refused: stats.refused,
    cancelledWhileQueued: stats.cancelledWhileQueued,
    withdrawnWhileQueued: stats.withdrawnWhileQueued,
    cancelledWhileAdmitted: stats.cancelledWhileAdmitted,
    releasedByMessage: stats.releasedByMessage,
    requestSideClosed: stats.requestSideClosed,
    leasesLeftToExpire: stats.leasesLeftToExpire,
    leasesLapsedUnderLoad: stats.leasesLapsedUnderLoad,
    runningRegistered: stats.runningRegistered,
    runningStopped: stats.runningStopped,
    processesKilled: stats.processesKilled,
    survivors: survivors.size,
    killedClients: stats.killedClients,
    killedAt: stats.killedAt,
    stateSamples: stats.stateSamples,
    repeatedRequests: stats.repeatedRequests,
    resumedQueued: stats.resumedQueued,
    resumedAdmitted: stats.resumedAdmitted,
    admittedWhileAway: stats.admittedWhileAway,
    abandonedToGrace: stats.abandonedToGrace,
    zeroWaits: stats.zeroWaits,
    pagedWalks: stats.pagedWalks,
    getStateMs: percentiles(stateLatencies),
    maxCommitted: `${formatSize(stats.maxCommittedMemory)} / ${stats.maxCommittedCpu} cpu`,
    maxQueue: stats.maxQueue,
    serverCodes,
    serviceCpuMs,
    testCpuMs: Math.round((testCpu.user + testCpu.system) / 1000),
    testLoopDelayMs: { p50: Math.round(loopDelay.percentile(50) / 1e6), p99: Math.round(loopDelay.percentile(99) / 1e6), max: Math.round(loopDelay.max / 1e6) },
    runMs: Math.round(runMs),
    durationMs: Math.round(performance.now() - startedAt),
  };
  reportSuite(summary);
  if (violations.size > 0) console.error([...violations.values()].slice(0, 50).join("\n"));
  expect(violations.size).toBe(0);
});
