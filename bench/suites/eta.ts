/**
 * How right the budget's ETAs are: a workload of queued builds with known durations replayed
 * in-process on a manual clock, and at every whole second, for every queued request, the ETA the
 * service shows (`state().queue[i].etaMs`, none when unknown) beside the seed's rule for the same
 * request (position × the moving hold time − waited, at least 1 s: `etaOf`), each against the true
 * wait left, known once the request is admitted.
 *
 * The workload: a few job names, each with its usual duration and memory ("npm run build" 40 s 4G,
 * "npm test" 90 s 3G, "lint" 10 s 2G, "tsc -b" 25 s 2G), every run's duration drawn around its
 * name's with a relative spread (`--spread`, normal, at least 0.3 × the usual), arriving at random
 * (Poisson) at a rate that keeps the 8G budget `--load` busy, so that a queue forms and drains. Each
 * job is admitted (`budget.admit`, no lease), holds for its duration and is released: the service
 * learns each name's run time from the releases. Seeded: the same `--seed` replays the same run.
 *
 * Two scenarios on the same arrivals and durations:
 * - `learnt`: every job runs under its name;
 * - `strangers`: a share of the jobs (`--strangers`, 0.2) runs under a name of its own, seen once,
 *   with no lease: nothing predicts its end, so a wait that needs what it holds is shown "unknown".
 *
 * The first `--warmup` jobs (40) are the warm-up: the service has not learnt the names yet (the
 * first runs of each name have no history). Their samples are counted apart; the figures are over
 * the jobs after them. One JSON line per figure, each with the run's settings:
 * - `workload`: how long the replay ran, how many jobs waited and for how long, the queue's length;
 * - `mean absolute error`: berth's ETA over the samples where it gave one, the seed's rule over
 *   the same samples and over all, and their ratio (goal: berth ≤ half the seed's), with the mean
 *   signed error (positive: the ETA was longer than the wait turned out, pessimistic);
 * - `error by what has no known end`: the same split by what the service could not see end when
 *   the sample was taken: a holder that had run past its usual time, a holder or a request ahead
 *   whose name had no past runs, or neither (the service's replay keeps their memory held);
 * - `error percentiles`: p50/p90 of the absolute errors, berth's and the seed's on the same samples;
 * - `shown`: the share of samples shown an ETA, and of requests shown one at every sample / at one;
 * - `unknowns`: how many samples were shown none, by the service's reason (names and sizes left
 *   out), and what the wait was for;
 * - `warm-up`: the same for the warm-up's samples;
 * - `worst`: the `--worst` (3) samples with berth's largest errors, one per request: what it was
 *   told and what happened, with what held the budget then (how long each had run, its usual
 *   time as the service knew it, and how long it still ran).
 *
 * `npm run bench -- eta [--jobs=400] [--seed=1] [--warmup=40] [--load=0.85] [--spread=0.2]
 * [--strangers=0.2] [--worst=3]`
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { createBudget, defaultPolicy, etaOf, ManualSampler, RunTimes, type Need, type Reservation } from "@berth/budget";
import { ManualClock } from "@berth/shared/clock";
import { seededRandom } from "@berth/shared/testing/seeded-random";
import { emit, percentiles, ratio } from "../lib/report.js";

const G = 1024 ** 3;
const BUDGET_GB = 8;

interface Settings {
  jobs: number;
  seed: number;
  warmup: number;
  load: number;
  spread: number;
  strangers: number;
  worst: number;
}

const DEFAULTS: Settings = { jobs: 400, seed: 1, warmup: 40, load: 0.85, spread: 0.2, strangers: 0.2, worst: 3 };

/** A kind of job: its name, usual duration and memory, and how often it comes (relative). */
interface JobKind {
  name: string;
  usualMs: number;
  memoryGb: number;
  weight: number;
}

const KINDS: readonly JobKind[] = [
  { name: "npm run build", usualMs: 40_000, memoryGb: 4, weight: 3 },
  { name: "npm test", usualMs: 90_000, memoryGb: 3, weight: 2 },
  { name: "lint", usualMs: 10_000, memoryGb: 2, weight: 3 },
  { name: "tsc -b", usualMs: 25_000, memoryGb: 2, weight: 2 },
];

type Scenario = "learnt" | "strangers";

interface Job {
  index: number;
  kind: JobKind;
  /** When it asks, in ms from the replay's start. */
  arrivesAtMs: number;
  durationMs: number;
  /** Drawn for every job, used by the `strangers` scenario: the job runs under a name of its own. */
  stranger: boolean;
}

