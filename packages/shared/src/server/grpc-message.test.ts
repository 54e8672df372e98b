import * as http2 from "node:http2";
import { fileURLToPath } from "node:url";
import { afterEach, describe, expect, it } from "vitest";
import pino from "pino";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { encodeGrpcMessage, isGrpcContentType, reencodeGrpcMessage, useGrpcMessageEncoding } from "./grpc-message.js";
import { startServer, type RunningServer } from "./start-server.js";

const healthProto = fileURLToPath(new URL("../../../../proto/grpc/health/v1/health.proto", import.meta.url));

describe("encodeGrpcMessage", () => {
  it("leaves printable ASCII but % as is, and escapes %, controls and UTF-8 bytes", () => {
    expect(encodeGrpcMessage('session_id: must match [A-Za-z0-9_-]{1,128}; got "a/b"')).toBe('session_id: must match [A-Za-z0-9_-]{1,128}; got "a/b"');
    expect(encodeGrpcMessage("50% done\nnext: é")).toBe("50%25 done%0Anext: %C3%A9");
  });

  it("re-encodes what encodeURIComponent wrote; a value that does not decode stays", () => {
    const text = "source locked: /tmp/a.ts is held by bob; wait 1,5 s (é 100%)";
    expect(decodeURIComponent(reencodeGrpcMessage(encodeURIComponent(text)))).toBe(text);
    // What @grpc/grpc-js does with the header: decodeURI, which keeps %3A, %2F, %2C, %3B escaped.
    expect(decodeURI(reencodeGrpcMessage(encodeURIComponent(text)))).toBe(text);
    expect(reencodeGrpcMessage("%E0%A4%A")).toBe("%E0%A4%A");
  });

  it("applies to gRPC's content types only", () => {
    expect(["application/grpc", "application/grpc+proto", "application/grpc;charset=utf-8"].map(isGrpcContentType)).toEqual([true, true, true]);
    expect(["application/grpc-web+proto", "application/json", undefined].map(isGrpcContentType)).toEqual([false, false, false]);
  });

  it("rewrites grpc-message in writeHead's headers and in the trailers", () => {
    const sent: unknown[] = [];
    const res = {
      writeHead: (status: number, headers: Record<string, string>) => void sent.push(status, { ...headers }),
      addTrailers: (trailers: Record<string, string>) => void sent.push({ ...trailers }),
    };
    useGrpcMessageEncoding(res as never);
    res.writeHead(200, { "grpc-status": "3", "grpc-message": encodeURIComponent("a: b/c") });
    res.addTrailers({ "grpc-status": "10", "grpc-message": encodeURIComponent("d, e; é") });
    expect(sent).toEqual([200, { "grpc-status": "3", "grpc-message": "a: b/c" }, { "grpc-status": "10", "grpc-message": "d, e; %C3%A9" }]);
  });
});

describe("a server's grpc-message", () => {
  let server: RunningServer | undefined;
  afterEach(async () => {
    await server?.close(false);
    server = undefined;
  });

  it("reads the same in @grpc/grpc-js, in connect-node and on the wire", async () => {
    server = await startServer({ name: "test", logger: pino({ level: "silent" }) });
    const service = "a:b/c, d; é";
    const expected = `unknown service ${JSON.stringify(service)}: no health status is registered for it`;

    const definition = protoLoader.loadSync(healthProto, { enums: String, defaults: true });
    const loaded = grpc.loadPackageDefinition(definition) as unknown as {
      grpc: { health: { v1: { Health: new (target: string, credentials: grpc.ChannelCredentials) => grpc.Client } } };
    };
    const client = new loaded.grpc.health.v1.Health(new URL(server.url).host, grpc.credentials.createInsecure()) as grpc.Client & {
      check(request: { service: string }, callback: (error: grpc.ServiceError | null) => void): void;
    };
    const grpcJsError = await new Promise<grpc.ServiceError | null>((resolve) => client.check({ service }, resolve));
    client.close();
    expect(grpcJsError?.code).toBe(grpc.status.NOT_FOUND);
    expect(grpcJsError?.details).toBe(expected);

    const connectError = await createClient(Health, createGrpcTransport({ baseUrl: server.url }))
      .check({ service })
      .then(
        () => undefined,
        (e: unknown) => ConnectError.from(e),
      );
    expect([connectError?.code, connectError?.rawMessage]).toEqual([Code.NotFound, expected]);

    // On the wire: printable ASCII as is, UTF-8 escaped.
    const session = http2.connect(server.url);
    // Closed below, then the server: a reset of the connection meanwhile must not throw.
    session.on("error", () => {});
    try {
      // Trailers-only or headers then trailers: grpc-message is in whichever comes last.
      const message = await new Promise<unknown>((resolve, reject) => {
        const name = Buffer.from(service, "utf8");
        const body = Buffer.concat([Buffer.from([0x0a, name.length]), name]);
        const frame = Buffer.concat([Buffer.from([0, 0, 0, 0, body.length]), body]);
        const stream = session.request({ ":method": "POST", ":path": "/grpc.health.v1.Health/Check", "content-type": "application/grpc", te: "trailers" });
        let seen: unknown;
        stream.on("response", (headers) => (seen = headers["grpc-message"] ?? seen));
        stream.on("trailers", (trailers) => (seen = trailers["grpc-message"] ?? seen));
        stream.on("close", () => resolve(seen));
        stream.on("error", reject);
        stream.resume();
        stream.end(frame);
      });
      expect(message).toBe(`unknown service "a:b/c, d; %C3%A9": no health status is registered for it`);
    } finally {
      session.close();
    }
  });
});
