/**
 * `lock_handoff`: a lock passed from its holder to a waiter already queued, one handoff at a time,
 * timed from the holder letting go (its Release sent, or its Hold stream cancelled) to the
 * waiter's grant arriving, on each route: the holder through instance A and the waiter through
 * instance B on one etcd, both through A, and both through the file store's instance.
 */
import type * as grpc from "@grpc/grpc-js";
import type { EtcdClient } from "@berth/etcd";
import { unary } from "../../lib/grpc-clients.js";
import { emit, percentiles, ratio } from "../../lib/report.js";
import { holdSection, leaseSection, lockClient, withTimeout, type SectionMode } from "../locks.js";
import { difference, etcdCalls, perOperation, type Calls } from "./etcd-calls.js";
import type { Route } from "./instances.js";
import { emptyRpcLatency, etcdPutLatency } from "./references.js";

/** Unmeasured handoffs first on each route (connections, JIT, the instances' caches). */
const WARM_HANDOFFS = 10;

export interface HandoffSettings {
  readonly handoffs: number;
  /** A directory that exists: the locked files are named in it (the service makes paths canonical). */
  readonly project: string;
}

/** etcd: berth's client (for the round-trip reference) and the members' URLs (for their call counters). */
export interface HandoffEtcd {
  readonly client: EtcdClient;
  readonly memberUrls: readonly string[];
}

export async function lockHandoff(routes: readonly Route[], etcd: HandoffEtcd, members: number, settings: HandoffSettings): Promise<void> {
  for (const mode of ["lease", "hold"] as const satisfies readonly SectionMode[]) {
    for (const route of routes) await handoffs(route, mode, etcd, members, settings);
  }
}

async function handoffs(route: Route, mode: SectionMode, etcd: HandoffEtcd, members: number, settings: HandoffSettings): Promise<void> {
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
    for (let i = 0; i < WARM_HANDOFFS + settings.handoffs; i++) {
      const held = await take(holder, "holder");
      const granted = take(waiter, "waiter").then((section) => ({ section, at: performance.now() }));
      granted.catch(() => {});
      // The waiter is queued (its grant can only come from this release) before the holder lets go.
      await queued(inspector, file);
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
    const latency = percentiles(handoff, [50, 99]);
    // Each reference is the mean of the two measured around the handoffs (the machine's load drifts).
    const reference = meanOf(emptyBefore, emptyAfter);
    const etcdRoundTrip = etcdBefore && etcdAfter ? meanOf(etcdBefore, etcdAfter) : undefined;
    const releaseLatency = percentiles(release, [50, 99]);
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
      tokens_fallen: tokensFallen,
      target_tokens_fallen: 0,
    });
  } finally {
    holder.close();
    waiter.close();
    inspector.close();
  }
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
