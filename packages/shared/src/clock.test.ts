import * as net from "node:net";
import { describe, expect, it } from "vitest";
import { ManualClock, reportTimerErrorsTo, STALL_MS, systemClock, wallTimeOf } from "./clock.js";

describe("ManualClock", () => {
  it("moves both readings together and fires timers by monotonic time", () => {
    const clock = new ManualClock(1_000_000, 50);
    const fired: Array<[string, number, number]> = [];
    clock.setTimeout(() => fired.push(["b", clock.now(), clock.monotonicNow()]), 20);
    clock.setTimeout(() => fired.push(["a", clock.now(), clock.monotonicNow()]), 10);
    clock.advance(30);
    expect(fired).toEqual([
      ["a", 1_000_010, 60],
      ["b", 1_000_020, 70],
    ]);
    expect([clock.now(), clock.monotonicNow()]).toEqual([1_000_030, 80]);
  });

  it("steps the wall clock alone: no timer moves, a monotonic deadline shows at its new wall time", () => {
    const clock = new ManualClock(1_000_000, 0);
    let fired = false;
    clock.setTimeout(() => (fired = true), 1000);
    const deadline = clock.monotonicNow() + 1000;
    clock.stepWall(-3_600_000);
    expect(clock.now()).toBe(1_000_000 - 3_600_000);
    expect(clock.monotonicNow()).toBe(0);
    expect(wallTimeOf(clock, deadline)).toBe(clock.now() + 1000);
    clock.stepWall(7_200_000);
    clock.advance(999);
    expect(fired).toBe(false);
    clock.advance(1);
    expect(fired).toBe(true);
  });

  it("stalls like a stopped process: time moves, nothing runs until the next advance, then in order", () => {
    const clock = new ManualClock(0, 0);
    const fired: string[] = [];
    clock.setTimeout(() => fired.push("second"), 200);
    clock.setTimeout(() => fired.push("first"), 100);
    clock.stall(30_000);
    expect(fired).toEqual([]);
    expect([clock.now(), clock.monotonicNow()]).toEqual([30_000, 30_000]);
    clock.advance(0);
    expect(fired).toEqual(["first", "second"]);
    expect(clock.pendingTimers()).toBe(0);
  });
});

describe("systemClock", () => {
  it("reads a monotonic clock that never goes back, and wall time in whole milliseconds", () => {
    const a = systemClock.monotonicNow();
    const b = systemClock.monotonicNow();
    expect(b).toBeGreaterThanOrEqual(a);
    expect(Number.isInteger(wallTimeOf(systemClock, a + 0.4))).toBe(true);
    expect(Math.abs(wallTimeOf(systemClock, systemClock.monotonicNow()) - Date.now())).toBeLessThan(50);
  });
});

describe("reportTimerErrorsTo", () => {
  it("hands a timer callback's throw to the reporter instead of ending the process, and is undone", async () => {
    const reported: unknown[] = [];
    const undo = reportTimerErrorsTo((error) => reported.push(error));
    try {
      await new Promise<void>((resolve) => {
        systemClock.setTimeout(() => {
          setImmediate(resolve);
          throw new Error("EMFILE: too many open files");
        }, 0);
      });
      expect(reported).toEqual([new Error("EMFILE: too many open files")]);
    } finally {
      undo();
    }
    // Undone: a throw goes to Node again (caught here by the test's own handler).
    const uncaught = new Promise<unknown>((resolve) => process.once("uncaughtException", resolve));
    const listeners = process.listeners("uncaughtException");
    systemClock.setTimeout(() => {
      throw new Error("thrown");
    }, 0);
    expect(await uncaught).toEqual(new Error("thrown"));
    expect(process.listeners("uncaughtException").length).toBe(listeners.length - 1);
  });
});

describe("systemClock.whenAwake", () => {
  it("runs after the loop has read the I/O that has arrived, in call order, even when the loop was away for over STALL_MS", async () => {
    const order: string[] = [];
    systemClock.whenAwake(() => order.push("first"));
    systemClock.whenAwake(() => order.push("second"));
    expect(order).toEqual([]);
    await new Promise((resolve) => setImmediate(resolve));
    expect(order).toEqual(["first", "second"]);
    // The loop is away (as a stopped process is): nothing runs for longer than STALL_MS.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, STALL_MS + 300);
    systemClock.whenAwake(() => order.push("awake"));
    expect(order).toEqual(["first", "second"]);
    await new Promise((resolve) => setImmediate(resolve));
    expect(order).toEqual(["first", "second", "awake"]);
  });

  it("waits for the end of a connection that is already there when a due timer hands something out, paused or not", async () => {
    const server = net.createServer((socket) => socket.on("error", () => {}));
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as net.AddressInfo;
    const accepted = new Promise<net.Socket>((resolve) => server.once("connection", resolve));
    const client = net.connect(port, "127.0.0.1");
    const socket = await accepted;
    let ended = false;
    socket.on("end", () => (ended = true));
    socket.resume();
    const seen: boolean[] = [];
    await new Promise<void>((resolve) => {
      systemClock.setTimeout(() => {
        seen.push(ended);
        systemClock.whenAwake(() => {
          seen.push(ended);
          resolve();
        });
      }, 0);
      // The client's FIN (destroy closes its descriptor at once) is in the server's socket, and the
      // timer due, before the loop runs again: it runs the due timer before it reads the socket.
      client.destroy();
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
    });
    expect(seen).toEqual([false, true]);
    server.close();
  });
});
