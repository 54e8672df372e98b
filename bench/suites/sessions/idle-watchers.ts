import type * as grpc from "@grpc/grpc-js";
import { unary } from "../../lib/grpc-clients.js";
import { emit } from "../../lib/report.js";
import { type BenchServer, startBenchServer } from "../../lib/server.js";
import { warmUp } from "./append.js";
import { type Options, median, phaseEvent, round, sessionClient } from "./common.js";
import type { WatchMessage } from "./watchers.js";

/** The service's memory per idle watcher: RSS before and after opening `idleWatchers` of them. */
export async function idleWatchers(options: Options): Promise<void> {
  const server = await startBenchServer("sessions", ["--fsync=batch"]);
  // Several connections, as many clients would have (each its own subchannel pool).
  const clients = Array.from({ length: 10 }, () => sessionClient(server.url, { "grpc.use_local_subchannel_pool": 1 }));
  const calls: grpc.ClientReadableStream<WatchMessage>[] = [];
  try {
    await warmUp(server, clients[0]!);
    for (let i = 0; i < 10; i++) await unary(clients[0]!, "appendEvent", { sessionId: `idle-${i}`, event: phaseEvent("idle") });
    // A first round opened and closed, so that lazily allocated server state is not counted.
    await openWatchers(clients, Math.min(100, options.idleWatchers), calls);
    for (const call of calls.splice(0)) call.cancel();
    await settle();
    const before = await sampleRss(server);
    await openWatchers(clients, options.idleWatchers, calls);
    await settle();
    const after = await sampleRss(server);
    const perWatcher = (after - before) / options.idleWatchers;
    emit({
      suite: "sessions",
      figure: "idle_watchers_memory",
      watchers: options.idleWatchers,
      sessions: 10,
      connections: clients.length,
      rss_before_mb: round(before / 1e6, 1),
      rss_after_mb: round(after / 1e6, 1),
      rss_per_watcher_kb: round(perWatcher / 1024, 1),
      note: "RSS deltas include V8 heap growth that GC has not returned; a ceiling, not an exact cost",
    });
  } finally {
    for (const call of calls) call.cancel();
    for (const client of clients) client.close();
    await server.stop();
  }
}

async function openWatchers(clients: grpc.Client[], count: number, calls: grpc.ClientReadableStream<WatchMessage>[]): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    let caughtUp = 0;
    const timer = setTimeout(() => reject(new Error(`only ${caughtUp} of ${count} watchers caught up within 30 s`)), 30_000);
    for (let i = 0; i < count; i++) {
      const client = clients[i % clients.length] as unknown as { watchSession(req: unknown): grpc.ClientReadableStream<WatchMessage> };
      const call = client.watchSession({ sessionId: `idle-${i % 10}`, fromSeq: 0 });
      calls.push(call);
      call.on("data", (message: WatchMessage) => {
        if (message.kind === "caughtUp" && ++caughtUp === count) {
          clearTimeout(timer);
          resolve();
        }
      });
      call.on("error", () => {});
    }
  });
}

async function settle(): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 1500));
}

async function sampleRss(server: BenchServer): Promise<number> {
  const samples: number[] = [];
  for (let i = 0; i < 5; i++) {
    samples.push(server.rssBytes());
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  return median(samples);
}
