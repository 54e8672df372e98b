import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { refusingGates } from "./verdict.js";
import { G, admit, need, settle, setup } from "./admission-queue-fixtures.js";

describe("AdmissionQueue (backfill)", () => {
  it("lets a request pass a blocked first waiter only with room the first waiter cannot use", async () => {
    const t = setup({ queueMode: "backfill" });
    admit(t, 2, 3, "x"); // holds 3 of 4 cpus
    const firstWaiter = admit(t, 1, 2, "first-waiter"); // waits for cpu
    const takesCpu = admit(t, 1, 1, "takes-cpu"); // fits alone, but its cpu is what the first waiter waits for
    const memoryOnly = admit(t, 2, 0, "memory-only"); // takes memory the first waiter does not need
    await settle();
    expect(t.granted).toEqual(["x", "memory-only"]);
    expect(memoryOnly.admitted).toBeDefined();
    expect(t.queue.entries().map((e) => e.owner)).toEqual(["first-waiter", "takes-cpu"]);
    t.release("x");
    // The first waiter goes the moment its cpu is back, then the one behind it.
    expect(t.granted).toEqual(["x", "memory-only", "first-waiter", "takes-cpu"]);
    await settle();
    expect(firstWaiter.admitted && takesCpu.admitted).toBeDefined();
  });

  it("lets memory pass a first waiter only while free memory stays above the reserve with both admitted", async () => {
    const t = setup({ queueMode: "backfill", memoryBytes: 16 * G, reserveBytes: 2 * G }, { availableBytes: 6 * G });
    t.countUnseen();
    admit(t, 0, 3, "x"); // holds 3 of 4 cpus
    admit(t, 2, 2, "first-waiter"); // waits for cpu; will need 2G of the 4G above the reserve
    admit(t, 3, 0, "too-big"); // fits alone (6 - 3 >= 2), but 6 - 3 - 2 < 2 would keep the first waiter out
    admit(t, 1, 0, "small"); // 6 - 1 - 2 >= 2: room the first waiter cannot use
    await settle();
    expect(t.granted).toEqual(["x", "small"]);
    t.release("x");
    expect(t.granted).toEqual(["x", "small", "first-waiter"]);
    expect(t.queue.entries().map((e) => e.owner)).toEqual(["too-big"]);
  });

  it("FIFO keeps the same request waiting", async () => {
    const t = setup({ queueMode: "fifo" });
    admit(t, 2, 3, "x");
    admit(t, 1, 2, "first-waiter");
    admit(t, 2, 0, "memory-only");
    await settle();
    expect(t.granted).toEqual(["x"]);
  });

  it("never lets anything past a first waiter that waits for the cpu to calm down, unless it takes no cpu", async () => {
    const t = setup({ queueMode: "backfill" }, { load1: 100 });
    admit(t, 1, 1, "first-waiter");
    admit(t, 1, 1, "wake", { skipLoadGate: true }); // fits its own gates, but adds cpu
    admit(t, 1, 0, "no-cpu", { skipLoadGate: true });
    await settle();
    expect(t.granted).toEqual(["no-cpu"]);
  });

  // The guarantee holds for the machine as it was when the request passed: if free memory falls
  // afterwards (other programs), what the backfilled request holds can keep the first waiter out,
  // as any work outside the queue can, in FIFO too. Such passes are left out of the check.
  it("property: a backfilled request never blocks the first waiter it passed, while free memory has not fallen since", () => {
    type Op = { kind: "arrive"; memoryGb: number; cpu: number } | { kind: "release"; pick: number } | { kind: "free"; gb: number };
    const op: fc.Arbitrary<Op> = fc.oneof(
      fc.record({ kind: fc.constant("arrive" as const), memoryGb: fc.integer({ min: 0, max: 10 }), cpu: fc.integer({ min: 0, max: 4 }) }),
      fc.record({ kind: fc.constant("release" as const), pick: fc.nat() }),
      fc.record({ kind: fc.constant("free" as const), gb: fc.integer({ min: 4, max: 24 }) }),
    );
    fc.assert(
      // Free memory starts anywhere from tight to plentiful, so that the free-memory half of the
      // pass rule is exercised as often as the budget half.
      fc.property(fc.integer({ min: 4, max: 24 }), fc.array(op, { maxLength: 60 }), (startGb, ops) => {
        const t = setup({ queueMode: "backfill", memoryBytes: 16 * G, cpu: 6, reserveBytes: 2 * G, maxQueue: 1000 }, { availableBytes: startGb * G });
        t.countUnseen();
        const seqOf = new Map<string, number>();
        /** Backfilled label → the label of the first waiter it passed, and the free memory then. */
        const passed = new Map<string, { firstWaiter: string; freeGb: number }>();
        let freeGb = startGb;
        t.hooks.onGrant = (label) => {
          const firstWaiter = t.queue.entries()[0];
          if (firstWaiter && seqOf.get(firstWaiter.owner)! < seqOf.get(label)!) passed.set(label, { firstWaiter: firstWaiter.owner, freeGb });
        };
        let n = 0;
        for (const o of ops) {
          if (o.kind === "arrive") {
            const label = `r${++n}`;
            seqOf.set(label, n);
            t.queue.admit(need(o.memoryGb, o.cpu), label).catch(() => undefined);
          } else if (o.kind === "release") {
            const labels = [...t.held.keys()];
            if (labels.length > 0) t.release(labels[o.pick % labels.length]!);
          } else {
            freeGb = o.gb;
            t.setSample({ availableBytes: o.gb * G });
          }
          const firstWaiter = t.queue.entries()[0];
          if (!firstWaiter) continue;
          const blockers = [...passed].filter(([b, p]) => p.firstWaiter === firstWaiter.owner && t.held.has(b) && freeGb >= p.freeGb).map(([b]) => b);
          if (blockers.length === 0) continue;
          // Take the requests that passed this first waiter away: if that made it fit, they delayed it.
          const context = t.context();
          const without = { ...context.committed };
          let unseen = context.unseenMemoryBytes ?? 0;
          for (const b of blockers) {
            without.memoryBytes -= t.held.get(b)!.memoryBytes;
            without.cpu -= t.held.get(b)!.cpu;
            unseen -= t.held.get(b)!.memoryBytes;
          }
          const withThem = refusingGates(firstWaiter.needs, context);
          const withoutThem = refusingGates(firstWaiter.needs, { ...context, committed: without, unseenMemoryBytes: unseen });
          expect(withThem !== 0 && withoutThem === 0).toBe(false);
        }
      }),
      { numRuns: 300 },
    );
  });
});
