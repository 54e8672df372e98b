/**
 * The source-lock benchmarks, each figure beside the same run's empty-RPC reference:
 *
 * - `uncontended`: Acquire+Release cycles per second, every worker on its own file, against the
 *   health Check rate at the same concurrency (two RPCs a cycle: 50 % is the ceiling; target ≥ 40 %).
 * - `contended`: 8 clients × 300 critical sections on one file: sections/s; handoff latency (the
 *   holder sends Release → the next holder receives its grant) against an empty RPC's latency
 *   (target p50 ≤ 2×: read against one empty RPC at a time before and after, against a sampled one
 *   during the sections, and against 8 clients' empty RPCs in a closed loop); the longest run of one holder while others wait (target 1: FIFO); exclusion
 *   violations (target 0), checked with the fencing tokens: ordered by token, no section may begin
 *   before the one granted just before it ended. Run twice: `lease` sections take the lock with
 *   Acquire and give it back with a Release RPC; `hold` sections hold a Hold stream and give the
 *   lock back by cancelling it (`berth lock hold`'s way: the release is one RST_STREAM frame).
 * - `holder_killed`: rounds of "the holder is killed while 4 clients wait": rounds with two holders
 *   at once (target 0) and the time from the kill to the next grant. Killing a process 1,000 times
 *   is slow, so those rounds model the killed holder as a Hold stream whose TCP connection this
 *   process resets abruptly (`socket.resetAndDestroy()`: an RST, no HTTP/2 goodbye, as a crashed
 *   host or a cut cable looks); `holder_sigkilled` then does fewer rounds with a real child process
 *   holding the Hold stream, killed with SIGKILL.
 *
 * Every client is a separate HTTP/2 connection. Times are taken in this process (one clock).
 */
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import * as http2 from "node:http2";
import * as net from "node:net";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { HoldRequestSchema, HoldResponseSchema, type HoldResponse } from "@berth/api/berth/locks/v1/lock_service_pb";
import { emptyRpcReference, grpcServiceClient, target, unary } from "../lib/grpc-clients.js";
import { closedLoop } from "../lib/load.js";
import { emit, percentiles, ratio } from "../lib/report.js";
import { startBenchServer, type BenchServer } from "../lib/server.js";

const LOCK_PROTO = "berth/locks/v1/lock_service.proto";
const LOCK_SERVICE = "berth.locks.v1.LockService";

interface Settings {
  uncontendedConcurrency: number;
  durationMs: number;
  clients: number;
  sectionsPerClient: number;
  killRounds: number;
  sigkillRounds: number;
  waiters: number;
}

/**
 * The directory the locked files live in during a run: real directories, as a client's files
 * usually are, since the service makes every path canonical.
 */
let project = "";
const lockPath = (name: string) => path.join(project, name);

const DEFAULTS: Settings = {
  uncontendedConcurrency: 32,
  durationMs: 4_000,
  clients: 8,
  sectionsPerClient: 300,
  killRounds: 1_000,
  sigkillRounds: 20,
  waiters: 4,
};

/**
 * Runs the suite: `npm run bench -- locks [--kill-rounds=N] [--sigkill-rounds=N] [--duration=MS]
 * [--only=uncontended,contended,contended-hold,killed,sigkilled]`.
 */
export async function run(args: string[] = []): Promise<void> {
  const settings = { ...DEFAULTS };
  let only: Set<string> | undefined;
  for (const arg of args) {
    const [name, value] = arg.replace(/^--/, "").split("=");
    const n = Number(value);
    if (name === "kill-rounds") settings.killRounds = n;
    else if (name === "sigkill-rounds") settings.sigkillRounds = n;
    else if (name === "duration") settings.durationMs = n;
    else if (name === "only") only = new Set((value ?? "").split(","));
  }
  project = mkdtempSync(path.join(tmpdir(), "berth-bench-project-"));
  mkdirSync(lockPath("bench/uncontended"), { recursive: true });
  const server = await startBenchServer("sessions");
  try {
    const wanted = (figure: string) => only === undefined || only.has(figure);
    if (wanted("uncontended")) await uncontended(server, settings);
    if (wanted("contended")) await contended(server, settings, "lease");
    if (wanted("contended") || wanted("contended-hold")) await contended(server, settings, "hold");
    if (wanted("killed")) await holderKilled(server, settings);
    if (wanted("sigkilled")) await holderSigkilled(server, settings);
  } finally {
    inspector?.close();
    inspector = undefined;
    await server.stop();
    rmSync(project, { recursive: true, force: true });
  }
}

