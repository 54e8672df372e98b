import { execFile, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as http2 from "node:http2";
import * as net from "node:net";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterEach, describe, expect, it, vi } from "vitest";
import pino from "pino";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { create, createFileRegistry, toJson, type DescService, type JsonObject } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_struct, StructSchema, type Struct } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type HandlerContext } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus as Status } from "@berth/api/grpc/health/v1/health_pb";
import { BerthError } from "../errors.js";
import { ERROR_DETAILS_HEADER, INTERNAL_ERROR_MESSAGE } from "./connect-errors.js";
import { installSignalHandlers } from "./signal-handlers.js";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { onDescriptorShortage } from "../descriptors.js";
import { streamHolds } from "./open-streams.js";
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
const TestService = testFile.getService("berth.test.v1.TestService") as DescService;

const testImplementation = {
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

const silent = pino({ level: "silent" });
const servers: RunningServer[] = [];

async function start(options: Partial<StartServerOptions> = {}): Promise<RunningServer> {
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

afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close(false)));
});

function port(server: RunningServer): number {
  if (!("port" in server.address)) throw new Error("not a TCP server");
  return server.address.port;
}

function grpcClient(server: RunningServer) {
  return createClient(Health, createGrpcTransport({ baseUrl: server.url }));
}

async function curl(args: string[]): Promise<string> {
  const { stdout } = await run("curl", ["-s", "--max-time", "10", ...args]);
  return stdout;
}

