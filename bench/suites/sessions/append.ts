import type * as grpc from "@grpc/grpc-js";
import { emptyRpcReference, unary } from "../../lib/grpc-clients.js";
import { closedLoop } from "../../lib/load.js";
import { emit, percentiles, ratio } from "../../lib/report.js";
import { type BenchServer, startBenchServer } from "../../lib/server.js";
import { type Options, phaseEvent, sessionClient, withServerCpu } from "./common.js";

/** AppendEvent at 64 clients with fsync=batch, as a share of the empty-RPC rate at the same concurrency. */
const TARGET_RATIO_TO_EMPTY_RPC = 0.85;

/** Warms a fresh server's code paths (JIT) so the first measured cell is not the slow one. */
export async function warmUp(server: BenchServer, client: grpc.Client): Promise<void> {
  await closedLoop(16, 1000, () => unary(client, "appendEvent", { sessionId: "warm-up", event: phaseEvent("warm") }));
  await emptyRpcReference(server.url, 16, 500);
}

/**
 * One cell: the empty-RPC rate just before and just after the appends, at the same concurrency on
 * the same server, so that a change in the machine's load during the cell shows.
 */
export async function appendCell(server: BenchServer, client: grpc.Client, clients: number, ms: number, sessionId: string) {
  const before = await emptyRpcReference(server.url, clients, ms);
  const { result: appends, cpuMs } = await withServerCpu(server, () =>
    closedLoop(clients, ms, () => unary(client, "appendEvent", { sessionId, event: phaseEvent("writing") })),
  );
  const after = await emptyRpcReference(server.url, clients, ms);
  const reference = Math.round((before.perSecond + after.perSecond) / 2);
  return { appends, cpuMs, before, after, reference };
}

export async function appendMatrix(options: Options): Promise<void> {
  const ms = options.seconds * 1000;
  for (const fsync of ["none", "batch", "always"] as const) {
    const server = await startBenchServer("sessions", [`--fsync=${fsync}`]);
    const client = sessionClient(server.url);
    try {
      await warmUp(server, client);
      for (const clients of [1, 16, 64]) {
        const cell = await appendCell(server, client, clients, ms, `append-${clients}`);
        emit({
          suite: "sessions",
          figure: "append_event",
          fsync,
          clients,
          appends_per_s: cell.appends.perSecond,
          ...percentiles(cell.appends.latenciesMs),
          errors: cell.appends.errors,
          ...(cell.appends.firstError ? { first_error: String(cell.appends.firstError) } : {}),
          server_cpu_us_per_append: Math.round((cell.cpuMs * 1000) / Math.max(1, cell.appends.ops)),
          ref_empty_rpc_per_s: cell.reference,
          ref_empty_rpc_before_after: [cell.before.perSecond, cell.after.perSecond],
          ref_empty_rpc_p50_ms: percentiles(cell.before.latenciesMs).p50_ms,
          ratio_to_empty_rpc: ratio(cell.appends.perSecond, cell.reference),
          ...(fsync === "batch" && clients === 64
            ? { target_ratio: TARGET_RATIO_TO_EMPTY_RPC, meets_target: cell.appends.perSecond >= TARGET_RATIO_TO_EMPTY_RPC * cell.reference }
            : {}),
        });
      }
    } finally {
      client.close();
      await server.stop();
    }
  }
}
