/**
 * `watch_delivery`: a writer appends one event at a time at a steady rate, and watchers of the
 * session (WatchSession, with snapshots) receive each; per delivery, the time from the append's
 * sending and from its acknowledgement (negative when the event reached the watcher before the
 * writer had its answer), on each route: the writer through instance A and the watchers through
 * instance B on one etcd, both through A, and both through the file store's instance.
 */
import * as http2 from "node:http2";
import { unary } from "../../lib/grpc-clients.js";
import { emit, percentiles, ratio } from "../../lib/report.js";
import { nowMs, phaseEvent, sessionClient } from "../sessions/common.js";
import { rawWatch, type RawWatch } from "../sessions/watchers.js";
import type { Route } from "./instances.js";
import { emptyRpcLatency } from "./references.js";

/** HTTP/2 connections the watchers share at most (browser tabs would each have their own). */
const WATCH_CONNECTIONS = 4;

export interface WatchSettings {
  readonly watchers: readonly number[];
  /** Appends a second, sent on schedule whatever the previous one's answer time. */
  readonly rate: number;
  readonly seconds: number;
}

export async function watchDelivery(routes: readonly Route[], members: number, settings: WatchSettings): Promise<void> {
  for (const watchers of settings.watchers) {
    for (const route of routes) await measure(route, watchers, members, settings);
  }
}

interface Watcher {
  last: number;
  outOfOrder: number;
  received: number;
  caughtUp: boolean;
  ended: string | undefined;
  call: RawWatch | undefined;
}

async function measure(route: Route, watchers: number, members: number, settings: WatchSettings): Promise<void> {
  const sessionId = `watch-${route.name}-${watchers}-${Date.now()}`;
  const writer = sessionClient(route.first.url, { "grpc.use_local_subchannel_pool": 1 });
  const connections = Array.from({ length: Math.min(WATCH_CONNECTIONS, watchers) }, () => http2.connect(route.second.url));
  for (const connection of connections) connection.on("error", () => {});
  const state: Watcher[] = Array.from({ length: watchers }, () => ({
    last: 0,
    outOfOrder: 0,
    received: 0,
    caughtUp: false,
    ended: undefined,
    call: undefined,
  }));
  let closing = false;
  try {
    const empty = await emptyRpcLatency(route.first);
    // The session exists before the watchers come: its first entry is their backlog, not measured.
    const { seq: firstSeq } = await unary<{ seq: number }>(writer, "appendEvent", { sessionId, event: phaseEvent("start") });
    const sentAt = new Map<number, number>();
    const ackedAt = new Map<number, number>();
    /** Per delivery: the seq and when it arrived (wall ms, this process's clock, as the send times). */
    const deliveries: Array<{ seq: number; at: number }> = [];
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${route.name}: not every watcher caught up within 15 s`)), 15_000);
      let caughtUp = 0;
      state.forEach((watcher, i) => {
        watcher.call = rawWatch(
          connections[i % connections.length]!,
          { sessionId, fromSeq: 0, includeSnapshot: true, maxBatch: 0 },
          (message) => {
            if (message.kind === "caughtUp") {
              watcher.caughtUp = true;
              if (++caughtUp === watchers) {
                clearTimeout(timer);
                resolve();
              }
              return;
            }
            if (message.seq !== watcher.last + 1) watcher.outOfOrder++;
            watcher.last = message.seq;
            watcher.received++;
            if (message.seq > firstSeq) deliveries.push({ seq: message.seq, at: nowMs() });
          },
          (status) => {
            if (!closing) watcher.ended = status;
          },
        );
      });
    });

    const total = Math.max(1, Math.round(settings.seconds * settings.rate));
    const interval = 1000 / settings.rate;
    const appendLatency: number[] = [];
    let appendErrors = 0;
    let lastSeq = firstSeq;
    const writerCpuBefore = route.first.cpuMs();
    const watchersCpuBefore = route.second.cpuMs();
    const start = performance.now();
    const appends: Promise<void>[] = [];
    for (let i = 0; i < total; i++) {
      const wait = start + i * interval - performance.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      const sent = nowMs();
      appends.push(
        unary<{ seq: number }>(writer, "appendEvent", { sessionId, event: phaseEvent("live", sent) }).then(
          ({ seq }) => {
            const acked = nowMs();
            sentAt.set(seq, sent);
            ackedAt.set(seq, acked);
            appendLatency.push(acked - sent);
            lastSeq = Math.max(lastSeq, seq);
          },
          () => void appendErrors++,
        ),
      );
    }
    await Promise.all(appends);
    const deadline = performance.now() + 30_000;
    while (state.some((w) => w.last < lastSeq && w.ended === undefined) && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const busyMs = performance.now() - start;
    const writerCpuShare = ratio(route.first.cpuMs() - writerCpuBefore, busyMs);
    const watchersCpuShare = ratio(route.second.cpuMs() - watchersCpuBefore, busyMs);
    const fromSend: number[] = [];
    const afterAck: number[] = [];
    for (const { seq, at } of deliveries) {
      fromSend.push(at - sentAt.get(seq)!);
      afterAck.push(at - ackedAt.get(seq)!);
    }
    const delivery = percentiles(fromSend, [50, 99]);
    emit({
      suite: "etcd",
      figure: "watch_delivery",
      route: route.name,
      store: route.store,
      members: route.store === "etcd" ? members : 0,
      watchers,
      events: total,
      events_per_s: settings.rate,
      with_snapshots: true,
      deliveries: deliveries.length,
      expected_deliveries: total * watchers,
      every_watcher_got_every_event: appendErrors === 0 && state.every((w) => w.received === lastSeq && w.last === lastSeq),
      in_order: state.every((w) => w.outOfOrder === 0),
      watcher_ends: state.filter((w) => w.ended !== undefined).map((w) => w.ended),
      append_errors: appendErrors,
      delivery_from_send: delivery,
      delivery_after_ack: percentiles(afterAck, [50, 99]),
      append_latency: percentiles(appendLatency, [50, 99]),
      empty_rpc_latency: empty,
      // Of one core, while the events were appended and delivered (one figure when both sides are one instance).
      writer_instance_cpu_share: writerCpuShare,
      ...(route.first === route.second ? {} : { watchers_instance_cpu_share: watchersCpuShare }),
      delivery_p99_to_empty_rpc_p50: ratio(delivery.p99_ms!, empty.p50_ms!),
    });
  } finally {
    closing = true;
    for (const watcher of state) watcher.call?.cancel();
    writer.close();
    for (const connection of connections) connection.close();
  }
}
