/**
 * etcd's own count of the calls it served, read from its gRPC server's counters on `/metrics`
 * (etcd's default metrics): the number of etcd calls an operation through berth costs, whatever
 * the client did, read before and after while nothing else talks to etcd.
 */
import { ratio } from "../../lib/report.js";

/** etcd's calls by method: unary calls started, and messages received on streams (`Watch:msgs`). */
export type Calls = Map<string, number>;

/** etcd's gRPC counters now, summed over `memberUrls`: unary calls started by method, stream messages received as `<method>:msgs`. */
export async function etcdCalls(memberUrls: readonly string[]): Promise<Calls> {
  const calls: Calls = new Map();
  for (const url of memberUrls) {
    const text = await (await fetch(`${url}/metrics`)).text();
    for (const line of text.split("\n")) {
      const match = /^grpc_server_(started|msg_received)_total\{grpc_method="(\w+)",grpc_service="[\w.]+",grpc_type="(\w+)"\} (\d+)/.exec(line);
      if (!match) continue;
      const [, counter, method, type, value] = match;
      if (counter === "started" && type === "unary") calls.set(method!, (calls.get(method!) ?? 0) + Number(value));
      else if (counter === "msg_received" && type !== "unary") calls.set(`${method}:msgs`, (calls.get(`${method}:msgs`) ?? 0) + Number(value));
    }
  }
  return calls;
}

/** The calls made between two readings. */
export function difference(after: Calls, before: Calls): Calls {
  const out: Calls = new Map();
  for (const [method, n] of after) if (n - (before.get(method) ?? 0) > 0) out.set(method, n - (before.get(method) ?? 0));
  return out;
}

/** Calls per operation by method, in method order. */
export function perOperation(calls: Calls, operations: number): Record<string, number> {
  return Object.fromEntries([...calls].sort(([x], [y]) => x.localeCompare(y)).map(([method, n]) => [method, ratio(n, operations)]));
}

/** Every unary call (stream messages left out). */
export function unarySum(calls: Calls): number {
  return [...calls].filter(([method]) => !method.endsWith(":msgs")).reduce((sum, [, n]) => sum + n, 0);
}

/** How many watch requests (creations) etcd has received: what {@link watchOpened} compares. */
export async function watchRequests(memberUrls: readonly string[]): Promise<number> {
  return (await etcdCalls(memberUrls)).get("Watch:msgs") ?? 0;
}

/**
 * Resolves once etcd has received more watch requests than `before` (10 s at most): a waiter that
 * watches its predecessor is then waiting in etcd, not still on its way there.
 */
export async function watchOpened(memberUrls: readonly string[], before: number): Promise<void> {
  const deadline = performance.now() + 10_000;
  while ((await watchRequests(memberUrls)) <= before) {
    if (performance.now() > deadline) throw new Error("no watch reached etcd within 10 s");
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}
