/**
 * `append_round_trips`: what an AppendEvent through berth costs in etcd calls, counted by etcd
 * itself (its gRPC server's counters on `/metrics`, summed over the members, read before and after
 * while nothing else talks to etcd) and timed beside an empty RPC on the same instance and one
 * append-shaped transaction sent by this process:
 *
 * - `same_session`: appends to one session through one instance (its head and snapshot known there);
 * - `new_session`: each append the first of a new session;
 * - `alternating_instances`: one session, appends one at a time through 2 (A, B) and then 3
 *   instances (A, B, C) in turn: each append finds that another instance appended since its own;
 * - `spread_clients`: 16 clients, a session each, each client's appends through the 2 (then 3)
 *   instances in turn;
 * - `spread_clients_one_session`: the same 16 clients on one session: the instances also race each
 *   other for the head, and an instance's appends queued behind each other go in one transaction.
 *
 * Each scenario's sessions first get one append through every instance it uses, not counted: the
 * figures are of an instance that has appended to the session before (a session new to an
 * instance costs its first append a retry and a rebuild, once).
 *
 * The summary figure reads the claim "an append costs at most one etcd round trip beyond the RPC"
 * two ways: the etcd calls per steady append, and (append p50 − empty RPC p50) / one txn's p50.
 */
import { compare, op, type EtcdClient } from "@berth/etcd";
import type * as grpc from "@grpc/grpc-js";
import { emptyRpcReference, unary } from "../../lib/grpc-clients.js";
import { closedLoop } from "../../lib/load.js";
import { emit, percentiles, ratio } from "../../lib/report.js";
import type { BenchServer } from "../../lib/server.js";
import { phaseEvent, sessionClient } from "../sessions/common.js";
import { difference, etcdCalls, perOperation, unarySum, type Calls } from "./etcd-calls.js";
import { emptyRpcLatency } from "./references.js";

type ScenarioName = "same_session" | "new_session" | "alternating_instances" | "spread_clients" | "spread_clients_one_session";

interface Scenario {
  readonly scenario: ScenarioName;
  /** How many instances its appends go through. */
  readonly instances: number;
  readonly clients: number;
  /** Client `worker`'s `i`th append (negative `i`: the uncounted ones first). */
  call(worker: number, i: number): Promise<unknown>;
}

/** Clients spreading their appends over the instances. */
const SPREAD_CLIENTS = 16;

/**
 * Runs the scenarios through `servers` (A, B and, when given, C: the 3-instance scenarios need
 * it), then the summary.
 */
