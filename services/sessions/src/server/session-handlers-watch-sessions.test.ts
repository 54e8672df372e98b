import * as fs from "node:fs";
import * as path from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { WatcherLaggedSchema, type WatchSessionsResponse, type WatchSessionsRequestSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ManualClock } from "@berth/shared/clock";
import { runRevisionBase } from "@berth/shared/revision-history";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  clientFor,
  clock,
  closeStores,
  codeAndReason,
  collect,
  complete,
  dir,
  failure,
  generate,
  openStore,
  phase,
  setUpStores,
  until,
  watchersAt,
} from "./session-handler-fixtures.js";
import type { SessionStoreApi } from "../session-store-api.js";

beforeEach(setUpStores);
afterEach(closeStores);

describe("WatchSessions", () => {
  it("describes the current sessions, marks the end, then sends every change", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvents({ sessionId: "a", events: [generate(), phase("x")] });
    await client.appendEvent({ sessionId: "done", event: complete() });
    const controller = new AbortController();
    const it = client.watchSessions({ includeCurrent: true, includeSnapshot: true }, { signal: controller.signal })[Symbol.asyncIterator]();
    const current = (await it.next()).value!;
    expect(current.kind.case).toBe("change");
    expect(current.kind.value).toMatchObject({ sessionId: "a", lastSeq: 2n, firstSeq: 2n, type: "agent_phase" });
    if (current.kind.case !== "change") throw new Error("unreachable");
    expect(current.kind.value.snapshot?.generationPhase).toBe("x");
    expect(current.kind.value.appendTime?.seconds).toBe(BigInt(Date.UTC(2026, 0, 1) / 1000));
    const marker = (await it.next()).value!;
    expect(marker.kind).toMatchObject({ case: "caughtUp", value: { sessions: 1, deleted: [] } });
    await client.appendEvent({ sessionId: "done", event: phase("revived") });
    const live = (await it.next()).value!;
    expect(live.kind.value).toMatchObject({ sessionId: "done", lastSeq: 2n, firstSeq: 2n, type: "agent_phase" });
    // An AppendEvents is one change, first..last, with the snapshot after its last event.
    await client.appendEvents({ sessionId: "a", events: [phase("y"), complete(), phase("z")] });
    const batch = (await it.next()).value!;
    expect(batch.kind.value).toMatchObject({ sessionId: "a", firstSeq: 3n, lastSeq: 5n, type: "agent_phase" });
    if (batch.kind.case !== "change") throw new Error("unreachable");
    expect(batch.kind.value.snapshot?.generationPhase).toBe("z");
    await client.appendEvent({ sessionId: "a", event: phase("after") });
    expect((await it.next()).value!.kind.value).toMatchObject({ sessionId: "a", firstSeq: 6n, lastSeq: 6n });
    controller.abort();
  });

  it("sends the change of a line another process wrote with a type that is no string, as an empty type", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "odd", event: generate() });
    const controller = new AbortController();
    const it = client.watchSessions({}, { signal: controller.signal })[Symbol.asyncIterator]();
    // One change of our own first: once it is here, the watch is live.
    const ours = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "odd", event: phase("ours") });
    expect((await ours).value!.kind.value).toMatchObject({ sessionId: "odd", lastSeq: 2n, type: "agent_phase" });
    const line = { seq: 3, id: "odd", type: { toString: 0 }, ts: "2026-01-01T00:00:01.000Z", event: { type: "agent_phase", phase: { toString: 0 } } };
    fs.appendFileSync(path.join(dir, "sessions", "odd.jsonl"), `${JSON.stringify(line)}\n`);
    expect((await it.next()).value!.kind.value).toMatchObject({ sessionId: "odd", firstSeq: 3n, lastSeq: 3n, type: "" });
    controller.abort();
  });

  it("without include_current sends only new changes, and ends a lagging watcher with WatcherLagged", async () => {
    const store = openStore({ maxBuffered: 2 });
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "old", event: generate() });
    const it = client.watchSessions({})[Symbol.asyncIterator]();
    const first = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "new", event: generate() });
    expect((await first).value!.kind.value).toMatchObject({ sessionId: "new", lastSeq: 1n });
    for (let i = 0; i < 5; i++) await client.appendEvent({ sessionId: "new", event: phase(`p${i}`) });
    let error: ConnectError | undefined;
    try {
      for (;;) if ((await it.next()).done) break;
    } catch (e) {
      error = ConnectError.from(e);
    }
    expect(codeAndReason(error!)).toEqual([Code.ResourceExhausted, "WATCHER_LAGGED"]);
    expect(error!.findDetails(WatcherLaggedSchema)[0]).toMatchObject({ sessionId: "", resumeFromSeq: 0n });
  });
});