/** A grpc-js LockService client on its own connection. */
export function lockClient(url: string): grpc.Client {
  const LockService = grpcServiceClient(LOCK_PROTO, LOCK_SERVICE);
  // A private subchannel pool: grpc-js would otherwise share one connection among clients.
  return new LockService(target(url), grpc.credentials.createInsecure(), { "grpc.use_local_subchannel_pool": 1 });
}

interface GrpcLease {
  leaseToken: string;
  fencingToken: number;
}

async function uncontended(server: BenchServer, settings: Settings): Promise<void> {
  const concurrency = settings.uncontendedConcurrency;
  const client = lockClient(server.url);
  try {
    // Warm both paths (connections, JIT) before measuring either.
    await emptyRpcReference(server.url, concurrency, 500);
    await closedLoop(concurrency, 500, (worker) => cycle(client, lockPath(`bench/uncontended/${worker}.ts`)));
    const cpuBeforeReference = server.cpuMs();
    const reference = await emptyRpcReference(server.url, concurrency, settings.durationMs);
    const referenceCpuMs = server.cpuMs() - cpuBeforeReference;
    const cpuBefore = server.cpuMs();
    const cycles = await closedLoop(concurrency, settings.durationMs, (worker) => cycle(client, lockPath(`bench/uncontended/${worker}.ts`)));
    const serverCpuMs = server.cpuMs() - cpuBefore;
    emit({
      suite: "locks",
      figure: "uncontended_acquire_release",
      concurrency,
      cycles_per_s: cycles.perSecond,
      empty_rpc_per_s: reference.perSecond,
      ratio_to_empty_rpc: ratio(cycles.perSecond, reference.perSecond),
      target_ratio: 0.4,
      cycle_latency: percentiles(cycles.latenciesMs),
      server_cpu_ms_per_cycle: Math.round((serverCpuMs / Math.max(1, cycles.ops)) * 1000) / 1000,
      server_cpu_ms_per_empty_rpc: Math.round((referenceCpuMs / Math.max(1, reference.ops)) * 1000) / 1000,
      errors: cycles.errors,
      ...(cycles.firstError ? { first_error: String(cycles.firstError) } : {}),
    });
  } finally {
    client.close();
  }
}

async function cycle(client: grpc.Client, file: string): Promise<void> {
  const { lease } = await unary<{ lease: GrpcLease }>(client, "acquire", { file, owner: "bench", ttl: { seconds: 30 } });
  await unary(client, "release", { leaseToken: lease.leaseToken });
}

interface Section {
  client: number;
  token: number;
  acquireSentAt: number;
  grantedAt: number;
  releaseSentAt: number;
}

/** The gap between two empty RPCs of the under-load probe. */
const PROBE_INTERVAL_MS = 20;

/**
 * How the contended sections take and give back the lock: `lease` by Acquire and a Release RPC;
 * `hold` by a Hold stream that the holder cancels (one RST_STREAM frame: no RPC to answer).
 */
export type SectionMode = "lease" | "hold";

/** A granted section: its fencing token, and how to let go of the lock. */
export interface HeldSection {
  fencingToken: number;
  release(): Promise<void>;
}

export async function leaseSection(client: grpc.Client, file: string, owner: string): Promise<HeldSection> {
  const { lease } = await unary<{ lease: GrpcLease }>(client, "acquire", { file, owner, maxWait: { seconds: 60 }, ttl: { seconds: 30 } });
  return { fencingToken: lease.fencingToken, release: () => unary(client, "release", { leaseToken: lease.leaseToken }).then(() => {}) };
}

