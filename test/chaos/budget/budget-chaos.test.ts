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
 * Knobs: BERTH_CHAOS_BUDGET_CLIENTS (200), BERTH_CHAOS_BUDGET_SECONDS (60),
 * BERTH_CHAOS_BUDGET_KILLED (3 slots of killed client processes), BERTH_CHAOS_SEED.
 */
import { spawn } from "node:child_process";
import { setMaxListeners } from "node:events";
import { readFileSync } from "node:fs";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { createInterface } from "node:readline";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { afterAll, expect, it } from "vitest";
import { NeedItemKind, RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { AdmitRequestSchema, AdmitResponse, AdmitStartSchema, GetStateResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { pushable } from "@berth/budget/server/testing";
import { formatSize } from "@berth/shared/units";
import { startBudget, until } from "../../budget-e2e.js";
import { closeClient, connectClient, cuttableProxy, onStopAll, repoPath, stopAll, type LogEntry } from "../../harness.js";
import { Sleepers, type Sleeper } from "./budget-sleepers.js";
import { seededRandom } from "../common/seeded-random.js";
import { chaosSetting, reportSuite } from "../common/summary.js";

afterAll(stopAll);

type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;
type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;
type AdmitStartInit = MessageInitShape<typeof AdmitStartSchema>;
type BudgetClient = Client<typeof BudgetService>;

const M = 1024 ** 2;
const G = 1024 ** 3;
const BUDGET_MEMORY = 4 * G;
const BUDGET_CPU = 4;
/** The policy's longest wait: a request that asks for no limit waits this long at most. */
const POLICY_WAIT_MS = 20_000;
/** How long any answer the service owes may take on a busy two-core machine before it counts as lost. */
const ANSWER_MS = 60_000;
/** Kept to the end, so the final tally has something it must still count. */
const MAX_SURVIVORS = 3;
/** How long an Admit stream with a request id whose connection broke keeps its place (`--admit-resume-grace`). */
const RESUME_GRACE_MS = 2_000;

const CLIENTS = chaosSetting("BUDGET_CLIENTS", 200);
const SECONDS = chaosSetting("BUDGET_SECONDS", 60);
const KILLED_SLOTS = chaosSetting("BUDGET_KILLED", 3);
const SEED = chaosSetting("SEED", Math.floor(Math.random() * 2 ** 31));
const KILLED_CLIENT = repoPath("test/dist/chaos/budget/budget-killed-client.js");

const rng = seededRandom(SEED);
const between = (low: number, high: number) => low + rng() * (high - low);
/** 1..n, uniformly. */
const upTo = (n: number) => 1 + Math.floor(rng() * n);

const durationOf = (ms: number) => {
  const whole = Math.max(0, Math.round(ms));
  return { seconds: BigInt(Math.floor(whole / 1000)), nanos: (whole % 1000) * 1_000_000 };
};

/** Resolves after `ms`, or at once when `signal` fires. */
function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}

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

/** One part of a need, in exact units (multiples of 256M and of a quarter cpu, so sums are exact). */
interface Part {
  name: string;
  memoryBytes: number;
  cpu: number;
}

/** A need as the suite plans it: the items sent and what they add up to. */
interface PlannedNeed {
  items: NeedItemInit[];
  starts: Part[];
  build?: Part | undefined;
  impossible: boolean;
}

const costOf = (part: Part) => ({ case: "cost" as const, value: { memoryBytes: BigInt(part.memoryBytes), cpu: part.cpu } });

/** A need of 256M to 2G: one or two starts, sometimes a build; now and then one larger than the whole budget. */
function randomNeed(label: string): PlannedNeed {
  if (rng() < 0.02) {
    const huge = { name: `${label}-huge`, memoryBytes: 5 * G, cpu: 1 };
    return { items: [{ kind: NeedItemKind.START, name: huge.name, costSource: costOf(huge) }], starts: [huge], impossible: true };
  }
  const part = (name: string): Part => ({ name, memoryBytes: upTo(4) * 256 * M, cpu: upTo(4) * 0.25 });
  const starts = [part(`${label}-a`)];
  if (rng() < 0.4) starts.push(part(`${label}-b`));
  let build: Part | undefined = rng() < 0.3 ? part(`${label}-build`) : undefined;
  const startMemory = starts.reduce((sum, s) => sum + s.memoryBytes, 0);
  if (build !== undefined && startMemory + build.memoryBytes > 2 * G) build = undefined;
  const items: NeedItemInit[] = starts.map((s) => ({ kind: NeedItemKind.START, name: s.name, costSource: costOf(s) }));
  if (build !== undefined) items.push({ kind: NeedItemKind.BUILD, name: build.name, costSource: costOf(build), wave: rng() < 0.5 ? 0 : undefined });
  return { items, starts, build, impossible: false };
}

/** An Admit stream read continuously into `responses`; waits are bounded and woken by each message. */
class AdmitCall {
  readonly responses: AdmitResponse[] = [];
  ended = false;
  failure: ConnectError | undefined;
  readonly done: Promise<void>;
  private readonly requests = pushable<AdmitRequestInit>();
  private readonly controller = new AbortController();
  private readonly wakers = new Set<() => void>();

  constructor(client: BudgetClient, start: AdmitStartInit) {
    this.requests.push({ kind: { case: "start", value: start } });
    this.done = (async () => {
      try {
        for await (const response of client.admit(this.requests, { signal: this.controller.signal })) {
          this.responses.push(response);
          this.wake();
        }
      } catch (error) {
        this.failure = ConnectError.from(error);
      } finally {
        this.ended = true;
        // Our side ends too, as a finished client's would (connect-node keeps it open otherwise).
        this.requests.end();
        this.wake();
      }
    })();
  }

  send(request: AdmitRequestInit): void {
    this.requests.push(request);
  }

  /** Closes the request side: the server sees the client finish. */
  endRequests(): void {
    this.requests.end();
  }

  /** Cancels the call (an RST_STREAM to the server). */
  cancel(): void {
    this.controller.abort();
  }

  count(kind: AdmitResponse["kind"]["case"]): number {
    return this.responses.filter((r) => r.kind.case === kind).length;
  }

  has(kind: AdmitResponse["kind"]["case"]): boolean {
    return this.responses.some((r) => r.kind.case === kind);
  }

  /** Waits until `predicate` holds, the call ends, `timeoutMs` passes or `signal` fires; returns `predicate()`. */
  async until(predicate: () => boolean, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
    const end = performance.now() + timeoutMs;
    while (!predicate() && !this.ended && !signal?.aborted) {
      const left = end - performance.now();
      if (left <= 0) break;
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          this.wakers.delete(done);
          signal?.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, left);
        this.wakers.add(done);
        signal?.addEventListener("abort", done, { once: true });
      });
    }
    return predicate();
  }

  private wake(): void {
    for (const waker of [...this.wakers]) waker();
  }
}

