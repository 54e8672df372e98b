/**
 * The sessions instances the cross-instance parts compare: two on the same etcd (A and B, one key
 * prefix: one service), a third (C) when a part spreads appends over three, and one on the file
 * store, each a child process on loopback. A "route" says which instance each side of a
 * measurement talks to.
 */
import { startBenchServer, type BenchServer } from "../../lib/server.js";

/** Where a measurement's two sides go: the same instance, two instances on one etcd, or the file store. */
export type RouteName = "file" | "etcd_one_instance" | "etcd_two_instances";

export interface Route {
  readonly name: RouteName;
  readonly store: "file" | "etcd";
  /** The holder's or writer's instance. */
  readonly first: BenchServer;
  /** The waiter's or watchers' instance. */
  readonly second: BenchServer;
}

export interface Instances {
  /** The routes to measure, file first when the file store is measured in this run. */
  readonly routes: Route[];
  readonly a: BenchServer;
  readonly b: BenchServer;
  /** A third instance on the same etcd and prefix, when asked for. */
  readonly c: BenchServer | undefined;
  stop(): Promise<void>;
}

/**
 * Starts A and B on `endpoints` (C too when `withThird`, and a file-store instance when
 * `withFile`); stops the ones started if a start fails.
 */
export async function startInstances(endpoints: readonly string[], withFile: boolean, withThird = false): Promise<Instances> {
  const prefix = `bench-instances-${Date.now()}/`;
  const etcdArgs = ["--store=etcd", `--etcd-endpoints=${endpoints.join(",")}`, `--etcd-prefix=${prefix}`];
  const started: BenchServer[] = [];
  const stop = async () => {
    for (const server of started.splice(0).reverse()) await server.stop();
  };
  try {
    const file = withFile ? await startBenchServer("sessions", ["--fsync=batch"], {}, { logLevel: "warn" }) : undefined;
    if (file) started.push(file);
    const a = await startBenchServer("sessions", etcdArgs, {}, { logLevel: "warn" });
    started.push(a);
    const b = await startBenchServer("sessions", etcdArgs, {}, { logLevel: "warn" });
    started.push(b);
    const c = withThird ? await startBenchServer("sessions", etcdArgs, {}, { logLevel: "warn" }) : undefined;
    if (c) started.push(c);
    const routes: Route[] = [
      ...(file ? [{ name: "file", store: "file", first: file, second: file } as const] : []),
      { name: "etcd_one_instance", store: "etcd", first: a, second: a },
      { name: "etcd_two_instances", store: "etcd", first: a, second: b },
    ];
    return { routes, a, b, c, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}
