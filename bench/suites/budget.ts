/**
 * The budget benchmarks, each figure beside a reference measured in the same run:
 *
 * - `handoff`: release → next admission over gRPC. A holder's Admit stream sends `release`; the
 *   head of the queue, on its own Admit stream, receives `admitted`. p50/p99 against the p50 of an
 *   empty RPC (health Check, one in flight) on the same server (target p50 ≤ 2×; the seed: 135 ms
 *   median, from its 250 ms poll).
 * - `waiters`: CPU per second of the service process while 10,000 Admit streams wait on an
 *   unchanging machine (a fixture `--proc-root`), heartbeats included (target ≤ 50 ms/s; the seed:
 *   467 ms/s for 1,000 waiters). References: the same process idle, before the waiters came; and
 *   the same waiters once SIGHUP has reloaded the heartbeat to one an hour (what waiting costs
 *   without messages), which also gives the cost of one Queued message. With the waiters queued, it
 *   also times GetState (its first page of 100 and the counts) and a walk of the whole queue with
 *   ListQueue, 1,000 entries a page, against an empty RPC on the same server. The measured window is
 *   three whole heartbeat periods (10,000 waiters at 100 heartbeats a second: 300 s), so that every
 *   waiter is heard from three times in it and the full garbage collections come at their own rate.
 * - `check`: Check RPCs per second against the health Check rate at the same concurrency (target
 *   ≥ 80 %: a check reads the cached sample, never /proc).
 *
 * `npm run bench -- budget [--seconds=4] [--handoffs=300] [--waiters=10000] [--window=SECONDS]
 * [--connections=10] [--only=handoff,waiters,check] [--profile=DIR]` (`--profile` writes a V8 CPU
profile of each service process into DIR). Clients are @grpc/grpc-js; times are taken in
 * this process.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import * as grpc from "@grpc/grpc-js";
import { heartbeatPeriodMs } from "@berth/budget";
import { fixtureMachine } from "../lib/fixture-machine.js";
import { emptyRpcReference, grpcServiceClient, target, unary } from "../lib/grpc-clients.js";
import { closedLoop } from "../lib/load.js";
import { emit, percentiles, ratio } from "../lib/report.js";
import { startBenchServer, type BenchServer } from "../lib/server.js";

const PARTS = ["handoff", "waiters", "check"] as const;
type Part = (typeof PARTS)[number];

interface Settings {
  seconds: number;
  concurrency: number;
  handoffs: number;
  waiters: number;
  /** The busy window; default: three whole heartbeat periods of the waiters (every waiter heard three times), at least 15 s. */
  windowSeconds: number | undefined;
  connections: number;
  /** Write a V8 CPU profile of the service here (`--profile=DIR`). */
  profileDir: string | undefined;
  only: Set<Part> | undefined;
}

const DEFAULTS: Settings = {
  seconds: 4,
  concurrency: 32,
  handoffs: 300,
  waiters: 10_000,
  windowSeconds: undefined,
  connections: 10,
  profileDir: undefined,
  only: undefined,
};

const G = 1024 ** 3;

/** The idle and no-heartbeat reference windows (nothing periodic happens in them). */
const REFERENCE_WINDOW_S = 15;

const BudgetClient = grpcServiceClient("berth/budget/v1/budget_service.proto", "berth.budget.v1.BudgetService");

/** Runs the parts asked for (all by default). */
export async function run(args: string[] = []): Promise<void> {
  const settings = { ...DEFAULTS };
  for (const arg of args) {
    const [name, value] = arg.replace(/^--/, "").split("=", 2) as [string, string | undefined];
    const n = Number(value);
    switch (name) {
      case "seconds":
        settings.seconds = n;
        break;
      case "concurrency":
        settings.concurrency = n;
        break;
      case "handoffs":
        settings.handoffs = n;
        break;
      case "waiters":
        settings.waiters = n;
        break;
      case "window":
        settings.windowSeconds = n;
        break;
      case "connections":
        settings.connections = n;
        break;
      case "profile":
        settings.profileDir = value;
        continue;
      case "only":
        settings.only = new Set((value ?? "").split(",").filter(Boolean) as Part[]);
        for (const part of settings.only) if (!PARTS.includes(part)) throw new Error(`--only: unknown part ${part}; parts: ${PARTS.join(", ")}`);
        continue;
      default:
        throw new Error(
          `unknown flag ${arg}; flags: --seconds=N --concurrency=N --handoffs=N --waiters=N --window=N --connections=N --only=${PARTS.join(",")}`,
        );
    }
    if (!(n > 0)) throw new Error(`--${name} needs a positive number`);
  }
  profileDir = settings.profileDir;
  const wants = (part: Part) => settings.only === undefined || settings.only.has(part);
  if (wants("handoff")) await handoff(settings);
  if (wants("check")) await checkRate(settings);
  if (wants("waiters")) await waiters(settings);
}

