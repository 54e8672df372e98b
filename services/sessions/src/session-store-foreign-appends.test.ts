import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { isBerthError, type BerthError } from "@berth/shared/errors";
import { nodeCommitIo, type CommitIo, type FsyncMode } from "./journal/group-commit.js";
import { encodeJournalLine, encodeSeedLine } from "./journal/journal-format.js";
import { applyEvent, baseSnapshot, type JournalEntry, type SessionSnapshot } from "./reducer.js";
import { APPEND_OVERTAKEN_RETRY_MS, type SessionStoreOptions, createSessionStore } from "./create-session-store.js";
import type { SessionStore } from "./session-store.js";
import type { StoredEntry } from "./journal/journal-store.js";
import { loadSeedStore, seedsAvailable, type SeedStoreHarness } from "./testing/seed-store.js";
import { seedAppend, seedDirsOf, seedReadState } from "./testing/seed-writer.js";

let dir: string;
let clock: ManualClock;
const stores: SessionStore[] = [];

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-store-"));
  clock = new ManualClock(Date.UTC(2026, 0, 1));
});

afterEach(async () => {
  for (const store of stores.splice(0)) await store.close().catch(() => undefined);
  fs.rmSync(dir, { recursive: true, force: true });
});

function makeLogger() {
  const lines: Array<{ level: string; obj: object; msg?: string }> = [];
  const at = (level: string) => (obj: object, msg?: string) => void lines.push({ level, obj, ...(msg ? { msg } : {}) });
  return { lines, debug: at("debug"), info: at("info"), warn: at("warn"), error: at("error") };
}

function countingIo(base: CommitIo = nodeCommitIo) {
  const counts = { writes: 0, syncs: 0 };
  let failWrites: NodeJS.ErrnoException | undefined;
  let partial = false;
  const io: CommitIo = {
    write(fd, data, offset, length) {
      counts.writes++;
      if (failWrites) {
        // Half the bytes reach the file before the error: the store must cut them back.
        if (partial) base.write(fd, data, offset, Math.max(1, Math.floor(length / 2)));
        throw failWrites;
      }
      return base.write(fd, data, offset, length);
    },
    async fdatasync(fd) {
      counts.syncs++;
      return base.fdatasync(fd);
    },
  };
  return {
    io,
    counts,
    fail(code: string | undefined, writePartial = false) {
      partial = writePartial;
      if (code === undefined) failWrites = undefined;
      else {
        failWrites = Object.assign(new Error(`${code}: simulated`), { code });
      }
    },
  };
}

function open(options: Partial<SessionStoreOptions> = {}): SessionStore {
  const store = createSessionStore({ dir: path.join(dir, "sessions"), clock, fsync: "batch", ...options });
  stores.push(store);
  return store;
}

function journal(id: string, root = path.join(dir, "sessions")): string {
  return path.join(root, `${id}.jsonl`);
}

async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}

/** The entries a read returns ([] for a session with no journal). */
async function readAll(store: SessionStore, sessionId: string, fromSeq?: number, limit?: number): Promise<StoredEntry[]> {
  const reading = store.read(sessionId, fromSeq, limit);
  return reading === null ? [] : collect(reading.entries);
}

async function expectBerthError(promise: Promise<unknown> | (() => unknown), code: string, reason?: string): Promise<BerthError> {
  try {
    if (typeof promise === "function") await promise();
    else await promise;
  } catch (error) {
    expect(isBerthError(error), String(error)).toBe(true);
    expect((error as BerthError).code).toBe(code);
    if (reason !== undefined) expect((error as BerthError).reason).toBe(reason);
    return error as BerthError;
  }
  throw new Error(`expected a BerthError ${code}`);
}

/** A seed-format line (no checksum) with a seq of the test's choosing, as the seed's store writes one. */
function seedLine(seq: number, id: string, event: Record<string, unknown>, ts = "2026-01-01T00:00:00.000Z"): string {
  return encodeSeedLine({ seq, id, type: String(event.type), ts, event: { ...event, id } });
}

/** The seqs of the journal's non-blank lines, in file order. */
function journalSeqs(id: string, root = path.join(dir, "sessions")): number[] {
  return fs
    .readFileSync(journal(id, root), "utf8")
    .split("\n")
    .filter((line) => line.trim() !== "")
    .map((line) => (JSON.parse(line) as { seq: number }).seq);
}

/** A session's life, for the comparisons with the seed. */
const script: Array<Record<string, unknown>> = [
  { type: "generate", count: 2, pageUrl: "http://localhost/", token: "t" },
  { type: "agent_phase", phase: "plan", at: 5, durationMs: 3 },
  { type: "checkpoint", revision: 1, phase: "generating", owner: "tab", paramValues: { a: 1 } },
  { type: "variants_ready", arrivedVariants: 2, at: 1000 },
  { type: "variant_mounted", variant: 2 },
  { type: "checkpoint", revision: 0, phase: "old" },
  { type: "discard", at: 2000 },
  { type: "agent_done", at: 3000 },
];

function fold(id: string, entries: JournalEntry[]): SessionSnapshot {
  return entries.reduce((snapshot, entry) => applyEvent(snapshot, entry), baseSnapshot(id));
}