export function holdSection(client: grpc.Client, file: string, owner: string): Promise<HeldSection> {
  return new Promise((resolve, reject) => {
    const call = (client as unknown as Record<string, (...args: unknown[]) => unknown>)["hold"]!({
      file,
      owner,
      maxWait: { seconds: 60 },
    }) as grpc.ClientReadableStream<{ kind: string; acquired?: GrpcLease }>;
    let granted = false;
    call.on("data", (message) => {
      if (message.kind !== "acquired" || granted) return;
      granted = true;
      resolve({
        fencingToken: message.acquired!.fencingToken,
        release: async () => {
          call.cancel();
        },
      });
    });
    // Cancelling is how this hold ends; anything else before the grant is a failure.
    call.on("error", (error: grpc.ServiceError) => {
      if (!granted) reject(error);
    });
  });
}

async function contended(server: BenchServer, settings: Settings, mode: SectionMode): Promise<void> {
  const file = lockPath(`bench/contended-${mode}.ts`);
  const clients = Array.from({ length: settings.clients }, () => lockClient(server.url));
  try {
    // The reference for the handoff (one Release on the wire, one grant back: an RPC's round trip):
    // one empty RPC at a time on the same server, half right before the sections and half right
    // after (the machine is shared: its load drifts). The Release calls' own round trips in the same
    // sections are reported beside it: the grant should reach the next holder about when the
    // releaser gets its answer.
    const before = await emptyRpcReference(server.url, 1, 1_500);
    const releases: number[] = [];
    const cpuBefore = server.cpuMs();
    const clientCpuBefore = process.cpuUsage();
    const sections: Section[] = [];
    let inside = 0;
    let concurrentEntries = 0;
    const started = performance.now();
    // A second reference: empty RPCs, one every PROBE_INTERVAL_MS on their own connection, while
    // the sections run, so the handoff can also be read against an RPC under the very same load.
    // (Sent back to back, they made ~40 % of the server's load themselves and slowed the handoff.)
    let sectionsDone = false;
    const probe = (async () => {
      const Health = grpcServiceClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
      const health = new Health(target(server.url), grpc.credentials.createInsecure());
      const latencies: number[] = [];
      try {
        while (!sectionsDone) {
          const t0 = performance.now();
          await unary(health, "check", { service: "" });
          latencies.push(performance.now() - t0);
          // Sampled, not back to back: the probe must not become the load it measures.
          await new Promise((resolve) => setTimeout(resolve, PROBE_INTERVAL_MS));
        }
      } finally {
        health.close();
      }
      return latencies;
    })();
    await Promise.all(
      clients.map(async (client, index) => {
        for (let i = 0; i < settings.sectionsPerClient; i++) {
          const acquireSentAt = performance.now();
          const section = mode === "lease" ? await leaseSection(client, file, `client-${index}`) : await holdSection(client, file, `client-${index}`);
          const grantedAt = performance.now();
          if (++inside > 1) concurrentEntries++;
          // The critical section: nothing but proving it is alone.
          inside--;
          const releaseSentAt = performance.now();
          sections.push({ client: index, token: section.fencingToken, acquireSentAt, grantedAt, releaseSentAt });
          await section.release();
          if (mode === "lease") releases.push(performance.now() - releaseSentAt);
          // The 8 clients share this process's event loop; separate processes would not. Let a
          // grant that arrived with this Release's answer be read before this client spends time
          // sending its next Acquire, so the handoff measures the service, not this loop's queue.
          await new Promise((resolve) => setImmediate(resolve));
        }
      }),
    );
    sectionsDone = true;
    const loadedReference = percentiles(await probe, [50, 99]);
    const elapsedMs = performance.now() - started;
    const serverCpuMs = server.cpuMs() - cpuBefore;
    const clientCpu = process.cpuUsage(clientCpuBefore);
    const after = await emptyRpcReference(server.url, 1, 1_500);
    // A third reference, like the append figures': empty RPCs from as many clients as take part in
    // the sections, each sending its next call when the last is answered.
    const sameConcurrency = percentiles((await emptyRpcReference(server.url, settings.clients, 1_500)).latenciesMs, [50, 99]);
    sections.sort((a, b) => a.token - b.token);

    // Exclusion, by fencing token: each section must begin after the previous grant's section ended.
    let violations = concurrentEntries;
    const handoffs: number[] = [];
    let longestRun = 1;
    let run = 1;
    let changes = 0;
    for (let i = 1; i < sections.length; i++) {
      const previous = sections[i - 1]!;
      const current = sections[i]!;
      if (current.token <= previous.token || current.grantedAt < previous.releaseSentAt) violations++;
      // A handoff: the next holder was already waiting when the previous one let go.
      if (current.acquireSentAt < previous.releaseSentAt) handoffs.push(current.grantedAt - previous.releaseSentAt);
      if (current.client === previous.client) {
        // Counts as a repeat only while someone else was waiting for the lock.
        const othersWaiting = sections.some(
          (s) => s.client !== current.client && s.acquireSentAt < previous.releaseSentAt && s.grantedAt > previous.releaseSentAt,
        );
        run = othersWaiting ? run + 1 : 1;
      } else {
        run = 1;
        changes++;
      }
      longestRun = Math.max(longestRun, run);
    }
    const handoff = percentiles(handoffs, [50, 99]);
    const reference = percentiles([...before.latenciesMs, ...after.latenciesMs], [50, 99]);
    const release = percentiles(releases, [50, 99]);
    emit({
      suite: "locks",
      figure: "contended_one_file",
      mode,
      clients: settings.clients,
      sections: sections.length,
      sections_per_s: Math.round((sections.length / elapsedMs) * 1000),
      handoffs_measured: handoffs.length,
      handoff_latency: handoff,
      empty_rpc_latency: reference,
      handoff_p50_to_empty_rpc_p50: ratio(handoff.p50_ms!, reference.p50_ms!),
      target_handoff_p50_ratio: 2,
      empty_rpc_latency_under_same_load: loadedReference,
      handoff_p50_to_loaded_empty_rpc_p50: ratio(handoff.p50_ms!, loadedReference.p50_ms!),
      empty_rpc_latency_at_same_concurrency: sameConcurrency,
      handoff_p50_to_same_concurrency_empty_rpc_p50: ratio(handoff.p50_ms!, sameConcurrency.p50_ms!),
      ...(mode === "lease" ? { release_rpc_latency: release, handoff_p50_to_release_rpc_p50: ratio(handoff.p50_ms!, release.p50_ms!) } : {}),
      server_cpu_busy: ratio(serverCpuMs, elapsedMs),
      clients_cpu_busy: ratio((clientCpu.user + clientCpu.system) / 1000, elapsedMs),
      holder_changes: changes,
      longest_run_while_others_wait: longestRun,
      target_longest_run: 1,
      exclusion_violations: violations,
      target_violations: 0,
    });
  } finally {
    for (const client of clients) client.close();
  }
}

