import * as path from "node:path";
import { durationFromMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { WatcherLaggedSchema, type WatchSessionResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
import { RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { ManualClock } from "@berth/shared/clock";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import {
  clientFor,
  closeStores,
  codeAndReason,
  collect,
  dir,
  failure,
  generate,
  openStore,
  phase,
  seqsOf,
  setUpStores,
  until,
  watched,
  watchersAt,
} from "./session-handler-fixtures.js";

beforeEach(setUpStores);
afterEach(closeStores);

describe("WatchSession", () => {
  it("misses nothing across appends racing the switch from backlog to live", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvents({ sessionId: "race", events: Array.from({ length: 50 }, (_, i) => phase(`b${i}`)) });
    const controller = new AbortController();
    const seen: bigint[] = [];
    let caughtUpAt = -1;
    const watching = (async () => {
      try {
        for await (const message of client.watchSession({ sessionId: "race" }, { signal: controller.signal })) {
          if (message.kind.case === "caughtUp") caughtUpAt = seen.length;
          seen.push(...seqsOf(message));
          if (seen.length === 100) return;
        }
      } catch (error) {
        if (!controller.signal.aborted) throw error;
      }
    })();
    await watchersAt(store, 1);
    const appends = Array.from({ length: 50 }, (_, i) => client.appendEvent({ sessionId: "race", event: phase(`l${i}`) }));
    await Promise.all(appends);
    await watching;
    controller.abort();
    expect(seen).toEqual(Array.from({ length: 100 }, (_, i) => BigInt(i + 1)));
    expect(caughtUpAt).toBeGreaterThanOrEqual(50);
  });

  it("ends a watcher that falls behind with RESOURCE_EXHAUSTED and WatcherLagged; a resume misses nothing", async () => {
    const store = openStore({ maxBuffered: 3 });
    const client = clientFor(store);
    await client.appendEvent({ sessionId: "slow", event: generate() });
    const seen: bigint[] = [];
    const stream = client.watchSession({ sessionId: "slow" })[Symbol.asyncIterator]();
    expect(seqsOf((await stream.next()).value as WatchSessionResponse)).toEqual([1n]);
    seen.push(1n);
    expect(((await stream.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    // Nobody reads while ten entries land: the watcher's buffer of three overflows.
    for (let i = 0; i < 10; i++) await client.appendEvent({ sessionId: "slow", event: phase(`p${i}`) });
    let error: ConnectError | undefined;
    for (;;) {
      try {
        const step = await stream.next();
        if (step.done) break;
        seen.push(...seqsOf(step.value as WatchSessionResponse));
      } catch (e) {
        error = ConnectError.from(e);
        break;
      }
    }
    expect(codeAndReason(error!)).toEqual([Code.ResourceExhausted, "WATCHER_LAGGED"]);
    const [lag] = error!.findDetails(WatcherLaggedSchema);
    expect(lag?.sessionId).toBe("slow");
    expect(lag?.resumeFromSeq).toBe(seen[seen.length - 1]! + 1n);
    const controller = new AbortController();
    for await (const message of client.watchSession({ sessionId: "slow", fromSeq: lag!.resumeFromSeq }, { signal: controller.signal })) {
      seen.push(...seqsOf(message));
      if (message.kind.case === "caughtUp") break;
    }
    controller.abort();
    expect(seen).toEqual(Array.from({ length: 11 }, (_, i) => BigInt(i + 1)));
  });

  it("watches a session that has no journal yet from its first append", async () => {
    const store = openStore();
    const client = clientFor(store);
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "later", includeSnapshot: true }, { signal: controller.signal })[Symbol.asyncIterator]();
    const marker = (await it.next()).value as WatchSessionResponse;
    expect(marker.kind.case).toBe("caughtUp");
    if (marker.kind.case !== "caughtUp") throw new Error("unreachable");
    expect(marker.kind.value.lastSeq).toBe(0n);
    expect(marker.kind.value.snapshot).toBeUndefined();
    expect(store.has("later")).toBe(false);
    await client.appendEvent({ sessionId: "later", event: generate() });
    const [first] = watched((await it.next()).value as WatchSessionResponse);
    expect(first?.entry).toMatchObject({ seq: 1n });
    expect(first?.snapshot?.phase).toBe("generate_requested");
    controller.abort();
    expect(store.stats().watchers).toBeLessThanOrEqual(1);
    await expect(it.next()).rejects.toThrow();
  });

  it("ends with UNAVAILABLE when the store closes, and validates its request", async () => {
    const store = openStore();
    const client = clientFor(store);
    const it = client.watchSession({ sessionId: "x" })[Symbol.asyncIterator]();
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    const ended = it.next();
    await store.close();
    const error = await failure(ended);
    expect(codeAndReason(error)).toEqual([Code.Unavailable, "SHUTTING_DOWN"]);
    expect(error.findDetails(RetryInfoSchema)).toHaveLength(1);
    const other = clientFor(openStore({ dir: path.join(dir, "other") }));
    for (const [request, message] of [
      [{ sessionId: "" }, /^session_id: /],
      [{ sessionId: "x", fromSeq: -1n }, /^from_seq: /],
      [{ sessionId: "x", maxBatch: -1 }, /^max_batch: /],
      [{ sessionId: "x", progressInterval: durationFromMs(99) }, /^progress_interval: must be unset, zero or at least 100ms/],
      [{ sessionId: "x", progressInterval: durationFromMs(-5) }, /^progress_interval: /],
    ] as const) {
      const bad = await failure(collect(other.watchSession(request)));
      expect(codeAndReason(bad)).toEqual([Code.InvalidArgument, "INVALID_FIELD"]);
      expect(bad.rawMessage).toMatch(message);
    }
  });
});

describe("WatchSession shape and progress", () => {
  it("sends the backlog up to 100 entries a message, then caught_up", async () => {
    const store = openStore();
    const client = clientFor(store);
    await client.appendEvents({ sessionId: "long", events: Array.from({ length: 250 }, (_, i) => phase(`p${i}`)) });
    const controller = new AbortController();
    const sizes: number[] = [];
    for await (const message of client.watchSession({ sessionId: "long", fromSeq: 3n }, { signal: controller.signal })) {
      if (message.kind.case === "caughtUp") break;
      sizes.push(watched(message).length);
    }
    controller.abort();
    expect(sizes).toEqual([100, 100, 48]);
  });

  it("sends progress with the last seq sent whenever the interval passes without a message once caught up", async () => {
    const store = openStore();
    const ticks = new ManualClock(Date.UTC(2026, 5, 1));
    const client = clientFor(store, { clock: ticks });
    await client.appendEvent({ sessionId: "idle", event: generate() });
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "idle", progressInterval: durationFromMs(1000) }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(seqsOf((await it.next()).value as WatchSessionResponse)).toEqual([1n]);
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    const pending = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(999);
    ticks.advance(1);
    const progress = (await pending).value as WatchSessionResponse;
    expect(progress.kind).toMatchObject({ case: "progress", value: { lastSeq: 1n, sendTime: { seconds: BigInt(Date.UTC(2026, 5, 1, 0, 0, 1) / 1000) } } });
    // Another interval, another progress; an entry resets the interval and moves last_seq.
    const second = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(1000);
    expect(((await second).value as WatchSessionResponse).kind.case).toBe("progress");
    const live = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(600);
    await client.appendEvent({ sessionId: "idle", event: phase("a") });
    expect(seqsOf((await live).value as WatchSessionResponse)).toEqual([2n]);
    expect(ticks.pendingTimers()).toBe(0);
    const third = it.next();
    await until(() => ticks.pendingTimers() === 1);
    ticks.advance(1000);
    expect(((await third).value as WatchSessionResponse).kind).toMatchObject({ case: "progress", value: { lastSeq: 2n } });
    controller.abort();
    await expect(it.next()).rejects.toThrow();
    expect(ticks.pendingTimers()).toBe(0);
  });

  it("without a progress interval, an idle watch sets no timer", async () => {
    const store = openStore();
    const ticks = new ManualClock();
    const client = clientFor(store, { clock: ticks });
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "quiet" }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    const pending = it.next();
    await watchersAt(store, 1);
    await client.appendEvent({ sessionId: "quiet", event: generate() });
    expect(seqsOf((await pending).value as WatchSessionResponse)).toEqual([1n]);
    expect(ticks.pendingTimers()).toBe(0);
    controller.abort();
  });
});
