/**
 * `lock_handoff`: a lock passed from its holder to a waiter already queued (Inspect shows it; on
 * etcd, etcd has also received its watch), one handoff at a time,
 * timed from the holder letting go (its Release sent, or its Hold stream cancelled) to the
 * waiter's grant arriving, on each route: the holder through instance A and the waiter through
 * instance B on one etcd, both through A, and both through the file store's instance. On etcd,
 * etcd's own handoff (mutex-reference.ts: a Mutex as etcd's client takes it, no berth in between)
 * is measured right before and right after, and the handoff is read against it.
 */
import type * as grpc from "@grpc/grpc-js";
import type { EtcdClient } from "@berth/etcd";
import { unary } from "../../lib/grpc-clients.js";
import { emit, percentiles, ratio } from "../../lib/report.js";
import { holdSection, leaseSection, lockClient, withTimeout, type SectionMode } from "../locks.js";
import { difference, etcdCalls, perOperation, watchOpened, watchRequests, type Calls } from "./etcd-calls.js";
import type { Route } from "./instances.js";
import { startMutexReference, type MutexReference, type MutexSamples } from "./mutex-reference.js";
import { emptyRpcLatency, etcdPutLatency } from "./references.js";

/** Unmeasured handoffs first on each route (connections, JIT, the instances' caches). */
const WARM_HANDOFFS = 10;

export interface HandoffSettings {
  readonly handoffs: number;
  /** A directory that exists: the locked files are named in it (the service makes paths canonical). */
  readonly project: string;
}

/** The most a handoff across two instances may take, in etcd's own handoffs (the p50s of one run). */
const TARGET_HANDOFF_TO_ETCD_MUTEX = 1.5;

/** etcd: berth's client (for the round-trip reference), the endpoints (leader first: etcd's own handoff) and the members' URLs (their call counters). */
export interface HandoffEtcd {
  readonly client: EtcdClient;
  readonly endpoints: readonly string[];
  readonly memberUrls: readonly string[];
}

export async function lockHandoff(routes: readonly Route[], etcd: HandoffEtcd, members: number, settings: HandoffSettings): Promise<void> {
  const mutex = await startMutexReference(etcd.endpoints, etcd.memberUrls);
  try {
    for (const mode of ["lease", "hold"] as const satisfies readonly SectionMode[]) {
      for (const route of routes) await handoffs(route, mode, etcd, mutex, members, settings);
    }
  } finally {
    mutex.close();
  }
}