/** Something holding the budget at a sample's time, as `worst` shows it. */
interface Holder {
  name: string;
  memory_gb: number;
  ran_ms: number;
  /** The name's usual time as the service knew it then (undefined: no past runs). */
  usual_ms: number | undefined;
  /** How long it still ran. */
  left_ms: number;
}

/** One queued request at one whole second. */
interface Sample {
  job: number;
  /** Monotonic ms. */
  at: number;
  position: number;
  etaMs: number | undefined;
  basis: string;
  seedMs: number;
  /**
   * What the service's replay could not see end when this sample was taken (no lease anywhere): a
   * holder that had run past its name's usual time, else a holder or a request ahead of it whose
   * name had no past runs, else nothing.
   */
  endless: "overran" | "no past runs" | "none";
  /** What the unknown wait was for, as the bench knows it (for `unknowns`). */
  unknownFor?: string | undefined;
}

interface Replay {
  samples: Sample[];
  /** Each job's admission (monotonic ms), by index. */
  admittedAt: number[];
  /** Each job's arrival (monotonic ms), by index. */
  arrivedAt: number[];
  /** Whether the job's name had a clean run when it arrived, by index. */
  hadHistory: boolean[];
  /** What held the budget at each sample's time (for `worst`). */
  holdersAt: Map<number, Holder[]>;
  /** The replay's start (monotonic ms). */
  start: number;
  replayMs: number;
}

/** Runs the suite. */
export async function run(args: string[] = []): Promise<void> {
  const settings = { ...DEFAULTS };
  for (const arg of args) {
    const [name, value] = arg.replace(/^--/, "").split("=", 2) as [string, string | undefined];
    const n = Number(value);
    if (!(name in DEFAULTS))
      throw new Error(
        `unknown flag ${arg}; flags: ${Object.keys(DEFAULTS)
          .map((key) => `--${key}=N`)
          .join(" ")}`,
      );
    const whole = name === "jobs" || name === "seed" || name === "warmup" || name === "worst";
    if (!Number.isFinite(n) || n < 0 || (whole && !Number.isInteger(n))) throw new Error(`--${name} needs a ${whole ? "whole " : ""}number ≥ 0`);
    settings[name as keyof Settings] = n;
  }
  if (settings.warmup >= settings.jobs) throw new Error(`--warmup (${settings.warmup}) must be less than --jobs (${settings.jobs})`);
  if (!(settings.load > 0)) throw new Error("--load needs a positive number");
  const jobs = workload(settings);
  for (const scenario of ["learnt", "strangers"] as const) {
    const replayed = await replay(jobs, scenario);
    report(scenario, jobs, replayed, settings);
  }
}

/** The jobs: kinds by weight, durations around each kind's usual, Poisson arrivals at `load`. */
function workload(settings: Settings): Job[] {
  const random = seededRandom(settings.seed);
  const totalWeight = KINDS.reduce((sum, kind) => sum + kind.weight, 0);
  // What a job holds on average, in GB·ms: the budget is `load` busy at one job every `gapMs`.
  const heldGbMs = KINDS.reduce((sum, kind) => sum + (kind.weight / totalWeight) * kind.memoryGb * kind.usualMs, 0);
  const gapMs = heldGbMs / (BUDGET_GB * settings.load);
  const jobs: Job[] = [];
  let at = 0;
  for (let index = 0; index < settings.jobs; index++) {
    at += Math.round(-Math.log(1 - random()) * gapMs);
    let pick = random() * totalWeight;
    const kind = KINDS.find((k) => (pick -= k.weight) < 0) ?? KINDS[KINDS.length - 1]!;
    // Box–Muller: one normal draw from two uniform ones.
    const normal = Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
    const durationMs = Math.round(kind.usualMs * Math.max(0.3, 1 + settings.spread * normal));
    jobs.push({ index, kind, arrivesAtMs: at, durationMs, stranger: random() < settings.strangers });
  }
  return jobs;
}

const nameOf = (job: Job, scenario: Scenario) => (scenario === "strangers" && job.stranger ? `./scripts/one-off-${job.index}.sh` : job.kind.name);

/**
 * Replays the jobs on a budget of its own (a manual clock, a machine that never holds the queue, a
 * state directory in a temporary one): every event at its ms, a sample at every whole second.
 */