describe("appends", () => {
  it("appends, numbers entries from 1 and serves the snapshot", async () => {
    const store = open();
    const first = await store.append("s1", [{ type: "generate", count: 3, pageUrl: "http://localhost/" }]);
    expect(first).toMatchObject({ firstSeq: 1, lastSeq: 1, duplicate: false });
    expect(first.snapshot.phase).toBe("generate_requested");
    const second = await store.append("s1", [{ type: "agent_done" }, { type: "variant_mounted", variant: 1 }]);
    expect(second).toMatchObject({ firstSeq: 2, lastSeq: 3 });
    expect(second.snapshot.renderState).toBe("mounted");
    const view = store.getSnapshot("s1");
    expect(view).toMatchObject({ lastSeq: 3, exists: true });
    expect(view!.snapshot).toBe(second.snapshot);
    const lines = fs
      .readFileSync(journal("s1"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.map((l) => l.seq)).toEqual([1, 2, 3]);
    expect(lines[1]).toMatchObject({ id: "s1", type: "agent_done", ts: "2026-01-01T00:00:00.000Z", n: 2, event: { type: "agent_done", id: "s1" } });
    expect(Object.keys(lines[0])).toEqual(["seq", "id", "type", "ts", "event", "crc"]);
    expect((fs.statSync(journal("s1")).mode & 0o777).toString(8)).toBe("600");
  });

  it("rejects bad ids and bad or oversized events with nothing written", async () => {
    const store = open({ maxEventBytes: 200 });
    await expectBerthError(store.append("../etc", [{ type: "x" }]), "invalid_argument");
    await expectBerthError(store.append("a/b", [{ type: "x" }]), "invalid_argument");
    await expectBerthError(store.append("s1", []), "invalid_argument");
    await expectBerthError(store.append("s1", [{ type: "ok" }, { notype: 1 }]), "invalid_argument");
    await expectBerthError(store.append("s1", [{ type: "ok" }, null]), "invalid_argument");
    await expectBerthError(store.append("s1", [{ type: "x", id: "other" }]), "invalid_argument");
    const big = await expectBerthError(store.append("s1", [{ type: "ok" }, { type: "x", blob: "y".repeat(300) }]), "invalid_argument", "EVENT_TOO_LARGE");
    expect(big.details).toMatchObject({ field: "events[1]", limit: 200 });
    expect(big.message).toMatch(/events\[1\].*over the limit of 200 bytes/);
    await expectBerthError(store.append("s1", [{ type: "x" }], { idempotencyKey: "k".repeat(129) }), "invalid_argument");
    expect(fs.readdirSync(path.join(dir, "sessions"))).toEqual([]);
    expect(() => store.getSnapshot("bad id")).toThrow(/session_id/);
    expect(store.has("s1")).toBe(false);
    expect(fs.readdirSync(dir)).toEqual(["sessions"]);
  });

  it("refuses an append whose expected seq is not the current one, with the current seq", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }], { expectedSeq: 0 });
    await store.append("s1", [{ type: "agent_phase", phase: "plan" }], { expectedSeq: 1 });
    const conflict = await expectBerthError(store.append("s1", [{ type: "steer" }], { expectedSeq: 1 }), "aborted", "SEQ_CONFLICT");
    expect(conflict.message).toContain("expected seq 1 but the session is at seq 2");
    expect(conflict.details).toMatchObject({ currentSeq: 2 });
    expect(store.getSnapshot("s1")!.lastSeq).toBe(2);
    const fresh = await expectBerthError(store.append("s2", [{ type: "steer" }], { expectedSeq: 4 }), "aborted", "SEQ_CONFLICT");
    expect(fresh.details).toMatchObject({ currentSeq: 0 });
  });

  it("refuses an append whose expected state does not hold: no session yet, or an existing one", async () => {
    const store = open();
    const missing = await expectBerthError(store.append("s1", [{ type: "steer" }], { expectedState: "exists" }), "aborted", "SEQ_CONFLICT");
    expect(missing.details).toMatchObject({ currentSeq: 0, expectedState: "exists" });
    expect(store.has("s1")).toBe(false);
    expect(await store.append("s1", [{ type: "generate" }], { expectedState: "no_session" })).toMatchObject({ firstSeq: 1 });
    const taken = await expectBerthError(store.append("s1", [{ type: "steer" }], { expectedState: "no_session" }), "aborted", "SEQ_CONFLICT");
    expect(taken.details).toMatchObject({ currentSeq: 1, expectedState: "no_session" });
    expect(await store.append("s1", [{ type: "steer" }], { expectedState: "exists" })).toMatchObject({ firstSeq: 2 });
    expect(await store.append("s1", [{ type: "steer" }], { expectedState: "any" })).toMatchObject({ firstSeq: 3 });
  });

  it("refuses an append whose fence check throws, with nothing written", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    const fence = () => {
      throw Object.assign(new Error("stale fence"), { code: "aborted" });
    };
    await expect(store.append("s1", [{ type: "steer" }], { fenceCheck: fence })).rejects.toThrow("stale fence");
    expect(store.getSnapshot("s1")!.lastSeq).toBe(1);
  });

  it("32 concurrent appenders get contiguous seqs with far fewer syncs than appends", async () => {
    const counter = countingIo();
    const store = open({ io: counter.io });
    await store.append("s1", [{ type: "generate" }]);
    counter.counts.syncs = 0;
    const results = await Promise.all(
      Array.from({ length: 32 }, (_, client) =>
        (async () => {
          const seqs: number[] = [];
          for (let i = 0; i < 8; i++) seqs.push((await store.append("s1", [{ type: "checkpoint", revision: client * 100 + i }])).firstSeq);
          return seqs;
        })(),
      ),
    );
    const all = results.flat().sort((a, b) => a - b);
    expect(all).toEqual(Array.from({ length: 256 }, (_, i) => i + 2));
    expect(counter.counts.syncs).toBeLessThan(256 / 4);
    const lines = fs
      .readFileSync(journal("s1"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l).seq);
    expect(lines).toEqual(Array.from({ length: 257 }, (_, i) => i + 1));
  });

  it("syncs once per append with fsync=always and never with none", async () => {
    for (const fsync of ["always", "none"] as FsyncMode[]) {
      const counter = countingIo();
      const store = open({ io: counter.io, fsync, dir: path.join(dir, fsync) });
      await Promise.all(Array.from({ length: 10 }, (_, i) => store.append("s1", [{ type: "checkpoint", revision: i }])));
      expect(counter.counts.syncs).toBe(fsync === "always" ? 10 : 0);
      expect(store.getSnapshot("s1")!.lastSeq).toBe(10);
    }
  });
});

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

describe("atomicity and write failures", () => {
  it("a failing write rejects the batch, cuts partial bytes back and rolls the state back", async () => {
    const counter = countingIo();
    const store = open({ io: counter.io });
    await store.append("s1", [{ type: "generate" }]);
    const sizeBefore = fs.statSync(journal("s1")).size;
    counter.fail("EIO", true);
    const failed = store.append("s1", [{ type: "agent_done" }, { type: "variant_mounted", variant: 1 }], { idempotencyKey: "k1" });
    const queued = store.append("s1", [{ type: "steer" }]);
    await expectBerthError(failed, "unavailable");
    await expectBerthError(queued, "unavailable");
    expect(fs.statSync(journal("s1")).size).toBe(sizeBefore);
    expect(store.getSnapshot("s1")).toMatchObject({ lastSeq: 1, snapshot: { phase: "generate_requested" } });
    counter.fail(undefined);
    const retried = await store.append("s1", [{ type: "agent_done" }], { idempotencyKey: "k1" });
    expect(retried).toMatchObject({ firstSeq: 2, duplicate: false });
    counter.fail("ENOSPC");
    const full = await expectBerthError(store.append("s1", [{ type: "steer" }]), "resource_exhausted", "DISK_FULL");
    expect(full.message).toBe(
      `session s1: the append was not written, nothing of it kept: the file system of the state directory ${path.join(dir, "sessions")} is full (ENOSPC); free space on it and retry (nothing is lost: reads go on, and writes resume once there is room, without a restart)`,
    );
    counter.fail(undefined);
    await store.close();
    const reopened = open();
    expect(reopened.getSnapshot("s1")).toMatchObject({ lastSeq: 2, snapshot: { phase: "variants_ready" } });
  });
});

