/**
 * WatchSessions by revision against a started sessions service, on each store and over gRPC and
 * Connect: changes carry growing revisions; a watcher that goes away and resumes with
 * start_revision gets exactly what it missed, a deletion included; a revision the service cannot
 * replay gives the current state with reset; progress carries the revision; a negative revision is
 * refused naming the field.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SessionService, type WatchSessionsResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
import { callFailure, connectClient, onStore, startService, stopAll, STORES, storeTags, type ServiceProcess } from "./harness.js";

afterAll(stopAll);

type Stream = AsyncIterator<WatchSessionsResponse>;

/** change session@lastSeq (x: deleted), caught_up (reset), progress. */
function summary(message: WatchSessionsResponse): string {
  const kind = message.kind;
  if (kind.case === "change") return `${kind.value.sessionId}@${kind.value.lastSeq}${kind.value.deleted ? "x" : ""}`;
  if (kind.case === "caughtUp") return `caught_up:${kind.value.reset}`;
  return kind.case ?? "none";
}

const revisionOf = (message: WatchSessionsResponse): bigint => (message.kind.case === undefined ? 0n : message.kind.value.revision);

async function take(stream: Stream, n: number): Promise<WatchSessionsResponse[]> {
  const out: WatchSessionsResponse[] = [];
  while (out.length < n) {
    const step = await stream.next();
    if (step.done) throw new Error(`the stream ended after ${out.map(summary).join(", ")}`);
    out.push(step.value);
  }
  return out;
}

const generate = { kind: { case: "generate" as const, value: { pageUrl: "http://localhost:3000/", count: 1, token: "t" } } };
const steer = { kind: { case: "steer" as const, value: { pageUrl: "http://localhost:3000/x" } } };

for (const store of STORES) {
  for (const protocol of ["grpc", "connect"] as const) {
    describe(`WatchSessions by revision (${store} store, ${protocol})`, storeTags(store), () => {
      let service: ServiceProcess;
      let client: Client<typeof SessionService>;
      beforeAll(async () => {
        service = await startService("sessions", await onStore(store, {}));
        client = connectClient(SessionService, service.url("sessions"), { protocol, defaultTimeoutMs: 60_000 });
      });

      it("numbers changes with growing revisions; a resume from the last one taken gets exactly what was missed, a deletion included", async () => {
        const first = new AbortController();
        const watch = client.watchSessions({ includeCurrent: true }, { signal: first.signal })[Symbol.asyncIterator]();
        // The marker says the watch is subscribed.
        const [marker] = await take(watch, 1);
        expect(summary(marker!)).toBe("caught_up:false");
        await client.appendEvent({ sessionId: "r-a", event: generate });
        await client.appendEvents({ sessionId: "r-b", events: [generate, steer] });
        const seen = await take(watch, 2);
        expect(seen.map(summary)).toEqual(["r-a@1", "r-b@2"]);
        expect(revisionOf(seen[0]!)).toBeGreaterThan(revisionOf(marker!));
        expect(revisionOf(seen[1]!)).toBeGreaterThan(revisionOf(seen[0]!));
        first.abort();
        // Away: a deletion, and appends to both sessions (the deleted one's seqs continue).
        await client.deleteSession({ sessionId: "r-a" });
        await client.appendEvent({ sessionId: "r-b", event: steer });
        await client.appendEvent({ sessionId: "r-a", event: generate });
        const again = new AbortController();
        const resumed = client.watchSessions({ startRevision: revisionOf(seen[0]!) }, { signal: again.signal })[Symbol.asyncIterator]();
        // The file store replays, then caught_up; etcd sends caught_up at the start revision first.
        const got = await take(resumed, 5);
        const changes = got.filter((m) => m.kind.case === "change");
        expect(changes.map(summary)).toEqual(["r-b@2", "r-a@1x", "r-b@3", "r-a@2"]);
        expect(revisionOf(changes[0]!)).toBe(revisionOf(seen[1]!));
        for (let i = 1; i < changes.length; i++) expect(revisionOf(changes[i]!)).toBeGreaterThan(revisionOf(changes[i - 1]!));
        const caughtUp = got.find((m) => m.kind.case === "caughtUp")!;
        expect(summary(caughtUp)).toBe("caught_up:false");
        expect(revisionOf(caughtUp)).toBe(store === "etcd" ? revisionOf(seen[0]!) : revisionOf(changes[3]!));
        again.abort();
      });

      it("answers a revision it cannot replay with the current state and caught_up reset", async () => {
        await client.appendEvent({ sessionId: "reset-a", event: generate });
        const ahead = new AbortController();
        const stream = client.watchSessions({ startRevision: 1n << 60n }, { signal: ahead.signal })[Symbol.asyncIterator]();
        const messages: WatchSessionsResponse[] = [];
        for (;;) {
          const [message] = await take(stream, 1);
          messages.push(message!);
          if (message!.kind.case === "caughtUp") break;
        }
        ahead.abort();
        expect(summary(messages.at(-1)!)).toBe("caught_up:true");
        expect(messages.map(summary)).toContain("reset-a@1");
        const at = revisionOf(messages.at(-1)!);
        for (const message of messages) expect(revisionOf(message)).toBe(at);
        if (store === "file") {
          // A revision below this run's first: of an earlier run, or older than the history.
          const old = new AbortController();
          const replayed = client.watchSessions({ startRevision: 1n }, { signal: old.signal })[Symbol.asyncIterator]();
          const seen: string[] = [];
          for (;;) {
            const [message] = await take(replayed, 1);
            seen.push(summary(message!));
            if (message!.kind.case === "caughtUp") break;
          }
          old.abort();
          expect(seen.at(-1)).toBe("caught_up:true");
        }
      });

      it("sends progress carrying the revision the watcher is up to", async () => {
        const stop = new AbortController();
        const watch = client.watchSessions({ includeCurrent: true, progressInterval: durationFromMs(100) }, { signal: stop.signal })[Symbol.asyncIterator]();
        let message: WatchSessionsResponse;
        do [message] = (await take(watch, 1)) as [WatchSessionsResponse];
        while (message.kind.case !== "caughtUp");
        await client.appendEvent({ sessionId: "progress-a", event: generate });
        let change: WatchSessionsResponse;
        do [change] = (await take(watch, 1)) as [WatchSessionsResponse];
        while (change.kind.case !== "change");
        let progress: WatchSessionsResponse;
        do [progress] = (await take(watch, 1)) as [WatchSessionsResponse];
        while (progress.kind.case !== "progress");
        expect(revisionOf(progress)).toBeGreaterThanOrEqual(revisionOf(change));
        stop.abort();
      });

      it("refuses a negative start_revision naming it", async () => {
        const error = await callFailure(take(client.watchSessions({ startRevision: -1n })[Symbol.asyncIterator](), 1));
        expect(error.code).toBe(Code.InvalidArgument);
        expect(error.rawMessage).toMatch(/^start_revision: must not be negative/);
      });
    });
  }
}
