import * as http from "node:http";
import * as http2 from "node:http2";
import { afterEach, describe, expect, it } from "vitest";
import pino from "pino";
import { create, createFileRegistry, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_duration } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { asInvalidArgumentIfDecodeError } from "./decode-errors.js";
import { implement, startServer, type RunningServer } from "./start-server.js";

// Found by the fuzzer (test/chaos/fuzz/fuzz.test.ts): bytes that are not a protobuf message were
// answered INTERNAL ("parse binary: premature EOF"), the code berth keeps for its own bugs.

const servers: RunningServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close(false)));
});

async function start(): Promise<RunningServer> {
  const server = await startServer({ name: "test", logger: pino({ level: "silent" }) });
  servers.push(server);
  return server;
}

function envelope(flags: number, payload: Uint8Array): Buffer {
  const out = Buffer.alloc(5 + payload.byteLength);
  out[0] = flags;
  out.writeUInt32BE(payload.byteLength, 1);
  Buffer.from(payload).copy(out, 5);
  return out;
}

/** Field 1 announcing 127 bytes that never come: no protobuf parser can read it. */
const GARBAGE = Buffer.from([0x0a, 0x7f, 0x01]);

interface RawAnswer {
  status: number;
  headers: http2.IncomingHttpHeaders;
  trailers: http2.IncomingHttpHeaders;
  body: Buffer;
}

function h2Post(url: string, path: string, headers: Record<string, string>, body: Buffer): Promise<RawAnswer> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(url);
    const timer = setTimeout(() => {
      session.destroy();
      reject(new Error(`no answer to ${path} within 5 s`));
    }, 5_000);
    session.on("close", () => clearTimeout(timer));
    session.on("error", reject);
    const stream = session.request({ ":method": "POST", ":path": path, ...headers });
    let answer: RawAnswer = { status: 0, headers: {}, trailers: {}, body: Buffer.alloc(0) };
    stream.on("response", (h) => (answer = { ...answer, status: Number(h[":status"]), headers: h }));
    stream.on("trailers", (t) => (answer.trailers = t));
    stream.on("data", (chunk: Buffer) => (answer.body = Buffer.concat([answer.body, chunk])));
    stream.on("end", () => {
      session.close();
      resolve(answer);
    });
    stream.on("error", reject);
    stream.end(body);
  });
}

function h1Post(url: string, path: string, contentType: string, body: Buffer): Promise<{ status: number; json: { code?: string; message?: string } }> {
  return new Promise((resolve, reject) => {
    const request = http.request(`${url}${path}`, { method: "POST", agent: false, headers: { "content-type": contentType } }, (response) => {
      let text = "";
      response.on("data", (chunk: Buffer) => (text += chunk.toString("utf8")));
      response.on("end", () => resolve({ status: response.statusCode ?? 0, json: JSON.parse(text) as { code?: string; message?: string } }));
    });
    request.on("error", reject);
    request.end(body);
  });
}

const grpcStatusOf = (answer: RawAnswer) => answer.trailers["grpc-status"] ?? answer.headers["grpc-status"];

describe("requests that do not decode", () => {
  it("are INVALID_ARGUMENT over gRPC, gRPC-Web and Connect (unary, HTTP/1.1 and HTTP/2)", async () => {
    const { url } = await start();
    const grpc = await h2Post(url, "/grpc.health.v1.Health/Check", { "content-type": "application/grpc", te: "trailers" }, envelope(0, GARBAGE));
    expect(grpcStatusOf(grpc)).toBe(String(Code.InvalidArgument));
    expect(decodeURIComponent(String(grpc.trailers["grpc-message"] ?? grpc.headers["grpc-message"]))).toMatch(/^the request did not decode: parse binary: /);

    const web = await h2Post(url, "/grpc.health.v1.Health/Check", { "content-type": "application/grpc-web+proto" }, envelope(0, GARBAGE));
    expect(web.body[0]).toBe(0x80);
    expect(web.body.subarray(5).toString("latin1")).toMatch(/grpc-status: 3\r\n/);

    const connectH2 = await h2Post(url, "/grpc.health.v1.Health/Check", { "content-type": "application/proto" }, GARBAGE);
    expect(connectH2.status).toBe(400);
    expect(JSON.parse(connectH2.body.toString("utf8"))).toMatchObject({ code: "invalid_argument" });

    const connectH1 = await h1Post(url, "/grpc.health.v1.Health/Check", "application/proto", GARBAGE);
    expect(connectH1).toMatchObject({ status: 400, json: { code: "invalid_argument", message: expect.stringMatching(/did not decode/) } });
  });

  it("are INVALID_ARGUMENT in a stream too, and a compressed flag without an encoding stays INTERNAL as the gRPC spec demands", async () => {
    const { url } = await start();
    const watch = await h2Post(url, "/grpc.health.v1.Health/Watch", { "content-type": "application/grpc", te: "trailers" }, envelope(0, GARBAGE));
    expect(grpcStatusOf(watch)).toBe(String(Code.InvalidArgument));
    const flagged = await h2Post(url, "/grpc.health.v1.Health/Check", { "content-type": "application/grpc", te: "trailers" }, envelope(1, Buffer.alloc(0)));
    expect(grpcStatusOf(flagged)).toBe(String(Code.Internal));
    // The server still answers a good request on the same footing.
    const ok = await h2Post(url, "/grpc.health.v1.Health/Check", { "content-type": "application/grpc", te: "trailers" }, envelope(0, Buffer.alloc(0)));
    expect(grpcStatusOf(ok)).toBe("0");
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
    const server = await startServer({
      name: "test",
      logger: pino({ level: "silent" }),
      services: [implement(WaitService, { wait: (d: unknown) => d } as never)],
    });
    servers.push(server);
    const json = Buffer.from('"\\ud800"');
    const path = "/berth.test.v1.WaitService/Wait";
    const grpc = await h2Post(server.url, path, { "content-type": "application/grpc+json", te: "trailers", "grpc-timeout": "3S" }, envelope(0, json));
    expect(grpcStatusOf(grpc)).toBe(String(Code.InvalidArgument));
    const web = await h2Post(server.url, path, { "content-type": "application/grpc-web+json", "grpc-timeout": "3S" }, envelope(0, json));
    expect(web.body.subarray(5).toString("latin1")).toMatch(/grpc-status: 3\r\n/);
    const connect = await h1Post(server.url, path, "application/json", json);
    expect(connect).toMatchObject({ status: 400, json: { code: "invalid_argument" } });
  });

  it("maps only decode failures", () => {
    const decode = asInvalidArgumentIfDecodeError(new ConnectError("parse binary: premature EOF", Code.Internal));
    expect(decode.code).toBe(Code.InvalidArgument);
    expect(asInvalidArgumentIfDecodeError(new ConnectError("decompression failed", Code.Internal)).code).toBe(Code.InvalidArgument);
    const other = new ConnectError("serialize binary: x", Code.Internal);
    expect(asInvalidArgumentIfDecodeError(other)).toBe(other);
    const notInternal = new ConnectError("parse binary: x", Code.Unavailable);
    expect(asInvalidArgumentIfDecodeError(notInternal)).toBe(notInternal);
  });
});