export async function appendRoundTrips(
  servers: readonly BenchServer[],
  etcd: EtcdClient,
  memberUrls: readonly string[],
  members: number,
  seconds: number,
): Promise<void> {
  const a = servers[0]!;
  const clients = servers.map((server) => sessionClient(server.url, { "grpc.use_local_subchannel_pool": 1 }));
  const run = Date.now();
  const ms = seconds * 1000;
  try {
    const append = (client: grpc.Client, sessionId: string) => unary(client, "appendEvent", { sessionId, event: phaseEvent("writing") });
    /** The instance of a client's `i`th append when it goes through `n` instances in turn. */
    const through = (n: number, worker: number, i: number) => clients[(((worker + i) % n) + n) % n]!;
    // Warm every instance (connections, JIT).
    await closedLoop(1, 500, (_, i) => append(through(clients.length, 0, i), `rt-${run}-warm`));
    const emptyBefore = await emptyRpcLatency(a);
    const scenarios: Scenario[] = [
      { scenario: "same_session", instances: 1, clients: 1, call: () => append(clients[0]!, `rt-${run}-same`) },
      { scenario: "new_session", instances: 1, clients: 1, call: (_, i) => append(clients[0]!, `rt-${run}-new-${i}`) },
    ];
    for (let n = 2; n <= clients.length; n++) {
      scenarios.push(
        { scenario: "alternating_instances", instances: n, clients: 1, call: (_, i) => append(through(n, 0, i), `rt-${run}-alt${n}`) },
        { scenario: "spread_clients", instances: n, clients: SPREAD_CLIENTS, call: (w, i) => append(through(n, w, i), `rt-${run}-spread${n}-${w}`) },
        { scenario: "spread_clients_one_session", instances: n, clients: SPREAD_CLIENTS, call: (w, i) => append(through(n, w, i), `rt-${run}-one${n}`) },
      );
    }
    let steady: { latency: Record<string, number>; appends: number; calls: Calls; cpuMs: number } | undefined;
    for (const s of scenarios) {
      const used = servers.slice(0, Math.max(s.instances, 1));
      // Every session of the scenario gets an append through each of its instances first.
      await Promise.all(
        Array.from({ length: s.clients }, async (_, w) => {
          for (let i = -s.instances; i < 0; i++) await s.call(w, i);
        }),
      );
      const before = await etcdCalls(memberUrls);
      const cpuBefore = used.reduce((sum, server) => sum + server.cpuMs(), 0);
      const result = await closedLoop(s.clients, ms, (w, i) => s.call(w, i));
      const cpuMs = used.reduce((sum, server) => sum + server.cpuMs(), 0) - cpuBefore;
      // Writes the instances do after answering (snapshot caching) are counted with the appends that caused them.
      await new Promise((resolve) => setTimeout(resolve, 200));
      const calls = difference(await etcdCalls(memberUrls), before);
      const latency = percentiles(result.latenciesMs, [50, 99]);
      if (s.scenario === "same_session") steady = { latency, appends: result.ops, calls, cpuMs };
      emit({
        suite: "etcd",
        figure: "append_etcd_calls",
        scenario: s.scenario,
        members,
        instances: s.instances,
        clients: s.clients,
        appends: result.ops,
        append_latency: latency,
        etcd_calls_per_append: perOperation(calls, result.ops),
        etcd_unary_calls_per_append: ratio(unarySum(calls), result.ops),
        instance_cpu_ms_per_append: ratio(cpuMs, result.ops),
        errors: result.errors,
        ...(result.firstError ? { first_error: String(result.firstError) } : {}),
      });
    }
    const cpuBefore = a.cpuMs();
    const emptyAfter = await emptyRpcReference(a.url, 1, 1_000);
    const emptyCpuMs = a.cpuMs() - cpuBefore;
    const txnCpu = process.cpuUsage();
    const txn = await appendShapedTxn(etcd, `rt-${run}-txn`, ms);
    const txnCpuUsed = process.cpuUsage(txnCpu);
    const txnCpuMs = (txnCpuUsed.user + txnCpuUsed.system) / 1000;
    const empty = Math.round(((emptyBefore.p50_ms! + percentiles(emptyAfter.latenciesMs).p50_ms!) / 2) * 1000) / 1000;
    if (steady === undefined) throw new Error("same_session was not measured");
    const beyond = Math.round((steady.latency.p50_ms! - empty) * 1000) / 1000;
    emit({
      suite: "etcd",
      figure: "append_round_trips",
      members,
      append_p50_ms: steady.latency.p50_ms,
      empty_rpc_p50_ms: empty,
      append_beyond_empty_rpc_p50_ms: beyond,
      etcd_txn_p50_ms: txn.p50_ms,
      beyond_in_etcd_txns: ratio(beyond, txn.p50_ms),
      etcd_unary_calls_per_append: ratio(unarySum(steady.calls), steady.appends),
      instance_cpu_ms_per_append: ratio(steady.cpuMs, steady.appends),
      instance_cpu_ms_per_empty_rpc: ratio(emptyCpuMs, emptyAfter.ops),
      bench_cpu_ms_per_etcd_txn: ratio(txnCpuMs, txn.calls),
      target_etcd_round_trips_per_append: 1,
    });
  } finally {
    for (const client of clients) client.close();
  }
}

/** One transaction at a time shaped as a steady append is (the head's compare, the entry and the new head), from this process. */
async function appendShapedTxn(etcd: EtcdClient, session: string, ms: number): Promise<{ p50_ms: number; p99_ms: number; calls: number }> {
  const entry = "x".repeat(200);
  let mod = 0n;
  const result = await closedLoop(1, ms, async (_, i) => {
    const done = await etcd.txn({
      compare: [compare.mod(`h/${session}`, "==", mod)],
      success: [op.put(`e/${session}/${String(i + 1).padStart(20, "0")}`, entry), op.put(`h/${session}`, JSON.stringify({ seq: i + 1 }))],
      failure: [op.get({ key: `h/${session}` })],
    });
    if (!done.succeeded) throw new Error("the bench's own head moved");
    mod = done.revision;
  });
  const { p50_ms, p99_ms } = percentiles(result.latenciesMs, [50, 99]);
  return { p50_ms: p50_ms!, p99_ms: p99_ms!, calls: result.ops };
}
