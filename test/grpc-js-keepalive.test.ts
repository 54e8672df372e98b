/**
 * HTTP/2 keepalive through @grpc/grpc-js (grpc-js-surface.ts): pings over a stream idle for longer
 * than the ping interval, sent by the server (`--keepalive`) or by the client, counted on the wire by
 * a proxy; the stream still delivers afterwards.
 */
import * as net from "node:net";
import * as path from "node:path";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { eventually, expectKind, generate, reader, recording, startSessionsSurface } from "./grpc-js-surface.js";
import { grpcJsClient, startService, stopAll, type GrpcJsClient } from "./harness.js";

afterAll(stopAll);

let sessionsUrl: string;
let projectRoot: string;
let rpc: GrpcJsClient;

beforeAll(async () => {
  ({ sessionsUrl, projectRoot, rpc } = await startSessionsSurface());
});

/** HTTP/2 frames seen on connections through a {@link pingCountingProxy}. */
interface FrameCounts {
  /** PING frames the client sent (not ACKs). */
  clientPings: number;
  /** PING ACKs the server sent back. */
  serverPingAcks: number;
  /** PING frames the server sent (its own keepalive, `--keepalive`). */
  serverPings: number;
  /** PING ACKs the client sent back. */
  clientPingAcks: number;
}

/**
 * A TCP proxy in front of `target` that reads the HTTP/2 frame headers going each way and counts
 * PINGs, so the test sees keepalive on the wire rather than trusting the client's own account.
 */
async function pingCountingProxy(target: string): Promise<{ url: string; counts: FrameCounts; close(): void }> {
  const { hostname, port } = new URL(target);
  const counts: FrameCounts = { clientPings: 0, serverPingAcks: 0, serverPings: 0, clientPingAcks: 0 };
  const sockets = new Set<net.Socket>();
  const PING = 0x6;
  const ACK = 0x1;
  /** Feeds bytes to an HTTP/2 frame-header reader that skips `skip` bytes first (the client preface). */
  const frameReader = (skip: number, onFrame: (type: number, flags: number) => void) => {
    let buffered = Buffer.alloc(0);
    let toSkip = skip;
    return (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      if (toSkip > 0) {
        const n = Math.min(toSkip, buffered.length);
        buffered = buffered.subarray(n);
        toSkip -= n;
      }
      while (buffered.length >= 9) {
        const length = buffered.readUIntBE(0, 3);
        if (buffered.length < 9 + length) break;
        onFrame(buffered[3]!, buffered[4]!);
        buffered = buffered.subarray(9 + length);
      }
    };
  };
  const server = net.createServer((client) => {
    const upstream = net.connect(Number(port), hostname);
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on("error", () => {});
      socket.on("close", () => {
        sockets.delete(socket);
        client.destroy();
        upstream.destroy();
      });
    }
    const fromClient = frameReader(24, (type, flags) => {
      if (type === PING) counts[(flags & ACK) === 0 ? "clientPings" : "clientPingAcks"]++;
    });
    const fromServer = frameReader(0, (type, flags) => {
      if (type === PING) counts[(flags & ACK) === 0 ? "serverPings" : "serverPingAcks"]++;
    });
    client.on("data", (chunk: Buffer) => {
      fromClient(chunk);
      upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => {
      fromServer(chunk);
      client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address() as net.AddressInfo;
  return {
    url: `http://127.0.0.1:${address.port}`,
    counts,
    close() {
      server.close();
      for (const socket of sockets) socket.destroy();
    },
  };
}

describe("keepalive", () => {
  it("with --keepalive=1s the server pings an idle stream's connection itself, and the stream still delivers", async () => {
    const pinged = await startService("sessions", { args: ["--keepalive", "1s"] });
    const proxy = await pingCountingProxy(pinged.url("sessions"));
    try {
      const quiet = recording(grpcJsClient(proxy.url, {}, { "grpc.use_local_subchannel_pool": 1 }));
      const id = "surface-server-keepalive";
      const watchCall = quiet.serverStream(SessionService.method.watchSession, { sessionId: id });
      const watch = reader(watchCall);
      await expectKind(watch, "caughtUp");
      await eventually(
        "three server pings answered",
        async () => ({ ...proxy.counts }),
        (c) => c.serverPings >= 3 && c.clientPingAcks >= 3,
      );
      expect(proxy.counts.clientPings).toBe(0);
      await grpcJsClient(pinged.url("sessions")).unary(SessionService.method.appendEvent, { sessionId: id, event: generate });
      expect((await expectKind(watch, "entries")).entries[0]?.entry?.seq).toBe(1n);
      watchCall.cancel();
      quiet.close();
    } finally {
      proxy.close();
      await pinged.stop();
    }
  });

  it("pings flow over a WatchSession and a Hold idle for many ping intervals; both still deliver afterwards", async () => {
    // The server pings every 30 s by default, so here the client pings: every 100 ms,
    // each to be answered within 5 s (a busy machine is slow, not dead) or grpc-js drops the connection.
    const proxy = await pingCountingProxy(sessionsUrl);
    try {
      const pinging = recording(
        grpcJsClient(proxy.url, {}, { "grpc.keepalive_time_ms": 100, "grpc.keepalive_timeout_ms": 5_000, "grpc.use_local_subchannel_pool": 1 }),
      );
      const file = path.join(projectRoot, "src/keepalive.ts");
      const holdCall = pinging.serverStream(LockService.method.hold, { file, owner: "idle-holder" });
      const hold = reader(holdCall);
      const acquired = await expectKind(hold, "acquired");
      const id = "surface-keepalive";
      const watchCall = pinging.serverStream(SessionService.method.watchSession, { sessionId: id, includeSnapshot: true });
      const watch = reader(watchCall);
      await expectKind(watch, "caughtUp");

      // Idle: nothing to send on the watch; the next Hold heartbeat is 5 s away.
      const before = { ...proxy.counts };
      const idle = await eventually(
        "five keepalive pings answered",
        async () => ({ ...proxy.counts }),
        (c) => c.clientPings >= before.clientPings + 5 && c.serverPingAcks >= before.serverPingAcks + 5,
      );
      expect(watch.received).toHaveLength(1);
      expect(watch.isEnded || hold.isEnded).toBe(false);

      // A live entry, appended through another connection, reaches the idle watcher.
      await rpc.unary(SessionService.method.appendEvent, { sessionId: id, event: generate });
      const [entry] = (await expectKind(watch, "entries")).entries;
      expect(entry?.entry?.seq).toBe(1n);
      expect(entry?.snapshot?.phase).toBe("generate_requested");

      // The Hold's first heartbeat comes after its 5 s of silence, the lock still held by the stream.
      const heartbeat = await expectKind(hold, "heartbeat", 20_000);
      expect(timestampMs(heartbeat.sendTime!)).toBeGreaterThan(timestampMs(acquired.acquireTime!));
      expect(proxy.counts.clientPings).toBeGreaterThan(idle.clientPings);
      const inspected = await rpc.unary(LockService.method.inspect, { file });
      expect([inspected.holder?.owner, inspected.holder?.fencingToken]).toEqual(["idle-holder", acquired.fencingToken]);

      holdCall.cancel();
      watchCall.cancel();
      expect((await hold.ended).name).toBe("CANCELLED");
      expect((await watch.ended).name).toBe("CANCELLED");
      await eventually(
        "the lock free after the cancel",
        () => rpc.unary(LockService.method.inspect, { file }),
        (s) => s.holder === undefined,
      );
      pinging.close();
    } finally {
      proxy.close();
    }
  });
});
