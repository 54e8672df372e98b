/**
 * SessionService against a started sessions service, on each store (`file`, and `etcd` on one real
 * member) where the store serves it: expected_seq conflicts,
 * an idempotent retry across a crash and restart of the service process (and a reused key refused
 * there too), AppendEvents atomicity, watchers (catch-up + live without a gap under concurrent
 * appends; a slow watcher ended and resumed without loss; shutdown; a deleted session), 32
 * concurrent appenders, ListSessions paged across 1,000 sessions while others append, the
 * retention of completed sessions, refused ids and sizes with nothing written, and journals shared
 * with a seed process (the seed's own store, when the seeds are there).
 */
import { existsSync, mkdirSync, readdirSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { create, toJson, type JsonObject, type MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import {
  ExpectedState,
  SeqConflictSchema,
  SessionService,
  WatcherLaggedSchema,
  type WatchSessionResponse,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { SnapshotSchema } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { loadSeedStore, seedsAvailable } from "@berth/sessions/testing/seed-store";
import { seedAppend, seedDirsOf, seedReadState } from "@berth/sessions/testing/seed-writer";
import {
  closeClient,
  connectClient,
  curl,
  curlJson,
  launchService,
  makeTempDir,
  onStore,
  startService,
  stopAll,
  STORES,
  storeTags,
  type ServiceProcess,
  callFailure,
} from "./harness.js";

afterAll(stopAll);

type Sessions = Client<typeof SessionService>;

function sessionsOf(url: string, protocol: "grpc" | "connect" = "grpc"): Sessions {
  return connectClient(SessionService, url, { protocol, defaultTimeoutMs: 30_000 });
}

function event(kind: MessageInitShape<typeof EventSchema>["kind"]): Event {
  return create(EventSchema, { kind });
}

const generate = (count = 3): Event => event({ case: "generate", value: { pageUrl: "http://localhost:3000/", count } });
const phase = (name: string): Event => event({ case: "agentPhase", value: { phase: name } });

/** The code and ErrorInfo reason of a refusal. */
function codeAndReason(error: ConnectError): [Code, string | undefined] {
  return [error.code, error.findDetails(ErrorInfoSchema)[0]?.reason];
}

/** The seqs of the entries a WatchSession message carries. */
function seqsOf(message: WatchSessionResponse): number[] {
  return message.kind.case === "entries" ? message.kind.value.entries.map((item) => Number(item.entry!.seq)) : [];
}

const atSeq = (seq: bigint) => ({ case: "expectedSeq" as const, value: seq });
const noSession = { case: "expectedState" as const, value: ExpectedState.NO_SESSION };

async function readSeqs(client: Sessions, sessionId: string): Promise<number[]> {
  const seqs: number[] = [];
  for await (const batch of client.readJournal({ sessionId })) for (const entry of batch.entries) seqs.push(Number(entry.seq));
  return seqs;
}

function range(from: number, to: number): number[] {
  return Array.from({ length: to - from + 1 }, (_, i) => from + i);
}

function journalFiles(stateDir: string): string[] {
  const dir = path.join(stateDir, "sessions");
  return existsSync(dir) ? readdirSync(dir).filter((name) => name.endsWith(".jsonl")) : [];
}

for (const store of STORES) {
  describe(`SessionService end to end (${store} store)`, storeTags(store), () => {
    let service: ServiceProcess;
    let url: string;
    // Started in a hook, not while the suite is collected: a skipped suite (no etcd here) starts nothing.
    let started: Promise<void>;
    beforeAll(() => {
      started = onStore(store, { args: ["--max-event-bytes", "2K", "--max-message-bytes", "64K", "--max-events-per-append", "50"] }).then(async (options) => {
        const s = await startService("sessions", options);
        service = s;
        url = s.url("sessions");
      });
      return started;
    });
    afterAll(async () => {
      await started;
      await service.stop();
    });

    it("refuses a stale expected_seq with ABORTED SEQ_CONFLICT and SeqConflict, over gRPC and Connect JSON", async () => {
      await started;
      const client = sessionsOf(url);
      await client.appendEvent({ sessionId: "conflict", event: generate(), expected: noSession });
      await client.appendEvent({ sessionId: "conflict", event: phase("a"), expected: atSeq(1n) });
      const error = await callFailure(client.appendEvent({ sessionId: "conflict", event: phase("b"), expected: atSeq(1n) }));
      expect(codeAndReason(error)).toEqual([Code.Aborted, "SEQ_CONFLICT"]);
      expect(error.findDetails(SeqConflictSchema)[0]).toMatchObject({ sessionId: "conflict", expectedSeq: 1n, currentSeq: 2n });

      // curl speaks Connect JSON: the typed detail arrives with its debug form.
      const res = await curlJson(url, "/berth.sessions.v1.SessionService/AppendEvent", {
        sessionId: "conflict",
        event: { agentPhase: { phase: "c" } },
        expectedSeq: "5",
      });
      expect(res.json).toMatchObject({
        code: "aborted",
        details: expect.arrayContaining([
          expect.objectContaining({ type: "berth.sessions.v1.SeqConflict", debug: { sessionId: "conflict", expectedSeq: "5", currentSeq: "2" } }),
          expect.objectContaining({ type: "google.rpc.ErrorInfo", debug: expect.objectContaining({ reason: "SEQ_CONFLICT", domain: "berth.sessions" }) }),
        ]),
      });
      expect(await readSeqs(client, "conflict")).toEqual([1, 2]);
      closeClient(client);
    });

    it("answers every protocol and message format with the same snapshots (pre-encoded for binary, real fields for JSON)", async () => {
      await started;
      const variants = [
        { protocol: "grpc", useBinaryFormat: true },
        { protocol: "grpc-web", useBinaryFormat: true },
        { protocol: "grpc-web", useBinaryFormat: false },
        { protocol: "connect", useBinaryFormat: true },
        { protocol: "connect", useBinaryFormat: false },
      ] as const;
      for (const [i, options] of variants.entries()) {
        const client = connectClient(SessionService, url, { ...options, defaultTimeoutMs: 30_000 });
        const sessionId = `formats-${i}`;
        const label = JSON.stringify(options);
        const first = await client.appendEvent({ sessionId, event: generate(4) });
        expect(first.snapshot?.expectedVariants, label).toBe(4);
        const controller = new AbortController();
        const it = client.watchSession({ sessionId, includeSnapshot: true }, { signal: controller.signal })[Symbol.asyncIterator]();
        await it.next(); // the backlog's entry
        const marker = (await it.next()).value as WatchSessionResponse;
        expect(marker.kind.case === "caughtUp" && marker.kind.value.snapshot?.expectedVariants, label).toBe(4);
        const second = await client.appendEvent({ sessionId, event: phase("live") });
        const live = (await it.next()).value as WatchSessionResponse;
        const [watched] = live.kind.case === "entries" ? live.kind.value.entries : [];
        expect(watched?.entry?.seq, label).toBe(2n);
        expect(watched?.snapshot, label).toEqual(second.snapshot);
        expect(watched?.snapshot?.generationPhase, label).toBe("live");
        controller.abort();
        closeClient(client);
      }
    });

    it("appends a batch atomically: a bad event, a stale seq or too many events write nothing", async () => {
      await started;
      const client = sessionsOf(url);
      await client.appendEvent({ sessionId: "atomic", event: generate() });
      const bad = await callFailure(
        client.appendEvents({ sessionId: "atomic", events: [phase("a"), phase("b"), event({ case: "other", value: { type: "" } })] }),
      );
      expect(bad.code).toBe(Code.InvalidArgument);
      expect(bad.rawMessage).toMatch(/^events\[2\]/);
      const stale = await callFailure(client.appendEvents({ sessionId: "atomic", events: [phase("a"), phase("b")], expected: noSession }));
      expect(codeAndReason(stale)).toEqual([Code.Aborted, "SEQ_CONFLICT"]);
      const tooMany = await callFailure(client.appendEvents({ sessionId: "atomic", events: Array.from({ length: 51 }, (_, i) => phase(`p${i}`)) }));
      expect(codeAndReason(tooMany)).toEqual([Code.InvalidArgument, "TOO_MANY_EVENTS"]);
      expect(await readSeqs(client, "atomic")).toEqual([1]);
      const ok = await client.appendEvents({ sessionId: "atomic", events: [phase("a"), phase("b"), phase("c")], expected: atSeq(1n) });
      expect(ok).toMatchObject({ firstSeq: 2n, lastSeq: 4n });
      expect(await readSeqs(client, "atomic")).toEqual([1, 2, 3, 4]);
      closeClient(client);
    });

    it("refuses bad ids, oversized events and oversized requests, writing nothing", async () => {
      await started;
      const client = sessionsOf(url);
      for (const sessionId of ["", "../escape", "a/b", "a.b", "x".repeat(129), "nul\0id", "space id"]) {
        const error = await callFailure(client.appendEvent({ sessionId, event: generate() }));
        expect(error.code, JSON.stringify(sessionId)).toBe(Code.InvalidArgument);
        expect(error.rawMessage).toMatch(/^session_id: /);
      }
      for (const method of ["getSnapshot", "flushSnapshot", "deleteSession"] as const) {
        const error = await callFailure(client[method]({ sessionId: "../x" }));
        expect(codeAndReason(error), method).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
      }
      const watchError = await callFailure(
        (async () => {
          for await (const _ of client.watchSession({ sessionId: "a/b" })) break;
        })(),
      );
      expect(watchError.code).toBe(Code.InvalidArgument);

      const big = event({ case: "steer", value: { pageUrl: "x".repeat(4000) } });
      const tooBig = await callFailure(client.appendEvent({ sessionId: "sizes", event: big }));
      expect(codeAndReason(tooBig)).toEqual([Code.InvalidArgument, "EVENT_TOO_LARGE"]);
      expect(tooBig.rawMessage).toMatch(/over the limit of 2048 bytes/);
      const hugeRequest = await callFailure(
        client.appendEvent({ sessionId: "sizes", event: event({ case: "steer", value: { pageUrl: "x".repeat(100_000) } }) }),
      );
      // Refused by the server's read limit before any handler or interceptor sees it.
      expect(hugeRequest.code).toBe(Code.ResourceExhausted);
      expect(codeAndReason(await callFailure(client.getSnapshot({ sessionId: "sizes" })))).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
      // Only the sessions of the tests before this one have journals (tests of a file run in order).
      const sessions = await client.listSessions({ includeCompleted: true, pageSize: 1000 });
      expect(
        sessions.sessions
          .map((s) => s.id)
          .filter((id) => !id.startsWith("formats-"))
          .sort(),
      ).toEqual(["atomic", "conflict"]);
      if (store === "file")
        expect(
          journalFiles(service.stateDir)
            .filter((name) => !name.startsWith("formats-"))
            .sort(),
        ).toEqual(["atomic.jsonl", "conflict.jsonl"]);
      closeClient(client);
    });

    it("32 clients appending to one session get contiguous seqs, none twice", async () => {
      await started;
      const clients = Array.from({ length: 32 }, () => sessionsOf(url));
      const perClient = 15;
      const seen = await Promise.all(
        clients.map(async (client, c) => {
          const seqs: number[] = [];
          for (let i = 0; i < perClient; i++) seqs.push(Number((await client.appendEvent({ sessionId: "many", event: phase(`c${c}-${i}`) })).seq));
          return seqs;
        }),
      );
      const all = seen.flat().sort((a, b) => a - b);
      expect(all).toEqual(range(1, 32 * perClient));
      for (const seqs of seen) expect([...seqs].sort((a, b) => a - b)).toEqual(seqs);
      const reader = sessionsOf(url);
      expect(await readSeqs(reader, "many")).toEqual(range(1, 32 * perClient));
      for (const client of [...clients, reader]) closeClient(client);
    });

    it("a watcher gets the backlog, the caught-up marker, then live entries with no gap across concurrent appends", async () => {
      await started;
      const writer = sessionsOf(url);
      await writer.appendEvents({ sessionId: "watch", events: range(1, 20).map((i) => phase(`b${i}`)) });
      const appenders = Array.from({ length: 4 }, () => sessionsOf(url));
      const watcher = sessionsOf(url);
      const controller = new AbortController();
      const seqs: number[] = [];
      let caughtUpAt: number | undefined;
      let snapshots = 0;
      const total = 20 + 4 * 25;
      const watching = (async () => {
        try {
          for await (const message of watcher.watchSession(
            { sessionId: "watch", fromSeq: 5n, includeSnapshot: true },
            { signal: controller.signal, timeoutMs: 60_000 },
          )) {
            if (message.kind.case === "caughtUp") caughtUpAt = Number(message.kind.value.lastSeq);
            if (message.kind.case === "entries") {
              for (const item of message.kind.value.entries) {
                seqs.push(Number(item.entry!.seq));
                if (item.snapshot !== undefined) snapshots++;
              }
              if (seqs.length === total - 4) return;
            }
          }
        } catch (error) {
          if (!controller.signal.aborted) throw error;
        }
      })();
      // The appends race the watcher's switch from the backlog to live entries.
      await Promise.all(
        appenders.map((client, a) =>
          (async () => {
            for (let i = 0; i < 25; i++) await client.appendEvent({ sessionId: "watch", event: phase(`a${a}-${i}`) });
          })(),
        ),
      );
      await watching;
      controller.abort();
      expect(seqs).toEqual(range(5, total));
      expect(caughtUpAt).toBeGreaterThanOrEqual(20);
      // Live entries carry their snapshot; backlog entries do not.
      expect(snapshots).toBe(total - caughtUpAt!);
      for (const client of [writer, watcher, ...appenders]) closeClient(client);
    });

    it("ends a watcher that stops reading with RESOURCE_EXHAUSTED and WatcherLagged; resuming misses nothing", async () => {
      await started;
      const slow = await startService("sessions", await onStore(store, { args: ["--watch-buffer", "4"] }));
      const slowUrl = slow.url("sessions");
      const writer = sessionsOf(slowUrl);
      await writer.appendEvent({ sessionId: "slow", event: generate() });
      const reader = sessionsOf(slowUrl);
      const it = reader.watchSession({ sessionId: "slow", includeSnapshot: true }, { timeoutMs: 60_000 })[Symbol.asyncIterator]();
      const received: number[] = [];
      received.push(...seqsOf((await it.next()).value as WatchSessionResponse));
      expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
      // Stop reading: once the stream's flow-control window is full the service cannot hand the
      // watcher more entries, its buffer of 4 overflows and the watch is ended.
      const total = 400;
      for (let i = 0; i < total / 50; i++) {
        await writer.appendEvents({
          sessionId: "slow",
          events: range(1, 50).map((n) => event({ case: "steer", value: { pageUrl: `/p${i}-${n}-`.padEnd(300, "x") } })),
        });
      }
      let lag: ConnectError | undefined;
      try {
        for (;;) {
          const step = await it.next();
          if (step.done) break;
          received.push(...seqsOf(step.value as WatchSessionResponse));
        }
      } catch (error) {
        lag = ConnectError.from(error);
      }
      expect(codeAndReason(lag!)).toEqual([Code.ResourceExhausted, "WATCHER_LAGGED"]);
      const last = received[received.length - 1]!;
      expect(received).toEqual(range(1, last));
      expect(last).toBeLessThan(total + 1);
      const detail = lag!.findDetails(WatcherLaggedSchema)[0];
      expect(detail).toMatchObject({ sessionId: "slow", resumeFromSeq: BigInt(last + 1) });
      // Resume where the service said: the rest, in order, none missing.
      const controller = new AbortController();
      for await (const message of writer.watchSession({ sessionId: "slow", fromSeq: detail!.resumeFromSeq }, { signal: controller.signal })) {
        received.push(...seqsOf(message));
        if (message.kind.case === "caughtUp") break;
      }
      controller.abort();
      expect(received).toEqual(range(1, total + 1));
      closeClient(writer);
      closeClient(reader);
      await slow.stop();
    });

    it("ends watchers with UNAVAILABLE when the service shuts down", async () => {
      await started;
      const own = await startService("sessions", await onStore(store));
      const client = sessionsOf(own.url("sessions"));
      const it = client.watchSession({ sessionId: "bye" }, { timeoutMs: 30_000 })[Symbol.asyncIterator]();
      expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
      const next = it.next();
      const stopped = own.stop();
      const error = await callFailure(next);
      expect(codeAndReason(error)).toEqual([Code.Unavailable, "SHUTTING_DOWN"]);
      expect(await stopped).toEqual({ code: 0, signal: null });
      closeClient(client);
    });
  });
}

for (const store of STORES) {
  describe(`idempotent retries across a restart (${store} store)`, storeTags(store), () => {
    it("answers a retried key with the first result after the service was SIGKILLed and started again", async () => {
      const stateDir = path.join(makeTempDir("berth-sessions-e2e-"), "state");
      const first = await startService("sessions", await onStore(store, { stateDir }));
      const client = sessionsOf(first.url("sessions"));
      await client.appendEvent({ sessionId: "retry", event: generate() });
      const original = await client.appendEvent({ sessionId: "retry", event: phase("keyed"), idempotencyKey: "request-42" });
      const batch = await client.appendEvents({ sessionId: "retry", events: [phase("x"), phase("y")], idempotencyKey: "batch-7" });
      await client.appendEvent({ sessionId: "retry", event: phase("after") });
      closeClient(client);
      // A crash: no shutdown, no snapshot file written; the keys are in the journal.
      await first.kill();

      const second = await startService("sessions", await onStore(store, { stateDir }));
      const again = sessionsOf(second.url("sessions"));
      const retry = await again.appendEvent({ sessionId: "retry", event: phase("keyed"), idempotencyKey: "request-42" });
      expect(retry.duplicate).toBe(true);
      expect(retry.seq).toBe(original.seq);
      expect(toJson(SnapshotSchema, retry.snapshot!)).toEqual(toJson(SnapshotSchema, original.snapshot!));
      const batchRetry = await again.appendEvents({ sessionId: "retry", events: [phase("x"), phase("y")], idempotencyKey: "batch-7" });
      expect(batchRetry).toMatchObject({ duplicate: true, firstSeq: batch.firstSeq, lastSeq: batch.lastSeq });
      // The keys' digests come back from the journal: a key with other events is refused.
      const reused = await callFailure(again.appendEvents({ sessionId: "retry", events: [phase("x"), phase("z")], idempotencyKey: "batch-7" }));
      expect(codeAndReason(reused)).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);
      expect(await readSeqs(again, "retry")).toEqual([1, 2, 3, 4, 5]);
      closeClient(again);
      await second.stop();
    });
  });
}

for (const store of STORES) {
  describe(`sessions that come and go (${store} store)`, storeTags(store), () => {
    it("pages ListSessions across 1,000 sessions while others append, create and complete sessions: none lost, none twice", { timeout: 120_000 }, async () => {
      const service = await startService("sessions", await onStore(store, { args: store === "file" ? ["--fsync", "none"] : [] }));
      const client = sessionsOf(service.url("sessions"));
      const ids = range(0, 999).map((i) => `page-${String(i).padStart(4, "0")}`);
      for (let i = 0; i < ids.length; i += 100) {
        await Promise.all(ids.slice(i, i + 100).map((sessionId) => client.appendEvent({ sessionId, event: generate() })));
      }
      // Appends to the listed sessions and new sessions (sorting before and after the pages being
      // read) run all through the paging.
      let paging = true;
      const created: string[] = [];
      const writers = Array.from({ length: 4 }, (_, w) =>
        (async () => {
          for (let n = 0; paging; n++) {
            await client.appendEvent({ sessionId: ids[(n * 37 + w * 251) % ids.length]!, event: phase(`w${w}-${n}`) });
            const fresh = `${n % 2 === 0 ? "a" : "z"}-${w}-${n}`;
            await client.appendEvent({ sessionId: fresh, event: generate() });
            created.push(fresh);
          }
        })(),
      );
      const listed: string[] = [];
      let pages = 0;
      let token = "";
      do {
        const page = await client.listSessions({ pageSize: 37, pageToken: token });
        listed.push(...page.sessions.map((snapshot) => snapshot.id));
        token = page.nextPageToken;
        pages++;
      } while (token !== "");
      paging = false;
      await Promise.all(writers);
      expect(new Set(listed).size).toBe(listed.length);
      expect([...listed].sort()).toEqual(listed);
      const listedSet = new Set(listed);
      expect(ids.filter((id) => !listedSet.has(id))).toEqual([]);
      expect(created.length).toBeGreaterThan(0);
      expect(pages).toBeGreaterThanOrEqual(Math.ceil(ids.length / 37));
      closeClient(client);
      // A graceful stop writes the snapshot of every open session (here over 1,000): on a loaded
      // 2-core machine that alone has taken more than the harness's default 10 s.
      await service.stop("SIGTERM", 60_000);
    });

    it("DeleteSession ends the session's watchers with NOT_FOUND SESSION_DELETED and tells WatchSessions", async () => {
      const service = await startService("sessions", await onStore(store));
      const client = sessionsOf(service.url("sessions"));
      await client.appendEvents({ sessionId: "doomed", events: [generate(), phase("a")] });
      const one = client.watchSession({ sessionId: "doomed" }, { timeoutMs: 30_000 })[Symbol.asyncIterator]();
      expect(seqsOf((await one.next()).value as WatchSessionResponse)).toEqual([1, 2]);
      expect(((await one.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
      const controller = new AbortController();
      const all = client.watchSessions({ includeCurrent: true }, { signal: controller.signal })[Symbol.asyncIterator]();
      expect((await all.next()).value!.kind).toMatchObject({ case: "change", value: { sessionId: "doomed", lastSeq: 2n } });
      expect((await all.next()).value!.kind.case).toBe("caughtUp");
      const ended = callFailure(one.next());
      const conflict = await callFailure(client.deleteSession({ sessionId: "doomed", expectedSeq: 1n }));
      expect(codeAndReason(conflict)).toEqual([Code.Aborted, "SEQ_CONFLICT"]);
      expect(await client.deleteSession({ sessionId: "doomed", expectedSeq: 2n })).toMatchObject({ lastSeq: 2n });
      expect(codeAndReason(await ended)).toEqual([Code.NotFound, "SESSION_DELETED"]);
      expect((await all.next()).value!.kind).toMatchObject({ case: "change", value: { sessionId: "doomed", lastSeq: 2n, deleted: true } });
      if (store === "file") {
        expect(journalFiles(service.stateDir)).toEqual([]);
        expect(readdirSync(path.join(service.stateDir, "sessions")).filter((name) => name.startsWith("doomed"))).toEqual([]);
      }
      expect(codeAndReason(await callFailure(client.deleteSession({ sessionId: "doomed" })))).toEqual([Code.NotFound, "SESSION_NOT_FOUND"]);
      controller.abort();
      closeClient(client);
      await service.stop();
    });
  });
}

// The file store only (journals a seed process wrote long ago); on etcd: etcd-instances.test.ts and etcd-retention.test.ts.
describe("retention of completed sessions", () => {
  it("deletes completed sessions past --completed-retention: at start, then when they fall due", { timeout: 60_000 }, async () => {
    const stateDir = path.join(makeTempDir("berth-retention-"), "state");
    // Journals a seed process wrote long ago: one completed (far past the retention), one active.
    const dirs = { dir: path.join(stateDir, "sessions") };
    mkdirSync(dirs.dir, { recursive: true, mode: 0o700 });
    const longAgo = "2020-01-01T00:00:00.000Z";
    for (const type of ["generate", "complete"]) seedAppend(dirs, "old", { type }, { ts: longAgo });
    seedAppend(dirs, "active", { type: "generate" }, { ts: longAgo });
    const service = await startService("sessions", { stateDir, args: ["--completed-retention", "2s"] });
    await service.waitForLog((entry) => entry.msg === "deleted a completed session past its retention" && entry.sessionId === "old", 15_000);
    const client = sessionsOf(service.url("sessions"));
    const limits = await client.getLimits({});
    expect(limits.completedRetention).toMatchObject({ seconds: 2n });
    // Completed now: deleted about 2 s later by the sweep's timer (the watcher waits for it).
    const controller = new AbortController();
    const all = client.watchSessions({}, { signal: controller.signal, timeoutMs: 30_000 })[Symbol.asyncIterator]();
    const completed = await client.appendEvents({ sessionId: "young", events: [generate(), event({ case: "discarded", value: {} })] });
    for (;;) {
      const change = (await all.next()).value!.kind;
      if (change.case === "change" && change.value.deleted) {
        expect(change.value).toMatchObject({ sessionId: "young", lastSeq: completed.lastSeq });
        break;
      }
    }
    controller.abort();
    expect((await client.listSessions({ includeCompleted: true })).sessions.map((snapshot) => snapshot.id)).toEqual(["active"]);
    closeClient(client);
    await service.stop();
  });
});

describe("journals shared with a seed process", () => {
  it("serves a journal a seed process wrote in a live directory, and appends after it in the seed's format", async () => {
    const project = makeTempDir("berth-live-project-");
    const live = seedDirsOf(project);
    seedAppend(live, "shared", { type: "generate", pageUrl: "http://localhost:3000/", count: 2, token: "t-1" }, { snapshotFile: true });
    const written = seedAppend(live, "shared", { type: "agent_phase", phase: "planning", durationMs: 5 }, { snapshotFile: true }).snapshot;

    const service = await startService("sessions", { args: ["--live-dir", live.liveDir, "--project-root", project] });
    const client = sessionsOf(service.url("sessions"), "connect");
    const served = await client.getSnapshot({ sessionId: "shared" });
    expect(served).toMatchObject({ lastSeq: 2n });
    const view = toJson(SnapshotSchema, served.snapshot!) as JsonObject;
    for (const key of ["phase", "pageUrl", "expectedVariants", "generationPhase", "pendingEvent"]) expect(view[key], key).toEqual(written[key] as JsonObject);

    await client.appendEvent({ sessionId: "shared", event: event({ case: "variantsReady", value: { arrivedVariants: 2 } }), expected: atSeq(2n) });
    closeClient(client);
    await service.stop();

    // A seed process reads berth's line and appends after it.
    expect(seedReadState(live, "shared")).toMatchObject({ nextSeq: 4, snapshot: { arrivedVariants: 2 } });
    const lines = readFileSync(path.join(live.dir, "shared.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as JsonObject);
    expect(lines.map((line) => line.seq)).toEqual([1, 2, 3]);
    expect(lines[2]).toMatchObject({ id: "shared", type: "variants_ready", event: { type: "variants_ready", id: "shared", arrivedVariants: 2 } });
  });

  it.skipIf(!seedsAvailable())("the seed's own store reads what the service appended to its journal", async () => {
    const seed = await loadSeedStore();
    try {
      const seedStore = seed.store("shared");
      seedStore.appendEvent({ id: "shared", type: "generate", pageUrl: "http://localhost:3000/", count: 2, token: "t-1" });
      seedStore.appendEvent({ id: "shared", type: "agent_phase", phase: "planning", durationMs: 5 });
      const seedView = seedStore.getSnapshot("shared") as JsonObject;

      const service = await startService("sessions", { args: ["--live-dir", seed.liveDir, "--project-root", seed.project] });
      const client = sessionsOf(service.url("sessions"), "connect");
      const view = toJson(SnapshotSchema, (await client.getSnapshot({ sessionId: "shared" })).snapshot!) as JsonObject;
      for (const key of ["phase", "pageUrl", "expectedVariants", "generationPhase", "pendingEvent"]) expect(view[key], key).toEqual(seedView[key]);
      await client.appendEvent({ sessionId: "shared", event: event({ case: "variantsReady", value: { arrivedVariants: 2 } }), expected: atSeq(2n) });
      closeClient(client);
      await service.stop();

      const after = seed.store("shared").getSnapshot("shared") as JsonObject;
      expect(after.arrivedVariants).toBe(2);
      seed.store("shared").appendEvent({ id: "shared", type: "steer" });
      const lines = readFileSync(path.join(seed.sessionsDir, "shared.jsonl"), "utf8")
        .trim()
        .split("\n")
        .map((line) => JSON.parse(line) as JsonObject);
      expect(lines.map((line) => line.seq)).toEqual([1, 2, 3, 4]);
    } finally {
      seed.remove();
    }
  });
});

describe("settings", () => {
  it("claims a live directory: a second service on it, with another state directory, refuses to start", async () => {
    const project = makeTempDir("berth-live-");
    const liveDir = path.join(project, ".impeccable", "live");
    const first = await startService("sessions", { args: ["--live-dir", liveDir, "--project-root", project] });
    const second = launchService("sessions", { args: ["--live-dir", liveDir, "--project-root", project] });
    const outcome = await second.outcome;
    expect(outcome.state).toBe("exited");
    expect(second.stderr()).toMatch(/berth-sessions\.lock|already served|held by/);
    expect(second.stderr()).toContain(String(first.pid));
    await first.stop();
  });

  it("refuses a wrong --fsync naming the choices, and reports its gauges in /metrics", async () => {
    const wrong = launchService("sessions", { args: ["--fsync", "sometimes"] });
    const outcome = await wrong.outcome;
    expect(outcome).toMatchObject({ state: "exited", status: { code: 2 } });
    expect(wrong.stderr()).toMatch(/--fsync: must be one of batch, always, none/);
    for (const [value, rule] of [
      ["10ms", /--completed-retention: must be at least 1s/],
      ["soon", /--completed-retention: must be a duration/],
    ] as const) {
      const retention = launchService("sessions", { args: ["--completed-retention", value] });
      expect(await retention.outcome).toMatchObject({ state: "exited", status: { code: 2 } });
      expect(retention.stderr()).toMatch(rule);
    }

    const service = await startService("sessions", { args: ["--fsync", "always"] });
    const client = sessionsOf(service.url("sessions"));
    await client.appendEvent({ sessionId: "gauges", event: generate() });
    const it = client.watchSession({ sessionId: "gauges" }, { timeoutMs: 30_000 })[Symbol.asyncIterator]();
    await it.next();
    await it.next();
    const metrics = await curl(service.url("sessions"), "/metrics");
    expect(metrics.body).toMatch(/^berth_sessions_open_sessions 1$/m);
    expect(metrics.body).toMatch(/^berth_sessions_watchers 1$/m);
    expect(service.entries().some((entry) => entry.msg === "session journals" && entry.fsync === "always")).toBe(true);
    closeClient(client);
    await service.stop();
  });
});
