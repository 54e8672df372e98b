import { fileURLToPath } from "node:url";
import * as http2 from "node:http2";
import * as grpc from "@grpc/grpc-js";
import { create, toBinary } from "@bufbuild/protobuf";
import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { WatchSessionRequestSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { emptyRpcReference, unary } from "../../lib/grpc-clients.js";
import { emit, percentiles } from "../../lib/report.js";
import { startBenchServer } from "../../lib/server.js";
import { warmUp } from "./append.js";
import { type Options, nowMs, phaseEvent, round, sessionClient } from "./common.js";
import { startScript } from "./processes.js";

export interface WatchMessage {
  kind: "entries" | "caughtUp" | "progress";
  caughtUp?: { lastSeq: number };
}

/** What the lean watcher client reads of a WatchSessionResponse. */
export interface LeanWatchMessage {
  kind: "entry" | "caughtUp" | undefined;
  /** The entry's seq, or the caught-up marker's last seq. */
  seq: number;
  /** The entry's `agent_phase.at` (the append's send time), when set. */
  at: number | undefined;
  /** Bytes of the snapshot field (0: none). */
  snapshotBytes: number;
}

const WATCH_SESSION_PATH = "/berth.sessions.v1.SessionService/WatchSession";

/** One raw WatchSession call: cancel it, or learn how it ended (its grpc-status). */
export interface RawWatch {
  cancel(): void;
  status: string | undefined;
}

/**
 * A WatchSession call made with node:http2 directly, reading each message with a few varint reads
 * instead of a full decode (seq, the send time in `agent_phase.at`, whether a snapshot came). It
 * is plain gRPC on the wire; what it saves is the client's per-message cost: a hundred grpc-js
 * watchers decoding every snapshot in the bench process cost about as much CPU as the service,
 * and on a 2-core machine the figures would then measure the client.
 */
export function rawWatch(
  session: http2.ClientHttp2Session,
  request: { sessionId: string; fromSeq: number; includeSnapshot: boolean; maxBatch: number },
  onMessage: (message: LeanWatchMessage) => void,
  onEnd: (status: string) => void,
): RawWatch {
  const body = toBinary(
    WatchSessionRequestSchema,
    create(WatchSessionRequestSchema, {
      sessionId: request.sessionId,
      fromSeq: BigInt(request.fromSeq),
      includeSnapshot: request.includeSnapshot,
      maxBatch: request.maxBatch,
    }),
  );
  const frame = Buffer.alloc(5 + body.length);
  frame.writeUInt32BE(body.length, 1);
  frame.set(body, 5);
  const stream = session.request({ ":method": "POST", ":path": WATCH_SESSION_PATH, "content-type": "application/grpc", te: "trailers" });
  const watch: RawWatch = {
    status: undefined,
    cancel: () => {
      if (!stream.closed) stream.close(http2.constants.NGHTTP2_CANCEL);
    },
  };
  let pending: Buffer = Buffer.alloc(0);
  stream.on("data", (chunk: Buffer) => {
    pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
    while (pending.length >= 5) {
      const length = pending.readUInt32BE(1);
      if (pending.length < 5 + length) break;
      for (const message of decodeWatchMessage(pending.subarray(5, 5 + length))) onMessage(message);
      pending = pending.subarray(5 + length);
    }
  });
  stream.on("trailers", (trailers) => {
    watch.status = String(trailers["grpc-status"] ?? "");
  });
  stream.on("error", () => {});
  stream.on("close", () => onEnd(watch.status ?? "closed without a status"));
  stream.end(frame);
  return watch;
}

/** One WatchSession message as the entries (or marker) it carries; progress messages carry none. */
function decodeWatchMessage(buffer: Buffer): LeanWatchMessage[] {
  const reader = new BinaryReader(buffer);
  while (reader.pos < reader.len) {
    const [no, wireType] = reader.tag();
    if (no === 1 && wireType === WireType.LengthDelimited) {
      // WatchedEntries: repeated WatchedEntry (entry = 1, snapshot = 2) in field 1.
      const batch = new BinaryReader(reader.bytes());
      const entries: LeanWatchMessage[] = [];
      while (batch.pos < batch.len) {
        const [n, w] = batch.tag();
        if (n !== 1 || w !== WireType.LengthDelimited) {
          batch.skip(w, n);
          continue;
        }
        const watched = new BinaryReader(batch.bytes());
        const one: LeanWatchMessage = { kind: "entry", seq: 0, at: undefined, snapshotBytes: 0 };
        while (watched.pos < watched.len) {
          const [m, x] = watched.tag();
          if (m === 1 && x === WireType.LengthDelimited) readEntry(watched.bytes(), one);
          else if (m === 2 && x === WireType.LengthDelimited) one.snapshotBytes = watched.bytes().length;
          else watched.skip(x, m);
        }
        entries.push(one);
      }
      return entries;
    } else if (no === 2 && wireType === WireType.LengthDelimited) {
      const out: LeanWatchMessage = { kind: "caughtUp", seq: 0, at: undefined, snapshotBytes: 0 };
      const marker = new BinaryReader(reader.bytes());
      while (marker.pos < marker.len) {
        const [n, w] = marker.tag();
        if (n === 1 && w === WireType.Varint) out.seq = Number(marker.uint64());
        else marker.skip(w, n);
      }
      return [out];
    } else reader.skip(wireType, no);
  }
  return [];
}

/** JournalEntry: seq = 1, event = 5 → Event.agent_phase = 4 → AgentPhaseEvent.at = 2. */
function readEntry(bytes: Uint8Array, out: LeanWatchMessage): void {
  const reader = new BinaryReader(bytes);
  while (reader.pos < reader.len) {
    const [no, wireType] = reader.tag();
    if (no === 1 && wireType === WireType.Varint) out.seq = Number(reader.uint64());
    else if (no === 5 && wireType === WireType.LengthDelimited) {
      const event = new BinaryReader(reader.bytes());
      while (event.pos < event.len) {
        const [n, w] = event.tag();
        if (n === 4 && w === WireType.LengthDelimited) {
          const phase = new BinaryReader(event.bytes());
          while (phase.pos < phase.len) {
            const [m, x] = phase.tag();
            if (m === 2 && x === WireType.Bit64) out.at = phase.double();
            else phase.skip(x, m);
          }
        } else event.skip(w, n);
      }
    } else reader.skip(wireType, no);
  }
}

interface WatchRun {
  watchers: number;
  events: number;
  seconds: number;
  eventsPerSecond: number;
  everyWatcherGotEveryEvent: boolean;
  inOrder: boolean;
  everyDeliveryHadSnapshot: boolean;
  deliveries: number;
  watcherErrors: number;
  /** grpc-status of the watches that ended on their own (not resumable). */
  watcherEndStatuses: string[];
  /** Watches the service ended for falling behind, resumed from the next seq. */
  watcherResumes: number;
  appendErrors: number;
  delivery: Record<string, number>;
  append: Record<string, number>;
  serverCpuShare: number;
  serverCpuUsPerDelivery: number;
  /** CPU of the bench process (appender and watchers) over the run, as a share of one core. */
  benchCpuShare: number;
}

/**
 * `watchers` watchers of one session (with snapshots) while `rate` events a second are appended
 * for `seconds`: whether each watcher got every entry, in order, and the latency from the append
 * call to each delivery. Appends are sent open loop (on schedule, whatever the previous one's
 * answer time), so the rate is the one asked for even when the watchers slow the service down.
 */
async function measureWatchers(
  url: string,
  serverCpuMs: () => number,
  sessionId: string,
  watchers: number,
  rate: number,
  seconds: number,
  maxBatch = 0,
): Promise<WatchRun> {
  // The appender on a connection of its own, the watchers spread over ten more (browser tabs would
  // each have their own): answers to appends do not queue behind the watchers' stream data.
  const client = sessionClient(url, { "grpc.use_local_subchannel_pool": 1 });
  const connections = Array.from({ length: Math.min(10, watchers) }, () => http2.connect(url));
  for (const connection of connections) connection.on("error", () => {});
  let closing = false;
  let stateOf: Array<{ call?: RawWatch | undefined }> = [];
  try {
    const latencies: number[] = [];
    const state = Array.from({ length: watchers }, () => ({
      last: 0,
      outOfOrder: 0,
      received: 0,
      /** Live entries (after caught-up) that came without their snapshot. */
      withoutSnapshot: 0,
      live: false,
      resumes: 0,
      /** How the watch ended, when it ended other than by falling behind (which is resumed). */
      ended: undefined as string | undefined,
      call: undefined as RawWatch | undefined,
    }));
    stateOf = state;
    const failed = (w: (typeof state)[number]) => w.ended !== undefined;
    let caughtUp = 0;
    let allCaughtUp: () => void = () => {};
    // A watcher the service ends for falling behind (RESOURCE_EXHAUSTED) resumes after the last
    // entry it got, as a client should; so "every event" holds through an overload too.
    const open = (watcher: (typeof state)[number], i: number, fromSeq: number) => {
      watcher.live = false;
      watcher.call = rawWatch(
        connections[i % connections.length]!,
        { sessionId, fromSeq, includeSnapshot: true, maxBatch },
        (message) => {
          if (message.kind === "caughtUp") {
            watcher.live = true;
            if (watcher.resumes === 0 && ++caughtUp === watchers) allCaughtUp();
            return;
          }
          if (message.at !== undefined) latencies.push(nowMs() - message.at);
          if (message.seq !== watcher.last + 1) watcher.outOfOrder++;
          if (watcher.live && message.snapshotBytes === 0) watcher.withoutSnapshot++;
          watcher.last = message.seq;
          watcher.received++;
        },
        (status) => {
          if (closing) return;
          if (status === String(grpc.status.RESOURCE_EXHAUSTED)) {
            watcher.resumes++;
            open(watcher, i, watcher.last + 1);
          } else watcher.ended = status;
        },
      );
    };
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`only ${caughtUp} of ${watchers} watchers caught up within 15 s`)), 15_000);
      allCaughtUp = () => {
        clearTimeout(timer);
        resolve();
      };
      state.forEach((watcher, i) => open(watcher, i, 0));
    });

    const total = Math.round(seconds * rate);
    const interval = 1000 / rate;
    const appendLatencies: number[] = [];
    let lastSeq = 0;
    let appendErrors = 0;
    const cpuBefore = serverCpuMs();
    const benchCpuBefore = process.cpuUsage();
    const start = performance.now();
    const appends: Promise<void>[] = [];
    for (let i = 0; i < total; i++) {
      const wait = start + i * interval - performance.now();
      if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
      const t0 = performance.now();
      appends.push(
        unary<{ seq: number }>(client, "appendEvent", { sessionId, event: phaseEvent("live", nowMs()) }).then(
          (res) => {
            appendLatencies.push(performance.now() - t0);
            lastSeq = Math.max(lastSeq, res.seq);
          },
          () => void appendErrors++,
        ),
      );
    }
    await Promise.all(appends);
    const appendedIn = performance.now() - start;
    const deadline = performance.now() + 30_000;
    while (state.some((w) => w.last < lastSeq && !failed(w)) && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const busyFor = performance.now() - start;
    const cpuMs = serverCpuMs() - cpuBefore;
    const benchCpu = process.cpuUsage(benchCpuBefore);
    return {
      benchCpuShare: round((benchCpu.user + benchCpu.system) / 1000 / busyFor, 3),
      watchers,
      events: total,
      seconds: round(appendedIn / 1000, 1),
      eventsPerSecond: Math.round((total / appendedIn) * 1000),
      everyWatcherGotEveryEvent: appendErrors === 0 && state.every((w) => w.received === total && w.last === lastSeq),
      inOrder: state.every((w) => w.outOfOrder === 0),
      everyDeliveryHadSnapshot: state.every((w) => w.withoutSnapshot === 0),
      deliveries: latencies.length,
      watcherErrors: state.filter(failed).length,
      watcherEndStatuses: state.filter(failed).map((w) => w.ended!),
      watcherResumes: state.reduce((sum, w) => sum + w.resumes, 0),
      appendErrors,
      delivery: percentiles(latencies),
      append: percentiles(appendLatencies),
      serverCpuShare: round(cpuMs / busyFor, 3),
      serverCpuUsPerDelivery: Math.round((cpuMs * 1000) / Math.max(1, latencies.length)),
    };
  } finally {
    closing = true;
    for (const watcher of stateOf) watcher.call?.cancel();
    client.close();
    for (const connection of connections) connection.close();
  }
}

