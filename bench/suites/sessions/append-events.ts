import { emptyRpcReference, unary } from "../../lib/grpc-clients.js";
import { closedLoop } from "../../lib/load.js";
import { emit, percentiles, ratio } from "../../lib/report.js";
import { startBenchServer } from "../../lib/server.js";
import { warmUp } from "./append.js";
import { seedStoreForReference } from "./cold-open.js";
import { type Options, phaseEvent, round, sessionClient, withServerCpu } from "./common.js";

export async function appendEventsAndSnapshots(options: Options): Promise<void> {
  const ms = options.seconds * 1000;
  const server = await startBenchServer("sessions", ["--fsync=batch"]);
  const client = sessionClient(server.url);
  try {
    await warmUp(server, client);
    const batch = Array.from({ length: 100 }, (_, i) => phaseEvent(`p${i % 5}`));
    const reference = await emptyRpcReference(server.url, 16, ms);
    const { result: calls, cpuMs } = await withServerCpu(server, () =>
      closedLoop(16, ms, () => unary(client, "appendEvents", { sessionId: "batched", events: batch })),
    );
    const seedRate = await seedAppendRate(Math.min(ms, 2000));
    const eventsPerSecond = calls.perSecond * 100;
    const seedRateFields = seedRate === undefined ? {} : { ref_seed_in_process_appends_per_s: seedRate, ratio_to_seed: ratio(eventsPerSecond, seedRate) };
    emit({
      suite: "sessions",
      figure: "append_events_batch",
      fsync: "batch",
      clients: 16,
      events_per_call: 100,
      durable_events_per_s: eventsPerSecond,
      calls_per_s: calls.perSecond,
      ...percentiles(calls.latenciesMs),
      errors: calls.errors,
      server_cpu_us_per_event: round((cpuMs * 1000) / Math.max(1, calls.ops * 100), 1),
      target_events_per_s: 10_000,
      meets_target: eventsPerSecond >= 10_000,
      ref_empty_rpc_per_s: reference.perSecond,
      ...seedRateFields,
    });

    // GetSnapshot while the journal has not moved: 1,000 entries against 100,000.
    const fill = async (sessionId: string, total: number) => {
      let sent = 0;
      await Promise.all(
        Array.from({ length: 16 }, async () => {
          while (sent < total) {
            sent += 100;
            await unary(client, "appendEvents", { sessionId, events: batch });
          }
        }),
      );
    };
    await fill("small", 1000);
    await fill("large", 100_000);
    const small = await unary<{ lastSeq: number }>(client, "getSnapshot", { sessionId: "small" });
    const large = await unary<{ lastSeq: number }>(client, "getSnapshot", { sessionId: "large" });
    const empty = await emptyRpcReference(server.url, 1, ms);
    const smallRun = await closedLoop(1, ms, () => unary(client, "getSnapshot", { sessionId: "small" }));
    const largeRun = await closedLoop(1, ms, () => unary(client, "getSnapshot", { sessionId: "large" }));
    const smallP50 = percentiles(smallRun.latenciesMs).p50_ms!;
    const largeP50 = percentiles(largeRun.latenciesMs).p50_ms!;
    emit({
      suite: "sessions",
      figure: "get_snapshot",
      entries_small: small.lastSeq,
      entries_large: large.lastSeq,
      p50_ms_small: smallP50,
      p50_ms_large: largeP50,
      large_over_small: ratio(largeP50, smallP50),
      flat: largeP50 <= 1.5 * smallP50,
      ref_empty_rpc_p50_ms: percentiles(empty.latenciesMs).p50_ms,
      errors: smallRun.errors + largeRun.errors,
    });
  } finally {
    client.close();
    await server.stop();
  }
}

/** The seed's in-process appendEvent rate (no fsync; it rewrites its snapshot file each time); undefined without the seeds. */
async function seedAppendRate(durationMs: number): Promise<number | undefined> {
  const seed = await seedStoreForReference();
  if (!seed) return undefined;
  try {
    const store = seed.store("seed-rate");
    const end = performance.now() + durationMs;
    const start = performance.now();
    let n = 0;
    while (performance.now() < end) {
      store.appendEvent({ id: "seed-rate", type: "agent_phase", phase: `p${n % 5}`, durationMs: 12 });
      n++;
    }
    return Math.round((n / (performance.now() - start)) * 1000);
  } finally {
    seed.remove();
  }
}
