/**
 * The references the cross-instance figures are read against, measured in the same run: one empty
 * RPC on the instance, and one etcd round trip from this process.
 */
import type { EtcdClient } from "@berth/etcd";
import { emptyRpcReference } from "../../lib/grpc-clients.js";
import { closedLoop } from "../../lib/load.js";
import { percentiles } from "../../lib/report.js";
import type { BenchServer } from "../../lib/server.js";

/** One empty RPC (health Check) at a time on `server` for `ms`: p50 and p99. */
export async function emptyRpcLatency(server: BenchServer, ms = 1_000): Promise<Record<string, number>> {
  return percentiles((await emptyRpcReference(server.url, 1, ms)).latenciesMs, [50, 99]);
}

/** One put at a time through berth's client for `ms`: what one etcd round trip costs now, p50 and p99. */
export async function etcdPutLatency(client: EtcdClient, ms = 1_000): Promise<Record<string, number>> {
  const value = new Uint8Array(256).fill(0x72);
  const run = Date.now();
  return percentiles((await closedLoop(1, ms, (_, i) => client.put(`rtt/${run}/${i}`, value))).latenciesMs, [50, 99]);
}
