/**
 * A server's own account of itself, from its `/metrics` page: the gauges the load suite expects
 * back at zero once every client has gone (open streams, watchers, locks, reservations, queue), and
 * the RPCs it finished by status code.
 */
import { curl } from "../harness.js";

/** One server's metrics: unlabelled samples by name, and finished RPCs by code. */
export interface ServerMetrics {
  readonly gauges: ReadonlyMap<string, number>;
  readonly rpcsByCode: Readonly<Record<string, number>>;
}

/** Reads and parses `/metrics` at `url`. */
export async function readMetrics(url: string): Promise<ServerMetrics> {
  const response = await curl(url, "/metrics", { timeoutMs: 30_000 });
  if (response.status !== 200) throw new Error(`GET ${url}/metrics answered ${response.status}`);
  const gauges = new Map<string, number>();
  const rpcsByCode: Record<string, number> = {};
  for (const line of response.body.split("\n")) {
    if (line.startsWith("#") || line.trim() === "") continue;
    const plain = /^([a-zA-Z_:][\w:]*) (\S+)$/.exec(line);
    if (plain) {
      gauges.set(plain[1]!, Number(plain[2]));
      continue;
    }
    const request = /^berth_rpc_requests_total\{method="[^"]*",code="([^"]*)"\} (\S+)$/.exec(line);
    if (request) rpcsByCode[request[1]!] = (rpcsByCode[request[1]!] ?? 0) + Number(request[2]);
  }
  return { gauges, rpcsByCode };
}

/** The gauges that count what clients hold: all must be 0 once the clients have gone. */
export const HELD_BY_CLIENTS = [
  "berth_streams_open",
  "berth_rpc_in_flight",
  "berth_sessions_watchers",
  "berth_locks_held",
  "berth_locks_waiting",
  "berth_budget_reservations",
  "berth_budget_queue_length",
  "berth_budget_committed_memory_bytes",
] as const;
