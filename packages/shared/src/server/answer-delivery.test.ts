import * as http from "node:http";
import { afterEach, describe, expect, it } from "vitest";
import { Code, ConnectError, createClient, createContextValues, createHandlerContext, type HandlerContext, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import pino from "pino";
import { ManualClock } from "../clock.js";
import { WIRE_PROTOCOLS, connectOver } from "./testing/wire-protocols.js";
import { AnswerDelivery, answerDeliveryKey, handOverGrant } from "./answer-delivery.js";
import { implement, startServer, type RunningServer } from "./start-server.js";

const servers: RunningServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close(false)));
});

/** Every protocol the server speaks, HTTP/2 and HTTP/1.1, each on a connection of its own that `close` drops. */
const PROTOCOLS: ReadonlyArray<{ name: string; open(url: string): { transport: Transport; close(): void } }> = [
  ...WIRE_PROTOCOLS.map((protocol) => ({ name: `${protocol.name} (HTTP/2)`, open: (url: string) => connectOver(protocol, url) })),
  ...[true, false].flatMap((binary) => [
    {
      name: `Connect ${binary ? "binary" : "JSON"} (HTTP/1.1)`,
      open(url: string) {
        const agent = new http.Agent({ keepAlive: true });
        return {
          transport: createConnectTransport({ baseUrl: url, httpVersion: "1.1", useBinaryFormat: binary, nodeOptions: { agent } }),
          close: () => agent.destroy(),
        };
      },
    },
    {
      name: `gRPC-Web ${binary ? "binary" : "JSON"} (HTTP/1.1)`,
      open(url: string) {
        const agent = new http.Agent({ keepAlive: true });
        return {
          transport: createGrpcWebTransport({ baseUrl: url, httpVersion: "1.1", useBinaryFormat: binary, nodeOptions: { agent } }),
          close: () => agent.destroy(),
        };
      },
    },
  ]),
];

/**
 * A server whose Inspect, for the file "answer after leaving", answers only once its client has
 * gone (its answer cannot be delivered); for any other file, at once. Each call's delivery is kept.
 */
async function serve(): Promise<{ url: string; deliveries: AnswerDelivery[]; waiting: () => number }> {
  const deliveries: AnswerDelivery[] = [];
  let waiting = 0;
  const server = await startServer({
    name: "test",
    logger: pino({ level: "silent" }),
    services: [
      implement(LockService, {
        async inspect(request, context) {
          deliveries.push(context.values.get(answerDeliveryKey)!);
          if (request.file === "answer after leaving") {
            waiting++;
            await new Promise((resolve) => context.signal.addEventListener("abort", resolve, { once: true }));
          }
          return { file: request.file };
        },
      }),
    ],
  });
  servers.push(server);
  return { url: server.url, deliveries, waiting: () => waiting };
}

describe("a call's answer delivery", () => {
  for (const protocol of PROTOCOLS) {
    it(`is delivered when the answer went out whole, lost when its client left first: ${protocol.name}`, async () => {
      const { url, deliveries, waiting } = await serve();
      const kept = protocol.open(url);
      expect((await createClient(LockService, kept.transport).inspect({ file: "at once" })).file).toBe("at once");
      await expect.poll(() => deliveries[0]?.outcome).toBe("delivered");
      kept.close();

      const leaving = protocol.open(url);
      const call = createClient(LockService, leaving.transport).inspect({ file: "answer after leaving" });
      call.catch(() => undefined);
      await expect.poll(waiting).toBe(1);
      leaving.close();
      await expect.poll(() => deliveries[1]?.outcome).toBe("lost");
    });
  }
});

/** A call's context, its answer watched by `delivery`. */
function callContext(delivery: AnswerDelivery): HandlerContext & { abort(reason?: unknown): void } {
  return createHandlerContext({
    service: LockService,
    method: LockService.method.acquire,
    protocolName: "connect",
    requestMethod: "POST",
    url: "http://127.0.0.1/berth.locks.v1.LockService/Acquire",
    contextValues: createContextValues().set(answerDeliveryKey, delivery),
  });
}

describe("handOverGrant", () => {
  it("undoes a grant whose answer is lost, once, and never one whose answer was delivered", async () => {
    const clock = new ManualClock();
    let undone = 0;
    const lost = new AnswerDelivery();
    await handOverGrant(callContext(lost), clock, () => undone++);
    expect(undone).toBe(0);
    lost.lost();
    lost.lost();
    expect(undone).toBe(1);

    const delivered = new AnswerDelivery();
    await handOverGrant(callContext(delivered), clock, () => undone++);
    delivered.delivered();
    delivered.lost();
    expect(undone).toBe(1);
  });

  it("keeps a grant without an undo (a call with a request id) whatever becomes of its answer", async () => {
    const delivery = new AnswerDelivery();
    const context = callContext(delivery);
    await handOverGrant(context, new ManualClock(), undefined);
    delivery.lost();
    context.abort();
    const gone = callContext(new AnswerDelivery());
    gone.abort();
    await expect(handOverGrant(gone, new ManualClock(), undefined)).rejects.toMatchObject({ code: Code.Canceled });
  });

  it("waits until what has arrived is read, then undoes the grant of a call that ended meanwhile and answers how it ended", async () => {
    const clock = new ManualClock();
    clock.stall(5_000);
    let undone = 0;
    const context = callContext(new AnswerDelivery());
    const handed = handOverGrant(context, clock, () => undone++);
    handed.catch(() => undefined);
    // The client's leaving is read before the hand-off goes on.
    context.abort(new ConnectError("the client closed its connection while the call was pending", Code.Canceled));
    clock.ioRead();
    await expect(handed).rejects.toMatchObject({ code: Code.Canceled, rawMessage: "the client closed its connection while the call was pending" });
    expect(undone).toBe(1);
  });
});