// --------------------------------------------------------------------------- shared pieces

let profileDir: string | undefined;

async function withBudget<T>(extraArgs: string[], env: NodeJS.ProcessEnv, work: (server: BenchServer) => Promise<T>): Promise<T> {
  const machine = fixtureMachine();
  const profile = profileDir === undefined ? {} : { NODE_OPTIONS: `--import=${profilerPreload(profileDir)}` };
  const server = await startBenchServer("budget", [...machine.args, ...extraArgs], { ...env, ...profile });
  try {
    return await work(server);
  } finally {
    await server.stop();
    rmSync(machine.dir, { recursive: true, force: true });
  }
}

/**
 * A module preloaded into the service to profile it between two SIGUSR2 (`--cpu-prof` is not
 * allowed in NODE_OPTIONS, and profiles only the window are what tell where its time goes).
 */
function profilerPreload(dir: string): string {
  mkdirSync(dir, { recursive: true });
  const file = path.join(dir, "preload.mjs");
  writeFileSync(
    file,
    `import { Session } from "node:inspector";
import { writeFileSync } from "node:fs";
const session = new Session();
session.connect();
session.post("Profiler.enable");
session.post("Profiler.setSamplingInterval", { interval: 200 });
let running = false;
let n = 0;
// SIGUSR2 starts a profile, the next one writes it: the bench profiles its measurement window only.
process.on("SIGUSR2", () => {
  if (!running) {
    running = true;
    session.post("Profiler.start");
    return;
  }
  running = false;
  session.post("Profiler.stop", (error, result) => {
    if (!error) writeFileSync(${JSON.stringify(dir)} + "/budget-" + process.pid + "-" + ++n + ".cpuprofile", JSON.stringify(result.profile));
  });
});
`,
  );
  return file;
}

function budgetClient(url: string, options: grpc.ChannelOptions = {}): grpc.Client {
  return new BudgetClient(target(url), grpc.credentials.createInsecure(), options);
}

/** One start item of `memoryGb` and `cpu`, as proto-loader's objects write it. */
function need(memoryGb: number, cpu = 1) {
  return { items: [{ kind: "NEED_ITEM_KIND_START", name: "svc", cost: { memoryBytes: memoryGb * G, cpu, declared: true } }] };
}

interface AdmitResponse {
  kind?: "queued" | "admitted" | "updated" | "released";
  queued?: { position: number };
  admitted?: { reservation: { id: string } };
}

/** An Admit stream: `first(kind)` resolves on the first response of that kind after the call. */
function openAdmit(client: grpc.Client, owner: string, memoryGb: number) {
  const call = (client as unknown as { admit(): grpc.ClientDuplexStream<unknown, AdmitResponse> }).admit();
  const waiting = new Map<string, Array<(at: number) => void>>();
  let errored: Error | undefined;
  call.on("data", (response: AdmitResponse) => {
    const at = performance.now();
    const kind = response.kind ?? "";
    const list = waiting.get(kind);
    if (list) {
      waiting.delete(kind);
      for (const resolve of list) resolve(at);
    }
  });
  call.on("error", (error) => (errored = error));
  call.write({ start: { owner, need: need(memoryGb) } });
  return {
    call,
    /** Resolves with the time (performance.now) the next response of `kind` arrives. */
    next(kind: string): Promise<number> {
      if (errored) return Promise.reject(errored);
      return new Promise((resolve, reject) => {
        const list = waiting.get(kind) ?? [];
        list.push(resolve);
        waiting.set(kind, list);
        call.once("error", reject);
      });
    },
    release() {
      call.write({ release: {} });
      call.end();
    },
  };
}

