/**
 * A server's own account of itself, from its `/metrics` page: the gauges the load suite expects
 * back at zero once every client has gone (open streams, watchers, locks, reservations, queue), and
 * the RPCs it finished by status code.
 */
import { curl } from "../../harness.js";

/** One server's metrics: gauges by name (a labelled one summed over its labels), and finished RPCs by code. */
export interface ServerMetrics {
  readonly gauges: ReadonlyMap<string, number>;
  readonly rpcsByCode: Readonly<Record<string, number>>;
}

/** The gauges read here that carry labels: each is summed over them. */
const LABELLED_GAUGES = new Set(["berth_streams_open"]);

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
    const labelled = /^([a-zA-Z_:][\w:]*)\{.*\} (\S+)$/.exec(line);
    if (labelled && LABELLED_GAUGES.has(labelled[1]!)) {
      gauges.set(labelled[1]!, (gauges.get(labelled[1]!) ?? 0) + Number(labelled[2]));
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

/** A stream a server still has open, as its `GET /debug/streams` describes it. */
interface OpenStreamView {
  readonly method: string;
  readonly peer: string;
  readonly openSeconds: number;
  readonly messages: number;
  readonly waitingOn: string;
  readonly waitingSeconds: number;
  readonly holds: string;
  readonly aborted?: string;
}

/** The streams open on the server at `url`, one line each: the RPC, its peer, its age, where it waits, what it holds. */
export async function describeOpenStreams(url: string): Promise<string[]> {
  const response = await curl(url, "/debug/streams", { timeoutMs: 30_000 });
  if (response.status !== 200) return [`GET ${url}/debug/streams answered ${response.status}`];
  const { streams } = JSON.parse(response.body) as { streams: OpenStreamView[] };
  return streams.map(
    (s) =>
      `${s.method} from ${s.peer}, open ${s.openSeconds} s, ${s.messages} messages, waiting ${s.waitingSeconds} s on the ${s.waitingOn}` +
      `${s.aborted === undefined ? "" : ` (call aborted: ${s.aborted})`}; holds ${s.holds === "" ? "nothing it named" : s.holds}`,
  );
}
