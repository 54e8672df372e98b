/**
 * `append_round_trips`: what an AppendEvent through berth costs in etcd calls, one append at a
 * time, counted by etcd itself (its gRPC server's counters on `/metrics`, summed over the members,
 * read before and after while nothing else talks to etcd) and timed beside an empty RPC on the
 * same instance and one append-shaped transaction sent by this process:
 *
 * - `same_session`: appends to one session through one instance (its head and snapshot known there);
 * - `new_session`: each append the first of a new session;
 * - `alternating_instances`: one session, appends through A and B in turn (each finds its head moved).
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
import { difference, etcdCalls, perOperation, unarySum } from "./etcd-calls.js";
import { emptyRpcLatency } from "./references.js";

type Scenario = "same_session" | "new_session" | "alternating_instances";

export async function appendRoundTrips(
  a: BenchServer,
  b: BenchServer,
  etcd: EtcdClient,
  memberUrls: readonly string[],
  members: number,
  seconds: number,
): Promise<void> {
  const clientA = sessionClient(a.url, { "grpc.use_local_subchannel_pool": 1 });
  const clientB = sessionClient(b.url, { "grpc.use_local_subchannel_pool": 1 });
  const run = Date.now();
  const ms = seconds * 1000;
  try {
    const append = (client: grpc.Client, sessionId: string) => unary(client, "appendEvent", { sessionId, event: phaseEvent("writing") });
    // Warm both instances (connections, JIT) and give the alternating session its first entries.
    await closedLoop(1, 500, (_, i) => append(i % 2 === 0 ? clientA : clientB, `rt-${run}-warm`));
    const emptyBefore = await emptyRpcLatency(a);
    const figures = new Map<Scenario, { latency: Record<string, number>; appends: number; calls: Map<string, number>; cpuMs: number }>();
    const scenarios: Array<[Scenario, (i: number) => Promise<unknown>]> = [
      ["same_session", () => append(clientA, `rt-${run}-same`)],
      ["new_session", (i) => append(clientA, `rt-${run}-new-${i}`)],
      ["alternating_instances", (i) => append(i % 2 === 0 ? clientA : clientB, `rt-${run}-warm`)],
    ];
    for (const [scenario, call] of scenarios) {
      if (scenario === "same_session") await call(-1);
      const before = await etcdCalls(memberUrls);
      const cpuBefore = a.cpuMs() + b.cpuMs();
      const result = await closedLoop(1, ms, (_, i) => call(i));
      const cpuMs = a.cpuMs() + b.cpuMs() - cpuBefore;
      // Writes the instances do after answering (snapshot caching) are counted with the appends that caused them.
      await new Promise((resolve) => setTimeout(resolve, 200));
      const calls = difference(await etcdCalls(memberUrls), before);
      const latency = percentiles(result.latenciesMs, [50, 99]);
      figures.set(scenario, { latency, appends: result.ops, calls, cpuMs });
      emit({
        suite: "etcd",
        figure: "append_etcd_calls",
        scenario,
        members,
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
    const steady = figures.get("same_session")!;
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
    clientA.close();
    clientB.close();
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