// --------------------------------------------------------------------------- handoff

/**
 * A chain of admissions on a 4G budget where each request takes 3G: one holds, one waits. Each
 * round a new request joins (and is told it is queued), then the holder sends `release`; the time
 * from that write to the waiter's `admitted` is one handoff. The waiter then holds.
 */
async function handoff(settings: Settings): Promise<void> {
  await withBudget([], {}, async (server) => {
    const holderClient = budgetClient(server.url, { "grpc.use_local_subchannel_pool": 1 });
    const waiterClient = budgetClient(server.url, { "grpc.use_local_subchannel_pool": 1 });
    const clients = [holderClient, waiterClient];
    try {
      let holder = openAdmit(clients[0]!, "holder", 3);
      await holder.next("admitted");
      const latencies: number[] = [];
      const warmup = 20;
      for (let i = 0; i < settings.handoffs + warmup; i++) {
        const waiter = openAdmit(clients[(i + 1) % 2]!, `waiter ${i}`, 3);
        await waiter.next("queued");
        const admitted = waiter.next("admitted");
        const released = performance.now();
        holder.release();
        const at = await admitted;
        if (i >= warmup) latencies.push(at - released);
        holder = waiter;
      }
      holder.release();
      const reference = await emptyRpcReference(server.url, 1, settings.seconds * 1000);
      const referenceP50 = percentiles(reference.latenciesMs)["p50_ms"]!;
      const figures = percentiles(latencies, [50, 90, 99]);
      emit({
        suite: "budget",
        figure: "release_to_next_admission",
        handoffs: latencies.length,
        ...figures,
        empty_rpc_p50_ms: referenceP50,
        ratio_p50: ratio(figures["p50_ms"]!, referenceP50),
        target_ratio_p50: 2,
        seed_median_ms: 135,
      });
    } finally {
      for (const client of clients) client.close();
    }
  });
}

// --------------------------------------------------------------------------- check rate

/** Check with a one-item need, closed loop, against the health Check rate; three rounds each, interleaved (the machine is shared: rates drift). */
async function checkRate(settings: Settings): Promise<void> {
  await withBudget([], {}, async (server) => {
    const client = budgetClient(server.url);
    try {
      const request = { need: need(1) };
      // Warm both paths (JIT) before measuring.
      await closedLoop(settings.concurrency, 500, () => unary(client, "check", request));
      await emptyRpcReference(server.url, settings.concurrency, 500);
      const checks: number[] = [];
      const empties: number[] = [];
      let errors = 0;
      for (let round = 0; round < 3; round++) {
        const empty = await emptyRpcReference(server.url, settings.concurrency, settings.seconds * 1000);
        empties.push(empty.perSecond);
        const check = await closedLoop(settings.concurrency, settings.seconds * 1000, () => unary(client, "check", request));
        checks.push(check.perSecond);
        errors += check.errors;
        if (check.firstError) throw check.firstError;
      }
      const checkRate = Math.round(checks.reduce((a, b) => a + b, 0) / checks.length);
      const emptyRate = Math.round(empties.reduce((a, b) => a + b, 0) / empties.length);
      emit({
        suite: "budget",
        figure: "check_rate",
        concurrency: settings.concurrency,
        check_per_second: checkRate,
        empty_rpc_per_second: emptyRate,
        ratio: ratio(checkRate, emptyRate),
        target_ratio: 0.8,
        rounds: { check: checks, empty: empties },
        errors,
      });
    } finally {
      client.close();
    }
  });
}

// --------------------------------------------------------------------------- waiters

/**
 * 10,000 Admit streams wait behind a reservation that never goes, on a machine that never changes.
 * The streams are spread over several HTTP/2 connections (one grpc-js channel each). Once every
 * stream has its first `queued`, the server's CPU is measured over a window of several heartbeats.
 */
