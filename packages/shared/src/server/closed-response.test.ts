import { once } from "node:events";
import * as fs from "node:fs";
import * as http from "node:http";
import * as http2 from "node:http2";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import pino from "pino";
import { create, createFileRegistry, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_struct, StructSchema, type Struct } from "@bufbuild/protobuf/wkt";
import { implement, startServer, type RunningServer, type StartServerOptions } from "./start-server.js";

// A stream of large messages, produced as fast as they are taken: a client that reads nothing
// leaves the server's write of the first one waiting (flow control, full socket buffers).
const file = createFileRegistry(
  create(FileDescriptorProtoSchema, {
    name: "berth/test/v1/big.proto",
    package: "berth.test.v1",
    dependency: ["google/protobuf/struct.proto"],
    syntax: "proto3",
    service: [
      { name: "BigService", method: [{ name: "Big", inputType: ".google.protobuf.Struct", outputType: ".google.protobuf.Struct", serverStreaming: true }] },
    ],
  }),
  (name) => (name === "google/protobuf/struct.proto" ? file_google_protobuf_struct : undefined),
);
const BigService = file.getService("berth.test.v1.BigService") as DescService;
const METHOD = "/berth.test.v1.BigService/Big";
/** Far more than an HTTP/2 stream's 64 KiB window or a unix socket's buffers; under the 4 MiB message limit. */
const MESSAGE_BYTES = 2 * 1024 * 1024;
/** An empty Struct in one uncompressed frame, as the gRPC and Connect streaming protocols send it. */
const EMPTY_REQUEST = Buffer.alloc(5);

const servers: RunningServer[] = [];
const directories: string[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close(false)));
  for (const dir of directories.splice(0)) fs.rmSync(dir, { recursive: true, force: true });
});

/** A server whose one stream floods large messages; `ended` resolves when its handler's `finally` has run. */
async function floodServer(options: Partial<StartServerOptions> = {}): Promise<{ server: RunningServer; ended: Promise<void> }> {
  let markEnded: () => void = () => {};
  const ended = new Promise<void>((resolve) => (markEnded = resolve));
  const big = create(StructSchema, { fields: { text: { kind: { case: "stringValue", value: "x".repeat(MESSAGE_BYTES) } } } });
  const server = await startServer({
    name: "test",
    logger: pino({ level: "silent" }),
    services: [
      implement(BigService, {
        async *big(): AsyncGenerator<Struct> {
          try {
            for (;;) yield big;
          } finally {
            markEnded();
          }
        },
      } as never),
    ],
    ...options,
  });
  servers.push(server);
  return { server, ended };
}

/** Opens the stream over HTTP/2 gRPC without ever reading it; resolves once the first message's write has begun. */
async function unreadGrpcStream(server: RunningServer): Promise<{ session: http2.ClientHttp2Session; stream: http2.ClientHttp2Stream }> {
  const session = http2.connect(server.url);
  session.on("error", () => {});
  const stream = session.request({ ":method": "POST", ":path": METHOD, "content-type": "application/grpc", te: "trailers" });
  stream.on("error", () => {});
  stream.pause();
  stream.end(EMPTY_REQUEST);
  // The server sends its headers in the same turn as it starts writing the first message, which
  // cannot finish: the stream's window is 64 KiB and nothing here reads.
  await once(stream, "response");
  return { session, stream };
}

/** The stream has ended on the server: handler done, gauge down, counted and logged CANCELED. */
async function expectEnded(server: RunningServer, ended: Promise<void>): Promise<void> {
  // Without the fix this never resolves (the test times out): the write waits forever.
  await ended;
  expect(server.metrics.streams.size).toBe(0);
  expect(server.metrics.render()).toContain(`berth_streams_open{method="${METHOD}"} 0`);
  await expect.poll(() => server.metrics.requestCount(METHOD, "canceled")).toBe(1);
}

describe("a stream whose client goes away while a message waits to be written", () => {
  it("ends when an HTTP/2 client resets the stream (a grpc-js cancel)", async () => {
    const { server, ended } = await floodServer();
    const { session, stream } = await unreadGrpcStream(server);
    expect(server.metrics.streams.list()).toMatchObject([{ method: METHOD, waitingOn: "client", messages: 1 }]);
    stream.close(http2.constants.NGHTTP2_CANCEL);
    await expectEnded(server, ended);
    session.close();
  });

  it("ends when the HTTP/2 client's connection goes", async () => {
    const { server, ended } = await floodServer();
    const { session } = await unreadGrpcStream(server);
    session.destroy();
    await expectEnded(server, ended);
  });

  it("ends when an HTTP/1.1 Connect client drops its connection", async () => {
    // A unix socket: its buffers are small and fixed (TCP's grow), so the write surely waits.
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-closed-response-"));
    directories.push(dir);
    const socketPath = path.join(dir, "s.sock");
    const { server, ended } = await floodServer({ socket: socketPath });
    const request = http.request({ socketPath, path: METHOD, method: "POST", headers: { "content-type": "application/connect+proto" } });
    request.on("error", () => {});
    request.end(EMPTY_REQUEST);
    const [response] = (await once(request, "response")) as [http.IncomingMessage];
    expect(response.statusCode).toBe(200);
    request.destroy();
    await expectEnded(server, ended);
  });
});
