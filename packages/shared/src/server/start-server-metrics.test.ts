import { afterEach, describe, expect, it } from "vitest";
import pino from "pino";
import type { Struct } from "@bufbuild/protobuf/wkt";
import { createClient, type HandlerContext } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { streamHolds } from "./open-streams.js";
import { implement } from "./start-server.js";
import { closeServers, curl, grpcClient, start, TestService, testImplementation } from "./start-server-fixtures.js";

afterEach(closeServers);

describe("metrics and logs", () => {
  it("serves /metrics with the request counter, the histogram and registered gauges", async () => {
    let sessions = 3;
    const server = await start({
      services: (context) => {
        context.metrics.registerGauge("berth_test_sessions", "Sessions open.", () => sessions);
        context.metrics.registerGauge("berth_test_by_gate", "Per gate.", () => [{ labels: { gate: "memory" }, value: 1 }]);
        return [implement(TestService, testImplementation as never)];
      },
    });
    await grpcClient(server).check({ service: "" });
    sessions = 4;
    const text = await curl([`${server.url}/metrics`]);
    expect(text).toContain('berth_rpc_requests_total{method="/grpc.health.v1.Health/Check",code="ok"} 1');
    expect(text).toContain('berth_rpc_duration_seconds_count{method="/grpc.health.v1.Health/Check"} 1');
    expect(text).toMatch(/^berth_rpc_in_flight 0$/m);
    expect(text).toMatch(/^process_resident_memory_bytes \d+$/m);
    expect(text).toContain("berth_test_sessions 4");
    expect(text).toContain('berth_test_by_gate{gate="memory"} 1');
    expect(await curl(["-o", "/dev/null", "-w", "%{http_code}", `${server.url}/nowhere`])).toBe("404");
  });

  it("counts open streams per method, and lists them at /debug/streams with their peer, age, turn and holdings", async () => {
    const server = await start({
      services: [
        implement(TestService, {
          ...testImplementation,
          async *stall(request: Struct, context: HandlerContext): AsyncGenerator<Struct> {
            streamHolds(context, "the lock on src/a.css, fencing token 7");
            yield request;
            await new Promise((resolve) => context.signal.addEventListener("abort", resolve));
          },
        } as never),
      ],
    });
    const openGauge = async () => (await curl([`${server.url}/metrics`])).split("\n").filter((line) => line.startsWith("berth_streams_open"));
    // Every streaming method shows from the start, at 0.
    expect(await openGauge()).toEqual(
      expect.arrayContaining([
        'berth_streams_open{method="/berth.test.v1.TestService/Stall"} 0',
        'berth_streams_open{method="/grpc.health.v1.Health/Watch"} 0',
      ]),
    );
    expect(JSON.parse(await curl([`${server.url}/debug/streams`]))).toEqual({ streams: [] });

    const client = createClient(TestService, createGrpcTransport({ baseUrl: server.url })) as unknown as {
      stall(request: object, options: { signal: AbortSignal }): AsyncIterable<Struct>;
    };
    const abort = new AbortController();
    const stream = client.stall({}, { signal: abort.signal })[Symbol.asyncIterator]();
    await stream.next();
    expect(await openGauge()).toContain('berth_streams_open{method="/berth.test.v1.TestService/Stall"} 1');
    const listed = JSON.parse(await curl([`${server.url}/debug/streams`])) as { streams: unknown[] };
    expect(listed.streams).toEqual([
      {
        method: "/berth.test.v1.TestService/Stall",
        peer: expect.stringMatching(/^127\.0\.0\.1:\d+$/),
        protocol: "grpc",
        openSeconds: expect.any(Number),
        messages: 1,
        // The message went out and the handler was asked for the next: its turn.
        waitingOn: "handler",
        waitingSeconds: expect.any(Number),
        holds: "the lock on src/a.css, fencing token 7",
      },
    ]);
    abort.abort();
    await expect.poll(() => server.metrics.streams.size).toBe(0);
    expect(await openGauge()).toContain('berth_streams_open{method="/berth.test.v1.TestService/Stall"} 0');
  });

  it("logs one line per RPC (health at debug), a stream's at its end", async () => {
    const lines: Array<Record<string, unknown>> = [];
    const logger = pino({ level: "debug" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    const server = await start({ logger });
    await grpcClient(server).check({ service: "" });
    const rpcLines = () => lines.filter((l) => l["msg"] === "rpc");
    expect(rpcLines()).toEqual([
      expect.objectContaining({
        level: 20,
        method: "/grpc.health.v1.Health/Check",
        code: "ok",
        protocol: "grpc",
        peer: expect.stringMatching(/^127\.0\.0\.1:\d+$/),
        ms: expect.any(Number),
      }),
    ]);

    const abort = new AbortController();
    const stream = grpcClient(server).watch({ service: "" }, { signal: abort.signal })[Symbol.asyncIterator]();
    await stream.next();
    expect(rpcLines()).toHaveLength(1); // the watch is still open: no line yet
    abort.abort();
    await expect.poll(() => rpcLines().length).toBe(2);
    expect(rpcLines()[1]).toMatchObject({ method: "/grpc.health.v1.Health/Watch", code: "canceled" });
  });
});
