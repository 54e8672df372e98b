/**
 * etcd's own write rate on this machine: the ceiling berth's etcd store is compared with. Real etcd
 * members (Debian's etcd-server) on loopback with data directories under the system temp dir,
 * one member and then three, each measured through berth's client (@berth/etcd):
 *
 * - `put`: single-key puts of `--value-bytes` (256) to distinct keys, by 1, 16 and 64 concurrent
 *   callers (over up to 16 HTTP/2 connections, as berth instances would hold).
 * - `txn_batch`: transactions of 100 puts each (what one AppendEvents ×100 could be at most), by 1
 *   and 16 callers; `puts_per_s` counts the puts.
 * - `etcdctl_check_perf`: etcd's own check (`etcdctl check perf --load=xl`: 1,000 Go clients aiming
 *   at 15,000 puts/s for 60 s), whose achieved rate is the ceiling with etcd's own client.
 *
 * - `store_append`: berth's etcd journal (services/sessions/src/etcd) under the same load: appends of
 *   one event by 16 and 64 callers, and appends of 100 events (AppendEvents ×100) by 16 callers,
 *   each caller on a session of its own; `of_txn_batch` compares the batched appends' events/s with
 *   `txn_batch`'s puts/s at 16 callers in the same run (the target is ≥ 0.5).
 *
 * - `service_append`: berth's RPC, a sessions service process on the file store (`--fsync=batch`)
 *   and one on this etcd (`--store etcd`), beside the empty RPC (health Check) on the same process:
 *   AppendEvent by 16 and 64 clients (on one session, as the sessions suite measures it, and on a
 *   session per client), and AppendEvents ×100 by 16 clients (a session each).
 *
 * - `client_cpu`: what one put costs this process's CPU, through berth's client (its unary calls
 *   straight on connect-node's HTTP/2 session, see docs/etcd.md) and through @grpc/grpc-js sending the
 *   same generated messages, one call at a time.
 *
 * Across instances: two sessions service processes on the same etcd (`--store etcd`, one prefix: A
 * and B), and a file-store process (`--fsync=batch`) for the same figures on files, measured on the
 * first `--members` value only (its figures do not depend on etcd).
 *
 * - `lock_handoff`: `--handoffs` (200) handoffs of one lock, one at a time, from a holder to a
 *   waiter already queued (Inspect shows it, and etcd has its watch), timed from the holder letting go to the waiter's
 *   grant arriving: the holder through A and the waiter through B (`etcd_two_instances`), both
 *   through A (`etcd_one_instance`), both through the file store's process (`file`); by Acquire and
 *   a Release RPC (`lease`) and by Hold streams the holder cancels (`hold`). Beside each: the empty
 *   RPC's latency on the holder's instance and, on etcd, one put's (one etcd round trip) and
 *   etcd's own handoff (`etcd_mutex_handoff`: a Mutex as etcd's client takes it, two holders
 *   through berth's etcd client with no berth service in between, from the delete to the waiter's
 *   watch event), measured right before and after; the target is A → B within 1.5× of it (p50).
 * - `watch_delivery`: a writer appends `--watch-rate` (50) events a second for `--seconds` through
 *   A (or the file process) while `--watchers` (1,16) WatchSession watchers (with snapshots) follow
 *   the session through B, through A, or through the file process: each delivery's time from the
 *   append's sending (p50/p99) and from its acknowledgement (negative: the watcher had it first).
 * - `append_round_trips`: AppendEvent counted in etcd calls by etcd itself (its gRPC counters on
 *   `/metrics`) per append: one at a time through A on one session and each on a new session; one
 *   at a time on one session through A and B in turn, then A, B and a third instance C; 16 clients
 *   spreading their appends over 2 and then 3 instances, a session each and on one session; then
 *   the steady append's p50 beyond the empty RPC's,
 *   against one append-shaped transaction's p50 from this process: the claim "an append costs at
 *   most one etcd round trip beyond the RPC", read both ways.
 *
 * The client talks to the leader first (on three members a follower would add a hop). Each
 * figure's `p50_ms`/`p99_ms` are per call; `client_cpu_ms_per_s` is this process's CPU while it
 * ran (near 1000: the client, not etcd, set the pace).
 *
 * `npm run bench -- etcd [--seconds=4] [--members=1,3] [--value-bytes=256] [--check-perf=xl|l|m|s|off]
 * [--handoffs=200] [--watchers=1,16] [--watch-rate=50]
 * [--only=put,txn_batch,store_append,service_append,lock_handoff,watch_delivery,append_round_trips,client_cpu,check_perf]`
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import { compare, createEtcdClient, op, type EtcdClient } from "@berth/etcd";
import { PutRequestSchema, PutResponseSchema, type PutRequest, type PutResponse } from "@berth/etcd/api";
import { etcdMissing, startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { EtcdJournal, type PreparedEvent } from "@berth/sessions/etcd/index";
import { closedLoop } from "../lib/load.js";
import { emptyRpcReference, grpcServiceClient, target, unary } from "../lib/grpc-clients.js";
import { startBenchServer } from "../lib/server.js";
import { emit, percentiles, ratio } from "../lib/report.js";
import { appendRoundTrips } from "./etcd/append-round-trips.js";
import { startInstances } from "./etcd/instances.js";
import { lockHandoff } from "./etcd/lock-handoff.js";
import { watchDelivery } from "./etcd/watch-delivery.js";

const PARTS = [
  "put",
  "txn_batch",
  "store_append",
  "service_append",
  "lock_handoff",
  "watch_delivery",
  "append_round_trips",
  "client_cpu",
  "check_perf",
] as const;
type Part = (typeof PARTS)[number];

interface Settings {
  seconds: number;
  members: number[];
  valueBytes: number;
  checkPerf: string;
  handoffs: number;
  watchers: number[];
  watchRate: number;
  only: Set<Part> | undefined;
}

const DEFAULTS: Settings = {
  seconds: 4,
  members: [1, 3],
  valueBytes: 256,
  checkPerf: "xl",
  handoffs: 200,
  watchers: [1, 16],
  watchRate: 50,
  only: undefined,
};
const MAX_CONNECTIONS = 16;
const BATCH = 100;

export async function run(args: string[] = []): Promise<void> {
  const settings = parse(args);
  const missing = etcdMissing();
  if (missing !== undefined) {
    // `npm run bench` runs every suite; on a machine without etcd this one says so and the rest go on.
    emit({ suite: "etcd", skipped: missing });
    return;
  }
  const wants = (part: Part) => settings.only === undefined || settings.only.has(part);
  for (const members of settings.members) {
    const etcd = await startEtcd({ members });
    try {
      const leader = await etcd.leader();
      const endpoints = [leader.clientUrl, ...etcd.clientUrls.filter((url) => url !== leader.clientUrl)];
      const clients = Array.from({ length: MAX_CONNECTIONS }, () => createEtcdClient({ endpoints, prefix: "bench/" }));
      try {
        // One round trip first on every connection, so no figure pays for connecting.
        await Promise.all(clients.map((c) => c.status()));
        if (wants("put")) for (const concurrency of [1, 16, 64]) await putRate(clients, members, concurrency, settings);
        let batchedPuts: number | undefined;
        if (wants("txn_batch")) for (const concurrency of [1, 16]) batchedPuts = await batchRate(clients, members, concurrency, settings);
        if (wants("store_append")) {
          for (const concurrency of [16, 64]) await storeRate(clients, members, concurrency, 1, settings, undefined);
          await storeRate(clients, members, 16, BATCH, settings, batchedPuts);
        }
        if (wants("service_append")) await serviceAppend(endpoints, members, settings, batchedPuts);
        if (wants("lock_handoff") || wants("watch_delivery") || wants("append_round_trips")) {
          await acrossInstances(endpoints, etcd, clients[0]!, members, members === settings.members[0], settings, wants);
        }
        if (wants("client_cpu")) await clientCpu(clients[0]!, leader.clientUrl, members, settings);
      } finally {
        for (const c of clients) c.close();
      }
      if (wants("check_perf") && settings.checkPerf !== "off") await checkPerf(etcd, members, settings.checkPerf);
    } finally {
      await etcd.stop();
    }
  }
}

async function putRate(clients: EtcdClient[], members: number, concurrency: number, settings: Settings): Promise<void> {
  const value = new Uint8Array(settings.valueBytes).fill(0x61);
  const cpu = process.cpuUsage();
  const result = await closedLoop(concurrency, settings.seconds * 1000, (worker, i) =>
    clients[worker % clients.length]!.put(`put/${concurrency}/${worker}/${i}`, value),
  );
  emit({
    suite: "etcd",
    figure: "put",
    members,
    concurrency,
    connections: Math.min(concurrency, clients.length),
    value_bytes: settings.valueBytes,
    puts_per_s: result.perSecond,
    ...percentiles(result.latenciesMs),
    client_cpu_ms_per_s: cpuPerSecond(cpu, settings.seconds),
    errors: result.errors,
    ...(result.firstError ? { first_error: String(result.firstError) } : {}),
  });
}

async function batchRate(clients: EtcdClient[], members: number, concurrency: number, settings: Settings): Promise<number> {
  const value = new Uint8Array(settings.valueBytes).fill(0x62);
  const cpu = process.cpuUsage();
  const result = await closedLoop(concurrency, settings.seconds * 1000, (worker, i) => {
    const base = `txn/${concurrency}/${worker}/${i}`;
    // As an append would: one compare (the batch's first key absent) guarding the puts.
    return clients[worker % clients.length]!.txn({
      compare: [compare.absent(`${base}/0`)],
      success: Array.from({ length: BATCH }, (_, k) => op.put(`${base}/${k}`, value)),
    });
  });
  emit({
    suite: "etcd",
    figure: "txn_batch",
    members,
    concurrency,
    connections: Math.min(concurrency, clients.length),
    batch: BATCH,
    value_bytes: settings.valueBytes,
    txns_per_s: result.perSecond,
    puts_per_s: result.perSecond * BATCH,
    ...percentiles(result.latenciesMs),
    client_cpu_ms_per_s: cpuPerSecond(cpu, settings.seconds),
    errors: result.errors,
    ...(result.firstError ? { first_error: String(result.firstError) } : {}),
  });
  return result.perSecond * BATCH;
}

/** Appends of `events` events through berth's etcd journal, one journal (instance) per connection. */
async function storeRate(
  clients: EtcdClient[],
  members: number,
  concurrency: number,
  events: number,
  settings: Settings,
  batchedPuts: number | undefined,
): Promise<void> {
  const journals = clients.map((client) => new EtcdJournal({ client }));
  // Each event's journal line is about `--value-bytes` long, as txn_batch's values are.
  const padding = "x".repeat(Math.max(0, settings.valueBytes - 150));
  const batch: PreparedEvent[] = Array.from({ length: events }, (_, i) => ({ type: "bench", event: { type: "bench", i, padding } }));
  const run = `${members}-${concurrency}-${events}-${Date.now()}`;
  const cpu = process.cpuUsage();
  const result = await closedLoop(concurrency, settings.seconds * 1000, (worker) =>
    journals[worker % journals.length]!.append(`bench-${run}-${worker}`, batch),
  );
  const eventsPerSecond = result.perSecond * events;
  emit({
    suite: "etcd",
    figure: "store_append",
    members,
    concurrency,
    connections: Math.min(concurrency, clients.length),
    events_per_append: events,
    appends_per_s: result.perSecond,
    events_per_s: eventsPerSecond,
    ...(batchedPuts !== undefined && events === BATCH ? { of_txn_batch: ratio(eventsPerSecond, batchedPuts) } : {}),
    ...percentiles(result.latenciesMs),
    client_cpu_ms_per_s: cpuPerSecond(cpu, settings.seconds),
    errors: result.errors,
    ...(result.firstError ? { first_error: String(result.firstError) } : {}),
  });
}