describe("opening journals", () => {
  it("cuts a torn tail back, reports it, and continues at the right seq", async () => {
    const logger = makeLogger();
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    const whole = encodeJournalLine({ seq: 1, id: "s1", type: "generate", ts: "2026-01-01T00:00:00.000Z", event: { type: "generate", id: "s1" } });
    const torn = encodeJournalLine({ seq: 2, id: "s1", type: "agent_done", ts: "2026-01-01T00:00:01.000Z", event: { type: "agent_done", id: "s1" } }).slice(
      0,
      30,
    );
    fs.writeFileSync(journal("s1"), whole + torn);
    const store = open({ logger });
    const view = store.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(1);
    expect(view.snapshot.diagnostics).toContainEqual({ error: "journal_torn_tail_repaired", line: 2, bytesDropped: 30, entriesDropped: 0 });
    expect(fs.readFileSync(journal("s1"), "utf8")).toBe(whole);
    expect(logger.lines.some((l) => l.level === "warn" && /torn/.test(l.msg ?? ""))).toBe(true);
    const next = await store.append("s1", [{ type: "agent_done" }]);
    expect(next.firstSeq).toBe(2);
    expect(
      fs
        .readFileSync(journal("s1"), "utf8")
        .split("\n")
        .filter(Boolean)
        .map((l) => JSON.parse(l).seq),
    ).toEqual([1, 2]);
  });

  it("drops an append of several events that reached the disk only in part", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    await store.append("s1", [{ type: "agent_done" }, { type: "variant_mounted", variant: 1 }, { type: "variant_mounted", variant: 2 }]);
    await store.close();
    // Keep the first two of the three lines of the second append, as a crash could.
    const lines = fs.readFileSync(journal("s1"), "utf8").split("\n");
    fs.writeFileSync(journal("s1"), `${lines.slice(0, 3).join("\n")}\n`);
    fs.rmSync(path.join(dir, "sessions", "s1.snapshot.json"));
    const reopened = open();
    const view = reopened.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(1);
    expect(view.snapshot.phase).toBe("generate_requested");
    expect(view.snapshot.diagnostics).toContainEqual(expect.objectContaining({ error: "journal_torn_tail_repaired", entriesDropped: 2 }));
    expect(fs.readFileSync(journal("s1"), "utf8").trim().split("\n")).toHaveLength(1);
  });

  it("keeps a corrupt line in the middle as journal_parse_failed and replays the rest", async () => {
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    fs.writeFileSync(journal("s1"), `${seedLine(1, "s1", { type: "generate", count: 2 })}{"seq":2,"id":"s1","ty\n${seedLine(3, "s1", { type: "agent_done" })}`);
    const store = open();
    const view = store.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(3);
    expect(view.snapshot.phase).toBe("variants_ready");
    expect(view.snapshot.diagnostics).toEqual([expect.objectContaining({ error: "journal_parse_failed", line: 2 })]);
    expect(fs.readFileSync(journal("s1"), "utf8").split("\n")).toHaveLength(4);
  });

  it("skips a damaged line that still parses, with a checksum diagnostic", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate", count: 2 }]);
    await store.append("s1", [{ type: "checkpoint", revision: 1, phase: "generating" }]);
    await store.append("s1", [{ type: "agent_phase", phase: "plan" }]);
    await store.close();
    const text = fs.readFileSync(journal("s1"), "utf8");
    fs.writeFileSync(journal("s1"), text.replace('"revision":1', '"revision":7'));
    fs.rmSync(path.join(dir, "sessions", "s1.snapshot.json"));
    const reopened = open();
    const view = reopened.getSnapshot("s1")!;
    expect(view.snapshot.browserCheckpointRevision).toBe(0);
    expect(view.snapshot.generationPhase).toBe("plan");
    expect(view.snapshot.diagnostics).toEqual([expect.objectContaining({ error: "journal_checksum_mismatch", line: 2 })]);
    expect((await readAll(reopened, "s1")).map((e) => e.entry.seq)).toEqual([1, 3]);
  });

  it("reads hand-written seed-format fixtures with the expected snapshot", async () => {
    fs.mkdirSync(path.join(dir, "sessions"), { recursive: true });
    const events = [
      { type: "generate", count: 3, pageUrl: "http://localhost:5173/", screenshotPath: "/tmp/a.png", token: "secret" },
      { type: "variant_plan", plan: { variants: 3 } },
      { type: "checkpoint", revision: 2, phase: "generating", owner: "tab-1", visibleVariant: 1, paramValues: { hue: 10 } },
      { type: "checkpoint", revision: 1, phase: "stale" },
      { type: "variants_ready", sourceFile: "src/Hero.tsx", arrivedVariants: 3 },
      { type: "variant_mount_failed", variant: 2, error: "boom", url: "http://x" },
      { type: "accept", variantId: "2" },
      { type: "agent_done" },
      { type: "mystery" },
    ];
    const entries = events.map((event, i) => ({ seq: i + 1, id: "fx", type: event.type, ts: `2026-01-01T00:00:0${i}.000Z`, event: { ...event, id: "fx" } }));
    fs.writeFileSync(journal("fx"), entries.map((e) => `${JSON.stringify(e)}\n`).join(""));
    const store = open();
    const view = store.getSnapshot("fx")!;
    expect(view.lastSeq).toBe(9);
    expect(view.snapshot).toEqual(fold("fx", entries));
    expect(view.snapshot).toMatchObject({
      phase: "accept_requested",
      expectedVariants: 3,
      visibleVariant: 2,
      browserCheckpointRevision: 2,
      sourceFile: "src/Hero.tsx",
      annotationArtifacts: [{ type: "screenshot", path: "/tmp/a.png" }],
      cancelReason: "accept",
    });
    expect(view.snapshot.diagnostics.map((d) => d.error)).toEqual(["stale_checkpoint_ignored", "late_generation_event_ignored", "unknown_event_type"]);
    expect((view.snapshot.pendingEvent as Record<string, unknown>).token).toBeUndefined();
  });
});

describe.skipIf(!seedsAvailable())("the seed's own store and berth read each other's journals", () => {
  let seed: SeedStoreHarness;
  beforeEach(async () => {
    seed = await loadSeedStore();
  });
  afterEach(() => seed.remove());

  /** The snapshot without the fields that hold wall-clock times the seed takes from Date. */
  const timeless = (snapshot: Record<string, unknown> | null) => {
    const { updatedAt: _u, generationCompletedAt: _g, generationCanceledAt: _c, ...rest } = snapshot ?? {};
    return JSON.parse(JSON.stringify(rest));
  };

  it("berth serves a journal the seed wrote", () => {
    const seedStore = seed.store("s1");
    let expected: Record<string, unknown> | null = null;
    for (const event of script) expected = seedStore.appendEvent(event);
    const store = open({ dir: seed.sessionsDir, legacyDir: seed.legacySessionsDir });
    const view = store.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(script.length);
    expect(JSON.parse(JSON.stringify(view.snapshot))).toEqual(JSON.parse(JSON.stringify(expected)));
    // The seed wrote a current snapshot file on its last append: berth hydrated from it.
    expect(store.stats().hydrations).toBe(1);
    fs.rmSync(path.join(seed.sessionsDir, "s1.snapshot.json"));
    const replaying = open({ dir: seed.sessionsDir });
    expect(JSON.parse(JSON.stringify(replaying.getSnapshot("s1")!.snapshot))).toEqual(JSON.parse(JSON.stringify(expected)));
  });

  it("the seed's store reads berth's journal and snapshot file and gets the same snapshot", async () => {
    const store = open({ dir: seed.sessionsDir, legacyDir: seed.legacySessionsDir });
    for (const event of script) await store.append("s1", [event]);
    const berthSnapshot = store.getSnapshot("s1", { includeCompleted: true })!.snapshot;
    // Lazily written: nothing yet.
    expect(fs.existsSync(path.join(seed.sessionsDir, "s1.snapshot.json"))).toBe(false);
    await store.flush("s1");
    const file = JSON.parse(fs.readFileSync(path.join(seed.sessionsDir, "s1.snapshot.json"), "utf8"));
    expect(file.__journalBytes).toBe(fs.statSync(journal("s1", seed.sessionsDir)).size);
    expect(file.__nextSeq).toBe(script.length + 1);
    // The seed hydrates from berth's snapshot file...
    const fromFile = seed.store("s1").getSnapshot("s1", { includeCompleted: true });
    expect(JSON.parse(JSON.stringify(fromFile))).toEqual(JSON.parse(JSON.stringify(berthSnapshot)));
    // ...and a replay of berth's journal by the seed gives the same snapshot (timestamps aside).
    fs.rmSync(path.join(seed.sessionsDir, "s1.snapshot.json"));
    const replayed = seed.store("s1").getSnapshot("s1", { includeCompleted: true });
    expect(timeless(replayed)).toEqual(timeless(berthSnapshot));
    expect(replayed!.updatedAt).toBe(berthSnapshot.updatedAt);
    // The seed appends after berth's lines at the right seq.
    seed.store("s1").appendEvent({ type: "steer", id: "s1" });
    const lines = fs
      .readFileSync(journal("s1", seed.sessionsDir), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.at(-1)).toMatchObject({ seq: script.length + 1, type: "steer" });
  });

  it("a session berth deleted is gone for the seed's store too, legacy copy included", async () => {
    const seedStore = seed.store("s1");
    for (const event of script) seedStore.appendEvent(event);
    fs.mkdirSync(seed.legacySessionsDir, { recursive: true });
    fs.copyFileSync(journal("s1", seed.sessionsDir), journal("s1", seed.legacySessionsDir));
    const store = open({ dir: seed.sessionsDir, legacyDir: seed.legacySessionsDir });
    await store.append("s1", [{ type: "steer" }]);
    await store.flush("s1");
    expect(seed.store("s1").has("s1")).toBe(true);
    expect(await store.delete("s1")).toEqual({ lastSeq: script.length + 1, duplicate: false });
    const after = seed.store("s1");
    expect(after.has("s1")).toBe(false);
    expect(after.listActiveSessions()).toEqual([]);
    expect(after.getSnapshot("s1", { includeCompleted: true })).toMatchObject({ id: "s1", phase: "new" });
  });

  it("the stand-in for a seed process in the tests below writes what the seed's store writes", () => {
    const project = fs.mkdtempSync(path.join(dir, "stand-in-"));
    const standIn = seedDirsOf(project);
    const ts = "2026-01-01T00:00:00.000Z";
    const events = [...script, ...Array.from({ length: 105 }, (_, i) => ({ type: "mystery", n: i }))];
    let expected: Record<string, unknown> | null = null;
    let written: Record<string, unknown> = {};
    for (const event of events) {
      expected = seed.store("s1").appendEvent({ ...event, id: "s1" });
      written = seedAppend(standIn, "s1", event, { snapshotFile: true, ts }).snapshot;
    }
    const lines = (file: string) =>
      fs
        .readFileSync(file, "utf8")
        .trim()
        .split("\n")
        .map((l) => ({ ...JSON.parse(l), ts }));
    expect(lines(journal("s1", standIn.dir))).toEqual(lines(journal("s1", seed.sessionsDir)));
    expect(timeless(written)).toEqual(timeless(expected));
    const file = (d: string) => timeless(JSON.parse(fs.readFileSync(path.join(d, "s1.snapshot.json"), "utf8")));
    expect(file(standIn.dir)).toEqual(file(seed.sessionsDir));
    // Its replay (no snapshot file) and its seq rule too.
    for (const d of [standIn.dir, seed.sessionsDir]) fs.rmSync(path.join(d, "s1.snapshot.json"));
    expect(timeless(seedReadState(standIn, "s1").snapshot)).toEqual(timeless(seed.store("s1").getSnapshot("s1", { includeCompleted: true })));
    expect(seedAppend(standIn, "s1", { type: "steer" }).seq).toBe(
      (seed.store("s1").appendEvent({ type: "steer", id: "s1" }) as { pendingEventSeq: number }).pendingEventSeq,
    );
  });
});

