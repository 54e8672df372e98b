import { createServer, constants, type Http2Server, type ServerHttp2Stream } from "node:http2";
import type { AddressInfo } from "node:net";
import { gzipSync } from "node:zlib";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { ConnectError, createClient, type Client } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KV, PutRequestSchema, PutResponseSchema } from "./gen/etcd/etcdserver/etcdserverpb/rpc_pb.js";
import { createEtcdTransport } from "./grpc-transport.js";
import { nodeErrorCodes } from "./http2-errors.js";

// Each scenario is what a server does with a Put whose key names it; connect-node's own transport
// and berth's must end every call alike (same message, or same error and reset).
const GRPC = { ":status": 200, "content-type": "application/grpc" };
const answer = (revision: bigint) => Buffer.from(toBinary(PutResponseSchema, create(PutResponseSchema, { header: { revision } })));
const frame = (bytes: Uint8Array, flag = 0, length = bytes.byteLength) => {
  const head = Buffer.alloc(5);
  head[0] = flag;
  head.writeUInt32BE(length, 1);
  return Buffer.concat([head, bytes]);
};
const withTrailers = (stream: ServerHttp2Stream, head: Record<string, string | number>, body: Buffer, trailers: Record<string, string>) => {
  stream.respond(head, { waitForTrailers: true });
  stream.on("wantTrailers", () => stream.sendTrailers(trailers));
  stream.end(body);
};

const SCENARIOS: Record<string, (stream: ServerHttp2Stream) => void> = {
  ok: (s) => withTrailers(s, GRPC, frame(answer(7n)), { "grpc-status": "0", "x-trailer": "t" }),
  "ok in pieces": (s) => {
    const body = frame(answer(8n));
    s.respond(GRPC, { waitForTrailers: true });
    s.on("wantTrailers", () => s.sendTrailers({ "grpc-status": "0" }));
    s.write(body.subarray(0, 3));
    setTimeout(() => s.end(body.subarray(3)), 5);
  },
  "ok as +proto": (s) => withTrailers(s, { ...GRPC, "content-type": "application/grpc+proto" }, frame(answer(9n)), { "grpc-status": "0" }),
  "ok gzipped": (s) => withTrailers(s, { ...GRPC, "grpc-encoding": "gzip" }, frame(gzipSync(answer(10n)), 1), { "grpc-status": "0" }),
  "status in trailers": (s) =>
    withTrailers(s, { ...GRPC, "x-head": "h" }, Buffer.alloc(0), {
      "grpc-status": "5",
      "grpc-message": encodeURIComponent("etcdserver: requested lease not found"),
    }),
  "trailers only": (s) => s.respond({ ...GRPC, "grpc-status": "14", "grpc-message": "etcdserver: no leader" }, { endStream: true }),
  "message with error status in head": (s) => withTrailers(s, { ...GRPC, "grpc-status": "3" }, frame(answer(1n)), { "grpc-status": "3" }),
  "http 503": (s) => {
    s.respond({ ":status": 503, "content-type": "text/plain" });
    s.end("busy");
  },
  "content type": (s) => withTrailers(s, { ...GRPC, "content-type": "application/json" }, Buffer.from("{}"), { "grpc-status": "0" }),
  "unknown encoding": (s) => withTrailers(s, { ...GRPC, "grpc-encoding": "snappy" }, frame(answer(1n), 1), { "grpc-status": "0" }),
  "no trailers": (s) => {
    s.respond(GRPC);
    s.end(frame(answer(1n)));
  },
  "no message": (s) => withTrailers(s, GRPC, Buffer.alloc(0), { "grpc-status": "0" }),
  "two messages": (s) => withTrailers(s, GRPC, Buffer.concat([frame(answer(1n)), frame(answer(2n))]), { "grpc-status": "0" }),
  "incomplete envelope": (s) => withTrailers(s, GRPC, frame(answer(1n), 0, 100), { "grpc-status": "0" }),
  "not protobuf": (s) => withTrailers(s, GRPC, frame(Buffer.from([0xff, 0xff, 0xff])), { "grpc-status": "0" }),
  "reset before the answer": (s) => s.close(constants.NGHTTP2_INTERNAL_ERROR),
  "refused stream": (s) => s.close(constants.NGHTTP2_REFUSED_STREAM),
  "cancelled by the server": (s) => s.close(constants.NGHTTP2_CANCEL),
  "reset after the head": (s) => {
    s.respond(GRPC);
    s.write(frame(answer(1n)).subarray(0, 4), () => setTimeout(() => s.close(constants.NGHTTP2_ENHANCE_YOUR_CALM), 5));
  },
  "connection dropped": (s) => s.session?.destroy(),
  silent: () => {},
};

interface Outcome {
  readonly revision?: bigint;
  readonly header?: [string, string][];
  readonly trailer?: [string, string][];
  readonly error?: { name: string; code: number; message: string; metadata: [string, string][]; causes: string[] };
  /** How the server saw its stream close. */
  readonly serverRstCode?: number;
}

