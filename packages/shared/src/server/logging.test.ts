import { Writable } from "node:stream";
import { afterEach, describe, expect, it } from "vitest";
import pino from "pino";
import { create, createFileRegistry, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema, file_google_protobuf_struct, type Struct } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { onStreamEnd } from "./logging.js";
import { implement, startServer, type RunningServer } from "./start-server.js";

describe("onStreamEnd", () => {
  const ended = (drive: (it: AsyncIterator<number>) => Promise<unknown>) => {
    let seen: unknown = "not ended";
    async function* source() {
      yield 1;
      yield 2;
    }
    const it = onStreamEnd(source(), (error) => (seen = error))[Symbol.asyncIterator]();
    return drive(it).then(
      () => seen,
      () => seen,
    );
  };

  it("reports completion, a source's error, and a consumer that stops early as CANCELED", async () => {
    const drained = await ended(async (it) => {
      while (!(await it.next()).done);
    });
    expect(drained).toBeUndefined();
    const early = await ended(async (it) => {
      await it.next();
      await it.return!();
    });
    expect(early).toBeInstanceOf(ConnectError);
    expect((early as ConnectError).code).toBe(Code.Canceled);
  });

  it("reports a write failure thrown in by the response writer (the client reset the stream) as CANCELED, not UNKNOWN", async () => {
    // What connect-node's response writer passes to throw() when the client has gone: a Node error.
    const writeFailure = Object.assign(new Error("The stream has been destroyed"), { code: "ERR_STREAM_DESTROYED" });
    const seen = await ended(async (it) => {
      await it.next();
      await it.throw!(writeFailure);
    });
    expect(seen).toBeInstanceOf(ConnectError);
    expect((seen as ConnectError).code).toBe(Code.Canceled);
    // A ConnectError thrown in keeps its code.
    const deadline = new ConnectError("deadline", Code.DeadlineExceeded);
    const kept = await ended(async (it) => {
      await it.next();
      await it.throw!(deadline);
    });
    expect(kept).toBe(deadline);
  });
});

// A server whose stream writes as fast as it can, so that a client's cancel lands mid-write.
const file = createFileRegistry(
  create(FileDescriptorProtoSchema, {
    name: "berth/test/v1/flood.proto",
    package: "berth.test.v1",
    dependency: ["google/protobuf/struct.proto"],
    syntax: "proto3",
    service: [
      { name: "FloodService", method: [{ name: "Flood", inputType: ".google.protobuf.Struct", outputType: ".google.protobuf.Struct", serverStreaming: true }] },
    ],
  }),
  (name) => (name === "google/protobuf/struct.proto" ? file_google_protobuf_struct : undefined),
);
const FloodService = file.getService("berth.test.v1.FloodService") as DescService;

const servers: RunningServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close(false)));
});

describe("the rpc log line of a stream its client cancels", () => {
  it("says canceled, however the cancel meets the server's writes (40 cancels mid-flood)", async () => {
    const codes: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _encoding, done) {
        for (const line of chunk.toString("utf8").split("\n")) {
          if (line.includes('"msg":"rpc"')) codes.push((JSON.parse(line) as { code: string }).code);
        }
        done();
      },
    });
    const server = await startServer({
      name: "test",
      logger: pino({ level: "info" }, sink),
      services: [
        implement(FloodService, {
          async *flood(request: Struct) {
            for (;;) {
              yield request;
              await new Promise((resolve) => setImmediate(resolve));
            }
          },
        } as never),
      ],
    });
    servers.push(server);
    const sessions = new Http2SessionManager(server.url);
    const client = createClient(FloodService, createGrpcTransport({ baseUrl: server.url, sessionManager: sessions })) as unknown as {
      flood(request: object, options: { signal: AbortSignal }): AsyncIterable<unknown>;
    };
    for (let i = 0; i < 40; i++) {
      const controller = new AbortController();
      let received = 0;
      try {
        for await (const _ of client.flood({ fields: {} }, { signal: controller.signal })) {
          if (++received === 1 + (i % 5)) controller.abort();
        }
      } catch {
        // our own abort
      }
    }
    sessions.abort();
    await expect.poll(() => codes.length, { timeout: 10_000 }).toBe(40);
    expect(codes.filter((code) => code !== "canceled")).toEqual([]);
  });
});
