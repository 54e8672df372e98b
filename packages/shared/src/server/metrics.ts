/**
 * The numbers a server exposes on `/metrics`, rendered in the Prometheus text format (version
 * 0.0.4) by hand: the format is small and stable, and a client library would be the heaviest
 * dependency of the server for a few counters.
 */
import { systemClock, type Clock } from "../clock.js";
import { OpenStreams } from "./open-streams.js";

/** One labelled value of a gauge that has several (e.g. one per session, one per gate). */
export interface GaugeSample {
  readonly labels?: Readonly<Record<string, string>>;
  readonly value: number;
}

/** Reads a gauge at scrape time: a single number, or one sample per label set. */
export type GaugeReader = () => number | readonly GaugeSample[];

/** Upper bounds (seconds) of the RPC duration histogram; `+Inf` is implicit. */
export const RPC_DURATION_BUCKETS: readonly number[] = [0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10, 60];

/** The content type Prometheus expects for the text format. */
export const METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8";

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/;

interface Histogram {
  /** Per-bucket (not cumulative) counts; the last slot is `+Inf`. Cumulated at render time. */
  readonly counts: Float64Array;
  sum: number;
  count: number;
}

interface Gauge {
  readonly help: string;
  readonly read: GaugeReader;
}

/**
 * RPC counters, the duration histogram, in-flight gauges, process figures and the gauges services
 * register. Recording is a few map lookups and additions: it runs on every RPC.
 */
export class ServerMetrics {
  /** Unary calls currently running. */
  inFlight = 0;
  /** Streaming calls open now, each with its method, peer and age (`berth_streams_open{method}`, `GET /debug/streams`). */
  readonly streams = new OpenStreams();

  private readonly requests = new Map<string, Map<string, number>>();
  private readonly durations = new Map<string, Histogram>();
  private readonly gauges = new Map<string, Gauge>();
  /** When the server started: on the wall clock (shown), and on the monotonic clock (its uptime). */
  private readonly startedAtMs: number;
  private readonly startedAtMonotonic: number;

  constructor(
    /** The server's name (`sessions`, `budget`), exported as `berth_server_info{name}`. */
    readonly serverName: string,
    private readonly clock: Pick<Clock, "now" | "monotonicNow"> = systemClock,
  ) {
    this.startedAtMs = clock.now();
    this.startedAtMonotonic = clock.monotonicNow();
  }

  /** Counts one finished RPC: `method` is `/pkg.Service/Method`, `code` is `ok` or a code name. */
  recordRpc(method: string, code: string, seconds: number): void {
    let byCode = this.requests.get(method);
    if (byCode === undefined) {
      byCode = new Map();
      this.requests.set(method, byCode);
    }
    byCode.set(code, (byCode.get(code) ?? 0) + 1);

    let histogram = this.durations.get(method);
    if (histogram === undefined) {
      histogram = { counts: new Float64Array(RPC_DURATION_BUCKETS.length + 1), sum: 0, count: 0 };
      this.durations.set(method, histogram);
    }
    let bucket = 0;
    while (bucket < RPC_DURATION_BUCKETS.length && seconds > RPC_DURATION_BUCKETS[bucket]!) bucket++;
    histogram.counts[bucket]! += 1;
    histogram.sum += seconds;
    histogram.count += 1;
  }

  /** How many RPCs of `method` ended with `code` so far (for tests and diagnostics). */
  requestCount(method: string, code: string): number {
    return this.requests.get(method)?.get(code) ?? 0;
  }

  /**
   * Adds a gauge read at every scrape. `name` must be a valid Prometheus metric name and unique
   * (prefix it with `berth_<service>_`); the reader must be cheap and must not throw (a reader
   * that throws is skipped for that scrape). Returns a function that removes the gauge.
   */
  registerGauge(name: string, help: string, read: GaugeReader): () => void {
    if (!METRIC_NAME.test(name)) throw new Error(`metric name ${JSON.stringify(name)} is not a valid Prometheus name`);
    if (this.gauges.has(name) || name.startsWith("berth_rpc_")) {
      throw new Error(`metric ${name} is already registered`);
    }
    const gauge: Gauge = { help, read };
    this.gauges.set(name, gauge);
    return () => {
      if (this.gauges.get(name) === gauge) this.gauges.delete(name);
    };
  }

