import { spawn } from "node:child_process";
import { readFileSync, statSync } from "node:fs";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import type { Reservation } from "./reservations.js";
import { runningFilePath } from "./running-tally.js";
import { G, M, admit, need, settle, testBudgets, track } from "./budget-fixtures.js";

const { setup, closeAll, removeAll } = testBudgets();
afterEach(closeAll);
afterAll(removeAll);

describe("budget", () => {
  it("a release admits the first waiter in the same tick", async () => {
    const { budget } = await setup();
    const first = await budget.admit(need(6, 1), "first");
    const firstWaiter = admit(budget, need(4, 1), "first-waiter");
    expect(budget.state().queue.map((q) => q.owner)).toEqual(["first-waiter"]);
    expect(budget.release(first.id)).toBe(true);
    expect(budget.state().queue).toEqual([]);
    expect(budget.state().reservations.map((r) => r.owner)).toEqual(["first-waiter"]);
    await settle();
    expect(firstWaiter.reservation?.owner).toBe("first-waiter");
    expect(budget.release(first.id)).toBe(false);
  });

  it("the end of a build gives its share back and lets the next one in", async () => {
    const { budget } = await setup();
    const r = await budget.admit(need(2, 1, 4, 2), "build and start");
    const next = admit(budget, need(4, 1), "next");
    expect(next.updates[0]!.waitFor.map((w) => w.gate)).toEqual(["memory_budget"]);
    budget.releaseBuild(r.id);
    await settle();
    expect(next.reservation).toBeDefined();
    expect(budget.state().committed.memoryBytes).toBe(6 * G);
  });

  it("consume moves the share from the reservation to the running tally, on disk before it resolves", async () => {
    const { budget, stateDir } = await setup();
    const r = await budget.admit(need(3, 2), "up");
    const { running: entry } = await budget.consume(r.id, "web", { memoryBytes: G, cpu: 1 }, { pid: process.pid });
    expect(r.start).toEqual({ memoryBytes: 2 * G, cpu: 1 });
    expect(entry).toMatchObject({ name: "web", cost: { memoryBytes: G, cpu: 1 }, pid: process.pid, reservationId: r.id });
    const state = budget.state();
    expect(state.committed.memoryBytes).toBe(3 * G);
    // Largest first.
    expect(state.committed.items.map((i) => [i.kind, i.label, i.memoryBytes])).toEqual([
      ["reservation", "up", 2 * G],
      ["running", "web", G],
    ]);
    const onDisk = JSON.parse(readFileSync(runningFilePath(stateDir), "utf8"));
    expect(onDisk.entries.map((e: { name: string }) => e.name)).toEqual(["web"]);
    expect(statSync(runningFilePath(stateDir)).mode & 0o777).toBe(0o600);
    // The reservation's release leaves the running work counted.
    budget.release(r.id);
    expect(budget.state().committed.memoryBytes).toBe(G);
  });

  it("the run cost of what a reservation starts is the cost its item was admitted with; the default for anything else", async () => {
    const { budget } = await setup();
    const r = await budget.admit(
      budget.needOf([
        { kind: "build", name: "web", spec: { memoryBytes: 2 * G, cpu: 2 } },
        { kind: "start", name: "web", spec: { memoryBytes: 256 * M, cpu: 0.25 } },
        { kind: "appliance", name: "db", spec: { memoryBytes: G } },
      ]),
      "up",
    );
    expect(budget.runCostOf("web", r.id)).toEqual({ memoryBytes: 256 * M, cpu: 0.25 });
    // An item that declared part of its cost was admitted with the default for the rest.
    expect(budget.runCostOf("db", r.id)).toEqual({ memoryBytes: G, cpu: 0.5 });
    expect(budget.runCostOf("cache", r.id)).toEqual({ memoryBytes: 512 * M, cpu: 0.5 });
    expect(budget.runCostOf("web")).toEqual({ memoryBytes: 512 * M, cpu: 0.5 });
    expect(budget.runCostOf("web", "gone")).toEqual({ memoryBytes: 512 * M, cpu: 0.5 });
  });

  it("a lease that is not renewed releases the reservation", async () => {
    const { budget, clock } = await setup();
    const leased = await budget.reserve(need(6, 1), "unary client", { ttlMs: 10_000 });
    expect(leased.leaseExpiresAt).toBe(clock.now() + 10_000);
    const firstWaiter = admit(budget, need(4, 1), "first-waiter", { maxWaitMs: 60_000 });
    clock.advance(8000);
    budget.renew(leased.id);
    clock.advance(8000);
    expect(firstWaiter.reservation).toBeUndefined();
    clock.advance(2000);
    await settle();
    expect(budget.getReservation(leased.id)).toBeUndefined();
    expect(firstWaiter.reservation?.owner).toBe("first-waiter");
    expect(() => budget.renew(leased.id)).toThrow(/no reservation/);
  });

  it("running work registered with a lease stops counting when the lease runs out", async () => {
    const { budget, clock } = await setup();
    const { running: entry } = await budget.registerRunning("daemon", { memoryBytes: 6 * G, cpu: 1 }, { ttlMs: 5000 });
    const firstWaiter = admit(budget, need(4, 1), "first-waiter");
    clock.advance(4000);
    await budget.renewRunning(entry.id);
    clock.advance(4000);
    expect(firstWaiter.reservation).toBeUndefined();
    clock.advance(1000);
    await settle();
    expect(firstWaiter.reservation).toBeDefined();
    expect(budget.state().running).toEqual([]);
  });

  it("a Reserve repeated answers the first reservation as first answered, while it lives and for the window after it ended; the id for another request is ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED", async () => {
    const { budget, clock } = await setup({ idempotencyWindowMs: 60_000 });
    const first = await budget.reserve(need(1, 1), "client", { ttlMs: 10_000, requestId: "r-1" });
    clock.advance(3000);
    budget.releaseBuild(first.id);
    const again = await budget.reserve(need(1, 1), "client", { ttlMs: 10_000, requestId: "r-1", maxWaitMs: 0 });
    expect(again).toEqual(first);
    expect(budget.state().reservationCount).toBe(1);
    // Another need, owner, ttl or skipLoadGate, or another rpc, with the id: refused, nothing done.
    for (const other of [
      () => budget.reserve(need(2, 1), "client", { ttlMs: 10_000, requestId: "r-1" }),
      () => budget.reserve(need(1, 1), "someone else", { ttlMs: 10_000, requestId: "r-1" }),
      () => budget.reserve(need(1, 1), "client", { ttlMs: 20_000, requestId: "r-1" }),
      () => budget.reserve(need(1, 1), "client", { ttlMs: 10_000, skipLoadGate: true, requestId: "r-1" }),
      async () => budget.release(first.id, { requestId: "r-1" }),
      () => budget.registerRunning("x", { memoryBytes: G, cpu: 0 }, { requestId: "r-1" }),
    ]) {
      await expect(other()).rejects.toMatchObject({
        code: "already_exists",
        reason: "IDEMPOTENCY_KEY_REUSED",
        details: { requestId: "r-1", rpc: "Reserve", owner: "client", reservationId: first.id },
      });
    }
    expect(budget.state()).toMatchObject({ reservationCount: 1, runningCount: 0 });
    // Released: the repeat is answered the first answer, and admits nothing; its renewal finds it gone.
    expect(budget.release(first.id)).toBe(true);
    expect(await budget.reserve(need(1, 1), "client", { ttlMs: 10_000, requestId: "r-1" })).toEqual(first);
    expect(budget.state().reservationCount).toBe(0);
    expect(() => budget.renew(first.id)).toThrow(expect.objectContaining({ reason: "RESERVATION_NOT_FOUND" }));
    // The window closes 60 s after it ended: the id is a new request then.
    clock.advance(59_999);
    expect(await budget.reserve(need(1, 1), "client", { ttlMs: 10_000, requestId: "r-1" })).toEqual(first);
    clock.advance(1);
    const fresh = await budget.reserve(need(2, 1), "another", { ttlMs: 10_000, requestId: "r-1" });
    expect(fresh.id).not.toBe(first.id);
    // A lease that runs out ends it too.
    clock.advance(10_000);
    expect(budget.state().reservationCount).toBe(0);
    expect(await budget.reserve(need(2, 1), "another", { ttlMs: 10_000, requestId: "r-1" })).toEqual(fresh);
  });

  it("a repeat while the first Reserve waits joins its one place, each call up to its own wait; the place goes with the last call", async () => {
    const { budget, clock } = await setup();
    const holder = await budget.admit(need(6, 1), "holder");
    const calls = [new AbortController(), new AbortController(), new AbortController()];
    const first = track(budget.reserve(need(4, 1), "waiter", { ttlMs: 10_000, requestId: "r-2", signal: calls[0]!.signal, maxWaitMs: 5_000 }));
    const short = track(budget.reserve(need(4, 1), "waiter", { ttlMs: 10_000, requestId: "r-2", signal: calls[1]!.signal, maxWaitMs: 1_000 }));
    const patient = track(budget.reserve(need(4, 1), "waiter", { ttlMs: 10_000, requestId: "r-2", signal: calls[2]!.signal, maxWaitMs: 60_000 }));
    await settle();
    // One place, as long as its longest call waits.
    expect(budget.state().queue.map((q) => [q.owner, q.deadline - q.queuedAt])).toEqual([["waiter", 60_000]]);
    // A repeat that will not wait answers at once.
    await expect(budget.reserve(need(4, 1), "waiter", { ttlMs: 10_000, requestId: "r-2", maxWaitMs: 0 })).rejects.toMatchObject({
      reason: "WAIT_EXHAUSTED",
    });
    clock.advance(1_000);
    await settle();
    expect([short.error?.reason, short.error?.details?.waitedMs]).toEqual(["WAIT_EXHAUSTED", 1_000]);
    calls[0]!.abort();
    await settle();
    expect(first.error?.code).toBe("cancelled");
    expect(budget.state().queueSize).toBe(1);
    clock.advance(1000);
    budget.release(holder.id);
    await settle();
    const granted = patient.reservation!;
    expect([granted.owner, granted.waitedMs, granted.leaseExpiresAt]).toEqual(["waiter", 2000, clock.now() + 10_000]);
    expect(await budget.reserve(need(4, 1), "waiter", { ttlMs: 10_000, requestId: "r-2" })).toEqual(granted);

    // Every caller gone: the request leaves the queue, and the id is free for a new request.
    await budget.admit(need(4, 1), "filler");
    const lone = new AbortController();
    const dropped = track(budget.reserve(need(4, 1), "lone", { ttlMs: 10_000, requestId: "r-3", signal: lone.signal }));
    await settle();
    expect(budget.state().queueSize).toBe(1);
    lone.abort();
    await settle();
    expect([dropped.error?.code, budget.state().queueSize]).toEqual(["cancelled", 0]);
    const anew = track(budget.reserve(need(2, 1), "lone again", { ttlMs: 10_000, requestId: "r-3" }));
    await settle();
    expect(budget.state().queue.map((q) => q.owner)).toEqual(["lone again"]);
    expect(anew.error).toBeUndefined();
  });

  it("a refused Reserve refuses every call waiting with its request id, and records nothing", async () => {
    const { budget, clock } = await setup();
    await budget.admit(need(6, 1), "holder");
    const a = track(budget.reserve(need(4, 1), "w", { ttlMs: 10_000, requestId: "r", maxWaitMs: 5000 }));
    await settle();
    const b = track(budget.reserve(need(4, 1), "w", { ttlMs: 10_000, requestId: "r", maxWaitMs: 5000 }));
    clock.advance(5000);
    await settle();
    expect([a.error?.reason, b.error?.reason]).toEqual(["WAIT_EXHAUSTED", "WAIT_EXHAUSTED"]);
    // Refused: the retry runs anew, and may ask for something else.
    const c = track(budget.reserve(need(3, 1), "w", { ttlMs: 10_000, requestId: "r", maxWaitMs: 60_000 }));
    await settle();
    expect(budget.state().queue.map((q) => q.needs.memoryBytes)).toEqual([3 * G]);
    expect(c.error).toBeUndefined();
  });

  it("RegisterRunning and consume repeated answer the first answer and never count twice, while the entry lives, after it ended (for the window) and across a restart", async () => {
    const first = await setup({ idempotencyWindowMs: 60_000 });
    const { budget } = first;
    const { running: entry } = await budget.registerRunning("daemon", { memoryBytes: G, cpu: 1 }, { requestId: "run-1" });
    const [again, concurrent] = await Promise.all([
      budget.registerRunning("daemon", { memoryBytes: G, cpu: 1 }, { requestId: "run-1" }),
      budget.registerRunning("daemon", { memoryBytes: G, cpu: 1 }, { requestId: "run-1" }),
    ]);
    expect([again, concurrent]).toEqual([{ running: entry }, { running: entry }]);
    expect([budget.state().runningCount, budget.state().committed.memoryBytes]).toEqual([1, G]);
    for (const other of [
      () => budget.registerRunning("other", { memoryBytes: G, cpu: 1 }, { requestId: "run-1" }),
      () => budget.registerRunning("daemon", { memoryBytes: 2 * G, cpu: 1 }, { requestId: "run-1" }),
      () => budget.registerRunning("daemon", { memoryBytes: G, cpu: 1 }, { requestId: "run-1", ttlMs: 5000 }),
      () => budget.registerRunning("daemon", { memoryBytes: G, cpu: 1 }, { requestId: "run-1", pid: process.pid }),
      () => budget.stopRunning(entry.id, { requestId: "run-1" }),
    ]) {
      await expect(other()).rejects.toMatchObject({
        code: "already_exists",
        reason: "IDEMPOTENCY_KEY_REUSED",
        details: { requestId: "run-1", rpc: "RegisterRunning", name: "daemon", runningId: entry.id },
      });
    }

    const r = await budget.admit(need(3, 2), "up");
    const consumed = await budget.consume(r.id, "web", { memoryBytes: G, cpu: 1 }, { requestId: "run-2" });
    expect(consumed.reservation).toMatchObject({ id: r.id, start: { memoryBytes: 2 * G, cpu: 1 }, runningIds: [consumed.running.id] });
    const repeated = await budget.consume(r.id, "web", { memoryBytes: G, cpu: 1 }, { requestId: "run-2" });
    expect(repeated).toEqual(consumed);
    expect(r.start).toEqual({ memoryBytes: 2 * G, cpu: 1 });
    // The reservation lists the entry it started once, however often the start is repeated.
    expect(r.runningIds).toEqual([consumed.running.id]);
    // The same request with another reservation is another request.
    await expect(budget.consume("another", "web", { memoryBytes: G, cpu: 1 }, { requestId: "run-2" })).rejects.toMatchObject({
      reason: "IDEMPOTENCY_KEY_REUSED",
    });
    // The repeat is answered the first answer even once the reservation is gone.
    budget.release(r.id);
    expect(await budget.consume(r.id, "web", { memoryBytes: G, cpu: 1 }, { requestId: "run-2" })).toEqual(consumed);
    await expect(budget.consume(r.id, "web", { memoryBytes: G, cpu: 1 }, { requestId: "run-3" })).rejects.toMatchObject({
      code: "not_found",
      reason: "RESERVATION_NOT_FOUND",
    });

    // Kept with the entry on disk: a repeat after a restart is answered the first answer, counts nothing.
    await budget.close();
    const second = await setup({ stateDir: first.stateDir, clock: first.clock, idempotencyWindowMs: 60_000 });
    expect(await second.budget.registerRunning("daemon", { memoryBytes: G, cpu: 1 }, { requestId: "run-1" })).toEqual({ running: entry });
    expect(await second.budget.consume(r.id, "web", { memoryBytes: G, cpu: 1 }, { requestId: "run-2" })).toEqual(consumed);
    expect(second.budget.state().runningCount).toBe(2);
    // Stopped: still the first answer for the window, then a new request.
    expect(await second.budget.stopRunning(entry.id, { requestId: "stop-1" })).toBe(true);
    expect(await second.budget.stopRunning(entry.id, { requestId: "stop-1" })).toBe(true);
    expect(await second.budget.registerRunning("daemon", { memoryBytes: G, cpu: 1 }, { requestId: "run-1" })).toEqual({ running: entry });
    expect(second.budget.state().runningCount).toBe(1);
    first.clock.advance(60_000);
    const fresh = await second.budget.registerRunning("daemon", { memoryBytes: G, cpu: 1 }, { requestId: "run-1" });
    expect(fresh.running.id).not.toBe(entry.id);
    expect(await second.budget.stopRunning(entry.id, { requestId: "stop-1" })).toBe(false);
  });

  it("Release and ReleaseBuild with a request id answer the first answer; the id for another reservation is REUSED", async () => {
    const { budget } = await setup();
    const a = await budget.admit(need(1, 1, 2, 1), "a");
    const b = await budget.admit(need(1, 1), "b");
    const built = budget.releaseBuild(a.id, { requestId: "build-a" });
    expect(built.build).toEqual({ memoryBytes: 0, cpu: 0 });
    expect(budget.releaseBuild(a.id, { requestId: "build-a" })).toEqual(built);
    expect(() => budget.releaseBuild(b.id, { requestId: "build-a" })).toThrow(
      expect.objectContaining({ reason: "IDEMPOTENCY_KEY_REUSED", details: { requestId: "build-a", rpc: "ReleaseBuild", reservationId: a.id } }),
    );
    expect(budget.release(a.id, { requestId: "rel-a" })).toBe(true);
    expect(budget.release(a.id, { requestId: "rel-a" })).toBe(true);
    expect(() => budget.release(b.id, { requestId: "rel-a" })).toThrow(expect.objectContaining({ code: "already_exists" }));
    expect(budget.state().reservationCount).toBe(1);
    // A refused ReleaseBuild (the reservation is gone) records nothing.
    expect(() => budget.releaseBuild(a.id, { requestId: "build-gone" })).toThrow(expect.objectContaining({ reason: "RESERVATION_NOT_FOUND" }));
    expect(budget.releaseBuild(b.id, { requestId: "build-gone" }).id).toBe(b.id);
  });

  it("state gives the first page of each list with the counts; the lists page on in arrival order", async () => {
    const { budget } = await setup({ policy: { memoryBytes: 64 * G, cpu: 64, maxQueue: 100 } });
    const reservations: Reservation[] = [];
    for (let i = 0; i < 5; i++) reservations.push(await budget.admit(need(1, 0.5), `r${i}`));
    for (let i = 0; i < 4; i++) await budget.registerRunning(`s${i}`, { memoryBytes: (i + 1) * G, cpu: 0 });
    const state = budget.state(2);
    expect(state.reservations.map((r) => r.owner)).toEqual(["r0", "r1"]);
    expect([state.reservationCount, state.runningCount, state.queueSize]).toEqual([5, 4, 0]);
    expect(state.running.map((e) => e.name)).toEqual(["s0", "s1"]);
    expect(state.queueNext).toBeUndefined();
    // Committed items stay whole here (the RPC layer pages them), largest first.
    expect(state.committed.items.slice(0, 2).map((i) => i.label)).toEqual(["s3", "s2"]);

    budget.release(reservations[2]!.id);
    await budget.admit(need(1, 0.5), "r5");
    const rest = budget.listReservations(state.reservationsNext, 10);
    expect([rest.items.map((r) => r.owner), rest.next]).toEqual([["r3", "r4", "r5"], undefined]);
    const running = budget.listRunning(state.runningNext, 1);
    expect(running.items.map((e) => e.name)).toEqual(["s2"]);
    const last = budget.listRunning(running.next, 1);
    expect([last.items.map((e) => e.name), last.next]).toEqual([["s3"], undefined]);
  });

  it("the tally drops work whose process died, at the next sample", async () => {
    const { budget, sampler } = await setup();
    const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1e6)"], { stdio: "ignore" });
    await new Promise((resolve) => child.once("spawn", resolve));
    await budget.registerRunning("child", { memoryBytes: 6 * G, cpu: 1 }, { pid: child.pid! });
    const firstWaiter = admit(budget, need(4, 1), "first-waiter");
    sampler.set();
    expect(budget.state().running).toHaveLength(1);
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGKILL");
    await exited;
    sampler.set();
    expect(budget.state().running).toEqual([]);
    await settle();
    expect(firstWaiter.reservation).toBeDefined();
  });

  it("the tally survives a restart, without what ended meanwhile", async () => {
    const first = await setup();
    const child = spawn(process.execPath, ["-e", "setInterval(() => {}, 1e6)"], { stdio: "ignore" });
    await new Promise((resolve) => child.once("spawn", resolve));
    await first.budget.registerRunning("no pid", { memoryBytes: G, cpu: 1 });
    await first.budget.registerRunning("alive", { memoryBytes: 2 * G, cpu: 1 }, { pid: process.pid });
    await first.budget.registerRunning("dies", { memoryBytes: 3 * G, cpu: 1 }, { pid: child.pid! });
    await first.budget.registerRunning("leased", { memoryBytes: 512 * M, cpu: 0 }, { ttlMs: 60_000 });
    await first.budget.close();
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGKILL");
    await exited;

    const second = await setup({ stateDir: first.stateDir, clock: first.clock });
    expect(
      second.budget
        .state()
        .running.map((e) => e.name)
        .sort(),
    ).toEqual(["alive", "leased", "no pid"]);
    expect(second.budget.state().committed.memoryBytes).toBe(3.5 * G);
    // The dropped entry is gone from the file too.
    const onDisk = JSON.parse(readFileSync(runningFilePath(first.stateDir), "utf8"));
    expect(onDisk.entries).toHaveLength(3);
    // The lease carried over keeps its expiry.
    first.clock.advance(60_000);
    expect(
      second.budget
        .state()
        .running.map((e) => e.name)
        .sort(),
    ).toEqual(["alive", "no pid"]);
    const stopped = second.budget.state().running.find((e) => e.name === "no pid")!;
    expect(await second.budget.stopRunning(stopped.id)).toBe(true);
    expect(await second.budget.stopRunning(stopped.id)).toBe(false);
  });

  it("memory admitted since the last sample is not spent twice", async () => {
    const { budget, sampler, clock } = await setup({ policy: { memoryBytes: 32 * G, cpu: 8 }, sample: { availableBytes: 5 * G } });
    const a = await budget.admit(need(3, 1), "a");
    const b = admit(budget, need(3, 1), "b");
    expect(b.updates[0]!.waitForText).toBe(
      "free memory: the box has 2G available (after 3G admitted since the last sample) and keeps 1G in reserve (BERTH_BUDGET_RESERVE)",
    );
    expect(budget.check(need(1, 0)).fits).toBe(true);
    // The next sample shows a's memory in use: still no room for b.
    clock.advance(1000);
    sampler.set({ availableBytes: 2 * G });
    expect(b.reservation).toBeUndefined();
    budget.release(a.id);
    clock.advance(1000);
    sampler.set({ availableBytes: 5 * G });
    await settle();
    expect(b.reservation).toBeDefined();
  });

  it("after a pause: a lease that ran out ends, and the queue admits in order none whose client left meanwhile", async () => {
    const { budget, clock, flush } = await setup();
    const leased = await budget.reserve(need(6, 1), "leased", { ttlMs: 5000 });
    const left = new AbortController();
    const gone = admit(budget, need(4, 1), "gone", { signal: left.signal });
    const next = admit(budget, need(4, 1), "next");
    clock.stall(30_000);
    clock.advance(0);
    expect(budget.getReservation(leased.id)).toBeUndefined();
    left.abort();
    clock.ioRead();
    flush();
    await settle();
    expect(gone.error?.code).toBe("cancelled");
    expect(gone.reservation).toBeUndefined();
    expect(next.reservation?.owner).toBe("next");
  });

  it("a policy reload re-checks the queue", async () => {
    const { budget } = await setup();
    await budget.admit(need(6, 1), "first");
    const firstWaiter = admit(budget, need(4, 1), "first-waiter");
    budget.reloadPolicy({ ...budget.policy(), memoryBytes: 10 * G });
    await settle();
    expect(firstWaiter.reservation).toBeDefined();
    expect(() => budget.reloadPolicy({ ...budget.policy(), cpu: Number.NaN })).toThrow(/policy.cpu/);
    expect(budget.policy().memoryBytes).toBe(10 * G);
  });

  it("estimates a queued request's wait from how long the work holding the budget usually runs, learnt across a restart, or its lease", async () => {
    const first = await setup();
    // Two builds of 40 s and 44 s teach 'npm run build' its usual 42 s; a stopped service its run time.
    for (const ms of [40_000, 44_000]) {
      const build = await first.budget.admit(need(6, 1), "npm run build");
      first.clock.advance(ms);
      first.budget.release(build.id);
    }
    const { running: db } = await first.budget.registerRunning("db", { memoryBytes: G, cpu: 0 });
    first.clock.advance(5000);
    await first.budget.stopRunning(db.id);
    await first.budget.close();

    const { budget, clock, flush } = await setup({ stateDir: first.stateDir, clock: first.clock });
    const build = await budget.admit(need(6, 1), "npm run build");
    clock.advance(12_000);
    const next = admit(budget, need(4, 1), "next");
    flush();
    expect(budget.state().queue[0]).toMatchObject({ etaMs: 30_000, etaBasis: "when 'npm run build' ends (it usually runs 42s (2 runs))" });
    // As time passes the estimate moves with it.
    clock.advance(10_000);
    expect(budget.state().queue[0]).toMatchObject({ etaMs: 20_000 });
    // Past its usual time: by its longest run; past that too, with no lease, nothing predicts it.
    clock.advance(21_000);
    expect(budget.state().queue[0]).toMatchObject({
      etaMs: 1000,
      etaBasis: "when 'npm run build' ends (it usually runs 42s (2 runs) and has run longer; its longest run took 44s)",
    });
    clock.advance(4000);
    expect(budget.state().queue[0]).toMatchObject({
      etaMs: undefined,
      etaBasis: "unknown: it waits for 'npm run build' (6G, 1 cpu) to end, and nothing says when: no lease, and it has run longer than any of its 2 past runs",
    });
    budget.release(build.id);
    flush();
    await settle();
    budget.release(next.reservation!.id);
    // A leased reservation with no past runs: its lease's end.
    const leased = await budget.reserve(need(6, 1), "client", { ttlMs: 10_000 });
    admit(budget, need(4, 1), "after");
    flush();
    const after = budget.state().queue.find((q) => q.owner === "after");
    expect(after).toMatchObject({ etaMs: 10_000, etaBasis: "when 'client' ends (its lease runs out unless renewed)" });
    budget.release(leased.id);
  });

  it("state shows committed items, the queue with positions and ETAs, reservations, running, policy and sample", async () => {
    const { budget, clock, flush } = await setup();
    const r = await budget.admit(need(6, 1), "first");
    admit(budget, need(4, 1), "a");
    admit(budget, need(4, 1), "b");
    clock.advance(2000);
    flush();
    const state = budget.state();
    // 'first' holds the budget with no lease and no past runs: nothing predicts when it ends.
    expect(state.queue).toEqual([
      expect.objectContaining({
        owner: "a",
        position: 1,
        waitedMs: 2000,
        etaMs: undefined,
        etaBasis: "unknown: it waits for 'first' (6G, 1 cpu) to end, and nothing says when: no lease, no past runs",
        needs: { memoryBytes: 4 * G, cpu: 1 },
      }),
      expect.objectContaining({ owner: "b", position: 2, waitedMs: 2000, etaMs: undefined, etaBasis: "unknown: a request ahead of it has no estimate" }),
    ]);
    expect(state.waitFor.map((w) => w.gate)).toEqual(["memory_budget"]);
    expect(state.reservations).toEqual([expect.objectContaining({ id: r.id, owner: "first", start: { memoryBytes: 6 * G, cpu: 1 } })]);
    expect(state.committed.items).toEqual([expect.objectContaining({ kind: "reservation", label: "first" })]);
    expect(state.policy.memoryBytes).toBe(8 * G);
    expect(state.sample?.availableBytes).toBe(64 * G);
    expect(state.holdMs).toBe(60_000);
    expect(state.freeMemoryBytes).toBe(58 * G);
    // The moving hold estimate follows releases (0.7 x old + 0.3 x held).
    budget.release(r.id);
    expect(budget.state().holdMs).toBe(Math.round(60_000 * 0.7 + 2000 * 0.3));
  });

  it("check reads the cached sample and names what holds the budget", async () => {
    const { budget } = await setup({ sample: { load1: 100 } });
    await budget.admit(need(2, 1), "first", { skipLoadGate: true });
    const verdict = budget.check(need(7, 1));
    expect(verdict.fits).toBe(false);
    expect(verdict.reasons.map((r) => r.gate)).toEqual(["memory_budget", "load"]);
    expect(verdict.committed.items.map((i) => i.label)).toEqual(["first"]);
    expect(budget.check(need(1, 1), { skipLoadGate: true }).fits).toBe(true);
  });

  it("watchMachine yields the latest sample, then each new one, and ends on close", async () => {
    const { budget, sampler } = await setup();
    const iterator = budget.watchMachine()[Symbol.asyncIterator]();
    expect((await iterator.next()).value?.sample.availableBytes).toBe(64 * G);
    const next = iterator.next();
    sampler.set({ availableBytes: 10 * G });
    expect((await next).value?.sample.availableBytes).toBe(10 * G);
    const last = iterator.next();
    await budget.close();
    expect((await last).done).toBe(true);
  });

  it("close refuses the waiters and leaves no timer behind", async () => {
    const { budget, clock } = await setup();
    await budget.reserve(need(6, 1), "leased", { ttlMs: 10_000 });
    const firstWaiter = admit(budget, need(4, 1), "first-waiter");
    await budget.close();
    await settle();
    expect(firstWaiter.error?.code).toBe("unavailable");
    expect(clock.pendingTimers()).toBe(0);
    await expect(budget.admit(need(1, 1), "late")).rejects.toMatchObject({ code: "unavailable" });
  });

  it("refuses malformed input naming the field", async () => {
    const { budget } = await setup();
    await expect(budget.admit(need(1, 1), "")).rejects.toMatchObject({ code: "invalid_argument", message: expect.stringMatching(/^owner: /) });
    await expect(budget.admit({ items: [], start: { memoryBytes: -1, cpu: 0 }, build: { memoryBytes: 0, cpu: 0 } }, "x")).rejects.toMatchObject({
      code: "invalid_argument",
      message: expect.stringMatching(/^need.start.memoryBytes: /),
    });
    await expect(budget.admit({ items: [], start: { memoryBytes: 0, cpu: Number.NaN }, build: { memoryBytes: 0, cpu: 0 } }, "x")).rejects.toMatchObject({
      code: "invalid_argument",
    });
    await expect(budget.registerRunning("x", { memoryBytes: G, cpu: -1 })).rejects.toMatchObject({ code: "invalid_argument" });
    await expect(budget.reserve(need(1, 1), "x", { ttlMs: 0 })).rejects.toMatchObject({ code: "invalid_argument" });
    expect(() => budget.releaseBuild("nope")).toThrow(/no reservation nope/);
    expect(() => budget.needOf([{ kind: "start", name: "web", spec: { memoryBytes: -1 } }])).toThrow(
      "items[0].spec.memoryBytes: must be a whole, non-negative number of bytes; got -1",
    );
  });

  it("costs and needs use the current policy's defaults", async () => {
    const { budget } = await setup();
    expect(budget.costs(undefined, undefined).run).toEqual({ memoryBytes: 512 * M, cpu: 0.5, declared: false });
    expect(
      budget.needOf([
        { kind: "start", name: "web" },
        { kind: "build", name: "web", wave: 0 },
      ]),
    ).toMatchObject({
      start: { memoryBytes: 512 * M, cpu: 0.5 },
      build: { memoryBytes: 2 * G, cpu: 1 },
    });
  });
});
