import * as fs from "node:fs";
import * as path from "node:path";
import { toBinary } from "@bufbuild/protobuf";
import { EntryIntegrity, type WatchSessionResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { snapshotToProto } from "./snapshot-codec.js";
import { clientFor, closeStores, collect, dir, generate, onlyEntry, openStore, phase, seqsOf, setUpStores, watched } from "./session-handler-fixtures.js";

beforeEach(setUpStores);
afterEach(closeStores);

describe.each([
  ["binary", false],
  ["JSON", true],
])("SessionService over %s messages", (_name, json) => {
  it("appends events, answering each with its seq and the snapshot it produced", async () => {
    const store = openStore();
    const client = clientFor(store, {}, json);
    const first = await client.appendEvent({ sessionId: "s1", event: generate(2) });
    expect(first.seq).toBe(1n);
    expect(first.duplicate).toBe(false);
    expect(first.snapshot?.phase).toBe("generate_requested");
    expect(first.snapshot?.expectedVariants).toBe(2);
    const second = await client.appendEvent({ sessionId: "s1", event: phase("planning") });
    expect(second.seq).toBe(2n);
    expect(second.snapshot?.generationPhase).toBe("planning");
    // The response's snapshot is the store's, field for field.
    const view = store.getSnapshot("s1")!;
    expect(toBinary(SnapshotSchema, second.snapshot!)).toEqual(toBinary(SnapshotSchema, snapshotToProto(view.snapshot)));
  });

  it("watches a session: backlog, caught-up with the snapshot, then live entries with theirs", async () => {
    const store = openStore();
    const client = clientFor(store, {}, json);
    await client.appendEvent({ sessionId: "w", event: generate() });
    await client.appendEvent({ sessionId: "w", event: phase("planning") });
    const controller = new AbortController();
    const stream = client.watchSession({ sessionId: "w", fromSeq: 2n, includeSnapshot: true }, { signal: controller.signal });
    const it = stream[Symbol.asyncIterator]();
    const backlog = (await it.next()).value as WatchSessionResponse;
    expect(backlog.kind.case).toBe("entries");
    expect(watched(backlog)).toHaveLength(1);
    expect(watched(backlog)[0]!.entry).toMatchObject({ seq: 2n, type: "agent_phase", sessionId: "w" });
    expect(watched(backlog)[0]!.snapshot).toBeUndefined();
    const marker = (await it.next()).value as WatchSessionResponse;
    expect(marker.kind.case).toBe("caughtUp");
    if (marker.kind.case !== "caughtUp") throw new Error("unreachable");
    expect(marker.kind.value.lastSeq).toBe(2n);
    expect(marker.kind.value.snapshot?.generationPhase).toBe("planning");
    const appended = await client.appendEvent({ sessionId: "w", event: phase("writing") });
    const live = watched((await it.next()).value as WatchSessionResponse);
    expect(live).toHaveLength(1);
    expect(live[0]!.entry!.seq).toBe(3n);
    expect(live[0]!.entry!.event?.kind.case).toBe("agentPhase");
    expect(live[0]!.snapshot?.generationPhase).toBe("writing");
    expect(live[0]!.snapshot).toEqual(appended.snapshot);
    controller.abort();
    await expect(it.next()).rejects.toThrow();
  });

  it("with max_batch, live entries that piled up come several to a message, each with its snapshot, none lost", async () => {
    const store = openStore();
    const client = clientFor(store, {}, json);
    await client.appendEvent({ sessionId: "b", event: generate() });
    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "b", includeSnapshot: true, maxBatch: 4 }, { signal: controller.signal })[Symbol.asyncIterator]();
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("entries");
    expect(((await it.next()).value as WatchSessionResponse).kind.case).toBe("caughtUp");
    // Ten entries land while nobody reads: they wait in the watcher's buffer.
    const snapshots = new Map<bigint, unknown>();
    for (let i = 0; i < 10; i++) {
      const appended = await client.appendEvent({ sessionId: "b", event: phase(`p${i}`) });
      snapshots.set(appended.seq, appended.snapshot);
    }
    const seen: bigint[] = [];
    const sizes: number[] = [];
    while (seen.length < 10) {
      const message = (await it.next()).value as WatchSessionResponse;
      if (message.kind.case !== "entries") throw new Error(`unexpected ${String(message.kind.case)}`);
      sizes.push(message.kind.value.entries.length);
      for (const item of message.kind.value.entries) {
        seen.push(item.entry!.seq);
        expect(item.entry!.sessionId).toBe("b");
        expect(item.snapshot).toEqual(snapshots.get(item.entry!.seq));
      }
    }
    expect(seen).toEqual(Array.from({ length: 10 }, (_, i) => BigInt(i + 2)));
    expect(Math.max(...sizes)).toBe(4);
    expect(sizes.length).toBeLessThan(10);
    // Caught up again: the next live entry comes alone.
    const next = await client.appendEvent({ sessionId: "b", event: phase("last") });
    expect(seqsOf((await it.next()).value as WatchSessionResponse)).toEqual([next.seq]);
    controller.abort();
  });

  it("entries carry the key they were appended with and their checksum verdict, read or watched", async () => {
    // A line the seed's library wrote: no checksum, so nothing can be verified about it.
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    const seedLine = { seq: 1, id: "k", type: "generate", ts: "2026-01-01T00:00:00.000Z", event: { type: "generate", id: "k", count: 1 } };
    fs.writeFileSync(path.join(dir, "sessions", "k.jsonl"), `${JSON.stringify(seedLine)}\n`);
    const store = openStore();
    const client = clientFor(store, {}, json);
    await client.appendEvents({ sessionId: "k", events: [phase("a"), phase("b"), phase("c")], idempotencyKey: "batch-1" });
    await client.appendEvent({ sessionId: "k", event: phase("d"), idempotencyKey: "one" });
    await client.appendEvent({ sessionId: "k", event: phase("e") });
    const expected = [
      [1n, "", EntryIntegrity.UNCHECKED],
      [2n, "batch-1", EntryIntegrity.VERIFIED],
      [3n, "batch-1", EntryIntegrity.VERIFIED],
      [4n, "batch-1", EntryIntegrity.VERIFIED],
      [5n, "one", EntryIntegrity.VERIFIED],
      [6n, "", EntryIntegrity.VERIFIED],
    ];
    const read = (await collect(client.readJournal({ sessionId: "k" }))).flatMap((m) => m.entries);
    expect(read.map((e) => [e.seq, e.idempotencyKey, e.integrity])).toEqual(expected);
    // From the middle of the keyed batch, too.
    const middle = (await collect(client.readJournal({ sessionId: "k", fromSeq: 3n, limit: 1 }))).flatMap((m) => m.entries);
    expect(middle.map((e) => [e.seq, e.idempotencyKey, e.integrity])).toEqual([expected[2]]);

    const controller = new AbortController();
    const it = client.watchSession({ sessionId: "k", fromSeq: 1n }, { signal: controller.signal })[Symbol.asyncIterator]();
    const backlog: unknown[] = [];
    for (;;) {
      const message = (await it.next()).value as WatchSessionResponse;
      if (message.kind.case !== "entries") break;
      for (const { entry } of message.kind.value.entries) backlog.push([entry!.seq, entry!.idempotencyKey, entry!.integrity]);
    }
    expect(backlog).toEqual(expected);
    await client.appendEvents({ sessionId: "k", events: [phase("f"), phase("g")], idempotencyKey: "live" });
    for (const seq of [7n, 8n]) {
      const live = onlyEntry((await it.next()).value as WatchSessionResponse);
      expect([live.seq, live.idempotencyKey, live.integrity]).toEqual([seq, "live", EntryIntegrity.VERIFIED]);
    }
    controller.abort();
    await expect(it.next()).rejects.toThrow();
  });
});
