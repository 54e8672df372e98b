import * as http2 from "node:http2";
import * as net from "node:net";
import { afterEach, describe, expect, it, vi } from "vitest";
import pino from "pino";
import { toJson } from "@bufbuild/protobuf";
import { StructSchema, type Struct } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { HealthCheckResponse_ServingStatus as Status } from "@berth/api/grpc/health/v1/health_pb";
import { ERROR_DETAILS_HEADER, INTERNAL_ERROR_MESSAGE } from "./connect-errors.js";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { onDescriptorShortage } from "../descriptors.js";
import { bufCurl, closeServers, curl, grpcClient, grpcJsCheck, port, start, TestService } from "./start-server-fixtures.js";

afterEach(closeServers);

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
    // Closed below, then the server: a reset of the connection meanwhile must not throw.
    session.on("error", () => {});
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