describe("berth's etcd transport against connect-node's", () => {
  let server: Http2Server;
  let url: string;
  let closed: Promise<number> = new Promise(() => {});
  /** Called once the server has read a request whole (its scenario begun). */
  let requestRead: (() => void) | undefined;
  const managers: Http2SessionManager[] = [];

  beforeAll(async () => {
    server = createServer();
    server.on("stream", (stream) => {
      closed = new Promise((resolve) => stream.on("close", () => resolve(stream.rstCode ?? 0)));
      stream.on("error", () => {});
      const chunks: Buffer[] = [];
      stream.on("data", (chunk: Buffer) => chunks.push(chunk));
      stream.on("end", () => {
        if (chunks.length === 0) return;
        const key = new TextDecoder().decode(fromBinary(PutRequestSchema, Buffer.concat(chunks).subarray(5)).key);
        SCENARIOS[key]?.(stream);
        requestRead?.();
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(async () => {
    for (const manager of managers) manager.abort();
    await new Promise((resolve) => server.close(resolve));
  });

  const clients = (target = url) => {
    const connectManager = new Http2SessionManager(target);
    const berthManager = new Http2SessionManager(target);
    managers.push(connectManager, berthManager);
    return {
      connect: createClient(KV, createGrpcTransport({ baseUrl: target, sessionManager: connectManager })),
      berth: createClient(KV, createEtcdTransport(target, berthManager)),
    };
  };

  const outcome = async (
    kv: Client<typeof KV>,
    key: string,
    options: { timeoutMs?: number; signal?: AbortSignal; headers?: Record<string, string> },
  ): Promise<Outcome> => {
    closed = new Promise(() => {});
    let header: Headers | undefined;
    let trailer: Headers | undefined;
    const result: Outcome = await kv
      .put(
        { key: new TextEncoder().encode(key) },
        {
          ...options,
          onHeader: (h) => (header = h),
          onTrailer: (t) => (trailer = t),
        },
      )
      .then(
        (response): Outcome => ({ revision: response.header?.revision ?? 0n, header: entries(header), trailer: entries(trailer) }),
        (error: unknown): Outcome => {
          const e = error as ConnectError;
          expect(e).toBeInstanceOf(ConnectError);
          return { error: { name: e.name, code: e.code, message: e.rawMessage, metadata: entries(e.metadata), causes: nodeErrorCodes(e.cause) } };
        },
      );
    const serverRstCode = await Promise.race([closed, new Promise<undefined>((resolve) => setTimeout(() => resolve(undefined), 200))]);
    return { ...result, ...(serverRstCode === undefined ? {} : { serverRstCode }) };
  };

  const both = async (key: string, options: { timeoutMs?: number; signal?: () => AbortSignal; headers?: Record<string, string> } = {}) => {
    const { connect, berth } = clients();
    const run = (kv: Client<typeof KV>) =>
      outcome(kv, key, {
        timeoutMs: options.timeoutMs ?? 2_000,
        ...(options.signal ? { signal: options.signal() } : {}),
        ...(options.headers ? { headers: options.headers } : {}),
      });
    const expected = await run(connect);
    const got = await run(berth);
    return { expected, got };
  };

  for (const scenario of Object.keys(SCENARIOS).filter((s) => s !== "silent")) {
    it(`ends alike: ${scenario}`, async () => {
      const { expected, got } = await both(scenario);
      expect(got).toEqual(expected);
    });
  }

  it("sends the same headers, and the caller's", async () => {
    const seen: Record<string, unknown>[] = [];
    const record = (_stream: ServerHttp2Stream, headers: Record<string, unknown>) => seen.push(headers);
    server.on("stream", record);
    try {
      const { expected, got } = await both("ok", { headers: { token: "secret" } });
      expect(got).toEqual(expected);
    } finally {
      server.off("stream", record);
    }
    const [fromConnect, fromBerth] = seen.map(({ ":authority": _a, ...rest }) => rest);
    expect(fromBerth).toEqual(fromConnect);
    expect(fromBerth).toMatchObject({ token: "secret", "grpc-timeout": "2000m", te: "trailers" });
  });

  it("ends alike at the deadline", async () => {
    const { expected, got } = await both("silent", { timeoutMs: 50 });
    expect(expected.error?.code).toBe(4);
    expect(got).toEqual(expected);
  });

  it("ends alike when the caller aborts, before or during the call", async () => {
    // During: once the server has the whole request (a fixed delay could end a call on a busy box
    // before its first frame went out, which is the case below).
    const during = await both("silent", {
      signal: () => {
        const controller = new AbortController();
        requestRead = () => controller.abort(new Error("caller gave up"));
        return controller.signal;
      },
    }).finally(() => (requestRead = undefined));
    expect(during.got).toEqual(during.expected);
    const before = await both("ok", { signal: () => AbortSignal.abort() });
    expect(before.got).toEqual(before.expected);
  });

  it("ends alike when nothing listens at the address", async () => {
    const unused = createServer();
    await new Promise<void>((resolve) => unused.listen(0, "127.0.0.1", resolve));
    const target = `http://127.0.0.1:${(unused.address() as AddressInfo).port}`;
    await new Promise((resolve) => unused.close(resolve));
    const { connect, berth } = clients(target);
    const expected = await outcome(connect, "ok", { timeoutMs: 2_000 });
    const got = await outcome(berth, "ok", { timeoutMs: 2_000 });
    expect(expected.error?.causes).toContain("ECONNREFUSED");
    expect(got).toEqual(expected);
  });
});

function entries(headers: Headers | undefined): [string, string][] {
  return headers ? [...headers.entries()].filter(([key]) => key !== "date").sort() : [];
}
