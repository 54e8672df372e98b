/**
 * What every route does around Connect, on a real server over every protocol: errors Connect writes
 * itself carry berth's code and ErrorInfo, a body Connect stops reading is read on so that the
 * client sees the answer, and the token is checked before the body is read.
 */
import { afterEach, describe, expect, it } from "vitest";
import pino from "pino";
import { create, createFileRegistry, toBinary, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_duration } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckRequestSchema } from "@berth/api/grpc/health/v1/health_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { envelope, RAW_ROUTES, rawRpc, type RawRpcAnswer } from "./testing/raw-rpc.js";
import { implement, startServer, type RunningServer, type StartServerOptions } from "./start-server.js";

// Found by the fuzzer (test/chaos/fuzz/fuzz.test.ts): bytes that are not a protobuf message were
// answered INTERNAL ("parse binary: premature EOF"), the code berth keeps for its own bugs; and
// errors Connect raised before any interceptor left without an ErrorInfo.

const servers: RunningServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close(false)));
});

async function start(options: Partial<StartServerOptions> = {}): Promise<RunningServer> {
  const server = await startServer({ name: "test", logger: pino({ level: "silent" }), ...options });
  servers.push(server);
  return server;
}

/** Field 1 announcing 127 bytes that never come: no protobuf parser can read it. */
const GARBAGE = Buffer.from([0x0a, 0x7f, 0x01]);
const CHECK = "/grpc.health.v1.Health/Check";
const WATCH = "/grpc.health.v1.Health/Watch";
const REFLECT = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";

const outcome = (answer: RawRpcAnswer) => [answer.code, answer.reason, answer.domain];

/** Sends `messages` (the same bytes, binary protocols only) over every route; the outcomes by route. */
async function everywhere(url: string, path: string, streaming: boolean, payload: Uint8Array, extra: { token?: string } = {}) {
  const out: Record<string, RawRpcAnswer> = {};
  for (const route of RAW_ROUTES.filter((r) => r.protocol !== "connect-json")) {
    out[`${route.protocol}/h${route.httpVersion}`] = await rawRpc(url, { ...route, path, streaming, messages: [payload], ...extra });
  }
  return out;
}

describe("errors Connect writes itself", () => {
  it("a request that does not decode is INVALID_ARGUMENT MALFORMED_REQUEST with an ErrorInfo, unary or streamed, on every protocol", async () => {
    const { url } = await start();
    for (const [path, streaming] of [
      [CHECK, false],
      [WATCH, true],
    ] as const) {
      const answers = await everywhere(url, path, streaming, GARBAGE);
      for (const [route, answer] of Object.entries(answers)) {
        expect([route, ...outcome(answer)]).toEqual([route, "invalid_argument", "MALFORMED_REQUEST", "grpc.health"]);
        expect(answer.message).toBe("the request did not decode: parse binary: premature EOF");
      }
    }
  });

  it("a compressed flag without an encoding stays INTERNAL, as the gRPC spec demands, with a reason saying it is the client's framing", async () => {
    const { url } = await start();
    for (const route of RAW_ROUTES.filter((r) => r.protocol !== "connect-json")) {
      const streaming = route.protocol === "connect";
      const answer = await rawRpc(url, { ...route, path: streaming ? WATCH : CHECK, streaming, body: envelope(1, Buffer.alloc(0)) });
      expect(outcome(answer)).toEqual(["internal", "COMPRESSED_WITHOUT_ENCODING", "grpc.health"]);
    }
    // The server still answers a good request on the same footing.
    const ok = await rawRpc(url, { protocol: "grpc", httpVersion: 2, path: CHECK, streaming: false, messages: [new Uint8Array()] });
    expect(ok.code).toBe("ok");
  });

  it("an encoding the server does not speak is UNIMPLEMENTED UNSUPPORTED_ENCODING, naming the ones it does", async () => {
    const { url } = await start();
    const grpc = await rawRpc(url, {
      protocol: "grpc",
      httpVersion: 2,
      path: CHECK,
      streaming: false,
      body: envelope(1, GARBAGE),
      headers: { "grpc-encoding": "zstd" },
    });
    expect([...outcome(grpc), grpc.metadata]).toEqual(["unimplemented", "UNSUPPORTED_ENCODING", "grpc.health", { encoding: "zstd", supported: "gzip,br" }]);
    const connect = await rawRpc(url, {
      protocol: "connect",
      httpVersion: 1,
      path: CHECK,
      streaming: false,
      body: GARBAGE,
      headers: { "content-encoding": "zstd" },
    });
    expect([...outcome(connect), connect.httpStatus]).toEqual(["unimplemented", "UNSUPPORTED_ENCODING", "grpc.health", 501]);
  });

  // Found by the fuzzer: a JSON field of the wrong type holding a lone surrogate is quoted in the
  // decode error, connect-es's encodeURIComponent of that message throws, and the call was left
  // unanswered (the client hung until its own deadline; the log said "ok").
  it("answers a gRPC and gRPC-Web JSON request whose decode error quotes a lone surrogate", async () => {
    // A unary method taking a Duration: a JSON string that is not one is quoted in the error.
    const registry = createFileRegistry(
      create(FileDescriptorProtoSchema, {
        name: "berth/test/v1/wait.proto",
        package: "berth.test.v1",
        dependency: ["google/protobuf/duration.proto"],
        syntax: "proto3",
        service: [{ name: "WaitService", method: [{ name: "Wait", inputType: ".google.protobuf.Duration", outputType: ".google.protobuf.Duration" }] }],
      }),
      (name) => (name === "google/protobuf/duration.proto" ? file_google_protobuf_duration : undefined),
    );
    const WaitService = registry.getService("berth.test.v1.WaitService") as DescService;
    const { url } = await start({ services: [implement(WaitService, { wait: (d: unknown) => d } as never)] });
    const json = Buffer.from('"\\ud800"');
    const path = "/berth.test.v1.WaitService/Wait";
    for (const contentType of ["application/grpc+json", "application/grpc-web+json", "application/json"]) {
      const protocol = contentType.startsWith("application/grpc-web") ? "grpc-web" : contentType.startsWith("application/grpc") ? "grpc" : "connect-json";
      const answer = await rawRpc(url, {
        protocol,
        httpVersion: 2,
        path,
        streaming: false,
        messages: [json],
        headers: { "content-type": contentType },
        timeoutMs: 3_000,
      });
      expect([contentType, ...outcome(answer)]).toEqual([contentType, "invalid_argument", "MALFORMED_REQUEST", "berth.test"]);
    }
  });
});

