import { ManualClock } from "@berth/shared/clock";
import { describe, expect, it } from "vitest";
import { DeadlineHeap } from "./deadline-heap.js";

interface Item {
  name: string;
  deadline: number;
  heapIndex: number;
}

function setup() {
  const clock = new ManualClock();
  const fired: string[][] = [];
  const heap = new DeadlineHeap<Item>(clock, (expired) => fired.push(expired.map((i) => i.name)));
  const item = (name: string, inMs: number): Item => ({ name, deadline: clock.monotonicNow() + inMs, heapIndex: -1 });
  return { clock, fired, heap, item };
}

describe("DeadlineHeap", () => {
  it("expires items in deadline order, a batch due together in one call, behind one timer", () => {
    const { clock, fired, heap, item } = setup();
    for (const [name, ms] of [
      ["c", 300],
      ["a", 100],
      ["d", 300],
      ["b", 200],
      ["e", 500],
    ] as const)
      heap.add(item(name, ms));
    expect(clock.pendingTimers()).toBe(1);
    clock.advance(100);
    expect(fired).toEqual([["a"]]);
    clock.advance(250);
    expect(fired.length).toBe(3);
    expect(fired[1]).toEqual(["b"]);
    expect([...fired[2]!].sort()).toEqual(["c", "d"]);
    expect(heap.size).toBe(1);
    expect(clock.pendingTimers()).toBe(1);
  });

  it("a deleted item never expires, and the timer follows the new earliest deadline", () => {
    const { clock, fired, heap, item } = setup();
    const early = item("early", 100);
    heap.add(early);
    heap.add(item("late", 400));
    heap.delete(early);
    expect(early.heapIndex).toBe(-1);
    heap.delete(early);
    clock.advance(399);
    expect(fired).toEqual([]);
    clock.advance(1);
    expect(fired).toEqual([["late"]]);
    expect(clock.pendingTimers()).toBe(0);
  });

  it("keeps its order through many adds and deletes", () => {
    const { clock, fired, heap, item } = setup();
    const items = Array.from({ length: 200 }, (_, i) => item(`i${i}`, ((i * 7919) % 1000) + 1));
    for (const i of items) heap.add(i);
    for (const i of items.filter((_, n) => n % 3 === 0)) heap.delete(i);
    clock.advance(1000);
    const expected = items.filter((_, n) => n % 3 !== 0).sort((x, y) => x.deadline - y.deadline);
    expect(fired.flat()).toEqual(expected.map((i) => i.name));
  });

  it("runs no timer after close", () => {
    const { clock, fired, heap, item } = setup();
    heap.add(item("a", 100));
    heap.close();
    heap.add(item("b", 50));
    expect(clock.pendingTimers()).toBe(0);
    clock.advance(1000);
    expect(fired).toEqual([]);
  });
});