/**
 * A Hold stream over a raw HTTP/2 connection of its own, so that the benchmark can cut the
 * connection abruptly. Speaks plain gRPC framing.
 */
interface RawHold {
  readonly owner: string;
  /** Resolves with the lease's fencing token once granted; rejects when the stream ends first. */
  readonly granted: Promise<{ token: number; at: number }>;
  /** Resets the TCP connection (RST): the server sees the peer vanish, with no HTTP/2 goodbye. */
  kill(): void;
  /** Cancels the stream politely and closes the connection. */
  close(): void;
}

function openRawHold(url: string, file: string, owner: string, waitMs: number): RawHold {
  const address = new URL(url);
  const socket = net.connect(Number(address.port), address.hostname);
  socket.setNoDelay(true);
  const session = http2.connect(url, { createConnection: () => socket });
  session.on("error", () => {});
  const stream = session.request({ ":method": "POST", ":path": "/berth.locks.v1.LockService/Hold", "content-type": "application/grpc", te: "trailers" });
  stream.on("error", () => {});
  const body = toBinary(HoldRequestSchema, create(HoldRequestSchema, { file, owner, maxWait: durationFromMs(waitMs) }));
  const frame = Buffer.alloc(5 + body.length);
  frame.writeUInt32BE(body.length, 1);
  frame.set(body, 5);
  stream.end(frame);

  let buffered = Buffer.alloc(0);
  const granted = new Promise<{ token: number; at: number }>((resolve, reject) => {
    stream.on("data", (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 5) {
        const length = buffered.readUInt32BE(1);
        if (buffered.length < 5 + length) break;
        const message: HoldResponse = fromBinary(HoldResponseSchema, buffered.subarray(5, 5 + length));
        buffered = buffered.subarray(5 + length);
        if (message.kind.case === "acquired") resolve({ token: Number(message.kind.value.fencingToken), at: performance.now() });
      }
    });
    stream.on("trailers", (trailers) =>
      reject(new Error(`hold of ${owner} ended: grpc-status ${String(trailers["grpc-status"])} ${String(trailers["grpc-message"] ?? "")}`)),
    );
    stream.on("close", () => reject(new Error(`hold of ${owner} closed`)));
  });
  granted.catch(() => {});
  return {
    owner,
    granted,
    kill() {
      socket.resetAndDestroy();
    },
    close() {
      stream.close(http2.constants.NGHTTP2_CANCEL);
      session.close();
    },
  };
}