describe("beside another process appending in the seed's format", () => {
  let live: ReturnType<typeof seedDirsOf>;
  beforeEach(() => {
    live = seedDirsOf(path.join(dir, "project"));
  });

  it("reads the legacy root and copies it over on the first append, as the seed does", async () => {
    seedAppend(live, "old", { type: "generate", count: 1 });
    seedAppend(live, "old", { type: "agent_done" });
    // Move the journal to the legacy root, as an older version of the seed left it.
    fs.mkdirSync(live.legacyDir, { recursive: true });
    fs.renameSync(journal("old", live.dir), journal("old", live.legacyDir));
    const legacyBytes = fs.readFileSync(journal("old", live.legacyDir), "utf8");

    const store = open({ dir: live.dir, legacyDir: live.legacyDir });
    expect(store.has("old")).toBe(true);
    expect(store.getSnapshot("old")).toMatchObject({ lastSeq: 2, snapshot: { phase: "variants_ready" } });
    expect(store.list().map((v) => v.sessionId)).toEqual(["old"]);
    expect(fs.existsSync(journal("old", live.dir))).toBe(false);
    const appended = await store.append("old", [{ type: "steer" }]);
    expect(appended.firstSeq).toBe(3);
    const primary = fs.readFileSync(journal("old", live.dir), "utf8");
    expect(primary.startsWith(legacyBytes)).toBe(true);
    expect(fs.readFileSync(journal("old", live.legacyDir), "utf8")).toBe(legacyBytes);
    // A seed process now reads the primary, where berth's line is.
    expect(seedReadState(live, "old")).toMatchObject({ nextSeq: 4, snapshot: { phase: "steer_requested" } });
  });

  it("picks up an append made by another process with one catch-up", async () => {
    const store = open({ dir: live.dir });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    const watcher = store.watch("s1", 2);
    seedAppend(live, "s1", { type: "agent_done" });
    seedAppend(live, "s1", { type: "variant_mounted", variant: 1 });
    const view = store.getSnapshot("s1")!;
    expect(view.lastSeq).toBe(3);
    expect(view.snapshot.renderState).toBe("mounted");
    const next = await store.append("s1", [{ type: "steer" }]);
    expect(next.firstSeq).toBe(4);
    const seen: number[] = [];
    for await (const item of watcher) {
      if (item.kind === "entry") seen.push(item.entry.seq);
      if (seen.length === 3) break;
    }
    expect(seen).toEqual([2, 3, 4]);
    expect(store.stats().replays).toBe(0);
  });

  it("refuses, retryably and writing nothing, appends that another process's line overtook before they were written", async () => {
    const store = open({ dir: live.dir });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    const watcher = store.watch("s1", 2);
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 1 });
    // Our append has taken seq 2 and waits for the group commit (a microtask away) when the other
    // process, reading the file, appends its own seq 2.
    const ours = store.append("s1", [{ type: "steer" }]);
    const behind = store.append("s1", [{ type: "agent_done" }]);
    expect(seedAppend(live, "s1", { type: "variant_mounted", variant: 1 }).seq).toBe(2);
    const refusal = { code: "unavailable", reason: "APPEND_OVERTAKEN", options: { retryAfterMs: APPEND_OVERTAKEN_RETRY_MS }, details: { sessionId: "s1" } };
    await expect(ours).rejects.toMatchObject(refusal);
    await expect(behind).rejects.toMatchObject(refusal);
    const retried = await store.append("s1", [{ type: "steer" }]);
    expect(retried.firstSeq).toBe(3);
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2, 3]);
    const seen: number[] = [];
    for await (const item of watcher) {
      if (item.kind === "entry") seen.push(item.entry.seq);
      if (seen.length === 2) break;
    }
    expect(seen).toEqual([2, 3]);
  });

  /**
   * An io whose next write lets another process's append land right before it and/or right after
   * it: the one span no check can close, between two adjacent system calls of ours.
   */
  function racingIo(onWrite: { before?: () => void; after?: () => void }) {
    let armed = false;
    const io: CommitIo = {
      write(fd, data, offset, length) {
        if (!armed) return nodeCommitIo.write(fd, data, offset, length);
        armed = false;
        onWrite.before?.();
        const written = nodeCommitIo.write(fd, data, offset, length);
        onWrite.after?.();
        return written;
      },
      fdatasync: (fd) => nodeCommitIo.fdatasync(fd),
    };
    return { io, arm: () => (armed = true) };
  }

  it("refuses an append another process's line got in front of between the check and the write, leaving no line of it", async () => {
    const racing = racingIo({ before: () => seedAppend(live, "s1", { type: "variant_mounted", variant: 1 }) });
    const store = open({ dir: live.dir, io: racing.io });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    racing.arm();
    await expect(store.append("s1", [{ type: "steer" }, { type: "agent_done" }])).rejects.toMatchObject({
      code: "unavailable",
      reason: "APPEND_OVERTAKEN",
      details: { sessionId: "s1" },
    });
    // The other process's seq 2 stands; ours (2 and 3) are blank lines now, which every reader skips.
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2]);
    const text = fs.readFileSync(journal("s1", live.dir), "utf8");
    expect(text).not.toMatch(/steer|agent_done/);
    expect(text.split("\n").filter((line) => line !== "" && line.trim() === "")).toHaveLength(2);
    expect(seedReadState(live, "s1").nextSeq).toBe(3);
    const retried = await store.append("s1", [{ type: "steer" }]);
    expect(retried).toMatchObject({ firstSeq: 3, snapshot: { renderState: "mounted", phase: "steer_requested" } });
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2, 3]);
    const reopened = open({ dir: live.dir });
    await store.close();
    expect(reopened.getSnapshot("s1")).toMatchObject({ lastSeq: 3, snapshot: { phase: "steer_requested", diagnostics: [] } });
  });

  it("undoes its bytes in place, never cutting the file: the other process's line written after them stays", async () => {
    const racing = racingIo({
      before: () => seedAppend(live, "s1", { type: "variant_mounted", variant: 1 }),
      after: () => seedAppend(live, "s1", { type: "variant_mounted", variant: 2 }),
    });
    const store = open({ dir: live.dir, io: racing.io });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    racing.arm();
    await expect(store.append("s1", [{ type: "steer" }])).rejects.toMatchObject({ code: "unavailable", reason: "APPEND_OVERTAKEN" });
    // The line after ours read the journal with our line in it, so took seq 3.
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2, 3]);
    expect(fs.readFileSync(journal("s1", live.dir), "utf8")).not.toMatch(/steer/);
    expect((await store.append("s1", [{ type: "steer" }])).firstSeq).toBe(4);
    expect(store.getSnapshot("s1")!.snapshot.mountedVariants).toEqual([1, 2]);
  });

  it("refuses as a seq conflict (look before writing again) an append whose split write it could not undo", async () => {
    let armed = false;
    // A short write: half the bytes, another process's line, then the rest.
    const io: CommitIo = {
      write(fd, data, offset, length) {
        if (!armed) return nodeCommitIo.write(fd, data, offset, length);
        armed = false;
        const half = Math.floor(length / 2);
        const first = nodeCommitIo.write(fd, data, offset, half);
        seedAppend(live, "s1", { type: "variant_mounted", variant: 1 });
        return first + nodeCommitIo.write(fd, data, offset + first, length - first);
      },
      fdatasync: (fd) => nodeCommitIo.fdatasync(fd),
    };
    const store = open({ dir: live.dir, io });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    armed = true;
    const refused = await expectBerthError(store.append("s1", [{ type: "steer" }]), "aborted", "SEQ_CONFLICT");
    // The journal as it is now: the two halves are no lines a reader can take.
    expect(refused.details).toMatchObject({ sessionId: "s1", currentSeq: 1 });
    expect(refused.options.retryAfterMs).toBeUndefined();
  });

  it("keeps an append another process's line followed rather than overtook", async () => {
    const racing = racingIo({ after: () => seedAppend(live, "s1", { type: "variant_mounted", variant: 1 }) });
    const store = open({ dir: live.dir, io: racing.io });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    racing.arm();
    expect(await store.append("s1", [{ type: "agent_done" }])).toMatchObject({ firstSeq: 2, lastSeq: 2 });
    expect(journalSeqs("s1", live.dir)).toEqual([1, 2, 3]);
    expect(store.getSnapshot("s1")).toMatchObject({ lastSeq: 3, snapshot: { renderState: "mounted" } });
    expect((await store.append("s1", [{ type: "steer" }])).firstSeq).toBe(4);
  });

  /** The session's snapshot as a fresh replay of its journal gives it (no snapshot file). */
  async function replayed(id: string, root: string): Promise<SessionSnapshot> {
    const copy = fs.mkdtempSync(path.join(dir, "replay-"));
    fs.copyFileSync(journal(id, root), journal(id, copy));
    const store = createSessionStore({ dir: copy, clock, fsync: "none" });
    const snapshot = store.getSnapshot(id, { includeCompleted: true })!.snapshot;
    await store.close();
    return snapshot;
  }

  it("counts every diagnostic after a hand-off: a diagnosticsTotal another process carried past entries of its own is recounted", async () => {
    const store = open({ dir: live.dir });
    await store.append(
      "s1",
      Array.from({ length: 120 }, (_, n) => ({ type: "mystery", n })),
    );
    await store.close(); // berth's snapshot file: 100 diagnostics kept, 120 counted
    // A seed process hydrates from it, appends 10 more and writes its own snapshot file: 110
    // diagnostics, and the count of 120 it read, untouched.
    for (let n = 120; n < 130; n++) seedAppend(live, "s1", { type: "mystery", n }, { snapshotFile: true });
    expect(JSON.parse(fs.readFileSync(path.join(live.dir, "s1.snapshot.json"), "utf8"))).toMatchObject({ diagnosticsTotal: 120 });

    const restarted = open({ dir: live.dir });
    const view = restarted.getSnapshot("s1")!;
    expect(view.snapshot.diagnosticsTotal).toBe(130);
    expect(view.snapshot.diagnostics).toHaveLength(100);
    expect(view.snapshot).toEqual(await replayed("s1", live.dir));
    const next = await restarted.append("s1", [{ type: "mystery", n: 130 }]);
    expect(next.snapshot.diagnosticsTotal).toBe(131);
    expect(next.snapshot).toEqual(await replayed("s1", live.dir));
  });

  it("serves the newest 100 diagnostics of a snapshot file another process wrote with more", async () => {
    for (let n = 0; n < 147; n++) seedAppend(live, "s1", { type: "mystery", n }, { snapshotFile: n === 146 });
    expect(JSON.parse(fs.readFileSync(path.join(live.dir, "s1.snapshot.json"), "utf8")).diagnostics).toHaveLength(147);
    const store = open({ dir: live.dir });
    const view = store.getSnapshot("s1")!;
    expect(store.stats().hydrations).toBe(1);
    expect(view.snapshot.diagnostics).toHaveLength(100);
    expect(view.snapshot.diagnostics[0]).toMatchObject({ error: "unknown_event_type" });
    expect(view.snapshot.diagnosticsTotal).toBe(147);
    expect(view.snapshot).toEqual(await replayed("s1", live.dir));
  });

  it("hands watchers what another process appends as it lands, with no call touching the session", async () => {
    const store = open({ dir: live.dir });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    const watcher = store.watch("s1", 2, { includeSnapshot: true });
    const everySession = store.watchAll();
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 1 });
    // Another process appending on its own, as a seed process sharing the live directory does.
    seedAppend(live, "s1", { type: "agent_done" }, { snapshotFile: true });
    expect((await watcher.next()).value).toMatchObject({ kind: "entry", entry: { seq: 2, type: "agent_done" }, snapshot: { phase: "variants_ready" } });
    expect((await everySession.next()).value).toMatchObject({ sessionId: "s1", firstSeq: 2, lastSeq: 2 });
    // A session another process creates while it is watched: its watcher reads it from the journal.
    const fresh = store.watch("s2", 1);
    expect((await fresh.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 0 });
    seedAppend(live, "s2", { type: "generate", count: 1 }, { snapshotFile: true });
    await expect(fresh.next()).rejects.toMatchObject({ code: "resource_exhausted", details: { sessionId: "s2", lastSeq: 0 } });
    expect(store.getSnapshot("s2")!.lastSeq).toBe(1);
  });

  it("ends the watchers, resumably, when another process's change needs a full replay: none misses an entry", async () => {
    const store = open({ dir: live.dir });
    await store.append("s1", [{ type: "generate", count: 2 }]);
    const watcher = store.watch("s1", 1);
    const everySession = store.watchAll();
    const first = await watcher.next();
    expect(first.value).toMatchObject({ kind: "entry", entry: { seq: 1 } });
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 1 });
    // A line that does not parse, then a good one: only a full replay applies them the seed's way.
    fs.appendFileSync(journal("s1", live.dir), `{"seq":2,"torn\n${seedLine(3, "s1", { type: "agent_done" })}`);
    expect(store.getSnapshot("s1")!.lastSeq).toBe(3);
    expect(store.stats().replays).toBe(1);
    const lagged = { code: "resource_exhausted", details: { sessionId: "s1", lastSeq: 1 } };
    await expect(watcher.next()).rejects.toMatchObject(lagged);
    await expect(everySession.next()).rejects.toMatchObject({ code: "resource_exhausted" });
    // Resumed where it was cut off, the watcher reads what the change brought from the journal.
    const resumed = store.watch("s1", 2);
    const seen: unknown[] = [];
    for await (const item of resumed) {
      seen.push(item.kind === "entry" ? item.entry.seq : item.kind);
      if (item.kind === "caught_up") break;
    }
    expect(seen).toEqual([3, "caught_up"]);
  });
});

