// @module-tag etcd
/**
 * etcd's limits as a client of the sessions service meets them (`--store etcd` on one real member
 * started with small limits): an append over etcd's request size is INVALID_ARGUMENT with a
 * BadRequest naming the field and the limit (whether berth was told the limit or etcd refused it
 * itself), and the service goes on serving; a watcher etcd's compaction cuts is told
 * (WATCHER_LAGGED, WatchSession naming the seq to resume from); with etcd's storage quota alarm
 * raised, an append is RESOURCE_EXHAUSTED ETCD_NO_SPACE saying what an operator must do, and
 * reads go on.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { SessionService, WatcherLaggedSchema, type WatchSessionResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
import { BadRequestSchema, ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { connectClient, startService, stopAll, type ServiceProcess, callFailure } from "./harness.js";

// etcd's request size at 64 KiB (gRPC's own limit is then 64 KiB + 512 KiB), its quota at 32 MiB.
const MAX_REQUEST_BYTES = 64 * 1024;
let etcd: EtcdCluster;
let client: EtcdClient;
beforeAll(async () => {
  etcd = await startEtcd({ args: ["--max-request-bytes", String(MAX_REQUEST_BYTES), "--quota-backend-bytes", String(32 * 1024 * 1024)] });
  client = createEtcdClient({ endpoints: etcd.clientUrls, prefix: "other/" });
});
afterAll(async () => {
  await stopAll();
  client?.close();
  await etcd?.stop();
});

function etcdService(prefix: string, more: string[] = []): Promise<ServiceProcess> {
  return startService("sessions", { args: ["--store", "etcd", "--etcd-endpoints", etcd.clientUrls.join(","), "--etcd-prefix", prefix, ...more] });
}

const sessionsOf = (service: ServiceProcess): Client<typeof SessionService> =>
  connectClient(SessionService, service.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 30_000 });
/** An event of about `bytes` bytes. */
const steer = (n: number, bytes = 100): Event =>
  create(EventSchema, { kind: { case: "steer", value: { pageUrl: `http://localhost:3000/${n}/`.padEnd(bytes, "x") } } });

const reasonOf = (error: ConnectError) => error.findDetails(ErrorInfoSchema)[0]?.reason;
const violationOf = (error: ConnectError) => error.findDetails(BadRequestSchema)[0]?.fieldViolations[0];

/** The entries' seqs of a WatchSession stream up to its end, and the error that ended it. */
async function drain(stream: AsyncIterator<WatchSessionResponse>, seqs: number[]): Promise<ConnectError | undefined> {
  try {
    for (;;) {
      const step = await stream.next();
      if (step.done) return undefined;
      if (step.value.kind.case === "entries") seqs.push(...step.value.kind.value.entries.map((item) => Number(item.entry!.seq)));
    }
  } catch (error) {
    return ConnectError.from(error);
  }
}

const range = (from: number, to: number) => Array.from({ length: to - from + 1 }, (_, i) => from + i);

