import { describe, expect, it } from "vitest";
import { ManualClock } from "./clock.js";
import { BerthError } from "./errors.js";
import { IDEMPOTENCY_SETTINGS, IdempotencyMemory, type KeyedRequest } from "./idempotency.js";

const acquire = (ttl: number): KeyedRequest => ({ rpc: "Acquire", fingerprint: JSON.stringify(["/a", "alice", ttl]), named: { file: "/a" } });

function refusal(run: () => unknown): BerthError {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(BerthError);
    return error as BerthError;
  }
  throw new Error("expected a refusal");
}

describe("IdempotencyMemory", () => {
  it("answers the first answer for the same request, refuses another request with ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED naming the key and what it named", () => {
    const memory = new IdempotencyMemory<string>({ clock: new ManualClock() });
    expect(memory.recall("k", acquire(1000))).toBeUndefined();
    memory.begin("k", acquire(1000));
    expect(memory.recall("k", acquire(1000))).toMatchObject({ phase: "pending" });
    memory.answered("k", { ...acquire(1000), named: { file: "/a", fencingToken: 7 } }, "lease-1");
    expect(memory.recall("k", acquire(1000))).toMatchObject({ phase: "live", answer: "lease-1" });
    for (const other of [acquire(2000), { ...acquire(1000), rpc: "Release" }]) {
      const error = refusal(() => memory.recall("k", other));
      expect([error.code, error.reason]).toEqual(["already_exists", "IDEMPOTENCY_KEY_REUSED"]);
      expect(error.details).toEqual({ requestId: "k", rpc: "Acquire", file: "/a", fencingToken: 7 });
      expect(error.message).toContain('request_id "k" was used for a different request (Acquire of file "/a", fencingToken 7)');
    }
  });

  it("forgets a refused call, never an answered one", () => {
    const memory = new IdempotencyMemory<string>({ clock: new ManualClock() });
    memory.begin("k", acquire(1000));
    memory.forget("k");
    expect(memory.recall("k", acquire(2000))).toBeUndefined();
    memory.answered("k", acquire(1000), "lease");
    memory.forget("k");
    expect(memory.recall("k", acquire(1000))).toMatchObject({ phase: "live" });
  });

  it("keeps a key while what it made lives and for the window after it ended, measured on the monotonic clock", () => {
    const clock = new ManualClock();
    const memory = new IdempotencyMemory<string>({ clock, windowMs: 60_000 });
    memory.answered("k", acquire(1000), "lease");
    clock.advance(10 * 60_000);
    expect(memory.recall("k", acquire(1000))).toMatchObject({ phase: "live" });
    memory.end("k");
    clock.advance(59_999);
    clock.stepWall(-86_400_000);
    expect(memory.recall("k", acquire(1000))).toMatchObject({ phase: "ended", answer: "lease" });
    expect(memory.stats()).toEqual({ live: 0, ended: 1 });
    clock.advance(1);
    expect(memory.recall("k", acquire(2000))).toBeUndefined();
    expect(memory.stats()).toEqual({ live: 0, ended: 0 });
    // A release: ended at once, remembered for the window.
    memory.answered("r", { rpc: "Release", fingerprint: "t", named: {} }, "released", { ended: true });
    expect(memory.recall("r", { rpc: "Release", fingerprint: "t", named: {} })).toMatchObject({ phase: "ended" });
  });

  it("caps the ended keys, forgetting the oldest first; live keys are never forgotten", () => {
    const memory = new IdempotencyMemory<number>({ clock: new ManualClock(), maxEnded: 3 });
    memory.answered("live", acquire(1), 0);
    for (let i = 0; i < 5; i++) memory.answered(`k${i}`, acquire(1), i, { ended: true });
    expect(memory.stats()).toEqual({ live: 1, ended: 3 });
    expect(memory.recall("k1", acquire(2))).toBeUndefined();
    expect(memory.recall("k2", acquire(1))).toMatchObject({ answer: 2 });
    expect(memory.recall("live", acquire(1))).toMatchObject({ phase: "live" });
  });

  it("a window of zero forgets a key as what it made ends", () => {
    const memory = new IdempotencyMemory<string>({ clock: new ManualClock(), windowMs: 0 });
    memory.answered("k", acquire(1000), "lease");
    memory.end("k");
    expect(memory.recall("k", acquire(2000))).toBeUndefined();
  });

  it("the setting reads durations up to a week", () => {
    const { parse } = IDEMPOTENCY_SETTINGS.idempotencyWindow;
    expect([parse("1h", "--idempotency-window"), parse("0", "x"), parse("7d", "x")]).toEqual([3_600_000, 0, 7 * 86_400_000]);
    expect(() => parse("8d", "--idempotency-window")).toThrow(/^--idempotency-window: must be at most 7d/);
    expect(() => parse("5", "--idempotency-window")).toThrow(/has no unit/);
  });
});
