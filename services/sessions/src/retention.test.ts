import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { baseSnapshot } from "./reducer.js";
import { CompletedRetention, type RetentionHost } from "./retention.js";
import { type SessionStoreOptions, createSessionStore } from "./create-session-store.js";
import type { SessionStore } from "./session-store.js";
import type { SessionChange } from "./session-store-api.js";
import { appendRetentionHistory, HOUR } from "./testing/retention-history.js";

const T0 = Date.UTC(2026, 0, 1);

let dir: string;
let clock: ManualClock;
const stores: SessionStore[] = [];

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-retention-"));
  clock = new ManualClock(T0);
});

afterEach(async () => {
  for (const store of stores.splice(0)) await store.close().catch(() => undefined);
  fs.rmSync(dir, { recursive: true, force: true });
});

function open(options: Partial<SessionStoreOptions> = {}): SessionStore {
  const store = createSessionStore({ dir: path.join(dir, "sessions"), clock, fsync: "none", ...options });
  stores.push(store);
  return store;
}

/** The next change of `all` that is a deletion. */
async function nextDeletion(all: AsyncIterator<SessionChange>): Promise<string> {
  for (;;) {
    const step = await all.next();
    if (step.done) throw new Error("the watcher ended");
    if (step.value.deleted) return step.value.sessionId;
  }
}

const ids = (store: SessionStore) => store.list({ includeCompleted: true }).map((view) => view.sessionId);

describe("retention of completed sessions", () => {
  it("deletes at start what is past it, and the rest when it falls due; active and revived sessions stay", async () => {
    const writer = open();
    await appendRetentionHistory(writer, clock);
    await writer.close();

    clock.advance(2 * HOUR); // T0 + 4h: "old" completed 4h ago, "young" 2h ago
    const store = open({ completedRetentionMs: 3 * HOUR });
    const all = store.watchAll();
    expect(await nextDeletion(all)).toBe("old");
    expect(ids(store)).toEqual(["active", "revived", "young"]);
    // The timer, not a call, deletes "young" once it is due (T0 + 5h).
    await store.settled();
    clock.advance(HOUR - 1);
    expect(ids(store)).toEqual(["active", "revived", "young"]);
    clock.advance(1);
    expect(await nextDeletion(all)).toBe("young");
    expect(ids(store)).toEqual(["active", "revived"]);
    await all.return!();
  });

  it("counts from the completing entry, not from later entries that leave the session completed", async () => {
    const writer = open();
    await writer.append("s1", [{ type: "generate" }, { type: "complete" }]);
    clock.advance(2 * HOUR);
    // Late news the reducer ignores: the session stays completed, its last entry is 2h newer.
    await writer.append("s1", [{ type: "variant_plan", plan: {} }]);
    expect(writer.getSnapshot("s1", { includeCompleted: true })!.snapshot.phase).toBe("completed");
    await writer.close();

    clock.advance(HOUR + 1); // 3h after the completing entry, 1h after the last one
    const store = open({ completedRetentionMs: 3 * HOUR });
    await store.sweepCompleted();
    expect(ids(store)).toEqual([]);
  });

  it("learns completions from its own appends and deletes them on time, without reading the disk again", async () => {
    const store = open({ completedRetentionMs: 10_000 });
    await store.sweepCompleted();
    const all = store.watchAll();
    await store.append("s1", [{ type: "generate" }]);
    await store.append("s1", [{ type: "complete" }]);
    clock.advance(5_000);
    await store.append("s1", [{ type: "variant_plan", plan: {} }]);
    await store.append("s2", [{ type: "discarded" }]);
    await store.append("s3", [{ type: "complete" }]);
    await store.append("s3", [{ type: "generate" }]); // revived: kept
    clock.advance(5_000);
    expect(await nextDeletion(all)).toBe("s1");
    await store.settled(); // the sweep has scheduled the next one
    expect(ids(store)).toEqual(["s2", "s3"]);
    clock.advance(5_000);
    expect(await nextDeletion(all)).toBe("s2");
    expect(ids(store)).toEqual(["s3"]);
    await all.return!();
  });

  it("goes by the wall clock its entries were stamped with: a step back keeps a session until the clock reads its due time again", async () => {
    const store = open({ completedRetentionMs: HOUR });
    await store.sweepCompleted();
    const all = store.watchAll();
    await store.append("s1", [{ type: "complete" }]); // stamped T0, due T0 + 1h
    clock.stepWall(-2 * HOUR);
    clock.advance(HOUR); // an hour has passed, but the clock reads T0 - 1h: not yet an hour after the entry
    await store.settled();
    expect(ids(store)).toEqual(["s1"]);
    clock.advance(2 * HOUR - 1);
    await store.settled();
    expect(ids(store)).toEqual(["s1"]);
    clock.advance(1); // the clock reads T0 + 1h
    expect(await nextDeletion(all)).toBe("s1");
    await all.return!();
  });

  it("deletes with the last seq it looked at, and leaves a session that moved on since", async () => {
    const completed = { ...baseSnapshot("s1"), phase: "completed", updatedAt: new Date(T0).toISOString() };
    const deletions: Array<[string, number]> = [];
    const warnings: unknown[] = [];
    const host: RetentionHost = {
      sessionIds: () => ["s1"],
      view: () => ({ lastSeq: 7, snapshot: completed }),
      entries: () => (async function* () {})(),
      delete: (id, lastSeq) => {
        deletions.push([id, lastSeq]);
        // Revived meanwhile: the store refuses the deletion, as DeleteSession with expected_seq.
        return Promise.reject(new BerthError("aborted", "moved on", { currentSeq: 8 }, { reason: "SEQ_CONFLICT" }));
      },
    };
    const logger = { debug() {}, info() {}, warn: (obj: object) => void warnings.push(obj), error() {} };
    clock.advance(HOUR);
    const retention = new CompletedRetention(host, { retentionMs: HOUR, clock, logger });
    await retention.schedule.sweep();
    expect(deletions).toEqual([["s1", 7]]);
    expect(warnings).toEqual([]);
    await retention.stop();
  });

  it("is off by default", async () => {
    const store = open();
    await store.append("s1", [{ type: "complete" }]);
    clock.advance(1000 * 24 * HOUR);
    await store.sweepCompleted();
    expect(ids(store)).toEqual(["s1"]);
    expect(store.limits().completedRetentionMs).toBeUndefined();
  });
});
