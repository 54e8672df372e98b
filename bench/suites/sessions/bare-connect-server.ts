/**
 * The reference server of the watcher figures (watchers.ts starts it as a process): connect-node's
 * adapter on a plain HTTP/2 server with only what a fan-out needs — no interceptors, no logging, no
 * journal. AppendEvent hands the entry, encoded once with a fixed snapshot of a similar size, to
 * every open WatchSession, so what the figures measure is what the RPC framework alone costs per
 * streamed message. It prints `{"url":"http://127.0.0.1:PORT"}` once it listens.
 */
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import { BinaryWriter } from "@bufbuild/protobuf/wire";
import type { ConnectRouter } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import {
  JournalEntrySchema,
  SessionService,
  WatchedEntriesSchema,
  WatchSessionResponseSchema,
  type WatchSessionResponse,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { preEncodedField } from "@berth/shared/server/pre-encoded";

const snapshot = create(SnapshotSchema, {
  id: "watched",
  phase: "generate_requested",
  pageUrl: "http://localhost:5173/pricing",
  expectedVariants: 3,
  generationPhase: "live",
  paramValues: { hue: 3, mode: "dark" },
  pendingEvent: { type: "generate", pageUrl: "http://localhost:5173/pricing", count: 3 },
});
const watchers = new Set<(message: WatchSessionResponse) => void>();
let seq = 0;

const routes = (router: ConnectRouter) =>
  router.service(SessionService, {
    async *watchSession(_request, context) {
      const queue: WatchSessionResponse[] = [];
      let wake: (() => void) | undefined;
      const deliver = (message: WatchSessionResponse) => {
        queue.push(message);
        wake?.();
      };
      watchers.add(deliver);
      context.signal.addEventListener("abort", () => wake?.(), { once: true });
      try {
        yield { kind: { case: "caughtUp", value: { lastSeq: BigInt(seq) } } };
        while (!context.signal.aborted) {
          while (queue.length > 0) yield queue.shift()!;
          await new Promise<void>((resolve) => (wake = resolve));
          wake = undefined;
        }
      } finally {
        watchers.delete(deliver);
      }
    },
    appendEvent(request) {
      seq++;
      const entry = create(JournalEntrySchema, { seq: BigInt(seq), sessionId: request.sessionId, type: "agent_phase", event: request.event });
      // Encoded once for every watcher: the entries field already in wire form.
      const entries = toBinary(WatchedEntriesSchema, create(WatchedEntriesSchema, { entries: [{ entry, snapshot }] }));
      const message = create(WatchSessionResponseSchema);
      message.$unknown = [preEncodedField(WatchSessionResponseSchema.field.entries.number, new BinaryWriter().bytes(entries).finish())];
      for (const deliver of watchers) deliver(message);
      return { seq: BigInt(seq) };
    },
  });

const server = http2.createServer({ settings: { maxConcurrentStreams: 10000, initialWindowSize: 1 << 20 } }, connectNodeAdapter({ routes }));
server.listen(0, "127.0.0.1", () => process.stdout.write(`${JSON.stringify({ url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` })}\n`));