describe("etcd's request size", () => {
  it("refuses an append over it INVALID_ARGUMENT, naming the field and the limit berth was given; the service goes on", async () => {
    const service = await etcdService("told/", ["--etcd-max-request-bytes", "64K"]);
    const sessions = sessionsOf(service);
    const one = await callFailure(sessions.appendEvent({ sessionId: "big", event: steer(1, 100 * 1024) }));
    const many = await callFailure(sessions.appendEvents({ sessionId: "big", events: range(1, 10).map((n) => steer(n, 10 * 1024)) }));
    for (const refused of [one, many]) {
      expect(refused.code).toBe(Code.InvalidArgument);
      expect(reasonOf(refused)).toBe("REQUEST_TOO_LARGE");
      expect(violationOf(refused)).toMatchObject({
        field: "events",
        description: expect.stringMatching(/at most 61440 bytes per append \(etcd's --max-request-bytes/),
      });
      expect(refused.rawMessage).toContain("--etcd-max-request-bytes");
    }
    // Nothing was written, and the service serves on.
    expect(await sessions.appendEvent({ sessionId: "big", event: steer(1, 1024) })).toMatchObject({ seq: 1n });
    expect((await sessions.getSnapshot({ sessionId: "big" })).lastSeq).toBe(1n);
  });

  it("refuses it the same way when etcd's limit is lower than berth was told, and still writes appends that fit one by one", async () => {
    // berth assumes etcd's default (1.5 MiB): etcd refuses, and the refusal still names the field.
    const service = await etcdService("untold/");
    const sessions = sessionsOf(service);
    for (const bytes of [100 * 1024, 700 * 1024]) {
      const refused = await callFailure(sessions.appendEvent({ sessionId: "big", event: steer(1, bytes) }));
      expect(refused.code).toBe(Code.InvalidArgument);
      expect(reasonOf(refused)).toBe("REQUEST_TOO_LARGE");
      expect(violationOf(refused)).toMatchObject({ field: "events", description: expect.stringMatching(/etcd's --max-request-bytes/) });
      expect(refused.rawMessage).toMatch(/etcd refused the append.*--etcd-max-request-bytes/);
    }
    // Appends that queue behind each other on one session go together unless that is too large for etcd.
    const written = await Promise.all(range(1, 16).map((n) => sessions.appendEvent({ sessionId: "queued", event: steer(n, 20 * 1024) })));
    expect(written.map((r) => Number(r.seq)).sort((x, y) => x - y)).toEqual(range(1, 16));
  });
});

describe("etcd's compaction", () => {
  it("tells a watcher it cut: WatchSession and WatchSessions end WATCHER_LAGGED, and resuming by seq misses nothing", { timeout: 60_000 }, async () => {
    const [a, b] = await Promise.all([etcdService("cut/"), etcdService("cut/")]);
    const writer = sessionsOf(b);
    await writer.appendEvent({ sessionId: "cut", event: steer(0) });
    const reader = sessionsOf(a);
    const controller = new AbortController();
    const options = { signal: controller.signal, timeoutMs: 60_000 };
    const one = reader.watchSession({ sessionId: "cut" }, options)[Symbol.asyncIterator]();
    const seqs: number[] = [];
    for (;;) {
      const message = (await one.next()).value as WatchSessionResponse;
      if (message.kind.case === "caughtUp") break;
      if (message.kind.case === "entries") seqs.push(...message.kind.value.entries.map((item) => Number(item.entry!.seq)));
    }
    const all = reader.watchSessions({ includeCurrent: true }, options)[Symbol.asyncIterator]();
    while ((await all.next()).value?.kind.case !== "caughtUp");
    // While instance a is stopped, its etcd watches fall behind: etcd can hand them a flow-control
    // window (64 KiB) and a channel of 128 responses, not 300 appends of 8 KiB. Then history is compacted.
    const total = 301;
    process.kill(a.pid, "SIGSTOP");
    try {
      for (let n = 2; n <= total; n++) await writer.appendEvent({ sessionId: "cut", event: steer(n, 8 * 1024) });
      await client.compact((await client.status()).revision);
    } finally {
      process.kill(a.pid, "SIGCONT");
    }
    const cut = await drain(one, seqs);
    expect(cut?.code).toBe(Code.ResourceExhausted);
    expect(reasonOf(cut!)).toBe("WATCHER_LAGGED");
    expect(cut!.rawMessage).toContain("compaction");
    const last = seqs.at(-1)!;
    expect(seqs).toEqual(range(1, last));
    expect(last).toBeLessThan(total);
    const resumeFrom = cut!.findDetails(WatcherLaggedSchema)[0]?.resumeFromSeq;
    expect(resumeFrom).toBe(BigInt(last + 1));
    // Resumed where it was told: the rest, in order, none missing.
    for await (const message of reader.watchSession({ sessionId: "cut", fromSeq: resumeFrom! }, options)) {
      if (message.kind.case === "entries") seqs.push(...message.kind.value.entries.map((item) => Number(item.entry!.seq)));
      if (message.kind.case === "caughtUp") break;
    }
    expect(seqs).toEqual(range(1, total));

    const allCut = await callFailure(
      (async () => {
        while (!(await all.next()).done);
      })(),
    );
    expect(allCut.code).toBe(Code.ResourceExhausted);
    expect(reasonOf(allCut)).toBe("WATCHER_LAGGED");
    expect(allCut.rawMessage).toContain("compaction");
    controller.abort();
  });
});

// Last: the alarm stays raised.
describe("etcd's storage quota", () => {
  it("refuses appends RESOURCE_EXHAUSTED ETCD_NO_SPACE saying what to do once the alarm is raised; reads go on", { timeout: 60_000 }, async () => {
    const service = await etcdService("full/");
    const sessions = sessionsOf(service);
    await sessions.appendEvents({ sessionId: "kept", events: [steer(1), steer(2)] });
    // Filled by someone else under another prefix: etcd's quota is the whole cluster's.
    let full: unknown;
    for (let i = 0; i < 2000 && full === undefined; i++)
      full = await client.put(`fill/${i}`, new Uint8Array(60 * 1024)).then(
        () => undefined,
        (error: unknown) => error,
      );
    expect(full).toMatchObject({ reason: "ETCD_NO_SPACE" });
    const refused = await callFailure(sessions.appendEvent({ sessionId: "kept", event: steer(3) }));
    expect(refused.code).toBe(Code.ResourceExhausted);
    expect(reasonOf(refused)).toBe("ETCD_NO_SPACE");
    expect(refused.rawMessage).toMatch(/etcdctl compact.*etcdctl defrag.*--quota-backend-bytes.*etcdctl alarm disarm/);
    // Reads go on.
    expect((await sessions.getSnapshot({ sessionId: "kept" })).lastSeq).toBe(2n);
    const read: bigint[] = [];
    for await (const message of sessions.readJournal({ sessionId: "kept" })) read.push(...message.entries.map((entry) => entry.seq));
    expect(read).toEqual([1n, 2n]);
    expect((await sessions.listSessions({})).sessions.map((snapshot) => snapshot.id)).toEqual(["kept"]);
  });
});