const SessionServiceClient = grpcServiceClient("berth/sessions/v1/session_service.proto", "berth.sessions.v1.SessionService");

/** AppendEvent and AppendEvents ×100 through a sessions service process on each store, beside the empty RPC. */
async function serviceAppend(endpoints: string[], members: number, settings: Settings, batchedPuts: number | undefined): Promise<void> {
  const ms = settings.seconds * 1000;
  const event = (phase: string) => ({ agentPhase: { phase, durationMs: 12 } });
  const stores: Array<["file" | "etcd", string[]]> = [
    ["file", ["--fsync=batch"]],
    ["etcd", ["--store=etcd", `--etcd-endpoints=${endpoints.join(",")}`, `--etcd-prefix=bench-service-${Date.now()}/`]],
  ];
  for (const [store, args] of stores) {
    // Only the file store's figures on three members: the same process, whatever etcd does.
    if (store === "file" && members !== 1) continue;
    const server = await startBenchServer("sessions", args, {}, { logLevel: "warn" });
    const client = new SessionServiceClient(target(server.url), grpc.credentials.createInsecure());
    try {
      await closedLoop(16, 1000, (worker) => unary(client, "appendEvent", { sessionId: `warm-${worker}`, event: event("warm") }));
      const reference = await emptyRpcReference(server.url, 16, ms);
      for (const [clients, sessions] of [
        [16, "one"],
        [64, "one"],
        [16, "per_client"],
        [64, "per_client"],
      ] as const) {
        const run = `${clients}-${sessions}-${Date.now()}`;
        const result = await closedLoop(clients, ms, (worker) =>
          unary(client, "appendEvent", { sessionId: sessions === "one" ? `one-${run}` : `c-${run}-${worker}`, event: event("writing") }),
        );
        emit({
          suite: "etcd",
          figure: "service_append_event",
          store,
          members: store === "etcd" ? members : 0,
          clients,
          sessions,
          appends_per_s: result.perSecond,
          ...percentiles(result.latenciesMs),
          ref_empty_rpc_per_s: reference.perSecond,
          ref_empty_rpc_p50_ms: percentiles(reference.latenciesMs).p50_ms,
          errors: result.errors,
          ...(result.firstError ? { first_error: String(result.firstError) } : {}),
        });
      }
      const batch = Array.from({ length: BATCH }, (_, i) => event(`p${i % 5}`));
      const run = `batch-${Date.now()}`;
      const calls = await closedLoop(16, ms, (worker) => unary(client, "appendEvents", { sessionId: `${run}-${worker}`, events: batch }));
      emit({
        suite: "etcd",
        figure: "service_append_events_batch",
        store,
        members: store === "etcd" ? members : 0,
        clients: 16,
        events_per_call: BATCH,
        calls_per_s: calls.perSecond,
        events_per_s: calls.perSecond * BATCH,
        ...(store === "etcd" && batchedPuts !== undefined ? { of_txn_batch: ratio(calls.perSecond * BATCH, batchedPuts) } : {}),
        ...percentiles(calls.latenciesMs),
        errors: calls.errors,
        ...(calls.firstError ? { first_error: String(calls.firstError) } : {}),
      });
    } finally {
      client.close();
      await server.stop();
    }
  }
}