describe("messages over the size limit", () => {
  it("are RESOURCE_EXHAUSTED MESSAGE_TOO_LARGE naming the limit, on every protocol", async () => {
    const { url } = await start({ maxMessageBytes: 1024 });
    const big = toBinary(HealthCheckRequestSchema, create(HealthCheckRequestSchema, { service: "x".repeat(4096) }));
    for (const [route, answer] of Object.entries(await everywhere(url, CHECK, false, big))) {
      expect([route, ...outcome(answer), answer.metadata.limitBytes]).toEqual([route, "resource_exhausted", "MESSAGE_TOO_LARGE", "grpc.health", "1024"]);
    }
  });

  // A 12 MB gRPC request got INTERNAL "Stream closed with error code NGHTTP2_ENHANCE_YOUR_CALM":
  // the server answered at the message's length prefix, and Node's HTTP/2 client resets its own
  // stream when an answer arrives while more than its session memory (10 MB) waits to be sent.
  it("reach a Node gRPC client that sent 12 MB as RESOURCE_EXHAUSTED, and over HTTP/1.1 the answer arrives before the connection closes", async () => {
    const server = await start();
    const client = createClient(Health, createGrpcTransport({ baseUrl: server.url }));
    const error = await client.check({ service: "x".repeat(12 << 20) }).then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect([error?.code, error?.findDetails(ErrorInfoSchema)[0]?.reason]).toEqual([Code.ResourceExhausted, "MESSAGE_TOO_LARGE"]);
    const big = Buffer.alloc(12 << 20);
    const h1 = await rawRpc(server.url, { protocol: "connect", httpVersion: 1, path: CHECK, streaming: false, body: big });
    expect(outcome(h1)).toEqual(["resource_exhausted", "MESSAGE_TOO_LARGE", "grpc.health"]);
    expect((await client.check({})).status).toBe(1);
  });
});

describe("the bearer token", () => {
  it("is checked before the body is read: a malformed request without it is UNAUTHENTICATED on every protocol, and health stays open", async () => {
    const server = await start({ token: "s3cret" });
    const url = server.url;
    for (const [token, reason] of [
      [undefined, "TOKEN_MISSING"],
      ["wrong", "TOKEN_INVALID"],
    ] as const) {
      for (const [route, answer] of Object.entries(await everywhere(url, REFLECT, true, GARBAGE, token === undefined ? {} : { token }))) {
        expect([route, ...outcome(answer)]).toEqual([route, "unauthenticated", reason, "grpc.reflection"]);
      }
    }
    // Counted as refused, also where the status travels in the body (gRPC-Web, Connect streams).
    expect(server.metrics.requestCount(REFLECT, "unauthenticated")).toBe(10);
    expect(server.metrics.requestCount(REFLECT, "ok")).toBe(0);
    // With the token, the same bytes reach the decoder.
    const decoded = await rawRpc(url, { protocol: "grpc", httpVersion: 2, path: REFLECT, streaming: true, messages: [GARBAGE], token: "s3cret" });
    expect(outcome(decoded)).toEqual(["invalid_argument", "MALFORMED_REQUEST", "grpc.reflection"]);
    for (const [route, answer] of Object.entries(await everywhere(url, CHECK, false, new Uint8Array()))) expect([route, answer.code]).toEqual([route, "ok"]);
  });
});
