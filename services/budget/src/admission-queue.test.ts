import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { DriftingClock } from "@berth/shared/testing/drifting-clock";
import { BerthError } from "@berth/shared/errors";
import type { QueuedUpdate } from "./queue-line.js";
import { HEARTBEAT_RATE_CAP, heartbeatPeriodMs } from "./queue-notifier.js";
import type { Policy } from "./policy.js";
import type { MachineSample } from "./sampler.js";
import { refusingGates } from "./verdict.js";
import { G, admit, need, settle, setup, track } from "./admission-queue-fixtures.js";

describe("AdmissionQueue (FIFO)", () => {
  it("admits at once what fits, queues the rest in order with positions and reasons", async () => {
    const t = setup();
    const big = admit(t, 6, 1, "big");
    t.ends.set("big", t.clock.monotonicNow() + 60_000);
    t.usual.set("a", 30_000);
    t.usual.set("b", 60_000);
    const a = admit(t, 4, 1, "a");
    const b = admit(t, 1, 1, "b"); // would fit, but FIFO: it waits its turn
    const c = admit(t, 4, 1, "c");
    await settle();
    expect(big.admitted).toBeDefined();
    expect(t.granted).toEqual(["big"]);
    expect(t.queue.entries().map((e) => [e.owner, e.position])).toEqual([
      ["a", 1],
      ["b", 2],
      ["c", 3],
    ]);
    // Told at once (synchronously, inside admit), with the first waiter's reason.
    expect(a.updates).toHaveLength(1);
    expect(a.updates[0]).toMatchObject({ position: 1, aheadCount: 0, ahead: [], etaMs: 60_000, etaBasis: "when 'big' ends (its end in this test)" });
    expect(a.updates[0]!.waitForText).toBe("memory: needs 4G, the budget has 2G of 8G free (berth has committed 6G)");
    expect(b.updates[0]!.waitForText).toBe("1 request(s) ahead in the queue; memory: needs 4G, the budget has 2G of 8G free (berth has committed 6G)");
    expect(b.updates[0]!.waitFor.map((r) => r.gate)).toEqual(["queue", "memory_budget"]);
    // 'a' is admitted when 'big' ends, 'b' with it (it fits beside 'a'), 'c' when 'a' has run its usual 30 s.
    expect(b.updates[0]).toMatchObject({ position: 2, etaMs: 60_000 });
    expect(c.updates[0]).toMatchObject({
      position: 3,
      aheadCount: 2,
      etaMs: 90_000,
      etaBasis: "when 'a' ends (it usually runs 30s (1 run)), after the 2 ahead of it",
    });
    expect(c.updates[0]!.ahead).toEqual([
      { owner: "a", needs: { memoryBytes: 4 * G, cpu: 1 } },
      { owner: "b", needs: { memoryBytes: G, cpu: 1 } },
    ]);
  });

  it("a release admits the first waiter in the same tick, then whoever fits behind it", () => {
    const t = setup();
    admit(t, 6, 1, "big");
    const a = admit(t, 4, 1, "a");
    const b = admit(t, 1, 1, "b");
    const c = admit(t, 4, 1, "c");
    t.release("big");
    // No await: the admission happened inside the release.
    expect(t.granted).toEqual(["big", "a", "b"]);
    expect(t.queue.entries().map((e) => e.owner)).toEqual(["c"]);
    t.flush();
    expect(c.updates.at(-1)).toMatchObject({ position: 1, aheadCount: 0 });
    expect(a.updates).toHaveLength(1);
    expect(b.updates).toHaveLength(1);
  });

  it("tells waiters when their position changes, and the rest nothing", () => {
    const t = setup();
    admit(t, 6, 1, "big");
    const a = admit(t, 4, 1, "a");
    const b = admit(t, 4, 1, "b");
    t.flush();
    expect([a.updates.length, b.updates.length]).toEqual([1, 1]);
    // A new sample that changes nothing the gates look at: nobody hears anything.
    t.setSample({ load1: 0.1 });
    t.flush();
    expect([a.updates.length, b.updates.length]).toEqual([1, 1]);
    // The first waiter's reason changes (now also the load): everyone hears.
    t.setSample({ load1: 20 });
    t.flush();
    expect(a.updates.at(-1)!.waitFor.map((r) => r.gate)).toEqual(["memory_budget", "load"]);
    expect(b.updates.at(-1)!.waitFor.map((r) => r.gate)).toEqual(["queue", "memory_budget", "load"]);
  });

  it("heartbeats every waiter every heartbeatMs on one shared timer, spread out, with a fresh ETA", () => {
    const t = setup({ heartbeatMs: 5000 });
    admit(t, 6, 1, "big");
    t.ends.set("big", t.clock.monotonicNow() + 60_000);
    const at: number[] = [];
    const waiters = Array.from({ length: 50 }, (_, i) => {
      const updates: QueuedUpdate[] = [];
      const onQueued = (u: QueuedUpdate) => {
        updates.push(u);
        at.push(t.clock.now());
      };
      return track(t.queue.admit(need(4, 1), `w${i}`, { onQueued }), updates);
    });
    // One heartbeat timer and one deadline timer, whatever the number of waiters.
    expect(t.clock.pendingTimers()).toBe(2);
    // The first sweep spreads the joiners out; by 10 s everyone has heard a heartbeat.
    t.clock.advance(10_000);
    expect(waiters.every((w) => w.updates.length >= 2)).toBe(true);
    expect(waiters[0]!.updates.at(-1)).toMatchObject({ position: 1 });
    expect(waiters[9]!.updates.at(-1)).toMatchObject({ position: 10 });
    // From then on each waiter hears exactly once per heartbeatMs, not all in the same instant.
    const before = waiters.map((w) => w.updates.length);
    at.length = 0;
    for (let round = 0; round < 2; round++) {
      t.clock.advance(5000);
      expect(waiters.map((w, i) => w.updates.length - before[i]!)).toEqual(waiters.map(() => round + 1));
    }
    expect(new Set(at).size).toBeGreaterThan(40);
    const last = waiters[0]!.updates.at(-1)!;
    // A fresh ETA: less the time waited when it was told, within the last beat of the 20 s so far.
    expect(last.etaMs).toBeGreaterThanOrEqual(40_000);
    expect(last.etaMs).toBeLessThanOrEqual(45_000);
    expect(t.clock.pendingTimers()).toBe(2);
  });

  it("caps heartbeats server-wide: 10,000 waiters hear at most HEARTBEAT_RATE_CAP a second, each every ~100 s", () => {
    const t = setup({ heartbeatMs: 5000, maxQueue: 20_000, maxWaitMs: 3_600_000 });
    admit(t, 6, 1, "big");
    const count = 10_000;
    let heartbeats = 0;
    const heard = new Map<number, number>();
    for (let i = 0; i < count; i++) {
      void t.queue
        .admit(need(4, 1), `w${i}`, {
          onQueued: () => {
            heartbeats++;
            heard.set(i, (heard.get(i) ?? 0) + 1);
          },
        })
        .catch(() => undefined);
    }
    t.flush();
    expect(heartbeats).toBe(count); // each told once on joining
    heartbeats = 0;
    heard.clear();
    expect(t.clock.pendingTimers()).toBe(2);
    const perSecond: number[] = [];
    for (let second = 0; second < 210; second++) {
      t.clock.advance(1000);
      perSecond.push(heartbeats);
      heartbeats = 0;
    }
    expect(Math.max(...perSecond)).toBeLessThanOrEqual(HEARTBEAT_RATE_CAP);
    // The first half period skips everyone (told on joining); from then on steady at the cap: spread out, not in bursts.
    expect(perSecond.slice(0, 49).every((n) => n === 0)).toBe(true);
    expect(perSecond.slice(51).every((n) => n >= HEARTBEAT_RATE_CAP * 0.9)).toBe(true);
    // Everyone heard within the first ~2 periods of 100 s, about twice in 210 s.
    expect(heard.size).toBe(count);
    expect(Math.max(...heard.values())).toBeLessThanOrEqual(3);
    expect(heartbeatPeriodMs(count, 5000)).toBe(100_000);
    expect(heartbeatPeriodMs(500, 5000)).toBe(5000);
    expect(t.clock.pendingTimers()).toBe(2);
  });

  it("a changed position still goes out at once in a long queue: only heartbeats are capped", async () => {
    const t = setup({ heartbeatMs: 5000, maxQueue: 20_000, maxWaitMs: 3_600_000 });
    admit(t, 6, 1, "big");
    const controller = new AbortController();
    const first = admit(t, 4, 1, "first", { signal: controller.signal });
    const rest = Array.from({ length: 2000 }, (_, i) => admit(t, 4, 1, `w${i}`));
    t.clock.advance(3000);
    // The first waiter gives up: everyone behind moves up one and hears it now, without waiting for a heartbeat.
    controller.abort();
    t.queue.recheck();
    t.flush();
    await settle();
    expect(first.error?.code).toBe("cancelled");
    expect(rest.every((w, i) => w.updates.at(-1)!.position === i + 1)).toBe(true);
    expect(rest.every((w) => w.updates.length >= 2)).toBe(true);
  });

  it("the ETA counts down as time passes, and says unknown, and why, when nothing predicts the wait", () => {
    const t = setup({ heartbeatMs: 5000, maxWaitMs: 600_000 });
    admit(t, 6, 1, "big");
    t.ends.set("big", t.clock.monotonicNow() + 10_000);
    const a = admit(t, 4, 1, "a");
    expect(a.updates[0]!.etaMs).toBe(10_000);
    t.clock.advance(5000);
    expect(a.updates.at(-1)!.etaMs).toBe(5000);
    // 'big' ran past its expected end: nothing predicts it any more.
    t.ends.delete("big");
    t.queue.recheck();
    t.clock.advance(5000);
    expect(a.updates.at(-1)).toMatchObject({
      etaMs: undefined,
      etaBasis: "unknown: it waits for 'big' (6G, 1 cpu) to end, and nothing says when: no lease, no past runs",
    });
    // The cpu gate closed: the first waiter waits for the machine.
    t.ends.set("big", t.clock.monotonicNow() + 10_000);
    t.setSample({ load1: 100 });
    t.clock.advance(5000);
    expect(a.updates.at(-1)).toMatchObject({ etaMs: undefined, etaBasis: "unknown: it waits for the load average to fall, which nothing predicts" });
  });

  it("refuses with queue full past maxQueue", async () => {
    const t = setup({ maxQueue: 2 });
    admit(t, 6, 1, "big");
    admit(t, 4, 1, "a");
    admit(t, 4, 1, "b");
    const c = admit(t, 4, 1, "c");
    await settle();
    expect(c.error).toBeInstanceOf(BerthError);
    expect(c.error!.code).toBe("resource_exhausted");
    expect(c.error!.message).toBe("the load budget's queue is full (2 waiting, BERTH_BUDGET_MAX_QUEUE) — 'c' was not queued; retry later");
    expect(c.error!.details).toMatchObject({ kind: "queue_full", retryAfterMs: 60_000 });
    expect([c.error!.reason, c.error!.options.retryAfterMs]).toEqual(["QUEUE_FULL", 60_000]);
  });

  it("a wait of zero never queues: admitted at once when it fits and it is its turn, else refused at once", async () => {
    const t = setup();
    const fits = admit(t, 2, 1, "fits", { maxWaitMs: 0 });
    await settle();
    expect(fits.admitted).toBeDefined();
    // Does not fit now, nobody waiting: refused with what it would wait for, never queued.
    const alone = admit(t, 7, 1, "alone", { maxWaitMs: 0 });
    await settle();
    expect(alone.updates).toEqual([]);
    expect(t.queue.length).toBe(0);
    expect([alone.error!.code, alone.error!.reason, alone.error!.options.retryAfterMs]).toEqual(["resource_exhausted", "WAIT_EXHAUSTED", 60_000]);
    expect(alone.error!.message).toMatch(/^'alone' does not fit now and asked not to wait — memory: needs 7G, the budget has 6G of 8G free/);
    expect(alone.error!.details).toMatchObject({ kind: "wait_exhausted", position: 1 });
    // Fits, but someone waits ahead (FIFO): its turn would come later, so it is refused too.
    admit(t, 7, 1, "first-waiter");
    const behind = admit(t, 1, 1, "behind", { maxWaitMs: 0 });
    await settle();
    expect(t.queue.entries().map((e) => e.owner)).toEqual(["first-waiter"]);
    expect(behind.error!.details).toMatchObject({ kind: "wait_exhausted", position: 2 });
    expect(behind.error!.message).toMatch(/^'behind' does not fit now and asked not to wait — 1 request\(s\) ahead in the queue; memory: needs 7G/);
    expect(t.clock.pendingTimers()).toBeGreaterThan(0); // the first waiter's deadline only
  });

  it("pages through the queue in arrival order: nobody repeated or lost while others are admitted, dropped or queued between pages", async () => {
    const t = setup({ maxQueue: 10_000, maxWaitMs: 600_000 });
    admit(t, 7, 1, "big");
    const controllers = new Map<string, AbortController>();
    const join = (name: string) => {
      const controller = new AbortController();
      controllers.set(name, controller);
      admit(t, 5, 1, name, { signal: controller.signal });
    };
    for (let i = 0; i < 25; i++) join(`w${i}`);
    const seen: string[] = [];
    let page = t.queue.page(undefined, 10);
    expect(page.items.map((e) => [e.owner, e.position])).toEqual(Array.from({ length: 10 }, (_, i) => [`w${i}`, i + 1]));
    seen.push(...page.items.map((e) => e.owner));
    // Between pages: the first waiter is admitted, a waiter of this page and one of the next leave, two join.
    t.release("big");
    controllers.get("w12")!.abort();
    controllers.get("w3")!.abort();
    join("late1");
    join("late2");
    await settle();
    page = t.queue.page(page.next, 10);
    // Positions are where they stand now: w0 went in and w3 left, so w10 is 9th.
    expect(page.items[0]).toMatchObject({ owner: "w10", position: 9 });
    seen.push(...page.items.map((e) => e.owner));
    page = t.queue.page(page.next, 10);
    seen.push(...page.items.map((e) => e.owner));
    expect(page.next).toBeUndefined();
    const expected = [...Array.from({ length: 25 }, (_, i) => `w${i}`).filter((n) => n !== "w12"), "late1", "late2"];
    expect(seen).toEqual(expected);
    // A page that ends exactly at the end of the queue says there is no next page.
    const all = t.queue.length;
    expect(t.queue.page(undefined, all).next).toBeUndefined();
    expect(t.queue.page(undefined, all - 1).next).toBeDefined();
  });

  it("refuses an impossible need at once, with the seed's words", async () => {
    const t = setup();
    const x = admit(t, 9, 1, "huge");
    await settle();
    expect(x.error!.code).toBe("failed_precondition");
    expect(x.error!.message).toBe(
      "the load budget can never admit 'huge': it needs 9G of memory and the whole budget is 8G (BERTH_BUDGET_MEMORY). Declare smaller resources or raise the budget",
    );
    expect(x.error!.details).toMatchObject({ kind: "impossible", gate: "memory_budget" });
    expect(x.error!.reason).toBe("IMPOSSIBLE");
  });

  it("a need of nothing never queues, even behind others", async () => {
    const t = setup();
    admit(t, 6, 1, "big");
    admit(t, 4, 1, "a");
    const nothing = admit(t, 0, 0, "nothing");
    await settle();
    expect(nothing.admitted).toBeDefined();
    expect(nothing.updates).toEqual([]);
  });

  it("advises what helps for the gates that hold the need, and nothing that would not", async () => {
    const cases: Array<[string, Partial<Policy>, Partial<MachineSample>, RegExp, RegExp]> = [
      [
        "load",
        {},
        { load1: 100 },
        /The cpu is busy: wait and try again, stop a process named above, or, when the work is light, skip the load gate \(--skip-load-gate/,
        /BERTH_BUDGET_MEMORY|BERTH_BUDGET_CPU\b/,
      ],
      [
        "free memory",
        { reserveBytes: 63.5 * G },
        {},
        /The machine itself is short of memory: .*a bigger budget would not help/,
        /skip the load gate|raise BERTH_BUDGET_MEMORY/,
      ],
      [
        "cpu budget",
        {},
        {},
        /For cpu: stop berth work you do not need, declare fewer cpus, or raise BERTH_BUDGET_CPU/,
        /skip the load gate|BERTH_BUDGET_MEMORY/,
      ],
    ];
    for (const [gate, policy, sample, advice, not] of cases) {
      const t = setup(policy, sample);
      if (gate === "cpu budget") admit(t, 0.5, 3.5, "holder");
      const refused = admit(t, 1, 1, gate, { maxWaitMs: 0 });
      await settle();
      expect(refused.error?.reason, gate).toBe("WAIT_EXHAUSTED");
      expect(refused.error!.message, gate).toMatch(advice);
      expect(refused.error!.message, gate).not.toMatch(not);
    }
  });

  it("gives up when the wait runs out, saying what it waited for", async () => {
    const t = setup({ maxWaitMs: 30_000 });
    admit(t, 6, 1, "big");
    const a = admit(t, 4, 1, "a");
    const b = admit(t, 4, 1, "b", { maxWaitMs: 10_000 });
    t.clock.advance(10_000);
    await settle();
    expect(b.error!.code).toBe("resource_exhausted");
    expect(b.error!.message).toBe(
      "waited 10s for the load budget and 'b' still does not fit — 1 request(s) ahead in the queue; memory: needs 4G, the budget has 2G of 8G free (berth has committed 6G). " +
        "For memory: stop berth work you do not need (named above; 'berth budget state' lists it), declare less memory, or raise BERTH_BUDGET_MEMORY: the budget, not the machine, is the limit",
    );
    expect(b.error!.details).toMatchObject({ kind: "wait_exhausted", position: 2, retryAfterMs: 110_000 });
    expect([b.error!.reason, b.error!.options.retryAfterMs]).toEqual(["WAIT_EXHAUSTED", 110_000]);
    expect(a.error).toBeUndefined();
    t.clock.advance(20_000);
    await settle();
    expect(a.error!.message).toMatch(/^waited 30s for the load budget and 'a' still does not fit — memory: needs 4G/);
    expect(t.queue.length).toBe(0);
    expect(t.clock.pendingTimers()).toBe(0);
  });

  it("shows a waiter's queued time and deadline exactly its wait apart, however the clocks move between readings", async () => {
    const t = setup({ maxWaitMs: 30_000 }, {}, new DriftingClock());
    admit(t, 6, 1, "big");
    admit(t, 4, 1, "a", { maxWaitMs: 7_777 });
    admit(t, 4, 1, "b");
    await settle();
    for (let i = 0; i < 5; i++) expect(t.queue.entries().map((e) => e.deadline - e.queuedAt)).toEqual([7_777, 30_000]);
    t.queue.close();
  });

  it("waits, heartbeats and ETAs run on the monotonic clock: a wall-clock step moves none of them", async () => {
    const HOUR = 3_600_000;
    for (const step of [-HOUR, HOUR]) {
      const t = setup({ maxWaitMs: 30_000, heartbeatMs: 5000 });
      admit(t, 6, 1, "big");
      t.ends.set("big", t.clock.monotonicNow() + 60_000);
      const a = admit(t, 4, 1, "a");
      t.clock.advance(1000);
      t.clock.stepWall(step);
      // Shown in the stepped wall clock, as of this answer: queued a second ago, 29 s to go.
      expect(t.queue.entries()[0]).toMatchObject({ queuedAt: t.clock.now() - 1000, waitedMs: 1000, deadline: t.clock.now() + 29_000, etaMs: 59_000 });
      const heard = a.updates.length;
      t.clock.advance(5000);
      expect(a.updates.length).toBe(heard + 1);
      // 'big' ends 60 s after it was admitted, less the 1 to 6 s passed when it was told.
      expect(a.updates.at(-1)!.etaMs).toBeGreaterThanOrEqual(54_000);
      expect(a.updates.at(-1)!.etaMs).toBeLessThanOrEqual(59_000);
      t.clock.advance(23_999);
      await settle();
      expect(a.error).toBeUndefined();
      t.clock.advance(1);
      await settle();
      expect(a.error!.message).toMatch(/^waited 30s for the load budget/);
      expect(t.clock.pendingTimers()).toBe(0);
    }
  });

  it("expires many waiters at once in one pass", async () => {
    const t = setup({ maxWaitMs: 1000, maxQueue: 5000 });
    admit(t, 6, 1, "big");
    const waiters = Array.from({ length: 3000 }, (_, i) => admit(t, 4, 1, `w${i}`));
    t.clock.advance(1000);
    t.flush();
    await settle();
    expect(waiters.every((w) => w.error?.code === "resource_exhausted")).toBe(true);
    expect(t.queue.length).toBe(0);
  });

  it("drops a request whose caller went away, and moves the others up", async () => {
    const t = setup();
    admit(t, 6, 1, "big");
    const controller = new AbortController();
    const a = admit(t, 4, 1, "a", { signal: controller.signal });
    const b = admit(t, 4, 1, "b");
    controller.abort();
    t.flush();
    await settle();
    expect(a.error!.code).toBe("cancelled");
    expect(a.error!.message).toBe("'a' was dropped from the load budget's queue: its caller disconnected");
    expect(b.updates.at(-1)).toMatchObject({ position: 1, aheadCount: 0 });
    expect(t.queue.entries().map((e) => e.owner)).toEqual(["b"]);
  });

  it("a dropped first waiter lets the next one in at once when it fits", async () => {
    const t = setup();
    admit(t, 6, 1, "big");
    const controller = new AbortController();
    admit(t, 4, 1, "a", { signal: controller.signal });
    const b = admit(t, 1, 1, "b");
    controller.abort();
    expect(t.granted).toEqual(["big", "b"]);
    await settle();
    expect(b.admitted).toBeDefined();
  });

  it("refuses an already-aborted caller without queueing it", async () => {
    const t = setup();
    const controller = new AbortController();
    controller.abort();
    const a = admit(t, 1, 1, "a", { signal: controller.signal });
    await settle();
    expect(a.error!.code).toBe("cancelled");
  });

  it("a policy change re-checks: a bigger budget admits, a smaller one refuses what can never fit", async () => {
    const t = setup();
    admit(t, 6, 1, "big");
    const a = admit(t, 4, 1, "a");
    const b = admit(t, 12, 1, "b", { maxWaitMs: 600_000 });
    expect(b.error).toBeUndefined();
    t.setPolicy({ memoryBytes: 10 * G });
    expect(t.granted).toEqual(["big", "a"]);
    t.setPolicy({ memoryBytes: 9 * G });
    await settle();
    expect(a.admitted).toBeDefined();
    expect(b.error!.code).toBe("failed_precondition");
  });

  it("close refuses every waiter as unavailable and leaves no timer", async () => {
    const t = setup();
    admit(t, 6, 1, "big");
    const a = admit(t, 4, 1, "a");
    const b = admit(t, 1, 1, "b");
    t.queue.close();
    await settle();
    expect([a.error?.code, b.error?.code]).toEqual(["unavailable", "unavailable"]);
    expect(t.granted).toEqual(["big"]);
    expect(t.clock.pendingTimers()).toBe(0);
  });
});

describe("AdmissionQueue (FIFO property)", () => {
  it("property: nothing is admitted while an older request waits, except a need of nothing", () => {
    const op = fc.oneof(
      fc.record({ kind: fc.constant("arrive" as const), memoryGb: fc.integer({ min: 0, max: 10 }), cpu: fc.integer({ min: 0, max: 4 }) }),
      fc.record({ kind: fc.constant("release" as const), pick: fc.nat() }),
      fc.record({ kind: fc.constant("free" as const), gb: fc.integer({ min: 4, max: 24 }) }),
    );
    fc.assert(
      fc.property(fc.array(op, { maxLength: 60 }), (ops) => {
        const t = setup({ memoryBytes: 16 * G, cpu: 6, reserveBytes: 2 * G, maxQueue: 1000 }, { availableBytes: 20 * G });
        t.countUnseen();
        const seqOf = new Map<string, number>();
        const zero = new Set<string>();
        t.hooks.onGrant = (label) => {
          if (zero.has(label)) return;
          for (const e of t.queue.entries()) expect(seqOf.get(e.owner)!).toBeGreaterThan(seqOf.get(label)!);
        };
        let n = 0;
        for (const o of ops) {
          if (o.kind === "arrive") {
            const label = `r${++n}`;
            seqOf.set(label, n);
            if (o.memoryGb === 0 && o.cpu === 0) zero.add(label);
            t.queue.admit(need(o.memoryGb, o.cpu), label).catch(() => undefined);
          } else if (o.kind === "release") {
            const labels = [...t.held.keys()];
            if (labels.length > 0) t.release(labels[o.pick % labels.length]!);
          } else {
            t.setSample({ availableBytes: o.gb * G });
          }
          // And the first waiter never waits while it fits: every event re-checked it.
          const firstWaiter = t.queue.entries()[0];
          if (firstWaiter) expect(refusingGates(firstWaiter.needs, t.context())).not.toBe(0);
        }
      }),
      { numRuns: 300 },
    );
  });
});