  /** The whole exposition, as `/metrics` serves it. */
  render(): string {
    const out: string[] = [];

    out.push("# HELP berth_rpc_requests_total RPCs finished, by method and status code.");
    out.push("# TYPE berth_rpc_requests_total counter");
    for (const [method, byCode] of this.requests) {
      for (const [code, count] of byCode) {
        out.push(`berth_rpc_requests_total{method="${escapeLabel(method)}",code="${escapeLabel(code)}"} ${count}`);
      }
    }

    out.push("# HELP berth_rpc_duration_seconds How long RPCs took, from the first byte in to the last byte out (streams: their whole life).");
    out.push("# TYPE berth_rpc_duration_seconds histogram");
    for (const [method, histogram] of this.durations) {
      const m = escapeLabel(method);
      let cumulative = 0;
      for (let i = 0; i < RPC_DURATION_BUCKETS.length; i++) {
        cumulative += histogram.counts[i]!;
        out.push(`berth_rpc_duration_seconds_bucket{method="${m}",le="${RPC_DURATION_BUCKETS[i]}"} ${cumulative}`);
      }
      out.push(`berth_rpc_duration_seconds_bucket{method="${m}",le="+Inf"} ${histogram.count}`);
      out.push(`berth_rpc_duration_seconds_sum{method="${m}"} ${formatValue(histogram.sum)}`);
      out.push(`berth_rpc_duration_seconds_count{method="${m}"} ${histogram.count}`);
    }

    gauge(out, "berth_rpc_in_flight", "Unary RPCs being handled now.", this.inFlight);
    out.push("# HELP berth_streams_open Streaming RPCs open now, by method (GET /debug/streams lists them).");
    out.push("# TYPE berth_streams_open gauge");
    for (const [method, count] of this.streams.counts()) out.push(`berth_streams_open{method="${escapeLabel(method)}"} ${count}`);

    const memory = process.memoryUsage();
    gauge(out, "process_resident_memory_bytes", "Resident memory size in bytes.", memory.rss);
    gauge(out, "nodejs_heap_size_used_bytes", "V8 heap in use, in bytes.", memory.heapUsed);
    gauge(out, "nodejs_heap_size_total_bytes", "V8 heap allocated, in bytes.", memory.heapTotal);
    gauge(out, "process_start_time_seconds", "When the server started, in seconds since the epoch.", this.startedAtMs / 1000);
    gauge(out, "berth_uptime_seconds", "Seconds since the server started.", (this.clock.monotonicNow() - this.startedAtMonotonic) / 1000);
    out.push("# HELP berth_server_info Which berth server this is.");
    out.push("# TYPE berth_server_info gauge");
    out.push(`berth_server_info{name="${escapeLabel(this.serverName)}"} 1`);

    for (const [name, { help, read }] of this.gauges) {
      let value: number | readonly GaugeSample[];
      try {
        value = read();
      } catch {
        continue;
      }
      out.push(`# HELP ${name} ${escapeHelp(help)}`);
      out.push(`# TYPE ${name} gauge`);
      if (typeof value === "number") {
        out.push(`${name} ${formatValue(value)}`);
        continue;
      }
      for (const sample of value) out.push(`${name}${formatLabels(sample.labels)} ${formatValue(sample.value)}`);
    }
    out.push("");
    return out.join("\n");
  }
}

function gauge(out: string[], name: string, help: string, value: number): void {
  out.push(`# HELP ${name} ${help}`);
  out.push(`# TYPE ${name} gauge`);
  out.push(`${name} ${formatValue(value)}`);
}

function formatLabels(labels: Readonly<Record<string, string>> | undefined): string {
  if (labels === undefined) return "";
  const parts: string[] = [];
  for (const [key, value] of Object.entries(labels)) {
    // A bad label name would make the whole scrape unparseable: drop the label instead.
    if (!LABEL_NAME.test(key)) continue;
    parts.push(`${key}="${escapeLabel(String(value))}"`);
  }
  return parts.length === 0 ? "" : `{${parts.join(",")}}`;
}

/** Prometheus spells the special floats its own way. */
function formatValue(value: number): string {
  if (Number.isNaN(value)) return "NaN";
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  return String(value);
}

function escapeLabel(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, '\\"');
}

function escapeHelp(value: string): string {
  return value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n");
}