function watchFigure(figure: string, run: WatchRun): Record<string, unknown> {
  return {
    suite: "sessions",
    figure,
    watchers: run.watchers,
    events: run.events,
    seconds: run.seconds,
    events_per_s: run.eventsPerSecond,
    with_snapshots: true,
    every_delivery_had_its_snapshot: run.everyDeliveryHadSnapshot,
    every_watcher_got_every_event: run.everyWatcherGotEveryEvent,
    in_order: run.inOrder,
    deliveries: run.deliveries,
    expected_deliveries: run.events * run.watchers,
    watcher_errors: run.watcherErrors,
    watcher_end_statuses: [...new Set(run.watcherEndStatuses)],
    watcher_resumes_after_lag: run.watcherResumes,
    append_errors: run.appendErrors,
    delivery_p50_ms: run.delivery.p50_ms,
    delivery_p99_ms: run.delivery.p99_ms,
    append_p50_ms: run.append.p50_ms,
    append_p99_ms: run.append.p99_ms,
    server_cpu_share: run.serverCpuShare,
    server_cpu_us_per_delivery: run.serverCpuUsPerDelivery,
    bench_client_cpu_share: run.benchCpuShare,
  };
}

/**
 * The watcher figures: berth at the asked rate; the same load on a bare connect-node server (no
 * interceptors, no store: each append is fanned out as a pre-encoded message) as the reference for
 * what the RPC framework alone costs per streamed message; and berth at a lower rate.
 */