async function replay(jobs: readonly Job[], scenario: Scenario): Promise<Replay> {
  const stateDir = mkdtempSync(path.join(tmpdir(), "berth-bench-eta-"));
  const clock = new ManualClock();
  // Room on the machine and no load: only the budget's own gates hold the queue.
  const sampler = new ManualSampler({ availableBytes: 64 * G, cores: 8, load1: 0 }, clock);
  const deferred: Array<() => void> = [];
  const policy = {
    ...defaultPolicy({ totalBytes: 64 * G, cpus: 8 }),
    memoryBytes: BUDGET_GB * G,
    cpu: 8,
    reserveBytes: G,
    maxWaitMs: 7 * 24 * 3_600_000,
    maxQueue: 100_000,
  };
  const budget = await createBudget({ policy, sampler, clock, stateDir, defer: (fn) => deferred.push(fn) });
  const start = clock.monotonicNow();
  const samples: Sample[] = [];
  const admittedAt: number[] = [];
  const arrivedAt: number[] = [];
  const hadHistory: boolean[] = [];
  /** What holds the budget, with when it ends. */
  const holding: Array<{ reservation: Reservation; endsAt: number; name: string; memoryGb: number }> = [];
  /** The usual times as the service knows them, learnt from the same releases (in memory). */
  const runTimes = new RunTimes();
  const holdersAt = new Map<number, Holder[]>();
  let next = 0;
  let waiting = 0;
  let failure: unknown;
  /** The queue numbers its requests as they queue (`seq`): which job each is. */
  const jobOfSeq = new Map<number, number>();
  let queuedCount = 0;
  let nextSampleAt = start + 1000;
  try {
    while (next < jobs.length || waiting > 0 || holding.length > 0) {
      if (failure !== undefined) throw failure;
      const arrival = next < jobs.length ? start + jobs[next]!.arrivesAtMs : Number.POSITIVE_INFINITY;
      const end = holding.reduce((soonest, h) => Math.min(soonest, h.endsAt), Number.POSITIVE_INFINITY);
      const at = Math.min(arrival, end, nextSampleAt);
      clock.advance(at - clock.monotonicNow());
      // Ends first: what they free is admitted in the same ms, before anyone new asks.
      for (let i = holding.length - 1; i >= 0; i--) {
        const done = holding[i]!;
        if (done.endsAt > at) continue;
        holding.splice(i, 1);
        budget.release(done.reservation.id);
        runTimes.record(done.name, at - done.reservation.admittedAtMonotonic, clock.now());
      }
      while (next < jobs.length && start + jobs[next]!.arrivesAtMs <= at) {
        const job = jobs[next++]!;
        const name = nameOf(job, scenario);
        arrivedAt[job.index] = at;
        hadHistory[job.index] = runTimes.usual(name) !== undefined;
        waiting++;
        const need: Need = { items: [], start: { memoryBytes: job.kind.memoryGb * G, cpu: 1 }, build: { memoryBytes: 0, cpu: 0 } };
        const queuedAs = (_: unknown) => jobOfSeq.set(++queuedCount, job.index);
        budget.admit(need, name, { onQueuedRequest: queuedAs }).then(
          (reservation) => {
            waiting--;
            admittedAt[job.index] = reservation.admittedAtMonotonic;
            holding.push({ reservation, endsAt: reservation.admittedAtMonotonic + job.durationMs, name, memoryGb: job.kind.memoryGb });
          },
          (error: unknown) => (failure = error),
        );
      }
      while (deferred.length > 0) deferred.shift()!();
      // The admissions' promises settle before time moves on.
      await new Promise<void>((resolve) => setImmediate(resolve));
      if (failure === undefined && waiting > 0 && holding.length === 0 && next === jobs.length)
        throw new Error("the queue stalled: requests wait with nothing holding the budget");
      if (at === nextSampleAt) {
        nextSampleAt += 1000;
        const state = budget.state();
        const held = new Map(holding.map((h) => [`'${h.name}'`, h.name]));
        const holders = holding.map((h) => ({
          name: h.name,
          memory_gb: h.memoryGb,
          ran_ms: at - h.reservation.admittedAtMonotonic,
          usual_ms: runTimes.usual(h.name)?.ms,
          left_ms: h.endsAt - at,
        }));
        const overran = holders.some((h) => h.usual_ms !== undefined && h.ran_ms >= h.usual_ms);
        const unknownHolder = holders.some((h) => h.usual_ms === undefined);
        const firstUnknownQueued = state.queue.find((entry) => runTimes.usual(entry.owner) === undefined)?.position ?? Number.POSITIVE_INFINITY;
        if (state.queue.length > 0) holdersAt.set(at, holders);
        for (const entry of state.queue) {
          const job = jobOfSeq.get(entry.seq);
          if (job === undefined) throw new Error(`queued request ${entry.seq} is no job of the workload`);
          samples.push({
            job,
            at,
            position: entry.position,
            etaMs: entry.etaMs,
            basis: entry.etaBasis,
            seedMs: etaOf(entry.position, state.holdMs, entry.waitedMs),
            endless: overran ? "overran" : unknownHolder || entry.position > firstUnknownQueued ? "no past runs" : "none",
            unknownFor: entry.etaMs === undefined ? unknownFor(entry.etaBasis, held, runTimes) : undefined,
          });
        }
      }
    }
    return { samples, admittedAt, arrivedAt, hadHistory, holdersAt, start, replayMs: clock.monotonicNow() - start };
  } finally {
    await budget.close();
    rmSync(stateDir, { recursive: true, force: true });
  }
}

