import { emit } from "../../lib/report.js";
import { startBenchServer } from "../../lib/server.js";
import { appendCell, warmUp } from "./append.js";
import { type Options, round, sessionClient } from "./common.js";

/**
 * The cost of the per-RPC log line: the same AppendEvent and empty-RPC cells on a server logging
 * every RPC (info) and on one that does not (warn).
 */
export async function loggingCost(options: Options): Promise<void> {
  const ms = options.seconds * 1000;
  const results: Record<string, { appends: number; empty: number; cpuUsPerAppend: number }> = {};
  for (const level of ["info", "warn"]) {
    const server = await startBenchServer("sessions", ["--fsync=batch"], {}, { logLevel: level });
    const client = sessionClient(server.url);
    try {
      await warmUp(server, client);
      const cell = await appendCell(server, client, 64, ms, "logging");
      results[level] = {
        appends: cell.appends.perSecond,
        empty: cell.reference,
        cpuUsPerAppend: Math.round((cell.cpuMs * 1000) / Math.max(1, cell.appends.ops)),
      };
    } finally {
      client.close();
      await server.stop();
    }
  }
  emit({
    suite: "sessions",
    figure: "per_rpc_logging",
    clients: 64,
    fsync: "batch",
    appends_per_s_logging: results.info!.appends,
    appends_per_s_silent: results.warn!.appends,
    empty_rpc_per_s_logging: results.info!.empty,
    empty_rpc_per_s_silent: results.warn!.empty,
    server_cpu_us_per_append_logging: results.info!.cpuUsPerAppend,
    server_cpu_us_per_append_silent: results.warn!.cpuUsPerAppend,
    logging_share_of_empty_rpc: round(1 - results.info!.empty / results.warn!.empty, 3),
  });
}
