import * as net from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { Code, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus as Status } from "@berth/api/grpc/health/v1/health_pb";
import { bufCurl, closeServers, curl, grpcClient, grpcJsCheck, port, start } from "./start-server-fixtures.js";

afterEach(closeServers);

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
    // How the server drops it (an end or a reset) is not what this checks: only that it does.
    socket.on("error", () => {});
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