async function handoffs(route: Route, mode: SectionMode, etcd: HandoffEtcd, mutex: MutexReference, members: number, settings: HandoffSettings): Promise<void> {
  const file = `${settings.project}/handoff-${route.name}-${mode}-${Date.now()}.ts`;
  // Each side on its own connection, as two machines' clients would be; Inspect on a third.
  const holder = lockClient(route.first.url);
  const waiter = lockClient(route.second.url);
  const inspector = lockClient(route.first.url);
  const take = (client: grpc.Client, owner: string) => (mode === "lease" ? leaseSection(client, file, owner) : holdSection(client, file, owner));
  const handoff: number[] = [];
  const release: number[] = [];
  let tokensFallen = 0;
  /** etcd's calls from each release to its grant, summed over the measured handoffs. */
  const calls: Calls = new Map();
  try {
    const emptyBefore = await emptyRpcLatency(route.first);
    const etcdBefore = route.store === "etcd" ? await etcdPutLatency(etcd.client) : undefined;
    // Half of etcd's own handoffs before berth's, half after: the machine's load drifts.
    const referenceHandoffs = Math.max(20, Math.ceil(settings.handoffs / 2));
    const mutexBefore = route.store === "etcd" ? await mutex.measure(referenceHandoffs) : undefined;
    for (let i = 0; i < WARM_HANDOFFS + settings.handoffs; i++) {
      const held = await take(holder, "holder");
      const watchesBefore = route.store === "etcd" ? await watchRequests(etcd.memberUrls) : undefined;
      const granted = take(waiter, "waiter").then((section) => ({ section, at: performance.now() }));
      granted.catch(() => {});
      // The waiter is queued (its grant can only come from this release) before the holder lets go.
      await queued(inspector, file);
      // On etcd, also its watch: the waiter's instance waits in etcd, as etcd's own reference's waiter does.
      if (watchesBefore !== undefined) await watchOpened(etcd.memberUrls, watchesBefore);
      const measured = i >= WARM_HANDOFFS;
      const callsBefore = measured && route.store === "etcd" ? await etcdCalls(etcd.memberUrls) : undefined;
      const releasedAt = performance.now();
      await held.release();
      const releaseAnswered = performance.now();
      const next = await withTimeout(granted, 30_000, `${route.name} ${mode}: no grant within 30 s of the release`);
      if (next.section.fencingToken <= held.fencingToken) tokensFallen++;
      if (callsBefore) {
        for (const [method, n] of difference(await etcdCalls(etcd.memberUrls), callsBefore)) calls.set(method, (calls.get(method) ?? 0) + n);
      }
      if (measured) {
        handoff.push(next.at - releasedAt);
        if (mode === "lease") release.push(releaseAnswered - releasedAt);
      }
      await next.section.release();
    }
    const emptyAfter = await emptyRpcLatency(route.first);
    const etcdAfter = route.store === "etcd" ? await etcdPutLatency(etcd.client) : undefined;
    const mutexAfter = route.store === "etcd" ? await mutex.measure(referenceHandoffs) : undefined;
    const latency = percentiles(handoff, [50, 99]);
    // Each reference is the mean of the two measured around the handoffs (the machine's load drifts).
    const reference = meanOf(emptyBefore, emptyAfter);
    const etcdRoundTrip = etcdBefore && etcdAfter ? meanOf(etcdBefore, etcdAfter) : undefined;
    const releaseLatency = percentiles(release, [50, 99]);
    const etcdMutex = mutexBefore && mutexAfter ? emitMutexReference(route, mode, members, mutexBefore, mutexAfter) : undefined;
    emit({
      suite: "etcd",
      figure: "lock_handoff",
      route: route.name,
      store: route.store,
      members: route.store === "etcd" ? members : 0,
      mode,
      handoffs: handoff.length,
      handoff_latency: latency,
      ...(mode === "lease" ? { release_rpc_latency: releaseLatency } : {}),
      empty_rpc_latency: reference,
      handoff_p50_to_empty_rpc_p50: ratio(latency.p50_ms!, reference.p50_ms!),
      ...(etcdRoundTrip
        ? {
            etcd_put_latency: etcdRoundTrip,
            handoff_p50_beyond_empty_rpc_in_etcd_puts: ratio(latency.p50_ms! - reference.p50_ms!, etcdRoundTrip.p50_ms!),
            etcd_calls_per_handoff: perOperation(calls, handoff.length),
          }
        : {}),
      ...(etcdMutex
        ? {
            etcd_mutex_handoff_latency: etcdMutex,
            handoff_p50_to_etcd_mutex_p50: ratio(latency.p50_ms!, etcdMutex.p50_ms!),
            ...(route.name === "etcd_two_instances" ? { target_handoff_p50_to_etcd_mutex_p50: TARGET_HANDOFF_TO_ETCD_MUTEX } : {}),
          }
        : {}),
      tokens_fallen: tokensFallen,
      target_tokens_fallen: 0,
    });
  } finally {
    holder.close();
    waiter.close();
    inspector.close();
  }
}

/** Emits etcd's own handoff, measured around `route`'s, and returns its p50 and p99 (delete → the waiter's watch event). */
function emitMutexReference(route: Route, mode: SectionMode, members: number, before: MutexSamples, after: MutexSamples): Record<string, number> {
  const handoff = percentiles([...before.handoff, ...after.handoff], [50, 99]);
  const handoffs = before.handoff.length + after.handoff.length;
  const calls: Calls = new Map(before.calls);
  for (const [method, n] of after.calls) calls.set(method, (calls.get(method) ?? 0) + n);
  emit({
    suite: "etcd",
    figure: "etcd_mutex_handoff",
    around: route.name,
    around_mode: mode,
    members,
    handoffs,
    handoff_latency: handoff,
    lock_return_latency: percentiles([...before.lockReturn, ...after.lockReturn], [50, 99]),
    handoff_p50_before_after: [percentiles(before.handoff, [50]).p50_ms, percentiles(after.handoff, [50]).p50_ms],
    etcd_calls_per_handoff: perOperation(calls, handoffs),
  });
  return handoff;
}

/** Resolves once Inspect shows `file` held with a waiter behind its holder (10 s at most). */
async function queued(inspector: grpc.Client, file: string): Promise<void> {
  const deadline = performance.now() + 10_000;
  for (;;) {
    const state = await unary<{ holder?: unknown; waiters?: unknown[] }>(inspector, "inspect", { file });
    if (state.holder && (state.waiters?.length ?? 0) >= 1) return;
    if (performance.now() > deadline) throw new Error(`no waiter for ${file} showed up within 10 s`);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

/** The mean of two `percentiles` results, rank by rank. */
function meanOf(a: Record<string, number>, b: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.keys(a).map((rank) => [rank, Math.round(((a[rank]! + b[rank]!) / 2) * 1000) / 1000]));
}