describe("snapshot files", () => {
  const snapshotFile = (id: string) => path.join(dir, "sessions", `${id}.snapshot.json`);
  const flushed = async (store: SessionStore) => {
    await store.settled();
  };

  it("are written lazily: after N entries or when idle, never on every append", async () => {
    const store = open({ snapshotEveryEntries: 5, snapshotIdleMs: 1000 });
    for (let i = 0; i < 4; i++) await store.append("s1", [{ type: "checkpoint", revision: i }]);
    await flushed(store);
    expect(fs.existsSync(snapshotFile("s1"))).toBe(false);
    await store.append("s1", [{ type: "checkpoint", revision: 4 }]);
    await flushed(store);
    expect(JSON.parse(fs.readFileSync(snapshotFile("s1"), "utf8"))).toMatchObject({ __nextSeq: 6, browserCheckpointRevision: 4 });
    await store.append("s1", [{ type: "checkpoint", revision: 5 }]);
    clock.advance(500);
    await store.append("s1", [{ type: "checkpoint", revision: 6 }]);
    clock.advance(600); // 1100 ms after the first, 600 after the last: not idle long enough
    await flushed(store);
    expect(JSON.parse(fs.readFileSync(snapshotFile("s1"), "utf8")).__nextSeq).toBe(6);
    clock.advance(400);
    await flushed(store);
    const file = JSON.parse(fs.readFileSync(snapshotFile("s1"), "utf8"));
    expect(file.__nextSeq).toBe(8);
    expect(file.__journalBytes).toBe(fs.statSync(journal("s1")).size);
    expect(store.stats().snapshotWrites).toBe(2);
    // Atomic: written by rename, no temp file left behind.
    expect(fs.readdirSync(path.join(dir, "sessions")).sort()).toEqual(["s1.jsonl", "s1.snapshot.json", "s1.snapshot.meta.json"]);
    expect(clock.pendingTimers()).toBe(0);
  });

  it("the idle write waits for quiet on the monotonic clock; entries are stamped with the wall clock", async () => {
    const store = open({ snapshotEveryEntries: 1000, snapshotIdleMs: 1000 });
    await store.append("s1", [{ type: "checkpoint", revision: 1 }]);
    clock.stepWall(3_600_000);
    const stamped = new Date(clock.now()).toISOString();
    await store.append("s1", [{ type: "checkpoint", revision: 2 }]);
    // Stepped back right after the last append: still 1 s of quiet, not 1 h and 1 s.
    clock.stepWall(-7_200_000);
    clock.advance(999);
    await flushed(store);
    expect(fs.existsSync(snapshotFile("s1"))).toBe(false);
    clock.advance(1);
    await flushed(store);
    expect(JSON.parse(fs.readFileSync(snapshotFile("s1"), "utf8")).__nextSeq).toBe(3);
    const entries: unknown[] = [];
    for await (const { entry } of store.read("s1", 2)!.entries) entries.push(entry.ts);
    expect(entries).toEqual([stamped]);
  });

  it("a stale snapshot file without berth's sidecar (as the seed writes them) is ignored and the journal replayed", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    await store.flush("s1");
    fs.appendFileSync(journal("s1"), seedLine(2, "s1", { type: "agent_done" }));
    await store.close();
    fs.appendFileSync(journal("s1"), seedLine(3, "s1", { type: "steer" }));
    fs.rmSync(path.join(dir, "sessions", "s1.snapshot.meta.json"));
    const reopened = open();
    expect(reopened.getSnapshot("s1")).toMatchObject({ lastSeq: 3, snapshot: { phase: "steer_requested" } });
    expect(reopened.stats()).toMatchObject({ hydrations: 0, replays: 1 });
  });

  describe("of a journal that grew since", () => {
    /**
     * A journal whose snapshot file (and sidecar) describe its first 40 entries, with 20 more
     * after them: keyed batches on both sides of the fence, single events, a foreign seed line.
     */
    async function grownJournal(): Promise<{ expected: SessionSnapshot; prefixBytes: number }> {
      for (const sub of ["sessions", "replay-only"]) fs.rmSync(path.join(dir, sub), { recursive: true, force: true });
      const store = open();
      for (let i = 0; i < 4; i++) {
        await store.append(
          "s1",
          Array.from({ length: 10 }, (_, j) => ({ type: "checkpoint", revision: i * 10 + j })),
          { idempotencyKey: `before-${i}` },
        );
      }
      await store.flush("s1");
      const prefixBytes = fs.statSync(journal("s1")).size;
      const saved = ["s1.snapshot.json", "s1.snapshot.meta.json"].map((name) => [name, fs.readFileSync(path.join(dir, "sessions", name))] as const);
      await store.append(
        "s1",
        Array.from({ length: 10 }, (_, j) => ({ type: "agent_phase", phase: `p${j}` })),
        { idempotencyKey: "after" },
      );
      for (let i = 0; i < 9; i++) await store.append("s1", [{ type: "checkpoint", revision: 100 + i }]);
      await store.close();
      fs.appendFileSync(journal("s1"), seedLine(60, "s1", { type: "steer" }));
      for (const [name, bytes] of saved) fs.writeFileSync(path.join(dir, "sessions", name), bytes);
      const replaying = createSessionStore({ dir: path.join(dir, "replay-only"), clock, fsync: "none" });
      fs.mkdirSync(path.join(dir, "replay-only"), { recursive: true });
      fs.copyFileSync(journal("s1"), path.join(dir, "replay-only", "s1.jsonl"));
      const expected = replaying.getSnapshot("s1", { includeCompleted: true })!.snapshot;
      await replaying.close();
      return { expected, prefixBytes };
    }

    it("hydrates from the snapshot file and replays only the tail, to the state a full replay gives", async () => {
      const { expected } = await grownJournal();
      const reopened = open();
      const view = reopened.getSnapshot("s1", { includeCompleted: true })!;
      expect(reopened.stats()).toMatchObject({ hydrations: 1, tailReplays: 1, replays: 0 });
      expect(view.lastSeq).toBe(60);
      expect(view.snapshot).toEqual(expected);
      // Keys on both sides of the fence are known, with the seqs of their whole batch.
      const before2 = Array.from({ length: 10 }, (_, j) => ({ type: "checkpoint", revision: 20 + j }));
      expect(await reopened.append("s1", before2, { idempotencyKey: "before-2" })).toMatchObject({ duplicate: true, firstSeq: 21, lastSeq: 30 });
      const after = Array.from({ length: 10 }, (_, j) => ({ type: "agent_phase", phase: `p${j}` }));
      expect(await reopened.append("s1", after, { idempotencyKey: "after" })).toMatchObject({ duplicate: true, firstSeq: 41, lastSeq: 50 });
      const read = await readAll(reopened, "s1", 35, 20);
      expect(read.map((e) => e.entry.seq)).toEqual(Array.from({ length: 20 }, (_, i) => 35 + i));
      expect(read.map((e) => e.idempotencyKey)).toEqual([
        ...Array<string>(6).fill("before-3"),
        ...Array<string>(10).fill("after"),
        ...Array<undefined>(4).fill(undefined),
      ]);
      const next = await reopened.append("s1", [{ type: "agent_done" }]);
      expect(next.firstSeq).toBe(61);
    });

    it("replays in full when the journal's bytes at the fence changed, or the snapshot file is not the sidecar's", async () => {
      const { expected, prefixBytes } = await grownJournal();
      const text = fs.readFileSync(journal("s1"));
      // The same length, one byte changed in the line before the fence: not the prefix it was.
      const altered = Buffer.from(text);
      altered[prefixBytes - 3] = altered[prefixBytes - 3] === 0x30 ? 0x31 : 0x30;
      fs.writeFileSync(journal("s1"), altered);
      const first = open();
      first.getSnapshot("s1");
      expect(first.stats()).toMatchObject({ tailReplays: 0, replays: 1 });
      await first.close();

      await grownJournal();
      const snapshotText = fs.readFileSync(snapshotFile("s1"), "utf8");
      fs.writeFileSync(snapshotFile("s1"), snapshotText.replace('"phase":', '"phase" :'));
      const second = open();
      expect(second.getSnapshot("s1", { includeCompleted: true })!.snapshot).toEqual(expected);
      expect(second.stats()).toMatchObject({ tailReplays: 0, replays: 1 });
    });

    it("leaves a tail with a damaged line, a torn append or a torn last line to a full replay", async () => {
      for (const spoil of [
        (text: string) => text.replace('"phase":"p3"', '"phase":"p4"'),
        (text: string, prefixBytes: number) => text.slice(0, text.indexOf("\n", prefixBytes + 10) + 1),
        (text: string) => `${text}{"seq":61,"id":"s1","ty`,
      ]) {
        const { prefixBytes } = await grownJournal();
        fs.writeFileSync(journal("s1"), spoil(fs.readFileSync(journal("s1"), "utf8"), prefixBytes));
        const reopened = open();
        const view = reopened.getSnapshot("s1", { includeCompleted: true })!;
        expect(reopened.stats()).toMatchObject({ tailReplays: 0, replays: 1 });
        expect(view.snapshot.diagnostics.map((d) => d.error).filter((e) => e.startsWith("journal_"))).toHaveLength(1);
        await reopened.close();
      }
    });
  });
});