async function waiters(settings: Settings): Promise<void> {
  // In a long queue each waiter hears a heartbeat less often (the queue sends at most 100 a second):
  // a window shorter than that period could miss heartbeats altogether and flatter the figure.
  const heartbeatPeriodS = heartbeatPeriodMs(settings.waiters, 5000) / 1000;
  // Three periods: every waiter is heard from three times, and the full collections the heartbeats'
  // garbage brings (one every few minutes at 10,000 waiters, ~2.5 s of CPU each) are counted at
  // their rate rather than by the luck of where one window falls.
  const windowSeconds = settings.windowSeconds ?? Math.max(REFERENCE_WINDOW_S, Math.ceil(3 * heartbeatPeriodS) + 5);
  const env = { BERTH_BUDGET_MAX_QUEUE: String(settings.waiters + 100) };
  // The heartbeat comes from a config file, so that SIGHUP can turn it off for the second window.
  const configDir = mkdtempSync(path.join(tmpdir(), "berth-bench-config-"));
  const config = path.join(configDir, "budget.json");
  writeFileSync(config, JSON.stringify({ heartbeat: "5s" }));
  await withBudget(["--wait=1h", "--lease-ttl=1h", `--config=${config}`], env, async (server) => {
    const control = budgetClient(server.url);
    const clients = Array.from({ length: settings.connections }, () => budgetClient(server.url, { "grpc.use_local_subchannel_pool": 1 }));
    const calls: grpc.ClientDuplexStream<unknown, AdmitResponse>[] = [];
    try {
      // The reference: the same process, idle, over the same window.
      await sleep(1000);
      const idleCpu = await cpuOver(server, REFERENCE_WINDOW_S * 1000);

      await unary(control, "reserve", { owner: "holder", need: need(3) });
      let queued = 0;
      let messages = 0;
      let failures = 0;
      const opened = performance.now();
      for (let i = 0; i < settings.waiters; i++) {
        const client = clients[i % clients.length]!;
        const call = (client as unknown as { admit(): grpc.ClientDuplexStream<unknown, AdmitResponse> }).admit();
        let first = true;
        call.on("data", (response: AdmitResponse) => {
          messages++;
          if (first && response.kind === "queued") {
            first = false;
            queued++;
          }
        });
        call.on("error", () => failures++);
        call.write({ start: { owner: `waiter ${i}`, need: need(2) } });
        calls.push(call);
        // Open in batches, so the server is never flooded with 10,000 stream starts at once.
        if (i % 500 === 499) await until(() => queued + failures >= i + 1 - 250, 60_000);
      }
      if (!(await until(() => queued + failures >= settings.waiters, 120_000))) throw new Error(`only ${queued} of ${settings.waiters} streams were queued`);
      const openMs = performance.now() - opened;
      if (failures > 0) throw new Error(`${failures} Admit streams failed while opening`);
      const queuedInService = await queueLength(server.url);
      const rss = server.rssBytes();
      const reads = await readsOfTheQueue(control, server.url, settings.waiters);

      // Let the opening burst settle, then measure over whole heartbeats.
      await sleep(2000);
      const before = messages;
      const sentBefore = await sentQueued(server.url);
      // The profile (with --profile) covers the measured window: what waiting costs, not opening.
      if (profileDir !== undefined) process.kill(server.pid, "SIGUSR2");
      const busy = await cpuOver(server, windowSeconds * 1000);
      if (profileDir !== undefined) process.kill(server.pid, "SIGUSR2");
      const sentPerSecond = Math.round(((await sentQueued(server.url)) - sentBefore) / windowSeconds);
      const receivedPerSecond = Math.round((messages - before) / windowSeconds);

      // The same 10,000 waiters without heartbeats (reloaded to one an hour): what waiting costs by itself.
      writeFileSync(config, JSON.stringify({ heartbeat: "1h" }));
      process.kill(server.pid, "SIGHUP");
      await sleep(1000);
      const quietBefore = await sentQueued(server.url);
      const quiet = await cpuOver(server, REFERENCE_WINDOW_S * 1000);
      const quietMessages = (await sentQueued(server.url)) - quietBefore;

      // Closing every stream must leave nothing queued.
      const cancelled = performance.now();
      for (const call of calls) call.cancel();
      const drained = await until(async () => (await queueLength(server.url)) === 0, 180_000);
      const drainMs = Math.round(performance.now() - cancelled);

      emit({
        suite: "budget",
        figure: "cpu_while_waiting",
        waiters: settings.waiters,
        queued_in_service: queuedInService,
        connections: settings.connections,
        window_s: windowSeconds,
        heartbeat_period_s: heartbeatPeriodS,
        cpu_ms_per_s: round(busy.msPerSecond),
        idle_cpu_ms_per_s: round(idleCpu.msPerSecond),
        target_cpu_ms_per_s: 50,
        seed_cpu_ms_per_s_for_1000_waiters: 467,
        queued_messages_sent_per_s: sentPerSecond,
        queued_messages_received_per_s: receivedPerSecond,
        cpu_us_per_queued_message: sentPerSecond > 0 ? Math.round(((busy.msPerSecond - quiet.msPerSecond) / sentPerSecond) * 1000) : null,
        cpu_ms_per_s_without_heartbeats: round(quiet.msPerSecond),
        queued_messages_sent_without_heartbeats: quietMessages,
        open_all_ms: Math.round(openMs),
        rss_mb: Math.round(rss / 2 ** 20),
        ...reads,
        queue_empty_after_cancel: drained,
        cancel_all_to_empty_queue_ms: drainMs,
      });
    } finally {
      for (const call of calls) call.cancel();
      for (const client of clients) client.close();
      control.close();
    }
  }).finally(() => rmSync(configDir, { recursive: true, force: true }));
}

