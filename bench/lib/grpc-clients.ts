/**
 * Clients for benchmarks: `@grpc/grpc-js` (independent of the server's implementation, and the
 * fastest client here) loaded from the proto files, and the empty-RPC reference every figure is
 * compared with (a health Check on the same server, in the same run).
 */
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { fileURLToPath } from "node:url";
import { closedLoop } from "./load.js";

const PROTO_ROOT = fileURLToPath(new URL("../../../proto", import.meta.url));

/** Loads a service client constructor from `proto/` (e.g. `berth.sessions.v1.SessionService`). */
export function grpcServiceClient(file: string, service: string): grpc.ServiceClientConstructor {
  const definition = protoLoader.loadSync(file, { includeDirs: [PROTO_ROOT], keepCase: false, longs: Number, enums: String, defaults: false, oneofs: true });
  const loaded = grpc.loadPackageDefinition(definition);
  const ctor = service.split(".").reduce<unknown>((node, part) => (node as Record<string, unknown>)[part], loaded);
  return ctor as grpc.ServiceClientConstructor;
}

/** `host:port` of an `http://host:port` url. */
export function target(url: string): string {
  return url.replace(/^https?:\/\//, "");
}

/** A promise for one unary call. */
export function unary<T>(client: grpc.Client, method: string, request: unknown): Promise<T> {
  return new Promise((resolve, reject) => {
    (client as unknown as Record<string, (...args: unknown[]) => unknown>)[method]!(request, (error: grpc.ServiceError | null, response: T) =>
      error ? reject(error) : resolve(response),
    );
  });
}

/** The empty-RPC reference: health Check at `concurrency` in flight for `durationMs`. */
export async function emptyRpcReference(url: string, concurrency: number, durationMs: number) {
  const Health = grpcServiceClient("grpc/health/v1/health.proto", "grpc.health.v1.Health");
  const client = new Health(target(url), grpc.credentials.createInsecure());
  try {
    return await closedLoop(concurrency, durationMs, () => unary(client, "check", { service: "" }));
  } finally {
    client.close();
  }
}