describe("the session cache", () => {
  it("is bounded: evicting closes the journal and a later access re-opens from the snapshot file", async () => {
    const store = open({ cacheSize: 2 });
    await store.append("a", [{ type: "generate" }]);
    await store.append("b", [{ type: "generate" }]);
    await store.append("c", [{ type: "steer" }]);
    expect(store.stats().openSessions).toBe(2);
    await store.settled();
    expect(fs.existsSync(path.join(dir, "sessions", "a.snapshot.json"))).toBe(true);
    expect(store.getSnapshot("a")).toMatchObject({ lastSeq: 1, snapshot: { phase: "generate_requested" } });
    expect(store.stats()).toMatchObject({ openSessions: 2, hydrations: 1, replays: 0 });
    expect((await store.append("a", [{ type: "agent_done" }])).firstSeq).toBe(2);
  });
});

describe("a session's snapshot does not change with unrelated traffic", () => {
  it("a NaN visibleVariant (the seed's Number of a non-numeric variantId) stays NaN when the session is evicted and re-opened, and after a restart", async () => {
    const store = open({ cacheSize: 1 });
    await store.append("s1", [{ type: "accept", variantId: "x" }]);
    expect(store.getSnapshot("s1")!.snapshot.visibleVariant).toBeNaN();
    await store.append("other", [{ type: "generate" }]); // evicts s1, which writes its snapshot file
    await store.settled();
    expect(store.getSnapshot("s1")!.snapshot.visibleVariant).toBeNaN();
    expect(store.stats().hydrations).toBe(1);
    // An accept without a variant keeps the number it finds: NaN stays NaN, where null became 0.
    expect((await store.append("s1", [{ type: "accept" }])).snapshot.visibleVariant).toBeNaN();
    await store.close();
    const restarted = open();
    expect(restarted.getSnapshot("s1")!.snapshot.visibleVariant).toBeNaN();
    expect(restarted.stats().hydrations).toBe(1);
    // The seed's own reader takes the file's null, as the seed does after a restart of its own.
    expect(JSON.parse(fs.readFileSync(path.join(dir, "sessions", "s1.snapshot.json"), "utf8")).visibleVariant).toBeNull();
  });
});