/**
 * GetState (the first page and the counts) and a walk of the whole queue with ListQueue, while the
 * waiters wait: p50 of 20 GetStates and the time of one full walk, beside an empty RPC's p50.
 */
async function readsOfTheQueue(control: grpc.Client, url: string, waiters: number) {
  const time = async (call: () => Promise<unknown>) => {
    const t0 = performance.now();
    await call();
    return performance.now() - t0;
  };
  const states: number[] = [];
  let size = 0;
  for (let i = 0; i < 20; i++) {
    states.push(
      await time(async () => {
        size = ((await unary(control, "getState", {})) as { queueSize?: number }).queueSize ?? 0;
      }),
    );
  }
  let listed = 0;
  let pages = 0;
  const walkMs = await time(async () => {
    let token = "";
    do {
      const page = (await unary(control, "listQueue", { pageSize: 1000, pageToken: token })) as { queue?: unknown[]; nextPageToken?: string };
      listed += page.queue?.length ?? 0;
      pages++;
      token = page.nextPageToken ?? "";
    } while (token !== "");
  });
  if (size !== waiters || listed !== waiters) throw new Error(`GetState counted ${size} and ListQueue listed ${listed} of ${waiters} waiters`);
  // One empty RPC in flight, as the reads above were.
  const reference = await emptyRpcReference(url, 1, 2000);
  const emptyP50 = percentiles(reference.latenciesMs)["p50_ms"]!;
  const stateP50 = percentiles(states)["p50_ms"]!;
  return {
    get_state_p50_ms: stateP50,
    get_state_p50_vs_empty_rpc: ratio(stateP50, emptyP50),
    list_queue_walk_ms: Math.round(walkMs),
    list_queue_pages: pages,
    empty_rpc_p50_ms: emptyP50,
  };
}

/** A gauge of the service's /metrics. */
async function gauge(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const match = new RegExp(`^${name} (\\d+)`, "m").exec(text);
  if (!match) throw new Error(`no ${name} in /metrics`);
  return Number(match[1]);
}

/** The queue's length from the service's gauge. */
function queueLength(url: string): Promise<number> {
  return gauge(url, "berth_budget_queue_length");
}

/** Queued messages the service has sent so far (counted as they leave the handler, whatever the client reads). */
function sentQueued(url: string): Promise<number> {
  return gauge(url, "berth_budget_queued_messages");
}

async function cpuOver(server: BenchServer, ms: number): Promise<{ msPerSecond: number }> {
  if (profileDir !== undefined) process.kill(server.pid, "SIGUSR2");
  const before = server.cpuMs();
  const t0 = performance.now();
  await sleep(ms);
  const elapsed = performance.now() - t0;
  if (profileDir !== undefined) process.kill(server.pid, "SIGUSR2");
  return { msPerSecond: ((server.cpuMs() - before) / elapsed) * 1000 };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function until(predicate: () => boolean | Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const end = performance.now() + timeoutMs;
  for (;;) {
    if (await predicate()) return true;
    if (performance.now() > end) return false;
    await sleep(20);
  }
}

function round(value: number, digits = 1): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}
