import * as fs from "node:fs";
import * as path from "node:path";
import { describe, expect, it } from "vitest";
import { encodeSeedLine } from "./journal/journal-format.js";
import { clock, dir, expectBerthError, journal, open, readAll, temporaryStores } from "./session-store-fixtures.js";

temporaryStores();

describe("deleting a session", () => {
  it("keeps a deleted session's keys and a keyed deletion for the idempotency window, then forgets them (the seqs still continue)", async () => {
    const store = open({ idempotencyWindowMs: 60_000 });
    await store.append("w", [{ type: "generate" }], { idempotencyKey: "k" });
    expect(await store.delete("w", { idempotencyKey: "d" })).toEqual({ lastSeq: 1, duplicate: false });
    clock.advance(59_999);
    await expectBerthError(store.append("w", [{ type: "generate" }], { idempotencyKey: "k" }), "not_found", "SESSION_DELETED");
    expect(await store.delete("w", { idempotencyKey: "d" })).toEqual({ lastSeq: 1, duplicate: true });
    // The window has passed: the sweep forgot the deletion (its timer was the only one armed).
    expect(clock.pendingTimers()).toBe(1);
    clock.advance(1);
    await store.settled();
    expect(clock.pendingTimers()).toBe(0);
    expect(await store.append("w", [{ type: "generate" }], { idempotencyKey: "k" })).toMatchObject({ firstSeq: 2, duplicate: false });
    expect(await store.delete("w", { idempotencyKey: "d" })).toEqual({ lastSeq: 2, duplicate: false });
    await store.close();
    // And so does a restart: the tombstone keeps only its last seq.
    const reopened = open({ idempotencyWindowMs: 60_000 });
    expect(await reopened.append("w", [{ type: "generate" }])).toMatchObject({ firstSeq: 3 });
  });

  it("removes its journal and snapshot files, ends its watchers and tells the watchers of every session", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }, { type: "steer" }], { idempotencyKey: "k" });
    await store.append("other", [{ type: "generate" }]);
    await store.flush("s1");
    expect(fs.readdirSync(path.join(dir, "sessions")).filter((name) => name.startsWith("s1."))).toHaveLength(3);
    const watcher = store.watch("s1", 1);
    const all = store.watchAll();
    expect((await watcher.next()).value).toMatchObject({ kind: "entry" });
    expect(await store.delete("s1")).toEqual({ lastSeq: 2, duplicate: false });
    expect(fs.readdirSync(path.join(dir, "sessions")).filter((name) => name.startsWith("s1."))).toEqual([]);
    expect(store.has("s1")).toBe(false);
    expect(store.getSnapshot("s1", { includeCompleted: true })).toMatchObject({ exists: false, lastSeq: 0 });
    expect(store.list().map((view) => view.sessionId)).toEqual(["other"]);
    await expect(watcher.next()).rejects.toMatchObject({ code: "not_found", reason: "SESSION_DELETED", details: { sessionId: "s1", lastSeq: 2 } });
    expect((await all.next()).value).toMatchObject({ sessionId: "s1", firstSeq: 2, lastSeq: 2, entry: undefined, deleted: true });
    // The old key answers for the idempotency window: its append went to the session deleted since.
    const gone = await expectBerthError(store.append("s1", [{ type: "generate" }, { type: "steer" }], { idempotencyKey: "k" }), "not_found", "SESSION_DELETED");
    expect(gone.details).toMatchObject({ firstSeq: 1, lastSeq: 2, deletedAtSeq: 2 });
    // A new session under the id continues after the deleted one's last seq.
    expect(await store.append("s1", [{ type: "generate" }, { type: "steer" }], { idempotencyKey: "k2" })).toMatchObject({
      firstSeq: 3,
      lastSeq: 4,
      duplicate: false,
    });
    expect((await all.next()).value).toMatchObject({ sessionId: "s1", firstSeq: 3, lastSeq: 4, deleted: false });
    await all.return!();
    await store.close();
    // The tombstone outlives a restart: the key still answers, the seqs still continue.
    const reopened = open();
    expect(reopened.getSnapshot("s1")).toMatchObject({ exists: true, lastSeq: 4 });
    await expectBerthError(reopened.append("s1", [{ type: "generate" }, { type: "steer" }], { idempotencyKey: "k" }), "not_found", "SESSION_DELETED");
  });

  it("with an expected seq only when it is still the last; a missing session is SESSION_NOT_FOUND", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    const conflict = await expectBerthError(store.delete("s1", { expectedSeq: 2 }), "aborted", "SEQ_CONFLICT");
    expect(conflict.details).toMatchObject({ sessionId: "s1", expectedSeq: 2, currentSeq: 1 });
    expect(store.has("s1")).toBe(true);
    expect(await store.delete("s1", { expectedSeq: 1 })).toEqual({ lastSeq: 1, duplicate: false });
    await expectBerthError(store.delete("s1"), "not_found", "SESSION_NOT_FOUND");
    await expectBerthError(store.delete("never"), "not_found", "SESSION_NOT_FOUND");
    await expectBerthError(() => store.delete("../x"), "invalid_argument");
  });

  it("lands the appends sequenced before it; appends made while it runs go to a new session", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    const before = store.append("s1", [{ type: "steer" }]);
    const deletion = store.delete("s1", { expectedSeq: 2 });
    const after = store.append("s1", [{ type: "agent_done" }]);
    expect(await before).toMatchObject({ firstSeq: 2 });
    expect(await deletion).toEqual({ lastSeq: 2, duplicate: false });
    expect(await after).toMatchObject({ firstSeq: 3, snapshot: { phase: "variants_ready" } });
    expect((await readAll(store, "s1")).map((stored) => stored.entry.type)).toEqual(["agent_done"]);
  });

  it("also removes a legacy journal (the seed would read it again), and its snapshot file", async () => {
    const legacyDir = path.join(dir, "legacy");
    fs.mkdirSync(legacyDir);
    const ts = "2026-01-01T00:00:00.000Z";
    fs.writeFileSync(journal("old", legacyDir), encodeSeedLine({ seq: 1, id: "old", type: "generate", ts, event: { type: "generate", id: "old" } }));
    fs.writeFileSync(path.join(legacyDir, "old.snapshot.json"), "{}");
    fs.copyFileSync(journal("old", legacyDir), journal("both", legacyDir));
    const store = open({ legacyDir });
    // "both" was migrated: the primary holds it, the legacy copy stays behind (as the seed leaves it).
    await store.append("both", [{ type: "steer" }]);
    expect(fs.existsSync(journal("both", legacyDir))).toBe(true);
    expect(await store.delete("old")).toEqual({ lastSeq: 1, duplicate: false });
    expect(await store.delete("both")).toEqual({ lastSeq: 2, duplicate: false });
    expect(fs.readdirSync(legacyDir)).toEqual([]);
    expect(store.list({ includeCompleted: true })).toEqual([]);
  });
});