describe("WatchSessions resumed", () => {
  it("describes only the sessions that moved since resume_from, and names the deleted ones", async () => {
    const store = openStore();
    const client = clientFor(store);
    for (const id of ["same", "moved", "gone", "done"]) await client.appendEvent({ sessionId: id, event: generate() });
    const known = { same: 1n, moved: 1n, gone: 1n, done: 1n, never: 4n };
    // While the watcher was away:
    await client.appendEvent({ sessionId: "moved", event: phase("a") });
    await client.appendEvent({ sessionId: "done", event: complete() });
    await client.deleteSession({ sessionId: "gone" });
    await client.appendEvent({ sessionId: "fresh", event: generate() });
    await client.appendEvents({ sessionId: "finished", events: [generate(), complete()] });
    /** The sessions described before caught_up, and caught_up. */
    const resume = async (request: MessageInitShape<typeof WatchSessionsRequestSchema>) => {
      const controller = new AbortController();
      const described: Array<[string, bigint]> = [];
      try {
        for await (const message of client.watchSessions(request, { signal: controller.signal })) {
          if (message.kind.case === "change") described.push([message.kind.value.sessionId, message.kind.value.lastSeq]);
          if (message.kind.case === "caughtUp") return { described, caughtUp: message.kind.value };
        }
      } finally {
        controller.abort();
      }
      throw new Error("the watch ended before caught_up");
    };
    // "done" is described though completed (the watcher knew it); "finished" is not (it did not).
    const resumed = await resume({ resumeFrom: known });
    expect(resumed.described).toEqual([
      ["done", 2n],
      ["fresh", 1n],
      ["moved", 2n],
    ]);
    expect(resumed.caughtUp).toMatchObject({ sessions: 3, deleted: ["gone", "never"] });
    const withCompleted = await resume({ resumeFrom: known, includeCompleted: true });
    expect(withCompleted.described.map(([id]) => id)).toEqual(["done", "finished", "fresh", "moved"]);
    const bad = await failure(collect(client.watchSessions({ resumeFrom: { "a b": 1n } })));
    expect(bad.rawMessage).toMatch(/^resume_from: /);
    const negative = await failure(collect(client.watchSessions({ resumeFrom: { a: -1n } })));
    expect(negative.rawMessage).toMatch(/^resume_from\[a\]: must not be negative/);
  });

  it("describes more than a page of sessions from one listing: one deleted before its page is read is left out, one created meanwhile comes live after caught_up", async () => {
    const store = openStore();
    const ids = Array.from({ length: 70 }, (_, i) => `s${String(i).padStart(3, "0")}`);
    const event = { type: "generate", pageUrl: "/", count: 1 };
    for (const id of ids) await store.append(id, [event]);
    // Between the first page and the second, another caller deletes a session of the second page
    // and creates one after the last.
    const pages = store.pages.bind(store);
    (store as { pages: SessionStoreApi["pages"] }).pages = async function* (options) {
      let first = true;
      for (const page of pages(options)) {
        yield page;
        if (first) {
          first = false;
          await store.delete("s068");
          await store.append("s100", [event]);
        }
      }
    };
    const client = clientFor(store);
    const controller = new AbortController();
    const described: string[] = [];
    const live: Array<[string, boolean]> = [];
    let caughtUp: number | undefined;
    for await (const message of client.watchSessions({ includeCurrent: true }, { signal: controller.signal })) {
      if (message.kind.case === "caughtUp") caughtUp = message.kind.value.sessions;
      else if (message.kind.case === "change" && caughtUp === undefined) described.push(message.kind.value.sessionId);
      else if (message.kind.case === "change") live.push([message.kind.value.sessionId, message.kind.value.deleted]);
      if (live.length === 2) break;
    }
    controller.abort();
    expect(described).toEqual(ids.filter((id) => id !== "s068"));
    expect(caughtUp).toBe(69);
    expect(live).toEqual([
      ["s068", true],
      ["s100", false],
    ]);
  });

  it("sends progress on an idle watch of every session", async () => {
    const store = openStore();
    const ticks = new ManualClock(Date.UTC(2026, 5, 1));
    const client = clientFor(store, { clock: ticks });
    const controller = new AbortController();
    const it = client.watchSessions({ includeCurrent: true, progressInterval: durationFromMs(250) }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect((await it.next()).value!.kind).toMatchObject({ case: "caughtUp", value: { sessions: 0 } });
    const pending = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(250);
    expect((await pending).value!.kind).toMatchObject({ case: "progress", value: { lastSeq: 0n } });
    controller.abort();
  });
});

describe("WatchSessions by revision", () => {
  type Message = WatchSessionsResponse;
  /** Revisions are shown as above the run's base (the store's clock's time). */
  const base = () => BigInt(runRevisionBase(clock));
  /** A message in short: change session@lastSeq#revision (x: deleted), caught_up#revision (reset), progress#revision. */
  const brief = (message: Message): string => {
    switch (message.kind.case) {
      case "change":
        return `${message.kind.value.sessionId}@${message.kind.value.lastSeq}${message.kind.value.deleted ? "x" : ""}#${message.kind.value.revision - base()}`;
      case "caughtUp":
        return `caught_up#${message.kind.value.revision - base()}${message.kind.value.reset ? " reset" : ""}`;
      case "progress":
        return `progress#${message.kind.value.revision - base()}`;
      default:
        return "?";
    }
  };
  const take = async (it: AsyncIterator<Message>, n: number): Promise<string[]> => {
    const got: string[] = [];
    for (let i = 0; i < n; i++) got.push(brief((await it.next()).value!));
    return got;
  };

  it("numbers every change; a watcher resumed with start_revision gets exactly what it missed, a deletion included, then caught_up at the current revision", async () => {
    const store = openStore();
    const client = clientFor(store);
    const first = new AbortController();
    const it = client.watchSessions({}, { signal: first.signal })[Symbol.asyncIterator]();
    const pending = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "a", event: generate() });
    await client.appendEvents({ sessionId: "b", events: [generate(), phase("x")] });
    expect([brief((await pending).value!), ...(await take(it, 1))]).toEqual(["a@1#1", "b@2#2"]);
    first.abort();
    // Away: a deletion and two appends.
    await client.deleteSession({ sessionId: "a" });
    await client.appendEvent({ sessionId: "b", event: phase("y") });
    await client.appendEvent({ sessionId: "a", event: generate() });
    const again = new AbortController();
    const resumed = client.watchSessions({ startRevision: base() + 2n, includeCurrent: true }, { signal: again.signal })[Symbol.asyncIterator]();
    expect(await take(resumed, 4)).toEqual(["a@1x#3", "b@3#4", "a@2#5", "caught_up#5"]);
    await client.appendEvent({ sessionId: "b", event: phase("z") });
    expect(await take(resumed, 1)).toEqual(["b@4#6"]);
    again.abort();
  });

  it("answers a start revision it cannot replay (of an earlier run, or ahead) with the current state and caught_up reset", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "a", event: generate() });
    await client.appendEvents({ sessionId: "b", events: [generate(), complete()] });
    for (const startRevision of [5n, base() - 1n, base() + 200n]) {
      const controller = new AbortController();
      const it = client.watchSessions({ startRevision }, { signal: controller.signal })[Symbol.asyncIterator]();
      // As include_current: the completed session only with include_completed.
      expect(await take(it, 2)).toEqual(["a@1#2", "caught_up#2 reset"]);
      controller.abort();
    }
    const controller = new AbortController();
    const it = client.watchSessions({ startRevision: 1n, includeCompleted: true }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(await take(it, 3)).toEqual(["a@1#2", "b@2#2", "caught_up#2 reset"]);
    controller.abort();
  });

  it("ends a lagging watcher with the revision to resume from, and a resume from it misses nothing", async () => {
    const store = openStore({ maxBuffered: 2 });
    const client = clientFor(store);
    const it = client.watchSessions({})[Symbol.asyncIterator]();
    const first = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "s", event: generate() });
    expect(brief((await first).value!)).toBe("s@1#1");
    for (let i = 0; i < 5; i++) await client.appendEvent({ sessionId: "s", event: phase(`p${i}`) });
    let error: ConnectError | undefined;
    try {
      for (;;) if ((await it.next()).done) break;
    } catch (e) {
      error = ConnectError.from(e);
    }
    expect(codeAndReason(error!)).toEqual([Code.ResourceExhausted, "WATCHER_LAGGED"]);
    const detail = error!.findDetails(WatcherLaggedSchema)[0]!;
    expect(detail).toMatchObject({ sessionId: "", resumeFromSeq: 0n });
    const controller = new AbortController();
    const resumed = client.watchSessions({ startRevision: detail.resumeFromRevision }, { signal: controller.signal })[Symbol.asyncIterator]();
    const expected = Array.from({ length: 6 }, (_, i) => i + 1).filter((seq) => BigInt(seq) > detail.resumeFromRevision - base());
    expect(await take(resumed, expected.length + 1)).toEqual([...expected.map((seq) => `s@${seq}#${seq}`), "caught_up#6"]);
    controller.abort();
  });

  it("sends progress carrying the revision the watcher is up to", async () => {
    const store = openStore();
    const ticks = new ManualClock(Date.UTC(2026, 5, 1));
    const client = clientFor(store, { clock: ticks });
    await client.appendEvent({ sessionId: "a", event: generate() });
    const controller = new AbortController();
    const it = client.watchSessions({ includeCurrent: true, progressInterval: durationFromMs(250) }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(await take(it, 2)).toEqual(["a@1#1", "caught_up#1"]);
    await client.appendEvent({ sessionId: "a", event: phase("x") });
    expect(await take(it, 1)).toEqual(["a@2#2"]);
    const pending = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(250);
    expect(brief((await pending).value!)).toBe("progress#2");
    controller.abort();
  });

  it("refuses a negative start_revision naming it", async () => {
    const client = clientFor(openStore());
    const negative = await failure(collect(client.watchSessions({ startRevision: -1n })));
    expect(codeAndReason(negative)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
    expect(negative.rawMessage).toMatch(/^start_revision: must not be negative/);
  });

  it("with resume_from too: replays when it can, and on a reset describes only what moved since resume_from", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "still", event: generate() });
    await client.appendEvent({ sessionId: "moved", event: generate() });
    await client.appendEvent({ sessionId: "gone", event: generate() });
    await client.appendEvent({ sessionId: "moved", event: phase("x") });
    await client.deleteSession({ sessionId: "gone" });
    const known = { still: 1n, moved: 1n, gone: 1n };
    const replay = new AbortController();
    const replayed = client.watchSessions({ startRevision: base() + 3n, resumeFrom: known }, { signal: replay.signal })[Symbol.asyncIterator]();
    expect(await take(replayed, 3)).toEqual(["moved@2#4", "gone@1x#5", "caught_up#5"]);
    replay.abort();
    const reset = new AbortController();
    const described = client.watchSessions({ startRevision: 1n, resumeFrom: known }, { signal: reset.signal })[Symbol.asyncIterator]();
    expect(await take(described, 1)).toEqual(["moved@2#5"]);
    const marker = (await described.next()).value!;
    expect(marker.kind).toMatchObject({ case: "caughtUp", value: { sessions: 1, deleted: ["gone"], reset: true } });
    reset.abort();
  });
});