/** Counts the moments two holders hold at once, and checks fencing tokens rise. */
class HolderWatch {
  private holders = new Set<string>();
  private lastToken = 0;
  violations = 0;
  granted(owner: string, token: number): boolean {
    const bad = this.holders.size > 0 || token <= this.lastToken;
    if (bad) this.violations++;
    this.holders.add(owner);
    this.lastToken = Math.max(this.lastToken, token);
    return bad;
  }
  gone(owner: string): void {
    this.holders.delete(owner);
  }
}

/** One empty RPC at a time for 1 s: the latency every kill-to-grant figure is shown beside. */
async function emptyRpcLatency(server: BenchServer): Promise<Record<string, number>> {
  return percentiles((await emptyRpcReference(server.url, 1, 1_000)).latenciesMs, [50, 99]);
}

async function holderKilled(server: BenchServer, settings: Settings): Promise<void> {
  const reference = await emptyRpcLatency(server);
  const file = lockPath("bench/killed.ts");
  const watch = new HolderWatch();
  let serial = 0;
  const open = () => {
    const owner = `hold-${serial++}`;
    const hold = openRawHold(server.url, file, owner, 600_000);
    void hold.granted.then(
      ({ token }) => watch.granted(owner, token),
      () => {},
    );
    return hold;
  };
  // The queue: the holder first, then the waiters; each round kills the head, the next inherits.
  let holder = open();
  await holder.granted;
  const queue: RawHold[] = [];
  for (let i = 0; i < settings.waiters; i++) queue.push(open());
  const killToGrant: number[] = [];
  let roundsWithTwo = 0;
  const started = performance.now();
  for (let round = 0; round < settings.killRounds; round++) {
    await waitForWaiters(server.url, file, settings.waiters);
    const before = watch.violations;
    watch.gone(holder.owner);
    const killedAt = performance.now();
    holder.kill();
    const next = queue.shift()!;
    const { at } = await withTimeout(next.granted, 10_000, `round ${round}: no grant after the kill`);
    killToGrant.push(at - killedAt);
    // Give a wrongful second grant a moment to show up before the round is judged.
    await new Promise((resolve) => setImmediate(resolve));
    if (watch.violations > before) roundsWithTwo++;
    holder = next;
    queue.push(open());
  }
  const elapsedMs = performance.now() - started;
  holder.close();
  for (const waiter of queue) waiter.close();
  emit({
    suite: "locks",
    figure: "holder_killed",
    model: "Hold stream whose TCP connection is reset (RST) by the benchmark process",
    rounds: settings.killRounds,
    waiters: settings.waiters,
    rounds_with_two_holders: roundsWithTwo,
    target_rounds_with_two_holders: 0,
    kill_to_next_grant: percentiles(killToGrant, [50, 99, 100]),
    empty_rpc_latency: reference,
    rounds_per_s: Math.round((settings.killRounds / elapsedMs) * 1000),
  });
}

