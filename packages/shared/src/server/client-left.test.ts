import * as net from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { Code, ConnectError } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { Health, HealthCheckResponse_ServingStatus } from "@berth/api/grpc/health/v1/health_pb";
import { listen, type Listener } from "./listener.js";

/** A Health/Check that, for the service "wait", waits until its call's signal aborts, and says when and why. */
interface WaitingCall {
  readonly reason: unknown;
  /** Whether the signal had aborted by the check phase that follows the poll reading the connection's end. */
  readonly abortedBeforeCheckPhase: boolean | undefined;
}

const listeners: Listener[] = [];
afterEach(async () => {
  await Promise.all(listeners.splice(0).map((l) => l.destroy()));
});

async function serve(): Promise<{ port: number; calls: Promise<WaitingCall>[] }> {
  const calls: Promise<WaitingCall>[] = [];
  let socketOfCall: net.Socket | undefined;
  const adapter = connectNodeAdapter({
    routes(router) {
      router.service(Health, {
        async check(request, context) {
          if (request.service !== "wait") return { status: HealthCheckResponse_ServingStatus.SERVING };
          const socket = socketOfCall!;
          let abortedBeforeCheckPhase: boolean | undefined;
          // Listened after the listener's own: told in the same poll, it looks once that poll is over.
          const onEnd = () => setImmediate(() => (abortedBeforeCheckPhase = context.signal.aborted));
          socket.once("end", onEnd);
          socket.once("error", onEnd);
          const call = new Promise<WaitingCall>((resolve) =>
            // Told once the look above is done (a check phase later).
            context.signal.addEventListener("abort", () => setTimeout(() => resolve({ reason: context.signal.reason, abortedBeforeCheckPhase }), 20), {
              once: true,
            }),
          );
          calls.push(call);
          await call;
          return { status: HealthCheckResponse_ServingStatus.NOT_SERVING };
        },
      });
    },
  });
  const listener = await listen({
    handler: (req, res) => {
      socketOfCall = req.socket as net.Socket;
      adapter(req, res);
    },
  });
  listeners.push(listener);
  return { port: (listener.address as { port: number }).port, calls };
}

const check = (service: string) => {
  const body = JSON.stringify({ service });
  return `POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`;
};

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: "127.0.0.1", port }, () => resolve(socket));
    socket.once("error", reject);
  });
}

/** Reads from `socket` until `responses` HTTP responses with a body are in (or it closes). */
function read(socket: net.Socket, responses: number): Promise<string> {
  return new Promise((resolve) => {
    let received = "";
    const done = () => resolve(received);
    socket.on("data", (chunk: Buffer) => {
      received += chunk.toString("latin1");
      if ((received.match(/"status":"[A-Z_]+"/g) ?? []).length >= responses) done();
    });
    socket.once("close", done);
  });
}

describe("an HTTP/1.1 client leaving while its call is pending", () => {
  it("ends the call (CANCELED) in the poll that reads its FIN, before anything is handed out after it", async () => {
    const { port, calls } = await serve();
    const socket = await connect(port);
    socket.write(check("wait"));
    await expect.poll(() => calls.length).toBe(1);
    socket.end();
    const call = await calls[0]!;
    expect(call.abortedBeforeCheckPhase).toBe(true);
    expect(call.reason).toBeInstanceOf(ConnectError);
    expect((call.reason as ConnectError).code).toBe(Code.Canceled);
    expect((call.reason as ConnectError).rawMessage).toMatch(/closed its connection/);
  });

  it("ends the call (CANCELED) in the poll that reads its reset (RST)", async () => {
    const { port, calls } = await serve();
    const socket = await connect(port);
    socket.write(check("wait"));
    await expect.poll(() => calls.length).toBe(1);
    socket.resetAndDestroy();
    const call = await calls[0]!;
    expect(call.abortedBeforeCheckPhase).toBe(true);
    expect((call.reason as ConnectError).code).toBe(Code.Canceled);
  });

  it("keeps a keep-alive connection's calls one after another, and answers a client that half-closes after a request answered at once", async () => {
    const { port } = await serve();
    const socket = await connect(port);
    const answers = read(socket, 2);
    socket.write(check(""));
    socket.write(check(""));
    expect((await answers).match(/"status":"SERVING"/g)).toHaveLength(2);

    const halfClosing = await connect(port);
    const answer = read(halfClosing, 1);
    halfClosing.end(check(""));
    expect(await answer).toMatch(/"status":"SERVING"/);
  });
});