/** The parts that need sessions instances: two on this etcd (A, B) and, when `withFile`, one on files. */
async function acrossInstances(
  endpoints: string[],
  etcd: EtcdCluster,
  client: EtcdClient,
  members: number,
  withFile: boolean,
  settings: Settings,
  wants: (part: Part) => boolean,
): Promise<void> {
  const project = mkdtempSync(path.join(tmpdir(), "berth-bench-etcd-project-"));
  const instances = await startInstances(endpoints, withFile, wants("append_round_trips"));
  try {
    if (wants("lock_handoff"))
      await lockHandoff(instances.routes, { client, endpoints, memberUrls: etcd.clientUrls }, members, { handoffs: settings.handoffs, project });
    if (wants("watch_delivery"))
      await watchDelivery(instances.routes, members, { watchers: settings.watchers, rate: settings.watchRate, seconds: settings.seconds });
    if (wants("append_round_trips")) {
      const servers = [instances.a, instances.b, ...(instances.c ? [instances.c] : [])];
      await appendRoundTrips(servers, client, etcd.clientUrls, members, settings.seconds);
    }
  } finally {
    await instances.stop();
    rmSync(project, { recursive: true, force: true });
  }
}

/** CPU and wall time per sequential put, berth's client against grpc-js carrying the same messages. */
async function clientCpu(client: EtcdClient, leaderUrl: string, members: number, settings: Settings): Promise<void> {
  const value = new Uint8Array(settings.valueBytes).fill(0x63);
  const Kv = grpc.makeGenericClientConstructor(
    {
      put: {
        path: "/etcdserverpb.KV/Put",
        requestStream: false,
        responseStream: false,
        requestSerialize: (m: PutRequest) => Buffer.from(toBinary(PutRequestSchema, m)),
        requestDeserialize: (b: Buffer) => fromBinary(PutRequestSchema, b),
        responseSerialize: (m: PutResponse) => Buffer.from(toBinary(PutResponseSchema, m)),
        responseDeserialize: (b: Buffer) => fromBinary(PutResponseSchema, b),
      },
    },
    "etcdserverpb.KV",
  );
  const grpcJs = new Kv(leaderUrl.replace(/^http:\/\//, ""), grpc.credentials.createInsecure());
  const encoder = new TextEncoder();
  const grpcPut = (key: string) => unary<PutResponse>(grpcJs, "put", create(PutRequestSchema, { key: encoder.encode(`bench/${key}`), value }));
  try {
    const calls = Math.max(500, settings.seconds * 250);
    const measure = async (put: (i: number) => Promise<unknown>) => {
      for (let i = 0; i < 50; i++) await put(-i - 1);
      const cpu = process.cpuUsage();
      const start = performance.now();
      for (let i = 0; i < calls; i++) await put(i);
      const used = process.cpuUsage(cpu);
      return { cpu_us: Math.round((used.user + used.system) / calls), wall_us: Math.round(((performance.now() - start) * 1000) / calls) };
    };
    // Alternated twice, so that a change of the machine's load falls on both alike.
    const berth1 = await measure((i) => client.put(`cpu/berth/a/${i}`, value));
    const grpc1 = await measure((i) => grpcPut(`cpu/grpc/a/${i}`));
    const berth2 = await measure((i) => client.put(`cpu/berth/b/${i}`, value));
    const grpc2 = await measure((i) => grpcPut(`cpu/grpc/b/${i}`));
    const berthCpu = (berth1.cpu_us + berth2.cpu_us) / 2;
    const grpcCpu = (grpc1.cpu_us + grpc2.cpu_us) / 2;
    emit({
      suite: "etcd",
      figure: "client_cpu",
      members,
      calls: 2 * calls,
      berth_client_cpu_us_per_put: Math.round(berthCpu),
      berth_client_wall_us_per_put: Math.round((berth1.wall_us + berth2.wall_us) / 2),
      grpc_js_cpu_us_per_put: Math.round(grpcCpu),
      grpc_js_wall_us_per_put: Math.round((grpc1.wall_us + grpc2.wall_us) / 2),
      cpu_ratio: ratio(berthCpu, grpcCpu),
    });
  } finally {
    grpcJs.close();
  }
}

/** `etcdctl check perf`: it exits non-zero when the load's target is missed, and still says the rate. */
async function checkPerf(etcd: EtcdCluster, members: number, load: string): Promise<void> {
  const output = await new Promise<{ code: number | null; text: string }>((resolve, reject) => {
    const child = spawn("etcdctl", [`--endpoints=${etcd.clientUrls.join(",")}`, "check", "perf", `--load=${load}`, "--auto-compact", "--auto-defrag"], {
      env: { ...process.env, ETCDCTL_API: "3" },
      stdio: ["ignore", "pipe", "pipe"],
      timeout: 180_000,
      killSignal: "SIGKILL",
    });
    let text = "";
    child.stdout.on("data", (chunk: Buffer) => (text += chunk.toString("utf8")));
    child.stderr.on("data", (chunk: Buffer) => (text += chunk.toString("utf8")));
    child.once("error", reject);
    child.once("close", (code) => resolve({ code, text }));
  });
  const rate = /Throughput (?:is|too low:) (\d+) writes\/s/.exec(output.text);
  const slowest = /Slowest request took(?: too long:)? ([\d.]+)s/.exec(output.text);
  const stddev = /Stddev (?:is|too high:) ([\d.]+)s/.exec(output.text);
  emit({
    suite: "etcd",
    figure: "etcdctl_check_perf",
    members,
    load,
    writes_per_s: rate ? Number(rate[1]) : null,
    slowest_s: slowest ? Number(slowest[1]) : null,
    stddev_s: stddev ? Number(stddev[1]) : null,
    pass: output.code === 0,
    ...(rate ? {} : { output: output.text.slice(-2000) }),
  });
}

/** This process's CPU (the client's encoding, HTTP/2, the loop) per second since `since`: near 1000 means the client, not etcd, set the pace. */
function cpuPerSecond(since: NodeJS.CpuUsage, seconds: number): number {
  const used = process.cpuUsage(since);
  return Math.round((used.user + used.system) / 1000 / seconds);
}

function parse(args: string[]): Settings {
  const settings = { ...DEFAULTS };
  for (const arg of args) {
    const [name, value = ""] = arg.replace(/^--/, "").split("=", 2) as [string, string | undefined];
    switch (name) {
      case "seconds":
        settings.seconds = positive(name, value);
        break;
      case "value-bytes":
        settings.valueBytes = positive(name, value);
        break;
      case "members":
        settings.members = value.split(",").map((m) => positive(name, m));
        break;
      case "check-perf":
        if (!["xl", "l", "m", "s", "off"].includes(value)) throw new Error(`--check-perf: one of xl, l, m, s, off`);
        settings.checkPerf = value;
        break;
      case "handoffs":
        settings.handoffs = positive(name, value);
        break;
      case "watchers":
        settings.watchers = value.split(",").map((w) => positive(name, w));
        break;
      case "watch-rate":
        settings.watchRate = positive(name, value);
        break;
      case "only":
        settings.only = new Set(value.split(",").filter(Boolean) as Part[]);
        for (const part of settings.only) if (!PARTS.includes(part)) throw new Error(`--only: unknown part ${part}; parts: ${PARTS.join(", ")}`);
        break;
      default:
        throw new Error(
          `unknown flag ${arg}; flags: --seconds=N --members=1,3 --value-bytes=N --check-perf=xl|l|m|s|off --handoffs=N --watchers=1,16 --watch-rate=N --only=${PARTS.join(",")}`,
        );
    }
  }
  return settings;
}

function positive(name: string, value: string): number {
  const n = Number(value);
  if (!(n > 0) || !Number.isInteger(n)) throw new Error(`--${name} needs a positive whole number, got ${value}`);
  return n;
}
