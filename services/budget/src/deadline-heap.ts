/**
 * Deadlines of many waiters behind one timer: a binary min-heap by deadline, so adding or removing
 * a waiter is O(log n) and a batch of expiries is handled in one go, whatever the number waiting.
 * Deadlines are monotonic-clock readings (the clock's `monotonicNow()`), so a step of the wall
 * clock neither ends a wait early nor stretches it.
 */
import type { Clock, TimerHandle } from "@berth/shared/clock";

/** What the heap keeps: a deadline, and the slot the heap writes its place into (-1 when out of it). */
export interface Deadlined {
  readonly deadline: number;
  heapIndex: number;
}

/** A min-heap of items by deadline with the one timer that expires them. */
export class DeadlineHeap<T extends Deadlined> {
  private readonly heap: T[] = [];
  private timer: TimerHandle | undefined;
  private timerAt = Number.POSITIVE_INFINITY;
  private closed = false;

  /** `onExpired` gets every item whose deadline has passed, earliest first, already out of the heap. */
  constructor(
    private readonly clock: Clock,
    private readonly onExpired: (expired: T[], now: number) => void,
  ) {}

  get size(): number {
    return this.heap.length;
  }

  add(item: T): void {
    item.heapIndex = this.heap.length;
    this.heap.push(item);
    this.siftUp(item.heapIndex);
    this.arm();
  }

  /** Takes `item` out (nothing when it is not in). */
  delete(item: T): void {
    if (item.heapIndex < 0) return;
    this.removeAt(item.heapIndex);
    if (this.timer !== undefined || this.heap.length > 0) this.arm();
  }

  /** Stops the timer for good: nothing expires after this. */
  close(): void {
    this.closed = true;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
  }

  private expire(): void {
    this.timer = undefined;
    this.timerAt = Number.POSITIVE_INFINITY;
    const now = this.clock.monotonicNow();
    const expired: T[] = [];
    while (this.heap.length > 0 && this.heap[0]!.deadline <= now) expired.push(this.pop()!);
    if (expired.length > 0) this.onExpired(expired, now);
    this.arm();
  }

  private arm(): void {
    if (this.closed) return;
    const next = this.heap[0]?.deadline ?? Number.POSITIVE_INFINITY;
    if (next === this.timerAt) return;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.timerAt = next;
    if (next !== Number.POSITIVE_INFINITY) this.timer = this.clock.setTimeout(() => this.expire(), next - this.clock.monotonicNow());
  }

  private pop(): T | undefined {
    const top = this.heap[0];
    if (top) this.removeAt(0);
    return top;
  }

  private removeAt(index: number): void {
    const heap = this.heap;
    const removed = heap[index]!;
    const last = heap.pop()!;
    removed.heapIndex = -1;
    if (index < heap.length) {
      heap[index] = last;
      last.heapIndex = index;
      this.siftUp(index);
      this.siftDown(last.heapIndex);
    }
  }

  private siftUp(index: number): void {
    const heap = this.heap;
    while (index > 0) {
      const parent = (index - 1) >> 1;
      if (heap[parent]!.deadline <= heap[index]!.deadline) break;
      this.swap(index, parent);
      index = parent;
    }
  }

  private siftDown(index: number): void {
    const heap = this.heap;
    for (;;) {
      const left = index * 2 + 1;
      const right = left + 1;
      let smallest = index;
      if (left < heap.length && heap[left]!.deadline < heap[smallest]!.deadline) smallest = left;
      if (right < heap.length && heap[right]!.deadline < heap[smallest]!.deadline) smallest = right;
      if (smallest === index) return;
      this.swap(index, smallest);
      index = smallest;
    }
  }

  private swap(a: number, b: number): void {
    const heap = this.heap;
    const wa = heap[a]!;
    const wb = heap[b]!;
    heap[a] = wb;
    heap[b] = wa;
    wa.heapIndex = b;
    wb.heapIndex = a;
  }
}