/** What an unknown wait was for, as the bench knows it: the holder it names and whether that name had run before. */
function unknownFor(basis: string, held: Map<string, string>, runTimes: RunTimes): string {
  const named = /^unknown: it waits for ('[^']*')/.exec(basis)?.[1];
  if (named === undefined) return basis.includes("request ahead") ? "a request ahead of it has no estimate" : basis;
  const name = held.get(named);
  if (name === undefined) return "a queued request ahead of it with no past runs";
  return runTimes.usual(name) !== undefined ? "a holder that ran past its usual time, no lease" : "a holder with no past runs and no lease";
}

function report(scenario: Scenario, jobs: readonly Job[], replayed: Replay, settings: Settings): void {
  const common = { suite: "eta", scenario, settings: { ...settings, budget: `${BUDGET_GB}G` } };
  const warm = (s: Sample) => s.job < settings.warmup;
  const measured = replayed.samples.filter((s) => !warm(s));
  const warmUp = replayed.samples.filter(warm);
  const truth = (s: Sample) => replayed.admittedAt[s.job]! - s.at;
  const waits = jobs.map((job) => replayed.admittedAt[job.index]! - replayed.arrivedAt[job.index]!);
  const queued = new Set(replayed.samples.map((s) => s.job));
  const queueLengths = new Map<number, number>();
  for (const s of replayed.samples) queueLengths.set(s.at, (queueLengths.get(s.at) ?? 0) + 1);
  const seconds = Math.floor(replayed.replayMs / 1000);
  emit({
    ...common,
    figure: "workload",
    jobs: jobs.length,
    strangers: scenario === "strangers" ? jobs.filter((job) => job.stranger).length : 0,
    replay_s: seconds,
    jobs_that_waited: queued.size,
    mean_wait_s: round(mean(waits) / 1000),
    p90_wait_s: round(percentiles(waits, [90]).p90_ms! / 1000),
    mean_queue: round(replayed.samples.length / Math.max(1, seconds)),
    max_queue: Math.max(0, ...queueLengths.values()),
    jobs_without_history: replayed.hadHistory.filter((had) => !had).length,
    samples: replayed.samples.length,
    warm_up_samples: warmUp.length,
  });

  const shown = measured.filter((s) => s.etaMs !== undefined);
  const berthErrors = shown.map((s) => s.etaMs! - truth(s));
  const seedErrorsShown = shown.map((s) => s.seedMs - truth(s));
  const seedErrorsAll = measured.map((s) => s.seedMs - truth(s));
  const berthMae = meanAbs(berthErrors);
  const seedMae = meanAbs(seedErrorsShown);
  const fraction = ratio(berthMae, seedMae);
  emit({
    ...common,
    figure: "mean absolute error",
    samples: shown.length,
    berth_ms: Math.round(berthMae),
    seed_same_samples_ms: Math.round(seedMae),
    seed_all_samples_ms: Math.round(meanAbs(seedErrorsAll)),
    ratio: fraction,
    goal: "≤ 0.5",
    met: fraction <= 0.5,
    berth_mean_signed_ms: Math.round(mean(berthErrors)),
    seed_mean_signed_ms: Math.round(mean(seedErrorsShown)),
  });
  // Split by what the service's replay could not see end: it then keeps that memory held for good.
  const split = (endless: Sample["endless"]) => {
    const part = shown.filter((s) => s.endless === endless);
    return {
      samples: part.length,
      berth_ms: Math.round(meanAbs(part.map((s) => s.etaMs! - truth(s)))),
      berth_mean_signed_ms: Math.round(mean(part.map((s) => s.etaMs! - truth(s)))),
      seed_ms: Math.round(meanAbs(part.map((s) => s.seedMs - truth(s)))),
    };
  };
  emit({
    ...common,
    figure: "error by what has no known end",
    a_holder_ran_past_its_usual_time: split("overran"),
    a_holder_or_request_ahead_has_no_past_runs: split("no past runs"),
    neither: split("none"),
  });
  emit({
    ...common,
    figure: "error percentiles",
    samples: shown.length,
    berth: percentiles(berthErrors.map(Math.abs), [50, 90]),
    seed_same_samples: percentiles(seedErrorsShown.map(Math.abs), [50, 90]),
    seed_all_samples: percentiles(seedErrorsAll.map(Math.abs), [50, 90]),
  });

  const requests = byJob(measured);
  const always = [...requests.values()].filter((own) => own.every((s) => s.etaMs !== undefined)).length;
  const ever = [...requests.values()].filter((own) => own.some((s) => s.etaMs !== undefined)).length;
  emit({
    ...common,
    figure: "shown",
    samples: measured.length,
    samples_shown: shown.length,
    samples_share: share(shown.length, measured.length),
    requests: requests.size,
    requests_always_shown: always,
    requests_always_share: share(always, requests.size),
    requests_ever_shown: ever,
    requests_ever_share: share(ever, requests.size),
  });
  emit({ ...common, figure: "unknowns", ...unknowns(measured) });
  const warmShown = warmUp.filter((s) => s.etaMs !== undefined);
  emit({
    ...common,
    figure: "warm-up",
    jobs: settings.warmup,
    samples: warmUp.length,
    samples_shown: warmShown.length,
    samples_share: share(warmShown.length, warmUp.length),
    berth_mae_ms: Math.round(meanAbs(warmShown.map((s) => s.etaMs! - truth(s)))),
    seed_same_samples_ms: Math.round(meanAbs(warmShown.map((s) => s.seedMs - truth(s)))),
    ...unknowns(warmUp),
  });

  // The largest errors, one sample per request: what it was told, and what happened.
  const seen = new Set<number>();
  const worst = [...shown]
    .sort((a, b) => Math.abs(b.etaMs! - truth(b)) - Math.abs(a.etaMs! - truth(a)))
    .filter((s) => !seen.has(s.job) && seen.add(s.job))
    .slice(0, settings.worst)
    .map((s) => {
      const job = jobs[s.job]!;
      const ahead: Record<string, number> = {};
      for (const other of replayed.samples) {
        if (other.at !== s.at || other.position >= s.position) continue;
        const name = nameOf(jobs[other.job]!, scenario);
        ahead[name] = (ahead[name] ?? 0) + 1;
      }
      return {
        request: `#${job.index} '${nameOf(job, scenario)}'`,
        at_s: Math.round((s.at - replayed.start) / 1000),
        position: s.position,
        ahead,
        basis: s.basis,
        predicted_ms: s.etaMs,
        true_ms: truth(s),
        seed_ms: s.seedMs,
        holders: replayed.holdersAt.get(s.at),
      };
    });
  emit({ ...common, figure: "worst", cases: worst });
}

