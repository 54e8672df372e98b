import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { afterEach, expect, it, vi } from "vitest";
import { closeWhenAnswered } from "./answered-streams.js";

const cleanups: Array<() => void> = [];
afterEach(() => {
  for (const cleanup of cleanups.splice(0)) cleanup();
});

it("closes a stream whose answer is complete while the client still sends, after the trailers (RST_STREAM NO_ERROR)", async () => {
  const server = http2.createServer((req, res) => {
    closeWhenAnswered(res);
    // Like an RPC: read the request, then answer with trailers before the client is done.
    req.once("data", () => {
      res.writeHead(200, { "content-type": "application/grpc" });
      res.write("answer");
      res.addTrailers({ "grpc-status": "14", "grpc-message": "server shutting down" });
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  cleanups.push(() => server.close());
  const client = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  cleanups.push(() => client.destroy());

  const stream = client.request({ ":method": "POST", ":path": "/x", "content-type": "application/grpc" });
  stream.write("request");
  const events: string[] = [];
  stream.on("data", () => events.push("data"));
  stream.on("trailers", (trailers) => events.push(`trailers ${String(trailers["grpc-status"])}`));
  // The client never ends its side.
  const rstCode = await new Promise<number | undefined>((resolve) => stream.once("close", () => resolve(stream.rstCode)));
  expect(events).toEqual(["data", "trailers 14"]);
  expect(rstCode).toBe(http2.constants.NGHTTP2_NO_ERROR);
}, 5_000);

it("leaves a stream whose client has ended its side to close by itself (no RST_STREAM after a unary call)", async () => {
  const closes: Array<number | undefined> = [];
  const serverStreamClosed = new Promise<void>((resolve) => {
    const server = http2.createServer((req, res) => {
      closeWhenAnswered(res);
      const close = vi.spyOn(res.stream, "close");
      res.stream.once("close", () =>
        setImmediate(() => {
          closes.push(...close.mock.calls.map(([code]) => code));
          resolve();
        }),
      );
      req.resume();
      req.once("end", () => {
        res.writeHead(200, { "content-type": "application/grpc" });
        res.addTrailers({ "grpc-status": "0" });
        res.end("answer");
      });
    });
    server.listen(0, "127.0.0.1", () => {
      const client = http2.connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
      cleanups.push(
        () => client.destroy(),
        () => server.close(),
      );
      client.request({ ":method": "POST", ":path": "/x", "content-type": "application/grpc" }).end("request").resume();
    });
  });
  await serverStreamClosed;
  expect(closes).toEqual([]);
}, 5_000);
