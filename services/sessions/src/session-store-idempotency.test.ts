import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { encodeJournalLine } from "./journal/journal-format.js";
import { dir, expectBerthError, journal, open, temporaryStores } from "./session-store-fixtures.js";

temporaryStores();

describe("idempotency keys", () => {
  it("a retry returns the original result and writes nothing, also after a restart", async () => {
    const store = open();
    const original = await store.append("s1", [{ type: "generate", count: 2 }, { type: "agent_done" }], { idempotencyKey: "req-1" });
    await store.append("s1", [{ type: "checkpoint", revision: 5, phase: "generating" }]);
    const size = fs.statSync(journal("s1")).size;
    const retry = await store.append("s1", [{ type: "generate", count: 2 }, { type: "agent_done" }], { idempotencyKey: "req-1", expectedSeq: 0 });
    expect(retry).toEqual({ ...original, duplicate: true });
    expect(fs.statSync(journal("s1")).size).toBe(size);
    await store.close();

    // Restart without a current snapshot file: the key comes back from the journal line.
    fs.rmSync(path.join(dir, "sessions", "s1.snapshot.json"), { force: true });
    const replayed = open();
    const again = await replayed.append("s1", [{ type: "generate", count: 2 }, { type: "agent_done" }], { idempotencyKey: "req-1" });
    expect(again).toMatchObject({ firstSeq: 1, lastSeq: 2, duplicate: true });
    expect(again.snapshot).toEqual(original.snapshot);
    await replayed.close();

    // Restart hydrating from the snapshot file: the key is found by the lazy scan.
    const hydrated = open();
    expect(fs.existsSync(path.join(dir, "sessions", "s1.snapshot.json"))).toBe(true);
    const third = await hydrated.append("s1", [{ type: "generate", count: 2 }, { type: "agent_done" }], { idempotencyKey: "req-1" });
    expect(third).toMatchObject({ firstSeq: 1, lastSeq: 2, duplicate: true });
    expect(third.snapshot).toEqual(original.snapshot);
    expect(hydrated.stats().hydrations).toBe(1);
    expect(fs.statSync(journal("s1")).size).toBe(size);
    const next = await hydrated.append("s1", [{ type: "steer" }], { idempotencyKey: "req-2" });
    expect(next).toMatchObject({ firstSeq: 4, duplicate: false });
  });

  it("a retry racing the original waits for it and returns its result", async () => {
    const store = open();
    const [a, b] = await Promise.all([
      store.append("s1", [{ type: "generate" }], { idempotencyKey: "k" }),
      store.append("s1", [{ type: "generate" }], { idempotencyKey: "k" }),
    ]);
    expect(a.duplicate).toBe(false);
    expect(b).toEqual({ ...a, duplicate: true });
    expect(store.getSnapshot("s1")!.lastSeq).toBe(1);
  });

  it("a key reused with other events is refused (IDEMPOTENCY_KEY_REUSED), also while the first is in flight and after a restart", async () => {
    const store = open();
    const first = store.append("s1", [{ type: "generate", count: 2 }], { idempotencyKey: "k" });
    // In flight: the same events wait for it, other events are refused at once.
    const other = expectBerthError(store.append("s1", [{ type: "generate", count: 3 }], { idempotencyKey: "k" }), "already_exists", "IDEMPOTENCY_KEY_REUSED");
    const same = store.append("s1", [{ type: "generate", count: 2 }], { idempotencyKey: "k" });
    expect((await other).details).toEqual({ sessionId: "s1", idempotencyKey: "k", firstSeq: 1, lastSeq: 1, named: "append" });
    expect(await same).toEqual({ ...(await first), duplicate: true });
    // Durable: key order inside an event is not a difference, any other change is.
    expect(await store.append("s1", [{ count: 2, type: "generate" }], { idempotencyKey: "k" })).toMatchObject({ firstSeq: 1, duplicate: true });
    for (const events of [[{ type: "generate", count: 2, pageUrl: "/x" }], [{ type: "generate" }], [{ type: "generate", count: 2 }, { type: "steer" }]]) {
      await expectBerthError(store.append("s1", events, { idempotencyKey: "k" }), "already_exists", "IDEMPOTENCY_KEY_REUSED");
    }
    await store.append("s1", [{ type: "steer" }, { type: "agent_done" }], { idempotencyKey: "batch" });
    await expectBerthError(
      store.append("s1", [{ type: "steer" }, { type: "agent_done", extra: 1 }], { idempotencyKey: "batch" }),
      "already_exists",
      "IDEMPOTENCY_KEY_REUSED",
    );
    const size = fs.statSync(journal("s1")).size;
    await store.close();

    // After a restart (a full replay, then a hydration from the snapshot file) the digest comes
    // from the key's entries in the journal.
    fs.rmSync(path.join(dir, "sessions", "s1.snapshot.json"), { force: true });
    for (const round of ["replayed", "hydrated"]) {
      const reopened = open();
      const refused = await expectBerthError(
        reopened.append("s1", [{ type: "steer" }, { type: "agent_done", n: 2 }], { idempotencyKey: "batch" }),
        "already_exists",
        "IDEMPOTENCY_KEY_REUSED",
      );
      expect(refused.details, round).toMatchObject({ firstSeq: 2, lastSeq: 3 });
      expect(await reopened.append("s1", [{ type: "steer" }, { type: "agent_done" }], { idempotencyKey: "batch" }), round).toMatchObject({
        firstSeq: 2,
        lastSeq: 3,
        duplicate: true,
      });
      await expectBerthError(reopened.append("s1", [{ type: "generate", count: 9 }], { idempotencyKey: "k" }), "already_exists", "IDEMPOTENCY_KEY_REUSED");
      expect(await reopened.append("s1", [{ type: "generate", count: 2 }], { idempotencyKey: "k" }), round).toMatchObject({ firstSeq: 1, duplicate: true });
      expect(reopened.stats().hydrations, round).toBe(round === "hydrated" ? 1 : 0);
      await reopened.close();
    }
    expect(fs.statSync(journal("s1")).size).toBe(size);
  });

  it("a key's digest read back from the journal is kept, though the session was evicted and opened again meanwhile", async () => {
    const first = open();
    for (const id of ["a", "b", "c"]) await first.append(id, [{ type: "steer", pageUrl: `/${id}` }], { idempotencyKey: `k-${id}` });
    await first.close();
    // One open session at a time: each retry's read of its key's entries lets another session in.
    const store = open({ cacheSize: 1 });
    const retries = await Promise.all(
      ["a", "b", "c", "a", "b", "c"].map((id) => store.append(id, [{ type: "steer", pageUrl: `/${id}` }], { idempotencyKey: `k-${id}` })),
    );
    expect(retries.map((r) => [r.firstSeq, r.duplicate])).toEqual(Array.from({ length: 6 }, () => [1, true]));
    await expectBerthError(store.append("a", [{ type: "steer", pageUrl: "/b" }], { idempotencyKey: "k-a" }), "already_exists", "IDEMPOTENCY_KEY_REUSED");
  });

  it("a key in a journal written before digests existed is compared by the events its lines hold", async () => {
    // What an earlier version wrote: the key on the append's first line, nothing else.
    const ts = "2026-01-01T00:00:00.000Z";
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    fs.writeFileSync(
      journal("s1"),
      encodeJournalLine({ seq: 1, id: "s1", type: "generate", ts, event: { type: "generate", count: 2, id: "s1" } }, { ikey: "old", n: 2 }) +
        encodeJournalLine({ seq: 2, id: "s1", type: "steer", ts, event: { type: "steer", id: "s1" } }),
    );
    const store = open();
    await expectBerthError(store.append("s1", [{ type: "generate", count: 2 }], { idempotencyKey: "old" }), "already_exists", "IDEMPOTENCY_KEY_REUSED");
    expect(await store.append("s1", [{ type: "generate", count: 2 }, { type: "steer" }], { idempotencyKey: "old" })).toMatchObject({
      firstSeq: 1,
      lastSeq: 2,
      duplicate: true,
    });
  });
});
