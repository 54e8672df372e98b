/**
 * WatchSessions by revision against a started sessions service, on each store and over gRPC and
 * Connect: changes carry growing revisions; a watcher that goes away and resumes with
 * start_revision gets exactly what it missed, a deletion included; a revision the service cannot
 * replay gives the current state with reset; progress carries the revision; a negative revision is
 * refused naming the field; a watcher that stops reading is ended WATCHER_LAGGED with the revision
 * to resume from, and resuming there misses no change.
 */
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SessionService, WatcherLaggedSchema, type WatchSessionsResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
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

// On etcd the transport's buffers take hundreds of changes before the service's watcher falls
// behind, and each with a snapshot is read back from etcd: the lag and its revision are tested
// against a real etcd in etcd-session-store.test.ts instead.
for (const store of STORES.filter((name) => name === "file")) {
  describe(`WatchSessions lagged (${store} store)`, storeTags(store), () => {
    it("ends a watcher that stops reading with the revision to resume from; resuming there misses no change", { timeout: 120_000 }, async () => {
      const service = await startService("sessions", await onStore(store, { args: ["--watch-buffer", "4"] }));
      const client = connectClient(SessionService, service.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 60_000 });
      const sessions = ["lag-a", "lag-b", "lag-c"];
      const slow = client.watchSessions({ includeCurrent: true, includeSnapshot: true })[Symbol.asyncIterator]();
      expect(summary((await take(slow, 1))[0]!)).toBe("caught_up:false");
      // Nobody reads while far more changes than the buffer are made (with snapshots, so the
      // transport's own buffers fill and the service's watcher falls behind).
      const appends = 600;
      for (let wave = 0; wave < appends; wave += 60)
        await Promise.all(
          Array.from({ length: 60 }, (_, i) =>
            client.appendEvent({ sessionId: sessions[(wave + i) % 3]!, event: { kind: { case: "steer", value: { pageUrl: `/q${wave + i}` } } } }),
          ),
        );
      const lastSeq = new Map<string, bigint>();
      const contiguous = (message: WatchSessionsResponse) => {
        if (message.kind.case !== "change") return;
        const { sessionId, firstSeq, lastSeq: last } = message.kind.value;
        const before = lastSeq.get(sessionId) ?? 0n;
        expect(`${sessionId} ${firstSeq}..${last} after ${before}`).toBe(
          firstSeq === before + 1n ? `${sessionId} ${firstSeq}..${last} after ${before}` : "contiguous",
        );
        lastSeq.set(sessionId, last);
      };
      const error = await callFailure(
        (async () => {
          for (;;) {
            const step = await slow.next();
            if (step.done) break;
            contiguous(step.value);
          }
        })(),
      );
      expect(error.code).toBe(Code.ResourceExhausted);
      const detail = error.findDetails(WatcherLaggedSchema)[0]!;
      expect(detail.resumeFromRevision).toBeGreaterThan(0n);
      const stop = new AbortController();
      const resumed = client.watchSessions({ startRevision: detail.resumeFromRevision }, { signal: stop.signal })[Symbol.asyncIterator]();
      // Up to caught_up: a replay of exactly what was missed, or (when more changed than the service
      // holds: four buffers of four here) a reset describing each session as it is now.
      const before: WatchSessionsResponse[] = [];
      for (;;) {
        const [message] = await take(resumed, 1);
        if (message!.kind.case === "caughtUp") {
          if (message!.kind.value.reset) {
            for (const m of before) if (m.kind.case === "change") lastSeq.set(m.kind.value.sessionId, m.kind.value.lastSeq);
          } else {
            before.forEach(contiguous);
          }
          break;
        }
        before.push(message!);
      }
      while (sessions.some((id) => lastSeq.get(id) !== BigInt(appends / 3))) contiguous((await take(resumed, 1))[0]!);
      stop.abort();
      expect(Object.fromEntries(lastSeq)).toEqual(Object.fromEntries(sessions.map((id) => [id, BigInt(appends / 3)])));
      await service.stop();
    });

    it("replays the changes missed while away when the service still holds them (more than a watch buffer, within the four held)", {
      timeout: 120_000,
    }, async () => {
      const service = await startService("sessions", await onStore(store, { args: ["--watch-buffer", "100"] }));
      const client = connectClient(SessionService, service.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 60_000 });
      const first = new AbortController();
      const watch = client.watchSessions({ includeCurrent: true }, { signal: first.signal })[Symbol.asyncIterator]();
      expect(summary((await take(watch, 1))[0]!)).toBe("caught_up:false");
      await client.appendEvent({ sessionId: "held", event: generate });
      const [seen] = await take(watch, 1);
      first.abort();
      // 300 changes while away: more than one buffer, fewer than the four held.
      for (let wave = 0; wave < 300; wave += 60) await Promise.all(Array.from({ length: 60 }, () => client.appendEvent({ sessionId: "held", event: steer })));
      const again = new AbortController();
      const resumed = client.watchSessions({ startRevision: revisionOf(seen!) }, { signal: again.signal })[Symbol.asyncIterator]();
      const got = await take(resumed, 301);
      again.abort();
      expect(got.slice(0, 300).map(summary)).toEqual(Array.from({ length: 300 }, (_, i) => `held@${i + 2}`));
      expect(summary(got[300]!)).toBe("caught_up:false");
      await service.stop();
    });
  });
}