describe("reads and lists", () => {
  it("reads entries from a seq with a limit, without berth's bookkeeping fields", async () => {
    const store = open();
    for (let i = 0; i < 30; i++)
      await store.append(
        "s1",
        [
          { type: "checkpoint", revision: i },
          { type: "agent_phase", phase: `p${i}` },
        ],
        { idempotencyKey: `k${i}` },
      );
    const all = await readAll(store, "s1");
    expect(all.map((e) => e.entry.seq)).toEqual(Array.from({ length: 60 }, (_, i) => i + 1));
    expect(Object.keys(all[0]!.entry)).toEqual(["seq", "id", "type", "ts", "event"]);
    expect((await readAll(store, "s1", 41, 5)).map((e) => e.entry.seq)).toEqual([41, 42, 43, 44, 45]);
    expect(await readAll(store, "s1", 61)).toEqual([]);
    expect(store.read("nope")).toBeNull();
    expect(() => store.read("s1", -1)).toThrow(/from_seq/);
  });

  it("reads each entry with the key it was appended with, also from inside an append and after a hydration", async () => {
    const store = open();
    const batch = Array.from({ length: 700 }, (_, i) => ({ type: "checkpoint", revision: i }));
    await store.append("s1", batch, { idempotencyKey: "first" });
    await store.append("s1", batch, { idempotencyKey: "second" });
    await store.append("s1", [{ type: "steer" }]);
    const keysFrom = async (s: SessionStore, fromSeq: number, limit: number) =>
      (await readAll(s, "s1", fromSeq, limit)).map((e) => `${e.entry.seq}:${e.idempotencyKey ?? "-"}:${e.integrity}`);
    const expected = ["1000:second:verified", "1001:second:verified", "1400:second:verified", "1401:-:verified"];
    const pick = (all: string[]) => all.filter((_, i) => [0, 1, 400, 401].includes(i));
    expect(pick(await keysFrom(store, 1000, 0))).toEqual(expected);
    expect(await keysFrom(store, 699, 3)).toEqual(["699:first:verified", "700:first:verified", "701:second:verified"]);
    await store.close();
    const hydrated = open();
    expect(pick(await keysFrom(hydrated, 1000, 0))).toEqual(expected);
    expect(hydrated.stats().hydrations).toBe(1);
  });

  it("reads a long journal through the seek index, also after a hydration", async () => {
    const store = open();
    const batch = Array.from({ length: 1000 }, (_, i) => ({ type: "checkpoint", revision: i }));
    for (let i = 0; i < 3; i++) await store.append("s1", batch);
    expect((await readAll(store, "s1", 2500, 3)).map((e) => e.entry.seq)).toEqual([2500, 2501, 2502]);
    await store.close();
    const hydrated = open();
    expect((await readAll(hydrated, "s1", 1999, 2)).map((e) => e.entry.seq)).toEqual([1999, 2000]);
    expect(hydrated.stats().hydrations).toBe(1);
  });

  it("lists active sessions sorted by id, completed ones only when asked; has never creates", async () => {
    const store = open();
    await store.append("b", [{ type: "generate" }]);
    await store.append("a", [{ type: "generate" }]);
    await store.append("c", [{ type: "complete" }]);
    await store.append("d", [{ type: "discarded" }]);
    expect(store.list().map((v) => v.sessionId)).toEqual(["a", "b"]);
    expect(store.list({ includeCompleted: true }).map((v) => v.sessionId)).toEqual(["a", "b", "c", "d"]);
    expect(store.getSnapshot("c")).toBeNull();
    expect(store.getSnapshot("c", { includeCompleted: true })!.snapshot.phase).toBe("completed");
    expect(store.has("zz")).toBe(false);
    expect(store.getSnapshot("zz")).toMatchObject({ exists: false, lastSeq: 0, snapshot: { phase: "new" } });
    expect(fs.existsSync(journal("zz"))).toBe(false);
  });
});