export async function watchers(options: Options): Promise<void> {
  const server = await startBenchServer("sessions", ["--fsync=batch"]);
  let berth: WatchRun;
  let batched: WatchRun;
  let low: WatchRun;
  let emptyP50: number | undefined;
  let emptyP99: number | undefined;
  try {
    const client = sessionClient(server.url);
    await warmUp(server, client);
    client.close();
    const empty = await emptyRpcReference(server.url, 1, 2000);
    ({ p50_ms: emptyP50, p99_ms: emptyP99 } = percentiles(empty.latenciesMs));
    berth = await measureWatchers(server.url, server.cpuMs, "watched", options.watchers, options.eventsPerSecond, options.watchSeconds);
    batched = await measureWatchers(
      server.url,
      server.cpuMs,
      "watched-batched",
      options.watchers,
      options.eventsPerSecond,
      options.watchSeconds,
      WATCH_MAX_BATCH,
    );
    low = await measureWatchers(server.url, server.cpuMs, "watched-low", options.watchers, options.lowEventsPerSecond, options.watchSeconds);
  } finally {
    await server.stop();
  }
  const bare = await startScript(BARE_CONNECT_SERVER, []);
  let reference: WatchRun;
  try {
    reference = await measureWatchers(bare.url, bare.cpuMs, "watched", options.watchers, options.eventsPerSecond, options.watchSeconds);
  } finally {
    await bare.stop();
  }
  emit({
    ...watchFigure("watchers_live", berth),
    target_delivery_p99_ms: 50,
    meets_target: berth.everyWatcherGotEveryEvent && berth.inOrder && (berth.delivery.p99_ms ?? Infinity) <= 50,
    ref_empty_rpc_p50_ms: emptyP50,
    ref_empty_rpc_p99_ms: emptyP99,
    ref_bare_connect_delivery_p50_ms: reference.delivery.p50_ms,
    ref_bare_connect_delivery_p99_ms: reference.delivery.p99_ms,
    ref_bare_connect_server_cpu_share: reference.serverCpuShare,
    ref_bare_connect_server_cpu_us_per_delivery: reference.serverCpuUsPerDelivery,
    ref_bare_connect_every_event: reference.everyWatcherGotEveryEvent,
  });
  emit({
    ...watchFigure("watchers_live_batched", batched),
    max_batch: WATCH_MAX_BATCH,
    target_delivery_p99_ms: 50,
    meets_target: batched.everyWatcherGotEveryEvent && batched.inOrder && (batched.delivery.p99_ms ?? Infinity) <= 50,
  });
  emit(watchFigure("watchers_live_low_rate", low));
}

/** The bare reference server (bare-connect-server.ts), as built. */
const BARE_CONNECT_SERVER = fileURLToPath(new URL("./bare-connect-server.js", import.meta.url));

/** `max_batch` of the batched watchers: entries that pile up behind one message go in the next. */
const WATCH_MAX_BATCH = 64;
