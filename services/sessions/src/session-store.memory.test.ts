/**
 * The store's rules on the in-memory journal double: no file is touched, so these check the core
 * (sequencing, idempotency, expectations, refusals, watches, deletion) apart from the file backend,
 * which the session-store-*.test.ts files check with them.
 */
import { describe, expect, it } from "vitest";
import { ManualClock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { createMemoryJournalStore } from "./journal/testing/memory-journal-store.js";
import { sessionReducer } from "./reducer.js";
import { SessionStore } from "./session-store.js";

function store() {
  const clock = new ManualClock(Date.parse("2026-01-01T00:00:00.000Z"));
  const journals = createMemoryJournalStore({ reducer: sessionReducer, now: () => clock.now() });
  return { journals, clock, store: new SessionStore({ journals, clock }) };
}

async function refusal(promise: Promise<unknown>): Promise<BerthError> {
  try {
    await promise;
  } catch (error) {
    expect(error).toBeInstanceOf(BerthError);
    return error as BerthError;
  }
  throw new Error("expected a refusal");
}

describe("the session store on the in-memory journal", () => {
  it("sequences appends in call order on the head, before any is durable", async () => {
    const { store: s } = store();
    const first = s.append("a", [{ type: "generate", count: 1 }]);
    const second = s.append(
      "a",
      [
        { type: "generate", count: 2 },
        { type: "generate", count: 3 },
      ],
      { expectedSeq: 1 },
    );
    // Nothing is durable yet: readers see no session.
    expect(s.getSnapshot("a")).toMatchObject({ lastSeq: 0, exists: false });
    expect(await first).toMatchObject({ firstSeq: 1, lastSeq: 1, duplicate: false });
    expect(await second).toMatchObject({ firstSeq: 2, lastSeq: 3 });
    expect(s.getSnapshot("a")).toMatchObject({ lastSeq: 3, exists: true });
    const seqs: number[] = [];
    for await (const stored of s.read("a", 2)!.entries) seqs.push(stored.entry.seq);
    expect(seqs).toEqual([2, 3]);
  });

  it("refuses an expectation that does not hold, naming the current seq", async () => {
    const { store: s } = store();
    await s.append("a", [{ type: "generate" }]);
    const error = await refusal(s.append("a", [{ type: "generate" }], { expectedSeq: 0 }));
    expect([error.code, error.reason, error.details]).toEqual(["aborted", "SEQ_CONFLICT", { sessionId: "a", expectedSeq: 0, currentSeq: 1 }]);
    expect((await refusal(s.append("b", [{ type: "generate" }], { expectedState: "exists" }))).reason).toBe("SEQ_CONFLICT");
  });

  it("answers a retry with the same idempotency key with the first append, and refuses the key for other events", async () => {
    const { store: s } = store();
    const [first, retry] = await Promise.all([
      s.append("a", [{ type: "generate", count: 1 }], { idempotencyKey: "k" }),
      s.append("a", [{ type: "generate", count: 1 }], { idempotencyKey: "k" }),
    ]);
    expect(first).toMatchObject({ firstSeq: 1, lastSeq: 1, duplicate: false });
    expect(retry).toMatchObject({ firstSeq: 1, lastSeq: 1, duplicate: true });
    expect(await s.append("a", [{ type: "generate", count: 1 }], { idempotencyKey: "k" })).toMatchObject({ firstSeq: 1, duplicate: true });
    const reused = await refusal(s.append("a", [{ type: "generate", count: 2 }], { idempotencyKey: "k" }));
    expect([reused.code, reused.reason]).toEqual(["already_exists", "IDEMPOTENCY_KEY_REUSED"]);
    expect(s.getSnapshot("a")?.lastSeq).toBe(1);
  });

  it("rolls the head back when the journal refuses a batch: the next append takes the same seq", async () => {
    const { store: s, journals } = store();
    await s.append("a", [{ type: "generate" }]);
    journals.failNext(2);
    const refused = [s.append("a", [{ type: "generate" }]), s.append("a", [{ type: "generate" }], { expectedSeq: 2 })];
    for (const r of refused) expect((await refusal(r)).reason).toBe("STATE_READ_ONLY");
    expect(await s.append("a", [{ type: "generate" }], { expectedSeq: 1 })).toMatchObject({ firstSeq: 2, lastSeq: 2 });
  });

  it("hands watchers the durable entries, its own and another writer's, then ends them when the session is deleted", async () => {
    const { store: s, journals } = store();
    await s.append("a", [{ type: "generate" }]);
    const watcher = s.watch("a", 1);
    const seen: string[] = [];
    const done = (async () => {
      try {
        for await (const event of watcher) {
          seen.push(event.kind === "entry" ? `entry ${event.entry.seq}` : event.kind);
          if (seen.length === 4) break;
        }
      } catch (error) {
        seen.push((error as BerthError).reason ?? "error");
      }
    })();
    await s.append("a", [{ type: "generate" }]);
    journals.appendAsOther("a", [{ type: "generate" }]);
    await done;
    expect(seen).toEqual(["entry 1", "caught_up", "entry 2", "entry 3"]);
    expect(s.getSnapshot("a")?.lastSeq).toBe(3);
    expect(await s.delete("a", { expectedSeq: 3 })).toEqual({ lastSeq: 3, duplicate: false });
    expect(s.has("a")).toBe(false);
    // A new session under the same id continues after the deleted one's last seq.
    expect(await s.append("a", [{ type: "generate" }], { expectedSeq: 0 })).toMatchObject({ firstSeq: 4 });
  });
});
