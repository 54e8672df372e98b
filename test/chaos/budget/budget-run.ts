/**
 * One budget chaos run's shared state and bookkeeping: its seeded random choices, the sleepers it
 * started and the survivors kept to the end, the signal that ends it, the figures it counts, and
 * the violations it finds (counted, not thrown, so the summary says everything that went wrong);
 * what a refusal may be, and what happens to a sleeper once its session is over.
 */
import { setMaxListeners } from "node:events";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, type Client, type ConnectError } from "@connectrpc/connect";
import { NeedItemKind, RefusalKind, RefusalSchema, type NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { Sleepers, type Sleeper } from "./budget-sleepers.js";

export type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;
export type BudgetClient = Client<typeof BudgetService>;

export const M = 1024 ** 2;
export const G = 1024 ** 3;
export const BUDGET_MEMORY = 4 * G;
export const BUDGET_CPU = 4;
/** The policy's longest wait: a request that asks for no limit waits this long at most. */
export const POLICY_WAIT_MS = 20_000;
/** How long any answer the service owes may take on a busy two-core machine before it counts as lost. */
export const ANSWER_MS = 60_000;
/** Kept to the end, so the final tally has something it must still count. */
const MAX_SURVIVORS = 3;
/** How long an Admit stream with a request id whose connection broke keeps its place (`--admit-resume-grace`). */
export const RESUME_GRACE_MS = 2_000;

export const durationOf = (ms: number) => {
  const whole = Math.max(0, Math.round(ms));
  return { seconds: BigInt(Math.floor(whole / 1000)), nanos: (whole % 1000) * 1_000_000 };
};

/** Resolves after `ms`, or at once when `signal` fires. */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
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

/** One part of a need, in exact units (multiples of 256M and of a quarter cpu, so sums are exact). */
interface Part {
  name: string;
  memoryBytes: number;
  cpu: number;
}

/** A need as the suite plans it: the items sent and what they add up to. */
export interface PlannedNeed {
  items: NeedItemInit[];
  starts: Part[];
  build?: Part | undefined;
  impossible: boolean;
}

export const costOf = (part: Part) => ({ case: "cost" as const, value: { memoryBytes: BigInt(part.memoryBytes), cpu: part.cpu } });

const refusalNames: Partial<Record<RefusalKind, string>> = {
  [RefusalKind.IMPOSSIBLE]: "impossible",
  [RefusalKind.QUEUE_FULL]: "queue_full",
  [RefusalKind.WAIT_EXHAUSTED]: "wait_exhausted",
};
const codeOfRefusal: Record<string, Code> = { impossible: Code.FailedPrecondition, queue_full: Code.ResourceExhausted, wait_exhausted: Code.ResourceExhausted };

/** A run against the budget at `url`, choosing by `rng`; it started at `startedAt` (performance.now()) and its clients go on for `seconds`. */
export function budgetRun(url: string, rng: () => number, startedAt: number, seconds: number) {
  const between = (low: number, high: number) => low + rng() * (high - low);
  /** 1..n, uniformly. */
  const upTo = (n: number) => 1 + Math.floor(rng() * n);

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
        const late = performance.now() - startedAt > (seconds * 1000 * 2) / 3;
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

  return {
    url,
    rng,
    between,
    upTo,
    randomNeed,
    sleepers,
    survivors,
    stop,
    background,
    stats,
    violations,
    retryAfterMs,
    violation,
    op,
    track,
    classify,
    retire,
  };
}

/** A run's state and bookkeeping, as {@link budgetRun} makes it. */
export type BudgetRun = ReturnType<typeof budgetRun>;