const refusalNames: Partial<Record<RefusalKind, string>> = {
  [RefusalKind.IMPOSSIBLE]: "impossible",
  [RefusalKind.QUEUE_FULL]: "queue_full",
  [RefusalKind.WAIT_EXHAUSTED]: "wait_exhausted",
};
const codeOfRefusal: Record<string, Code> = { impossible: Code.FailedPrecondition, queue_full: Code.ResourceExhausted, wait_exhausted: Code.ResourceExhausted };

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
  const sleepers = new Sleepers();
  const survivors = new Set<Sleeper>();
  const stop = new AbortController();
  // Every waiting client listens for the end of the run.
  setMaxListeners(0, stop.signal);
  const background = new Set<Promise<void>>();

  const stats = {
    sessions: 0,
    operations: 0,
    admitted: 0,
    /** Of which by Reserve (a lease) rather than an Admit stream. */
    admittedByReserve: 0,
    queued: 0,
    refused: { impossible: 0, queue_full: 0, wait_exhausted: 0 } as Record<string, number>,
    cancelledWhileQueued: 0,
    withdrawnWhileQueued: 0,
    cancelledWhileAdmitted: 0,
    releasedByMessage: 0,
    requestSideClosed: 0,
    leasesLeftToExpire: 0,
    leasesLapsedUnderLoad: 0,
    runningRegistered: 0,
    runningStopped: 0,
    processesKilled: 0,
    killedClients: 0,
    killedAt: {} as Record<string, number>,
    stateSamples: 0,
    /** Reserves and RegisterRunnings sent twice with one request id, both answered with the same grant. */
    repeatedRequests: 0,
    /** Admit streams with a request id whose connection was cut: resumed while queued, resumed once admitted, left to the grace. */
    resumedQueued: 0,
    resumedAdmitted: 0,
    admittedWhileAway: 0,
    abandonedToGrace: 0,
    zeroWaits: 0,
    pagedWalks: 0,
    maxCommittedMemory: 0,
    maxCommittedCpu: 0,
    maxQueue: 0,
  };
  const violations = new Map<string, string>();
  /** The retry_after of a session's refusal, by label, for its client's backoff. */
  const retryAfterMs = new Map<string, number>();
  const violation = (key: string, message = key) => {
    if (violations.has(key)) return;
    violations.set(key, message);
    if (violations.size <= 30) console.error(`budget chaos violation: ${message}`);
  };
  const op = () => stats.operations++;
  const track = (task: Promise<void>) => {
    const tracked = task.catch((error: unknown) => violation(`background: ${String(error)}`)).finally(() => background.delete(tracked));
    background.add(tracked);
  };

  /** Refusals and cancellations that are part of the game; anything else is a violation. */
  const classify = (failure: ConnectError, where: string, need: PlannedNeed, cancelled: boolean) => {
    const detail = failure.findDetails(RefusalSchema)[0];
    const kind = detail === undefined ? undefined : refusalNames[detail.kind];
    if (kind !== undefined) {
      stats.refused[kind] = (stats.refused[kind] ?? 0) + 1;
      if (detail?.retryAfter !== undefined) retryAfterMs.set(where, Number(detail.retryAfter.seconds) * 1000 + detail.retryAfter.nanos / 1e6);
      if (failure.code !== codeOfRefusal[kind]) violation(`${where}: ${kind} refusal with code ${Code[failure.code]}`);
      if ((kind === "impossible") !== need.impossible)
        violation(`${where}: ${kind} refusal of a need that is ${need.impossible ? "" : "not "}impossible: ${failure.rawMessage}`);
      return;
    }
    if (cancelled && failure.code === Code.Canceled) return;
    violation(`${where}: unexpected ${Code[failure.code]}: ${failure.rawMessage}`);
  };

  /** What happens to a sleeper once its session is over: killed, stopped then killed, or kept to the end. */
  const retire = (client: BudgetClient, sleeper: Sleeper) =>
    track(
      (async () => {
        // Survivors are picked late in the run, so that what they hold to the end leaves the budget to the rest until then.
        const late = performance.now() - startedAt > (SECONDS * 1000 * 2) / 3;
        const small = sleeper.memoryBytes <= 512 * M && sleeper.cpu <= 0.5;
        if (sleeper.registration === "confirmed" && !sleeper.leased && late && small && survivors.size < MAX_SURVIVORS && rng() < 0.5) {
          survivors.add(sleeper);
          return;
        }
        await delay(between(0, 1500));
        if (sleeper.registration === "confirmed" && rng() < 0.4) {
          sleeper.letGo = true;
          op();
          const { stopped } = await client.stopRunning({ id: sleeper.entryId! });
          if (stopped) {
            sleeper.stopped = true;
            stats.runningStopped++;
          } else if (!sleeper.leased && !sleeper.hasExited) {
            violation(`the entry of running pid ${sleeper.pid} (${sleeper.entryId}) was gone before StopRunning`);
          }
        }
        await sleepers.kill(sleeper);
        stats.processesKilled++;
      })(),
    );

  /** Admit → wait → BuildDone / Started → Release, cancel or close; or cancel while queued. */
  async function admitSession(client: BudgetClient, label: string): Promise<void> {
    stats.sessions++;
    const need = randomNeed(label);
    const maxWaitMs = rng() < 0.2 ? undefined : rng() < 0.1 ? 0 : Math.round(between(500, POLICY_WAIT_MS));
    if (maxWaitMs === 0) stats.zeroWaits++;
    const call = new AdmitCall(client, { owner: label, need: { items: need.items }, maxWait: maxWaitMs === undefined ? undefined : durationOf(maxWaitMs) });
    op();
    let cancelled = false;
    const cancel = () => {
      cancelled = true;
      call.cancel();
    };
    const admittedOrEnded = () => call.has("admitted");
    if (rng() < 0.15) {
      await call.until(admittedOrEnded, between(20, 1500), stop.signal);
      if (!call.has("admitted") && !call.ended) {
        if (rng() < 0.3) {
          // Withdrawn by a Release while queued: the server answers released and ends the stream.
          call.send({ kind: { case: "release", value: {} } });
          op();
          await call.done;
          stats.withdrawnWhileQueued++;
          if (call.has("queued")) stats.queued++;
          if (call.has("admitted")) stats.admitted++; // admitted just before the release arrived
          if (call.failure !== undefined) classify(call.failure, label, need, false);
          else if (!call.has("released")) violation(`${label}: a release while queued ended the stream without a released answer`);
          return;
        }
        cancel();
        stats.cancelledWhileQueued++;
      }
    }
    if (!cancelled) {
      const bound = (maxWaitMs ?? POLICY_WAIT_MS) + ANSWER_MS;
      await call.until(admittedOrEnded, bound, stop.signal);
      if (!call.has("admitted") && !call.ended) {
        if (!stop.signal.aborted) violation(`${label}: neither admitted nor refused within ${bound} ms`);
        cancel();
        stats.cancelledWhileQueued++;
      }
    }
    if (call.has("queued")) stats.queued++;
    if (!call.has("admitted")) {
      await call.done;
      if (call.failure !== undefined) classify(call.failure, label, need, cancelled);
      else violation(`${label}: the stream ended with neither an admission nor a refusal`);
      return;
    }

    stats.admitted++;
    if (need.impossible) violation(`${label}: a need larger than the whole budget was admitted`);
    const admitted = call.responses.find((r) => r.kind.case === "admitted")!;
    const reservation = admitted.kind.case === "admitted" ? admitted.kind.value.reservation : undefined;
    const startMemory = need.starts.reduce((sum, s) => sum + s.memoryBytes, 0);
    if (Number(reservation?.start?.memoryBytes ?? -1n) !== startMemory || Number(reservation?.build?.memoryBytes ?? -1n) !== (need.build?.memoryBytes ?? 0)) {
      violation(
        `${label}: admitted with start ${reservation?.start?.memoryBytes} / build ${reservation?.build?.memoryBytes}, asked ${startMemory} / ${need.build?.memoryBytes ?? 0}`,
      );
    }
    await delay(between(0, 150));

    const started: Sleeper[] = [];
    let updates = 0;
    /** Sends a request that the server answers with `updated`; the answer, or undefined when none came. */
    const step = async (request: AdmitRequestInit, what: string): Promise<AdmitResponse | undefined> => {
      call.send(request);
      op();
      const want = ++updates;
      if (await call.until(() => call.count("updated") >= want, ANSWER_MS)) return call.responses.filter((r) => r.kind.case === "updated")[want - 1];
      violation(`${label}: no answer to ${what}: ${call.failure === undefined ? "timed out" : `${Code[call.failure.code]} ${call.failure.rawMessage}`}`);
      return undefined;
    };
    try {
      if (need.build !== undefined && rng() < 0.7) await step({ kind: { case: "buildDone", value: {} } }, "build_done");
      for (const part of need.starts) {
        if (call.ended || rng() < 0.5) continue;
        const sleeper = sleepers.start(part.memoryBytes, part.cpu);
        started.push(sleeper);
        const leased = rng() < 0.2;
        const request: AdmitRequestInit = {
          kind: {
            case: "started",
            value: { name: part.name, costSource: costOf(part), pid: sleeper.pid, ttl: leased ? durationOf(between(300, 800)) : undefined },
          },
        };
        sleeper.registration = "pending";
        if (rng() < 0.1) {
          // Gone before the answer: whether the entry exists is the server's race to decide.
          call.send(request);
          op();
          sleeper.registration = "uncertain";
          cancel();
          stats.cancelledWhileAdmitted++;
          break;
        }
        const answer = await step(request, `started ${part.name}`);
        const entry = answer?.kind.case === "updated" ? answer.kind.value.running : undefined;
        if (entry === undefined) {
          sleeper.registration = "uncertain";
          break;
        }
        sleepers.confirm(sleeper, entry.id, leased);
        stats.runningRegistered++;
        if (entry.pid !== sleeper.pid) violation(`${label}: running entry ${entry.id} has pid ${entry.pid}, reported ${sleeper.pid}`);
      }
      if (!cancelled) {
        await delay(between(0, 150));
        const ending = rng();
        if (ending < 0.4) {
          call.send({ kind: { case: "release", value: {} } });
          op();
          if (!(await call.until(() => call.has("released"), ANSWER_MS))) violation(`${label}: no answer to release`);
          stats.releasedByMessage++;
        } else if (ending < 0.8) {
          cancel();
          stats.cancelledWhileAdmitted++;
        } else {
          call.endRequests();
          stats.requestSideClosed++;
        }
      }
      await call.done;
      if (call.failure !== undefined && !(cancelled && call.failure.code === Code.Canceled))
        violation(`${label}: stream failed: ${Code[call.failure.code]} ${call.failure.rawMessage}`);
    } finally {
      for (const sleeper of started) retire(client, sleeper);
    }
  }

  /** Reserve with a short lease → KeepAlive / ReleaseBuild / RegisterRunning → Release, or let it expire. */
  async function leaseSession(client: BudgetClient, label: string): Promise<void> {
    stats.sessions++;
    const need = randomNeed(label);
    const ttlMs = Math.round(between(600, 1500));
    const maxWaitMs = Math.round(between(1000, POLICY_WAIT_MS));
    const controller = new AbortController();
    let cancelled = false;
    const cancel = () => {
      if (cancelled) return;
      cancelled = true;
      controller.abort();
    };
    const cancelTimer = rng() < 0.1 ? setTimeout(cancel, between(20, 1500)) : undefined;
    stop.signal.addEventListener("abort", cancel);
    op();
    let reservationId: string;
    // A retried Reserve: the same request id sent twice at once; both must get the one reservation.
    const retried = rng() < 0.25;
    const request = {
      owner: label,
      need: { items: need.items },
      ttl: durationOf(ttlMs),
      maxWait: durationOf(maxWaitMs),
      requestId: retried ? `${label}-reserve` : "",
    };
    try {
      const reserve = () => client.reserve(request, { signal: controller.signal, timeoutMs: maxWaitMs + ANSWER_MS });
      const [answer, again] = await Promise.all([reserve(), retried ? (op(), reserve()) : undefined]);
      if (answer.reservation === undefined) return violation(`${label}: Reserve answered without a reservation`);
      reservationId = answer.reservation.id;
      if (again !== undefined) {
        stats.repeatedRequests++;
        if (again.reservation?.id !== reservationId)
          violation(`${label}: a Reserve repeated with its request id got reservation ${again.reservation?.id}, the first ${reservationId}`);
      }
      if ((answer.waited?.seconds ?? 0n) > 0n || (answer.waited?.nanos ?? 0) > 0) stats.queued++;
    } catch (error) {
      const failure = ConnectError.from(error);
      if (cancelled && failure.code === Code.Canceled) stats.cancelledWhileQueued++;
      classify(failure, label, need, cancelled);
      return;
    } finally {
      clearTimeout(cancelTimer);
      stop.signal.removeEventListener("abort", cancel);
    }
    stats.admitted++;
    stats.admittedByReserve++;
    if (need.impossible) violation(`${label}: a need larger than the whole budget was admitted`);

    let lapsed = false;
    let entryLeased = false;
    let sleeper: Sleeper | undefined;
    const lost = (error: unknown): boolean => {
      const failure = ConnectError.from(error);
      // Under load a renewal may come late: the lease lapses and the reservation is gone. Allowed.
      if (failure.code === Code.NotFound) {
        lapsed = true;
        return true;
      }
      violation(`${label}: unexpected ${Code[failure.code]}: ${failure.rawMessage}`);
      return false;
    };

    // Renew the reservation (and a leased entry) every quarter ttl while the session holds it.
    const holding = new AbortController();
    const renewals = (async () => {
      while (!holding.signal.aborted && !lapsed) {
        await delay(ttlMs / 4, holding.signal);
        if (holding.signal.aborted) return;
        const ids = [reservationId];
        if (entryLeased && sleeper?.entryId !== undefined) ids.push(sleeper.entryId);
        op();
        const { renewals } = await client.keepAlive({ ids });
        if (renewals[0]?.alive !== true) lapsed = true;
      }
    })();
    try {
      if (need.build !== undefined && rng() < 0.5) {
        op();
        await client.releaseBuild({ reservationId }).catch(lost);
      }
      const part = need.starts[0]!;
      if (!lapsed && rng() < 0.6) {
        sleeper = sleepers.start(part.memoryBytes, part.cpu);
        const leased = rng() < 0.4;
        sleeper.registration = "pending";
        op();
        try {
          const repeated = rng() < 0.25;
          const registration = {
            name: part.name,
            costSource: costOf(part),
            pid: sleeper.pid,
            reservationId,
            ttl: leased ? durationOf(between(500, 1000)) : undefined,
            requestId: repeated ? `${label}-running` : "",
          };
          const [answer, again] = await Promise.all([
            client.registerRunning(registration),
            repeated ? (op(), client.registerRunning(registration)) : undefined,
          ]);
          if (again !== undefined) {
            stats.repeatedRequests++;
            if (again.running?.id !== answer.running?.id)
              violation(`${label}: a RegisterRunning repeated with its request id made entry ${again.running?.id} beside ${answer.running?.id}`);
          }
          sleepers.confirm(sleeper, answer.running!.id, leased);
          entryLeased = leased;
          stats.runningRegistered++;
        } catch (error) {
          sleeper.registration = "refused";
          lost(error);
        }
      }
      await delay(between(50, 1000));
    } finally {
      holding.abort();
      await renewals.catch((error: unknown) => violation(`${label}: KeepAlive failed: ${String(error)}`));
      if (sleeper !== undefined) retire(client, sleeper);
    }
    if (rng() < 0.3) {
      stats.leasesLeftToExpire++;
      return;
    }
    op();
    const { released } = await client.release({ reservationId });
    if (!released) lapsed = true;
    if (lapsed) stats.leasesLapsedUnderLoad++;
    // Released means gone: a renewal now finds nothing to renew.
    op();
    const after = await client.keepAlive({ ids: [reservationId] });
    if (after.renewals[0]?.alive !== false) violation(`${label}: KeepAlive still finds reservation ${reservationId} alive after its release`);
  }

  /**
   * Walks one of the lists a few entries a page while everything else goes on: no entry twice, and
   * every entry there before the first page and still there after the last is listed.
   */
  async function pagerSession(client: BudgetClient, label: string): Promise<void> {
    const lists = {
      queue: async (token: string, pageSize: number) => {
        const page = await client.listQueue({ pageToken: token, pageSize });
        return { keys: page.queue.map((q) => q.owner), next: page.nextPageToken };
      },
      reservations: async (token: string, pageSize: number) => {
        const page = await client.listReservations({ pageToken: token, pageSize });
        return { keys: page.reservations.map((r) => r.id), next: page.nextPageToken };
      },
      running: async (token: string, pageSize: number) => {
        const page = await client.listRunning({ pageToken: token, pageSize });
        return { keys: page.running.map((e) => e.id), next: page.nextPageToken };
      },
    };
    const name = (["queue", "reservations", "running"] as const)[Math.floor(rng() * 3)]!;
    const list = lists[name];
    const whole = async () => {
      op();
      return new Set((await list("", 1000)).keys);
    };
    const before = await whole();
    const seen = new Map<string, number>();
    let token = "";
    do {
      op();
      const page = await list(token, upTo(4));
      for (const key of page.keys) seen.set(key, (seen.get(key) ?? 0) + 1);
      token = page.next;
      await delay(between(0, 50));
    } while (token !== "");
    const after = await whole();
    stats.pagedWalks++;
    for (const [key, times] of seen) if (times > 1) violation(`${label}: ${name} entry ${key} listed ${times} times in one walk of the pages`);
    for (const key of before)
      if (after.has(key) && !seen.has(key)) violation(`${label}: ${name} entry ${key}, there before and after the walk, was not on any page`);
  }

  /**
   * An Admit with a request id on a connection of its own, cut while queued or admitted; then
   * resumed with the same id on the client's connection (or, now and then, left to the grace).
   */
  async function resumeSession(client: BudgetClient, label: string): Promise<void> {
    stats.sessions++;
    let need = randomNeed(label);
    while (need.impossible) need = randomNeed(label);
    const start: AdmitStartInit = { owner: label, need: { items: need.items }, requestId: `${label}-admit`, maxWait: durationOf(POLICY_WAIT_MS) };
    const proxy = await cuttableProxy(url);
    const own = connectClient(BudgetService, proxy.url, { protocol: "grpc", defaultTimeoutMs: 120_000 });
    try {
      const first = new AdmitCall(own, start);
      op();
      // Cut while queued, or once admitted (as long as the queue takes, within bounds).
      const untilAdmitted = rng() < 0.5;
      await first.until(
        () => first.has("admitted") || (!untilAdmitted && first.has("queued")),
        untilAdmitted ? POLICY_WAIT_MS : between(100, 3000),
        stop.signal,
      );
      if (first.ended) {
        if (first.failure !== undefined) classify(first.failure, label, need, false);
        return;
      }
      const firstAdmitted = first.responses.find((r) => r.kind.case === "admitted");
      const held = firstAdmitted?.kind.case === "admitted" ? firstAdmitted.kind.value.reservation?.id : undefined;
      if (first.has("queued")) stats.queued++;
      proxy.cut();
      await first.done;
      if (rng() < 0.15) {
        // Left to the grace: the end of the run checks that nothing of it is held.
        stats.abandonedToGrace++;
        return;
      }
      await delay(between(0, RESUME_GRACE_MS / 2));
      const resumed = new AdmitCall(client, start);
      op();
      const bound = POLICY_WAIT_MS + ANSWER_MS;
      await resumed.until(() => resumed.has("admitted"), bound, stop.signal);
      if (!resumed.has("admitted")) {
        if (!resumed.ended) resumed.cancel();
        await resumed.done;
        // A resume that found the admission gone (refused meanwhile) queues anew or is refused: both fine.
        if (resumed.failure !== undefined && !(stop.signal.aborted && resumed.failure.code === Code.Canceled))
          classify(resumed.failure, label, need, stop.signal.aborted);
        return;
      }
      const admitted = resumed.responses.find((r) => r.kind.case === "admitted");
      const reservationId = admitted?.kind.case === "admitted" ? admitted.kind.value.reservation?.id : undefined;
      if (held !== undefined) {
        stats.resumedAdmitted++;
        if (reservationId !== held) violation(`${label}: resumed to reservation ${reservationId}, it held ${held}`);
      } else {
        stats.resumedQueued++;
        if (resumed.responses[0]?.kind.case === "admitted") stats.admittedWhileAway++;
      }
      stats.admitted++;
      op();
      const mine = (await client.listReservations({ pageSize: 1000 })).reservations.filter((r) => r.owner === label);
      if (mine.length > 1 || (mine.length === 1 && mine[0]!.id !== reservationId))
        violation(`${label}: ${mine.length} reservations (${mine.map((r) => r.id).join(", ")}) for one request id; the stream holds ${reservationId}`);
      if (resumed.has("released")) {
        // The resume came after the grace (a loaded machine): the service answered the first answer and its end.
        return;
      }
      await delay(between(0, 300));
      resumed.send({ kind: { case: "release", value: {} } });
      op();
      if (!(await resumed.until(() => resumed.has("released"), ANSWER_MS))) violation(`${label}: no answer to release after a resume`);
      stats.releasedByMessage++;
      await resumed.done;
    } finally {
      closeClient(own);
      await proxy.close();
    }
  }

  /** The unary reads: a verdict and the machine. */
  async function lookSession(client: BudgetClient, label: string): Promise<void> {
    const need = randomNeed(label);
    op();
    const { verdict } = await client.check({ need: { items: need.items } });
    if (need.impossible !== (verdict?.impossible !== undefined))
      violation(`${label}: Check's impossible is ${verdict?.impossible} for a need that is ${need.impossible ? "" : "not "}impossible`);
    op();
    await client.getMachine({});
  }

  async function worker(index: number): Promise<void> {
    const client = clients[index % clients.length]!;
    // Clients arrive over the first seconds, not all in one burst.
    await delay(between(0, 5000), stop.signal);
    for (let n = 0; !stop.signal.aborted; n++) {
      const label = `c${index}-${n}`;
      try {
        const choice = rng();
        if (choice < 0.6) await admitSession(client, label);
        else if (choice < 0.66) await resumeSession(client, label);
        else if (choice < 0.91) await leaseSession(client, label);
        else if (choice < 0.95) await pagerSession(client, label);
        else await lookSession(client, label);
      } catch (error) {
        violation(`${label}: ${error instanceof Error ? error.message : String(error)}`);
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
  if (!drained) violation(`the clients did not finish within ${2 * ANSWER_MS} ms of the end`);
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