async function holderSigkilled(server: BenchServer, settings: Settings): Promise<void> {
  const reference = await emptyRpcLatency(server);
  const file = lockPath("bench/sigkilled.ts");
  const watch = new HolderWatch();
  const killToGrant: number[] = [];
  let roundsWithTwo = 0;
  for (let round = 0; round < settings.sigkillRounds; round++) {
    const child = spawn(process.execPath, [fileURLToPath(import.meta.url), "--hold-child", server.url, file, `child-${round}`], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    const exited = new Promise((resolve) => child.once("exit", resolve));
    const token = await new Promise<number>((resolve, reject) => {
      let out = "";
      child.stdout!.on("data", (chunk: Buffer) => {
        out += chunk.toString();
        const match = /acquired (\d+)/.exec(out);
        if (match) resolve(Number(match[1]));
      });
      child.once("exit", (code) => reject(new Error(`hold child exited with ${code} before holding`)));
    });
    watch.granted(`child-${round}`, token);
    const waiters = Array.from({ length: settings.waiters }, (_, i) => {
      const owner = `waiter-${round}-${i}`;
      const hold = openRawHold(server.url, file, owner, 60_000);
      void hold.granted.then(
        ({ token: t }) => watch.granted(owner, t),
        () => {},
      );
      return hold;
    });
    await waitForWaiters(server.url, file, settings.waiters);
    const before = watch.violations;
    watch.gone(`child-${round}`);
    const killedAt = performance.now();
    child.kill("SIGKILL");
    const { at } = await withTimeout(waiters[0]!.granted, 10_000, `round ${round}: no grant after SIGKILL`);
    killToGrant.push(at - killedAt);
    await new Promise((resolve) => setImmediate(resolve));
    if (watch.violations > before) roundsWithTwo++;
    await exited;
    // Reset for the next round: the waiters leave (the first one holding).
    watch.gone(waiters[0]!.owner);
    for (const waiter of waiters) waiter.close();
    await waitForFree(server.url, file);
  }
  emit({
    suite: "locks",
    figure: "holder_sigkilled",
    model: "a child process holding a Hold stream, killed with SIGKILL",
    rounds: settings.sigkillRounds,
    waiters: settings.waiters,
    rounds_with_two_holders: roundsWithTwo,
    target_rounds_with_two_holders: 0,
    kill_to_next_grant: percentiles(killToGrant, [50, 99, 100]),
    empty_rpc_latency: reference,
  });
}

let inspector: grpc.Client | undefined;
async function inspect(url: string, file: string): Promise<{ holder?: unknown; waiters?: unknown[] }> {
  inspector ??= lockClient(url);
  return unary(inspector, "inspect", { file });
}

/** Resolves once `count` requests wait for `file` (so a kill happens while they all wait). */
async function waitForWaiters(url: string, file: string, count: number): Promise<void> {
  for (let i = 0; ; i++) {
    const state = await inspect(url, file);
    if ((state.waiters?.length ?? 0) >= count && state.holder) return;
    if (i > 2_000) throw new Error(`${count} waiters for ${file} never showed up`);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

async function waitForFree(url: string, file: string): Promise<void> {
  for (let i = 0; ; i++) {
    const state = await inspect(url, file);
    if (!state.holder && (state.waiters?.length ?? 0) === 0) return;
    if (i > 2_000) throw new Error(`${file} never became free`);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

export function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  return Promise.race([
    promise,
    new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(what)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

/** The child of `holder_sigkilled`: holds a Hold stream until killed, printing `acquired <token>`. */
async function holdChild(url: string, file: string, owner: string): Promise<void> {
  const hold = openRawHold(url, file, owner, 60_000);
  const { token } = await hold.granted;
  process.stdout.write(`acquired ${token}\n`);
  setInterval(() => {}, 60_000);
}

if (process.argv[2] === "--hold-child" && process.argv[1] === fileURLToPath(import.meta.url)) {
  await holdChild(process.argv[3]!, process.argv[4]!, process.argv[5]!);
}