/** The unknown samples by the service's reason (quoted names and sizes left out) and by what they waited for. */
function unknowns(samples: readonly Sample[]): { unknown: number; reasons: Record<string, number>; waiting_for: Record<string, number> } {
  const reasons: Record<string, number> = {};
  const waitingFor: Record<string, number> = {};
  let unknown = 0;
  for (const s of samples) {
    if (s.etaMs !== undefined) continue;
    unknown++;
    const reason = s.basis.replace(/'[^']*'/g, "'…'").replace(/\([^()]*cpu\)/g, "(…)");
    reasons[reason] = (reasons[reason] ?? 0) + 1;
    const what = s.unknownFor ?? "?";
    waitingFor[what] = (waitingFor[what] ?? 0) + 1;
  }
  return { unknown, reasons, waiting_for: waitingFor };
}

function byJob(samples: readonly Sample[]): Map<number, Sample[]> {
  const jobs = new Map<number, Sample[]>();
  for (const s of samples) {
    const own = jobs.get(s.job);
    if (own === undefined) jobs.set(s.job, [s]);
    else own.push(s);
  }
  return jobs;
}

const mean = (values: readonly number[]) => (values.length === 0 ? Number.NaN : values.reduce((sum, v) => sum + v, 0) / values.length);
const meanAbs = (values: readonly number[]) => mean(values.map(Math.abs));
const round = (n: number) => Math.round(n * 10) / 10;
const share = (part: number, whole: number) => (whole === 0 ? Number.NaN : Math.round((part / whole) * 1000) / 1000);