async function bufCurl(args: string[]): Promise<{ ok: boolean; stdout: string; stderr: string }> {
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

async function grpcJsCheck(target: string, service = ""): Promise<string> {
  const client = grpcJsHealth(target);
  try {
    return await new Promise<string>((resolve, reject) => {
      client.check({ service }, (error, response) => (error ? reject(error) : resolve(response!.status)));
    });
  } finally {
    client.close();
  }
}

describe("health", () => {
  it("answers Check SERVING to @grpc/grpc-js, connect-node over HTTP/2 and curl over HTTP/1.1", async () => {
    const server = await start();
    expect(await grpcJsCheck(`127.0.0.1:${port(server)}`)).toBe("SERVING");
    expect(await grpcJsCheck(`127.0.0.1:${port(server)}`, "berth.test.v1.TestService")).toBe("SERVING");

    expect((await grpcClient(server).check({ service: "" })).status).toBe(Status.SERVING);

    const body = await curl(["-X", "POST", "-H", "content-type: application/json", "-d", "{}", `${server.url}/grpc.health.v1.Health/Check`]);
    expect(JSON.parse(body)).toEqual({ status: "SERVING" });

    const connect = createClient(Health, createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" }));
    expect((await connect.check({ service: "" })).status).toBe(Status.SERVING);
  });

  it("speaks gRPC-Web and Connect, unary and streaming, over HTTP/1.1 and HTTP/2", async () => {
    const server = await start();
    for (const httpVersion of ["1.1", "2"] as const) {
      for (const transport of [createGrpcWebTransport({ baseUrl: server.url, httpVersion }), createConnectTransport({ baseUrl: server.url, httpVersion })]) {
        const client = createClient(Health, transport);
        expect((await client.check({ service: "" })).status).toBe(Status.SERVING);
        const abort = new AbortController();
        for await (const update of client.watch({ service: "" }, { signal: abort.signal })) {
          expect(update.status).toBe(Status.SERVING);
          break;
        }
      }
    }
  });

  it("answers NOT_FOUND for an unknown service, SERVICE_UNKNOWN on Watch until it becomes known", async () => {
    const server = await start();
    const client = grpcClient(server);
    await expect(client.check({ service: "nope" })).rejects.toMatchObject({ code: Code.NotFound });

    const abort = new AbortController();
    const stream = client.watch({ service: "later" }, { signal: abort.signal })[Symbol.asyncIterator]();
    expect((await stream.next()).value?.status).toBe(Status.SERVICE_UNKNOWN);
    server.health.setStatus("later", Status.NOT_SERVING);
    expect((await stream.next()).value?.status).toBe(Status.NOT_SERVING);
    server.health.setStatus("later", Status.SERVING);
    expect((await stream.next()).value?.status).toBe(Status.SERVING);
    abort.abort();
  });

  it("sends NOT_SERVING to watchers on shutdown, then ends the stream with UNAVAILABLE", async () => {
    const server = await start();
    const stream = grpcClient(server).watch({ service: "" })[Symbol.asyncIterator]();
    expect((await stream.next()).value?.status).toBe(Status.SERVING);
    const closing = server.close();
    expect((await stream.next()).value?.status).toBe(Status.NOT_SERVING);
    await expect(stream.next()).rejects.toMatchObject({ code: Code.Unavailable, rawMessage: "server shutting down" });
    await closing;
  });

  it("keeps a quiet watch alive across many keepalive pings", async () => {
    // Pings every 20 ms; the timeout is long so that a stalled test process is not taken for a dead peer.
    const server = await start({ keepalive: { pingIntervalMs: 20, pingTimeoutMs: 5_000 } });
    const abort = new AbortController();
    const stream = grpcClient(server).watch({ service: "" }, { signal: abort.signal })[Symbol.asyncIterator]();
    expect((await stream.next()).value?.status).toBe(Status.SERVING);
    await new Promise((resolve) => setTimeout(resolve, 300));
    server.health.setStatus("", Status.NOT_SERVING);
    expect((await stream.next()).value?.status).toBe(Status.NOT_SERVING);
    abort.abort();
  });

  it("drops an HTTP/2 connection whose peer never acknowledges a ping", async () => {
    const server = await start({ keepalive: { pingIntervalMs: 20, pingTimeoutMs: 50 } });
    const socket = net.connect(port(server), "127.0.0.1");
    // The client preface and an empty SETTINGS frame, and then silence: pings go unanswered.
    socket.write(Buffer.concat([Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), Buffer.from([0, 0, 0, 4, 0, 0, 0, 0, 0])]));
    socket.resume();
    await new Promise<void>((resolve) => socket.once("close", () => resolve()));
  });
});

describe("reflection", () => {
  it("lists the services to buf curl over grpc-v1, grpc-v1alpha and the default negotiation", async () => {
    const server = await start();
    const expected = ["berth.test.v1.TestService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"];
    for (const protocol of [[], ["--reflect-protocol", "grpc-v1"], ["--reflect-protocol", "grpc-v1alpha"]]) {
      const result = await bufCurl([...protocol, "--list-services", server.url]);
      expect(result.stderr).toBe("");
      expect(result.stdout.trim().split("\n").sort()).toEqual(expected);
    }
  });

  it("lets buf curl call RPCs knowing nothing but the reflection answers", async () => {
    const server = await start();
    for (const protocol of ["grpc-v1", "grpc-v1alpha"]) {
      const check = await bufCurl(["--reflect-protocol", protocol, "-d", "{}", `${server.url}/grpc.health.v1.Health/Check`]);
      expect(JSON.parse(check.stdout)).toEqual({ status: "SERVING" });
      // A method whose messages live in an imported well-known file (google/protobuf/struct.proto).
      const echo = await bufCurl(["--reflect-protocol", protocol, "-d", '{"a":[1,"two",{"b":null}]}', `${server.url}/berth.test.v1.TestService/Echo`]);
      expect(JSON.parse(echo.stdout)).toEqual({ a: [1, "two", { b: null }] });
    }
    const methods = await bufCurl(["--list-methods", server.url]);
    expect(methods.stdout).toContain("berth.test.v1.TestService/Stall");
  });
});

describe("bearer token", () => {
  it("refuses every call but health without the token", async () => {
    const server = await start({ token: "s3cret" });
    const denied = await bufCurl(["--list-services", server.url]);
    expect(denied.ok).toBe(false);
    expect(denied.stderr).toMatch(/not authenticated|unauthenticated/i);

    const allowed = await bufCurl(["--reflect-header", "authorization: Bearer s3cret", "--list-services", server.url]);
    expect(allowed.stdout).toContain("grpc.health.v1.Health");
    // An RPC of a protected service, described by reflection and called with the token.
    const echo = await bufCurl([
      "-H",
      "authorization: Bearer s3cret",
      "--reflect-header",
      "*",
      "-d",
      '{"k":"v"}',
      `${server.url}/berth.test.v1.TestService/Echo`,
    ]);
    expect(JSON.parse(echo.stdout)).toEqual({ k: "v" });

    // Health stays open, to orchestrators and curl alike.
    expect(await grpcJsCheck(`127.0.0.1:${port(server)}`)).toBe("SERVING");
    const body = await curl(["-X", "POST", "-H", "content-type: application/json", "-d", "{}", `${server.url}/grpc.health.v1.Health/Check`]);
    expect(JSON.parse(body)).toEqual({ status: "SERVING" });

    const test = createClient(TestService, createGrpcTransport({ baseUrl: server.url })) as unknown as {
      echo(request: object, options?: { headers?: Record<string, string> }): Promise<Struct>;
    };
    await expect(test.echo({})).rejects.toMatchObject({ code: Code.Unauthenticated, rawMessage: expect.stringContaining("Bearer") });
    await expect(test.echo({}, { headers: { authorization: "Bearer wrong" } })).rejects.toMatchObject({ code: Code.Unauthenticated });
    await expect(test.echo({}, { headers: { authorization: "Bearer s3cret" } })).resolves.toBeDefined();

    // /metrics and /debug/streams are not RPCs, but they tell what the services do and who their
    // clients are: they need the token too.
    for (const page of ["/metrics", "/debug/streams"]) {
      const status = (headers: string[]) => curl(["-o", "/dev/null", "-w", "%{http_code}", ...headers, `${server.url}${page}`]);
      expect(await status([])).toBe("401");
      expect(await status(["-H", "authorization: Bearer wrong"])).toBe("401");
      expect(await status(["-H", "authorization: Bearer s3cret"])).toBe("200");
    }
  });
});

describe("compression", () => {
  it("answers a client that accepts gzip uncompressed (loopback: gzip costs CPU and saves nothing)", async () => {
    const server = await start();
    const big = JSON.stringify({ k: "v".repeat(64 * 1024) }); // far over connect's 1 KiB default threshold
    const headers = await curl([
      "-s",
      "-D",
      "-",
      "-o",
      "/dev/null",
      "-X",
      "POST",
      "-H",
      "content-type: application/json",
      "-H",
      "accept-encoding: gzip",
      "-d",
      big,
      `${server.url}/berth.test.v1.TestService/Echo`,
    ]);
    expect(headers).toMatch(/^HTTP\/1\.1 200/);
    expect(headers.toLowerCase()).not.toContain("content-encoding: gzip");
  });
});

describe("errors", () => {
  type TestClient = { fail(request: MessageLike): Promise<Struct> };
  type MessageLike = { fields: Record<string, { kind: { case: "stringValue"; value: string } }> };
  const ask = (kind: string): MessageLike => ({ fields: { kind: { kind: { case: "stringValue", value: kind } } } });

  it("maps a BerthError to its code, message and details, over gRPC and Connect", async () => {
    const server = await start();
    for (const transport of [createGrpcTransport({ baseUrl: server.url }), createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" })]) {
      const client = createClient(TestService, transport) as unknown as TestClient;
      const error = await client.fail(ask("berth")).then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
      expect(error?.code).toBe(Code.FailedPrecondition);
      expect(error?.rawMessage).toBe("expected seq 3 but the journal is at 5");
      const [details] = error!.findDetails(StructSchema);
      expect(toJson(StructSchema, details!)).toEqual({ current_seq: 5, session: "é" });
      expect(JSON.parse(error!.metadata.get(ERROR_DETAILS_HEADER)!)).toEqual({ reason: "FAILED_PRECONDITION", current_seq: 5, session: "é" });
      expect(error!.findDetails(ErrorInfoSchema)).toEqual([
        expect.objectContaining({ reason: "FAILED_PRECONDITION", metadata: { current_seq: "5", session: "é" } }),
      ]);
    }
  });

  it("answers a raw EMFILE, wherever it was met, RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES with a RetryInfo (no path), and closes idle descriptors", async () => {
    const server = await start();
    let relieved = 0;
    const unregister = onDescriptorShortage(() => ++relieved);
    try {
      for (const transport of [createGrpcTransport({ baseUrl: server.url }), createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" })]) {
        const client = createClient(TestService, transport) as unknown as TestClient;
        for (const kind of ["emfile", "client-emfile"]) {
          const error = ConnectError.from(await client.fail(ask(kind)).catch((e: unknown) => e));
          expect(error.code).toBe(Code.ResourceExhausted);
          expect(error.findDetails(ErrorInfoSchema)[0]?.reason).toBe("TOO_MANY_OPEN_FILES");
          expect(error.findDetails(RetryInfoSchema)[0]?.retryDelay?.seconds).toBe(1n);
          expect(error.rawMessage).not.toMatch(/secret|2379/);
        }
      }
      expect(relieved).toBe(4);
    } finally {
      unregister();
    }
  });

  it("hides an unexpected error behind INTERNAL and logs it", async () => {
    const lines: Array<Record<string, unknown>> = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    const server = await start({ logger });
    const client = createClient(TestService, createGrpcTransport({ baseUrl: server.url })) as unknown as TestClient;
    await expect(client.fail(ask("bug"))).rejects.toMatchObject({ code: Code.Internal, rawMessage: INTERNAL_ERROR_MESSAGE });
    const logged = lines.find((l) => l["msg"] === "handler failed unexpectedly");
    expect(JSON.stringify(logged)).toContain("disk on fire");
  });
});

describe("limits and robustness", () => {
  it("refuses an oversize message with RESOURCE_EXHAUSTED and counts it", async () => {
    const server = await start({ maxMessageBytes: 64 });
    const big = "x".repeat(200);
    await expect(grpcClient(server).check({ service: big })).rejects.toMatchObject({ code: Code.ResourceExhausted });
    const body = await curl([
      "-X",
      "POST",
      "-H",
      "content-type: application/json",
      "-d",
      JSON.stringify({ service: big }),
      `${server.url}/grpc.health.v1.Health/Check`,
    ]);
    expect(JSON.parse(body)).toMatchObject({ code: "resource_exhausted" });
    expect(server.metrics.requestCount("/grpc.health.v1.Health/Check", "resource_exhausted")).toBe(2);
    // Small messages still pass.
    expect((await grpcClient(server).check({ service: "" })).status).toBe(Status.SERVING);
  });

  it("answers health on a spare connection (over the share of connections) and refuses every other call TOO_MANY_OPEN_FILES", async () => {
    const server = await start({ maxConnections: 2, spareConnections: 2 });
    // The connections of the share, held.
    const held = await Promise.all(
      [0, 1].map(async () => {
        const socket = net.connect({ host: "127.0.0.1", port: port(server) });
        socket.on("error", () => {});
        await new Promise((resolve) => socket.once("connect", resolve));
        return socket;
      }),
    );
    try {
      expect(await grpcJsCheck(`127.0.0.1:${port(server)}`)).toBe("SERVING");
      expect(JSON.parse(await curl(["-X", "POST", "-H", "content-type: application/json", "-d", "{}", `${server.url}/grpc.health.v1.Health/Check`]))).toEqual({
        status: "SERVING",
      });
      type TestClient = { echo(request: object): Promise<Struct> };
      const clients = [createGrpcTransport({ baseUrl: server.url }), createConnectTransport({ baseUrl: server.url, httpVersion: "1.1" })].map(
        (transport) => createClient(TestService, transport) as unknown as TestClient,
      );
      for (const client of clients) {
        // Twice: the spare connection says GOAWAY before its answer, so the second call comes on a
        // new spare connection and is refused the same way (not REFUSED_STREAM on the old one).
        for (let i = 0; i < 2; i++) {
          const error = ConnectError.from(await client.echo({}).catch((e: unknown) => e));
          expect(error.code).toBe(Code.ResourceExhausted);
          expect(error.findDetails(ErrorInfoSchema)[0]?.reason).toBe("TOO_MANY_OPEN_FILES");
          expect(error.findDetails(RetryInfoSchema)).toHaveLength(1);
        }
      }
      // The connections of the share free again: the same clients' next calls are served.
      for (const socket of held) socket.destroy();
      await vi.waitFor(() => expect(server.connections).toBe(0));
      for (const client of clients) expect(await client.echo({})).toBeDefined();
    } finally {
      for (const socket of held) socket.destroy();
    }
  });

  it("keeps serving after garbage bytes, a bad HTTP/2 connection and a truncated gRPC frame", async () => {
    const server = await start();
    for (const garbage of [
      Buffer.from("\x00\x01\x02garbage\r\n\r\n"),
      Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"),
    ]) {
      const socket = net.connect(port(server), "127.0.0.1");
      socket.on("error", () => {});
      socket.end(garbage);
      socket.resume();
      await new Promise((resolve) => socket.once("close", resolve));
    }

    // A gRPC frame header that announces 100 bytes, followed by 3 of them and the end of the stream.
    const session = http2.connect(server.url);
    const stream = session.request({
      ":method": "POST",
      ":path": "/grpc.health.v1.Health/Check",
      "content-type": "application/grpc",
      te: "trailers",
    });
    const trailers = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once("trailers", resolve));
    const headers = new Promise<http2.IncomingHttpHeaders>((resolve) => stream.once("response", resolve));
    stream.end(Buffer.from([0, 0, 0, 0, 100, 1, 2, 3]));
    stream.resume();
    const status = (await Promise.race([trailers, headers.then(async (h) => (h["grpc-status"] ? h : trailers))]))["grpc-status"];
    expect(status).toBeDefined();
    expect(status).not.toBe("0");
    session.close();

    expect(await grpcJsCheck(`127.0.0.1:${port(server)}`)).toBe("SERVING");
    expect(JSON.parse(await curl(["-X", "POST", "-H", "content-type: application/json", "-d", "{}", `${server.url}/grpc.health.v1.Health/Check`]))).toEqual({
      status: "SERVING",
    });
  });
});

describe("metrics and logs", () => {
  it("serves /metrics with the request counter, the histogram and registered gauges", async () => {
    let sessions = 3;
    const server = await start({
      services: (context) => {
        context.metrics.registerGauge("berth_test_sessions", "Sessions open.", () => sessions);
        context.metrics.registerGauge("berth_test_by_gate", "Per gate.", () => [{ labels: { gate: "memory" }, value: 1 }]);
        return [implement(TestService, testImplementation as never)];
      },
    });
    await grpcClient(server).check({ service: "" });
    sessions = 4;
    const text = await curl([`${server.url}/metrics`]);
    expect(text).toContain('berth_rpc_requests_total{method="/grpc.health.v1.Health/Check",code="ok"} 1');
    expect(text).toContain('berth_rpc_duration_seconds_count{method="/grpc.health.v1.Health/Check"} 1');
    expect(text).toMatch(/^berth_rpc_in_flight 0$/m);
    expect(text).toMatch(/^process_resident_memory_bytes \d+$/m);
    expect(text).toContain("berth_test_sessions 4");
    expect(text).toContain('berth_test_by_gate{gate="memory"} 1');
    expect(await curl(["-o", "/dev/null", "-w", "%{http_code}", `${server.url}/nowhere`])).toBe("404");
  });

  it("counts open streams per method, and lists them at /debug/streams with their peer, age, turn and holdings", async () => {
    const server = await start({
      services: [
        implement(TestService, {
          ...testImplementation,
          async *stall(request: Struct, context: HandlerContext): AsyncGenerator<Struct> {
            streamHolds(context, "the lock on src/a.css, fencing token 7");
            yield request;
            await new Promise((resolve) => context.signal.addEventListener("abort", resolve));
          },
        } as never),
      ],
    });
    const openGauge = async () => (await curl([`${server.url}/metrics`])).split("\n").filter((line) => line.startsWith("berth_streams_open"));
    // Every streaming method shows from the start, at 0.
    expect(await openGauge()).toEqual(
      expect.arrayContaining([
        'berth_streams_open{method="/berth.test.v1.TestService/Stall"} 0',
        'berth_streams_open{method="/grpc.health.v1.Health/Watch"} 0',
      ]),
    );
    expect(JSON.parse(await curl([`${server.url}/debug/streams`]))).toEqual({ streams: [] });

    const client = createClient(TestService, createGrpcTransport({ baseUrl: server.url })) as unknown as {
      stall(request: object, options: { signal: AbortSignal }): AsyncIterable<Struct>;
    };
    const abort = new AbortController();
    const stream = client.stall({}, { signal: abort.signal })[Symbol.asyncIterator]();
    await stream.next();
    expect(await openGauge()).toContain('berth_streams_open{method="/berth.test.v1.TestService/Stall"} 1');
    const listed = JSON.parse(await curl([`${server.url}/debug/streams`])) as { streams: unknown[] };
    expect(listed.streams).toEqual([
      {
        method: "/berth.test.v1.TestService/Stall",
        peer: expect.stringMatching(/^127\.0\.0\.1:\d+$/),
        protocol: "grpc",
        openSeconds: expect.any(Number),
        messages: 1,
        // The message went out and the handler was asked for the next: its turn.
        waitingOn: "handler",
        waitingSeconds: expect.any(Number),
        holds: "the lock on src/a.css, fencing token 7",
      },
    ]);
    abort.abort();
    await expect.poll(() => server.metrics.streams.size).toBe(0);
    expect(await openGauge()).toContain('berth_streams_open{method="/berth.test.v1.TestService/Stall"} 0');
  });

  it("logs one line per RPC (health at debug), a stream's at its end", async () => {
    const lines: Array<Record<string, unknown>> = [];
    const logger = pino({ level: "debug" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    const server = await start({ logger });
    await grpcClient(server).check({ service: "" });
    const rpcLines = () => lines.filter((l) => l["msg"] === "rpc");
    expect(rpcLines()).toEqual([
      expect.objectContaining({
        level: 20,
        method: "/grpc.health.v1.Health/Check",
        code: "ok",
        protocol: "grpc",
        peer: expect.stringMatching(/^127\.0\.0\.1:\d+$/),
        ms: expect.any(Number),
      }),
    ]);

    const abort = new AbortController();
    const stream = grpcClient(server).watch({ service: "" }, { signal: abort.signal })[Symbol.asyncIterator]();
    await stream.next();
    expect(rpcLines()).toHaveLength(1); // the watch is still open: no line yet
    abort.abort();
    await expect.poll(() => rpcLines().length).toBe(2);
    expect(rpcLines()[1]).toMatchObject({ method: "/grpc.health.v1.Health/Watch", code: "canceled" });
  });
});

describe("shutdown", () => {
  it("cuts a stream that ignores the shutdown signal, then runs the hooks", async () => {
    const order: string[] = [];
    const server = await start({ onShutdown: [() => void order.push("hook")] });
    const client = createClient(TestService, createGrpcTransport({ baseUrl: server.url })) as unknown as {
      stall(request: object): AsyncIterable<Struct>;
    };
    const stream = client.stall({})[Symbol.asyncIterator]();
    await stream.next();
    const closing = server.close().then(() => order.push("closed"));
    await expect(stream.next()).rejects.toMatchObject({ code: Code.Unavailable });
    await closing;
    expect(order).toEqual(["hook", "closed"]);
    await expect(grpcJsCheck(`127.0.0.1:${port(server)}`)).rejects.toMatchObject({ code: grpc.status.UNAVAILABLE });
  });

  it("exposes the shutdown signal to handler factories and to every handler's context", async () => {
    let seen: AbortSignal | undefined;
    const server = await start({
      // A backstop far beyond the test's timeout: only the signal can end the stream in time.
      streamGraceMs: 120_000,
      services: (context) => {
        seen = context.shutdownSignal;
        return [
          implement(TestService, {
            async *stall(_request: Struct, handler: HandlerContext) {
              yield {};
              await new Promise((resolve) => handler.signal.addEventListener("abort", resolve));
              handler.signal.throwIfAborted();
            },
          } as never),
        ];
      },
    });
    expect(seen?.aborted).toBe(false);
    const client = createClient(TestService, createGrpcTransport({ baseUrl: server.url })) as unknown as { stall(request: object): AsyncIterable<Struct> };
    const stream = client.stall({})[Symbol.asyncIterator]();
    await stream.next();
    const started = Date.now();
    const closing = server.close();
    await expect(stream.next()).rejects.toMatchObject({ code: Code.Unavailable, rawMessage: "server shutting down" });
    expect(Date.now() - started).toBeLessThan(10_000); // ended on the signal, not by the 120 s backstop
    expect(seen?.aborted).toBe(true);
    await closing;
  });

  it("shuts down on the first signal and exits at once on the second", async () => {
    const server = await start();
    const exits: number[] = [];
    const uninstall = installSignalHandlers(server, silent, { exit: (code) => void exits.push(code), signals: ["SIGUSR2"] });
    try {
      process.emit("SIGUSR2", "SIGUSR2");
      process.emit("SIGUSR2", "SIGUSR2");
      expect(exits).toEqual([130]);
      await server.closed;
      await expect.poll(() => exits).toEqual([130, 0]);
    } finally {
      uninstall();
    }
  });
});

describe("unix socket", () => {
  it("listens on a socket only its owner can use", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-server-"));
    try {
      const socket = path.join(dir, "test.sock");
      const server = await start({ socket });
      expect(server.url).toBe(`unix:${socket}`);
      expect(fs.statSync(socket).mode & 0o777).toBe(0o600);
      expect(await grpcJsCheck(`unix:${socket}`)).toBe("SERVING");
      await server.close();
      expect(fs.existsSync(socket)).toBe(false);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("replaces a socket file left by a dead server", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-server-"));
    try {
      const socket = path.join(dir, "stale.sock");
      // A server killed with SIGKILL leaves its socket file behind, with nobody listening.
      const child = spawn(process.execPath, ["-e", `require("net").createServer().listen(${JSON.stringify(socket)}, () => console.log("ready"))`]);
      await new Promise((resolve) => child.stdout.once("data", resolve));
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("exit", resolve));
      expect(fs.existsSync(socket)).toBe(true);
      const server = await start({ socket });
      expect(await grpcJsCheck(`unix:${socket}`)).toBe("SERVING");
      await server.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
