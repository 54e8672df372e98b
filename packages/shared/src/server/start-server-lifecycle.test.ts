import { spawn } from "node:child_process";
import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import * as grpc from "@grpc/grpc-js";
import type { Struct } from "@bufbuild/protobuf/wkt";
import { Code, createClient, type HandlerContext } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { installSignalHandlers } from "./signal-handlers.js";
import { implement } from "./start-server.js";
import { closeServers, grpcJsCheck, port, silent, start, TestService } from "./start-server-fixtures.js";

afterEach(closeServers);

describe("shutdown", () => {
  it("cuts a stream that ignores the shutdown signal, then runs the hooks", async () => {
    const order: string[] = [];
    const server = await start({ onShutdown: [() => void order.push("hook")] });
    const client = createClient(TestService, createGrpcTransport({ baseUrl: server.url })) as unknown as {
      stall(request: object): AsyncIterable<Struct>;
    };
    const stream = client.stall({})[Symbol.asyncIterator]();
    await stream.next();
    const closing = server.close().then(() => order.push("closed"));
    await expect(stream.next()).rejects.toMatchObject({ code: Code.Unavailable });
    await closing;
    expect(order).toEqual(["hook", "closed"]);
    await expect(grpcJsCheck(`127.0.0.1:${port(server)}`)).rejects.toMatchObject({ code: grpc.status.UNAVAILABLE });
  });

  it("exposes the shutdown signal to handler factories and to every handler's context", async () => {
    let seen: AbortSignal | undefined;
    const server = await start({
      // A backstop far beyond the test's timeout: only the signal can end the stream in time.
      streamGraceMs: 120_000,
      services: (context) => {
        seen = context.shutdownSignal;
        return [
          implement(TestService, {
            async *stall(_request: Struct, handler: HandlerContext) {
              yield {};
              await new Promise((resolve) => handler.signal.addEventListener("abort", resolve));
              handler.signal.throwIfAborted();
            },
          } as never),
        ];
      },
    });
    expect(seen?.aborted).toBe(false);
    const client = createClient(TestService, createGrpcTransport({ baseUrl: server.url })) as unknown as { stall(request: object): AsyncIterable<Struct> };
    const stream = client.stall({})[Symbol.asyncIterator]();
    await stream.next();
    const started = Date.now();
    const closing = server.close();
    await expect(stream.next()).rejects.toMatchObject({ code: Code.Unavailable, rawMessage: "server shutting down" });
    expect(Date.now() - started).toBeLessThan(10_000); // ended on the signal, not by the 120 s backstop
    expect(seen?.aborted).toBe(true);
    await closing;
  });

  it("shuts down on the first signal and exits at once on the second", async () => {
    const server = await start();
    const exits: number[] = [];
    const uninstall = installSignalHandlers(server, silent, { exit: (code) => void exits.push(code), signals: ["SIGUSR2"] });
    try {
      process.emit("SIGUSR2", "SIGUSR2");
      process.emit("SIGUSR2", "SIGUSR2");
      expect(exits).toEqual([130]);
      await server.closed;
      await expect.poll(() => exits).toEqual([130, 0]);
    } finally {
      uninstall();
    }
  });
});

describe("unix socket", () => {
  it("listens on a socket only its owner can use", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-server-"));
    try {
      const socket = path.join(dir, "test.sock");
      const server = await start({ socket });
      expect(server.url).toBe(`unix:${socket}`);
      expect(fs.statSync(socket).mode & 0o777).toBe(0o600);
      expect(await grpcJsCheck(`unix:${socket}`)).toBe("SERVING");
      await server.close();
      expect(fs.existsSync(socket)).toBe(false);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it("replaces a socket file left by a dead server", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-server-"));
    try {
      const socket = path.join(dir, "stale.sock");
      // A server killed with SIGKILL leaves its socket file behind, with nobody listening.
      const child = spawn(process.execPath, ["-e", `require("net").createServer().listen(${JSON.stringify(socket)}, () => console.log("ready"))`]);
      await new Promise((resolve) => child.stdout.once("data", resolve));
      child.kill("SIGKILL");
      await new Promise((resolve) => child.once("exit", resolve));
      expect(fs.existsSync(socket)).toBe(true);
      const server = await start({ socket });
      expect(await grpcJsCheck(`unix:${socket}`)).toBe("SERVING");
      await server.close();
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
