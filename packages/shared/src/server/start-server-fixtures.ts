/**
 * For the tests of startServer: a tiny service of their own, servers started with it and closed
 * after each test, and the clients that call them as the world does (@grpc/grpc-js, connect-node,
 * curl, buf curl).
 */
import { execFile } from "node:child_process";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import pino from "pino";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { create, createFileRegistry, toJson, type DescService, type JsonObject } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_struct, StructSchema, type Struct } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { BerthError } from "../errors.js";
import { implement, startServer, type RunningServer, type StartServerOptions } from "./start-server.js";

const run = promisify(execFile);
const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));
const bufBin = path.join(repoRoot, "node_modules/.bin/buf");
const healthProto = path.join(repoRoot, "proto/grpc/health/v1/health.proto");

// A tiny service built at run time, so these tests depend on no berth contract: Echo returns its
// input, Fail throws what the input asks for, Stall streams one message and then ignores every
// signal (the shutdown backstop must cut it).
const testFile = createFileRegistry(
  create(FileDescriptorProtoSchema, {
    name: "berth/test/v1/test.proto",
    package: "berth.test.v1",
    dependency: ["google/protobuf/struct.proto"],
    syntax: "proto3",
    service: [
      {
        name: "TestService",
        method: [
          { name: "Echo", inputType: ".google.protobuf.Struct", outputType: ".google.protobuf.Struct" },
          { name: "Fail", inputType: ".google.protobuf.Struct", outputType: ".google.protobuf.Struct" },
          { name: "Stall", inputType: ".google.protobuf.Struct", outputType: ".google.protobuf.Struct", serverStreaming: true },
        ],
      },
    ],
  }),
  (name) => (name === "google/protobuf/struct.proto" ? file_google_protobuf_struct : undefined),
);
export const TestService = testFile.getService("berth.test.v1.TestService") as DescService;

export const testImplementation = {
  echo: (request: Struct) => request,
  fail(request: Struct): Struct {
    const kind = toJson(StructSchema, request) as JsonObject;
    if (kind["kind"] === "berth") throw new BerthError("failed_precondition", "expected seq 3 but the journal is at 5", { current_seq: 5, session: "é" });
    if (kind["kind"] === "emfile") throw Object.assign(new Error("EMFILE: too many open files, open '/secret/path'"), { code: "EMFILE" });
    // A client library's connection refused a descriptor, as connect-node reports it.
    if (kind["kind"] === "client-emfile") {
      const cause = Object.assign(new Error("connect EMFILE 127.0.0.1:2379"), { code: "EMFILE" });
      throw new ConnectError(cause.message, Code.Internal, undefined, undefined, cause);
    }
    throw new Error("disk on fire at /secret/path");
  },
  async *stall(request: Struct): AsyncGenerator<Struct> {
    yield request;
    await new Promise(() => {});
  },
};

export const silent = pino({ level: "silent" });
const servers: RunningServer[] = [];

export async function start(options: Partial<StartServerOptions> = {}): Promise<RunningServer> {
  const server = await startServer({
    name: "test",
    logger: silent,
    services: [implement(TestService, testImplementation as never)],
    streamGraceMs: 200,
    ...options,
  });
  servers.push(server);
  return server;
}

/** For `afterEach`: closes every server the test started. */
export async function closeServers(): Promise<void> {
  await Promise.all(servers.splice(0).map((s) => s.close(false)));
}

export function port(server: RunningServer): number {
  if (!("port" in server.address)) throw new Error("not a TCP server");
  return server.address.port;
}

export function grpcClient(server: RunningServer) {
  return createClient(Health, createGrpcTransport({ baseUrl: server.url }));
}

export async function curl(args: string[]): Promise<string> {
  const { stdout } = await run("curl", ["-s", "--max-time", "10", ...args]);
  return stdout;
}

export async function bufCurl(args: string[]): Promise<{ ok: boolean; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(bufBin, ["curl", "--protocol", "grpc", "--http2-prior-knowledge", ...args], { timeout: 20_000 });
    return { ok: true, stdout, stderr };
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string };
    return { ok: false, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
  }
}

/** The HealthCheck stub of @grpc/grpc-js, from the vendored health.proto. */
function grpcJsHealth(target: string) {
  const definition = protoLoader.loadSync(healthProto, { enums: String, defaults: true });
  const loaded = grpc.loadPackageDefinition(definition) as unknown as {
    grpc: { health: { v1: { Health: new (target: string, credentials: grpc.ChannelCredentials) => grpc.Client } } };
  };
  return new loaded.grpc.health.v1.Health(target, grpc.credentials.createInsecure()) as grpc.Client & {
    check(request: { service: string }, callback: (error: grpc.ServiceError | null, response?: { status: string }) => void): void;
  };
}

export async function grpcJsCheck(target: string, service = ""): Promise<string> {
  const client = grpcJsHealth(target);
  try {
    return await new Promise<string>((resolve, reject) => {
      client.check({ service }, (error, response) => (error ? reject(error) : resolve(response!.status)));
    });
  } finally {
    client.close();
  }
}
