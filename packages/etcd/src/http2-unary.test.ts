import { createServer, type ClientHttp2Stream, type Http2Server } from "node:http2";
import type { AddressInfo } from "node:net";
import { Code, ConnectError } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { exchangeUnary } from "./http2-unary.js";

describe("a unary exchange that fails before its stream opens", () => {
  let server: Http2Server;
  let manager: Http2SessionManager;

  beforeAll(async () => {
    server = createServer();
    server.on("stream", (stream) => stream.on("error", () => {}));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    manager = new Http2SessionManager(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  });
  afterAll(async () => {
    manager.abort();
    await new Promise((resolve) => server.close(resolve));
  });

  // The session manager may hand the stream over after the call has failed: a request to a member
  // whose connection sat idle waits for a PING first, and a paused member answers it only once the
  // call's deadline has passed. The stream is then reset at once, and its reset is no error of anyone's.
  for (const [how, fail] of [
    ["its deadline", () => ({ timeoutMs: 20, signal: undefined })],
    [
      "its caller's signal",
      () => {
        const caller = new AbortController();
        setTimeout(() => caller.abort(new Error("the caller gave up")), 20);
        return { timeoutMs: undefined, signal: caller.signal };
      },
    ],
  ] as const) {
    it(`at ${how}: fails the call, resets the stream when it opens, and throws nothing`, async () => {
      let open: () => void = () => {};
      const gate = new Promise<void>((resolve) => (open = resolve));
      let handOver: (stream: ClientHttp2Stream) => void = () => {};
      const handedOver = new Promise<ClientHttp2Stream>((resolve) => (handOver = resolve));
      const late = {
        request: async (...args: Parameters<Http2SessionManager["request"]>) => {
          await gate;
          const stream = await manager.request(...args);
          handOver(stream);
          return stream;
        },
        notifyResponseByteRead: () => {},
      } as unknown as Http2SessionManager;
      const uncaught: unknown[] = [];
      const record = (error: unknown) => uncaught.push(error);
      process.on("uncaughtException", record);
      try {
        const call = exchangeUnary({
          sessionManager: late,
          path: "/etcdserverpb.KV/Put",
          headers: { "content-type": "application/grpc" },
          ...fail(),
          body: () => new Uint8Array(5),
          checkHead: () => undefined,
        });
        const error = await call.then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(error).toBeInstanceOf(ConnectError);
        expect([Code.DeadlineExceeded, Code.Canceled]).toContain((error as ConnectError).code);
        open();
        const stream = await handedOver;
        // Whatever the stream emits on its reset comes within a few turns of the event loop (an
        // 'error' nobody listens to would throw, and its 'close' never come).
        await new Promise((resolve) => setTimeout(resolve, 100));
        expect(stream.rstCode).toBeGreaterThan(0);
      } finally {
        process.off("uncaughtException", record);
      }
      expect(uncaught).toEqual([]);
    }, 5_000);
  }
});