describe("watchers", () => {
  it("catch up and go live with no gap or repeat across a concurrent append", async () => {
    const store = open();
    for (let i = 1; i <= 5; i++) await store.append("s1", [{ type: "checkpoint", revision: i }]);
    const watcher = store.watch("s1", 3, { includeSnapshot: true });
    // Appends racing the backlog read: some land before the watcher has read the file.
    const racing = [store.append("s1", [{ type: "checkpoint", revision: 6 }]), store.append("s1", [{ type: "checkpoint", revision: 7 }, { type: "steer" }])];
    const items: Array<{ kind: string; seq?: number; lastSeq?: number; phase?: string }> = [];
    for await (const item of watcher) {
      items.push(
        item.kind === "entry"
          ? { kind: "entry", seq: item.entry.seq, ...(item.snapshot ? { phase: item.snapshot.phase } : {}) }
          : { kind: item.kind, lastSeq: item.lastSeq },
      );
      if (item.kind === "entry" && item.entry.seq === 8) break;
    }
    await Promise.all(racing);
    expect(items).toEqual([
      { kind: "entry", seq: 3 },
      { kind: "entry", seq: 4 },
      { kind: "entry", seq: 5 },
      { kind: "caught_up", lastSeq: 5 },
      { kind: "entry", seq: 6, phase: "new" },
      { kind: "entry", seq: 7, phase: "new" },
      { kind: "entry", seq: 8, phase: "steer_requested" },
    ]);
    expect(store.stats().watchers).toBe(0);
  });

  it("hand live entries over with the key they were appended with", async () => {
    const store = open();
    const watcher = store.watch("s1", 1);
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 0 });
    await store.append("s1", [{ type: "generate" }, { type: "steer" }], { idempotencyKey: "k" });
    await store.append("s1", [{ type: "agent_done" }]);
    const got = [];
    for (let i = 0; i < 3; i++) got.push((await watcher.next()).value);
    expect(got).toMatchObject([
      { kind: "entry", entry: { seq: 1 }, idempotencyKey: "k", integrity: "verified" },
      { kind: "entry", entry: { seq: 2 }, idempotencyKey: "k", integrity: "verified" },
      { kind: "entry", entry: { seq: 3 }, idempotencyKey: undefined, integrity: "verified" },
    ]);
    await watcher.return!();
  });

  it("a slow watcher is ended with resource_exhausted and resumes from its last seq without loss", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    const watcher = store.watch("s1", 1, { maxBuffered: 5 });
    const seen: number[] = [];
    const first = await watcher.next();
    expect(first.value).toMatchObject({ kind: "entry", entry: { seq: 1 } });
    seen.push(1);
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 1 });
    await store.append("s1", [{ type: "checkpoint", revision: 1 }]);
    const second = await watcher.next();
    seen.push((second.value as { entry: JournalEntry }).entry.seq);
    for (let i = 0; i < 10; i++) await store.append("s1", [{ type: "checkpoint", revision: i + 2 }]);
    const error = await expectBerthError(() => watcher.next(), "resource_exhausted");
    expect(error.message).toContain("fell behind at seq 2; resume with from_seq=3");
    expect(error.details).toMatchObject({ lastSeq: 2 });
    expect(await watcher.next()).toEqual({ value: undefined, done: true });
    expect(store.stats().watchers).toBe(0);
    for await (const item of store.watch("s1", (error.details!.lastSeq as number) + 1)) {
      if (item.kind === "caught_up") break;
      seen.push(item.entry.seq);
    }
    expect(seen).toEqual(Array.from({ length: 12 }, (_, i) => i + 1));
  });

  it("watchAll sees one change per append of every session; cancelling unsubscribes at once", async () => {
    const store = open();
    const all = store.watchAll({ includeSnapshot: true });
    const pending = all.next();
    await store.append("a", [{ type: "generate" }]);
    await store.append("b", [{ type: "steer" }, { type: "agent_phase", phase: "plan" }, { type: "agent_done" }]);
    const firstChange = (await pending).value;
    expect(firstChange).toMatchObject({ sessionId: "a", firstSeq: 1, lastSeq: 1, entry: { seq: 1 }, snapshot: { phase: "generate_requested" } });
    const batch = (await all.next()).value!;
    expect(batch).toMatchObject({ sessionId: "b", firstSeq: 1, lastSeq: 3, entry: { seq: 3, type: "agent_done" } });
    expect(batch.snapshot).toBe(store.getSnapshot("b", { includeCompleted: true })!.snapshot);
    const waiting = all.next();
    expect(store.stats().watchers).toBe(1);
    await all.return!();
    expect(await waiting).toEqual({ value: undefined, done: true });
    expect(store.stats().watchers).toBe(0);
  });

  it("close ends watchers with unavailable", async () => {
    const store = open();
    await store.append("s1", [{ type: "generate" }]);
    const watcher = store.watch("s1", 2);
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up" });
    const waiting = watcher.next();
    await store.close();
    await expectBerthError(waiting, "unavailable");
    expect(() => store.getSnapshot("s1")).toThrow(/closed/);
  });
});

describe("a failed first append", () => {
  it("leaves no journal behind", async () => {
    const counter = countingIo();
    const store = open({ io: counter.io });
    counter.fail("EIO");
    await expectBerthError(store.append("s1", [{ type: "generate" }]), "unavailable");
    expect(store.has("s1")).toBe(false);
    counter.fail(undefined);
    expect((await store.append("s1", [{ type: "generate" }])).firstSeq).toBe(1);
    expect(store.has("s1")).toBe(true);
  });
});

describe("input checks", () => {
  it("refuse bad session ids on every call before touching the filesystem", async () => {
    const store = open();
    for (const bad of ["", "..", "a/b", "a b", "x".repeat(129), "a\0b"]) {
      expect(() => store.has(bad)).toThrow(/session_id/);
      expect(() => store.getSnapshot(bad)).toThrow(/session_id/);
      expect(() => store.read(bad)).toThrow(/session_id/);
      expect(() => store.watch(bad)).toThrow(/session_id/);
      await expectBerthError(store.flush(bad), "invalid_argument");
      await expectBerthError(store.append(bad, [{ type: "x" }]), "invalid_argument");
    }
    expect(fs.readdirSync(path.join(dir, "sessions"))).toEqual([]);
    expect(store.stats().watchers).toBe(0);
  });

  it("a watcher of a session that does not exist yet sees its first entries", async () => {
    const store = open();
    const watcher = store.watch("later", 1, { includeSnapshot: true });
    expect((await watcher.next()).value).toMatchObject({ kind: "caught_up", lastSeq: 0, snapshot: { phase: "new" } });
    expect(store.has("later")).toBe(false);
    await store.append("later", [{ type: "generate" }, { type: "agent_done" }]);
    expect((await watcher.next()).value).toMatchObject({ entry: { seq: 1 }, snapshot: { phase: "generate_requested" } });
    expect((await watcher.next()).value).toMatchObject({ entry: { seq: 2 }, snapshot: { phase: "variants_ready" } });
    await watcher.return!();
  });
});
