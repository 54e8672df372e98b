/**
 * The admission queue's line: waiters in arrival order. A waiter that leaves is only marked
 * removed, so leaving is O(1) whatever its place; the line drops the marked ones when it is walked
 * anyway (a flush of positions, a heartbeat tick), in one pass.
 */
import type { BerthError } from "@berth/shared/errors";
import type { Need, Resources } from "./costs.js";
import type { Reservation } from "./reservations.js";
import type { Reason } from "./verdict.js";

/** A request ahead of a waiter, and what it asks for. */
export interface AheadEntry {
  owner: string;
  needs: Resources;
}

/** What a waiter hears while it waits. */
export interface QueuedUpdate {
  /** 1 is the first waiter. */
  position: number;
  /** Estimated wait left (eta.ts); undefined when nothing predicts it. */
  etaMs: number | undefined;
  /** What `etaMs` rests on, or why there is none. */
  etaBasis: string;
  /** Why it waits: requests ahead (gate "queue"), then the first waiter's refusing gates. */
  waitFor: Reason[];
  /** The same, written out as the seed does. */
  waitForText: string;
  /** Up to `AHEAD_LIMIT` requests ahead of it, from the first waiter. */
  ahead: AheadEntry[];
  /** How many requests are ahead of it in all. */
  aheadCount: number;
}

/** One queued request. */
export interface Waiter {
  id: string;
  seq: number;
  owner: string;
  need: Need;
  want: Resources;
  skipLoadGate: boolean;
  /** When it was queued and when its wait runs out (monotonic clock). */
  queuedAt: number;
  deadline: number;
  onQueued: ((update: QueuedUpdate) => void) | undefined;
  resolve: (reservation: Reservation) => void;
  reject: (error: BerthError) => void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
  removed: boolean;
  /** Its place in the deadline heap. */
  heapIndex: number;
  /** What it was last told: a new position or a new key of the first waiter's refusal means it hears again. */
  lastPosition: number;
  lastKey: string;
  lastNotifiedAt: number;
}

/** The first waiter and the gates that refuse it, computed once per event. */
export interface FirstWaiterState {
  waiter: Waiter;
  gates: number;
}

/** What waiters compare to know whether the first waiter's refusal changed. */
export function gatesKeyOf(gates: number): string {
  return String(gates);
}

/** Waiters in arrival order, removed ones marked until the next compaction. */
export class QueueLine {
  /** Arrival order; entries before `firstIndex` and those marked removed are gone. */
  waiters: Waiter[] = [];
  firstIndex = 0;
  /** How many are not removed. */
  live = 0;

  push(waiter: Waiter): void {
    this.waiters.push(waiter);
    this.live++;
  }

  /** Marks `waiter` removed; false when it already was. */
  markRemoved(waiter: Waiter): boolean {
    if (waiter.removed) return false;
    waiter.removed = true;
    this.live--;
    return true;
  }

  /** The first waiter not removed, skipping past removed ones for good. */
  first(): Waiter | undefined {
    while (this.firstIndex < this.waiters.length && this.waiters[this.firstIndex]!.removed) this.firstIndex++;
    return this.waiters[this.firstIndex];
  }

  /** Drops removed waiters; returns where the waiter at index `cursor` now is, so a cursor stays on the same waiter. */
  compact(cursor: number): number {
    if (this.firstIndex === 0 && this.waiters.length === this.live) return cursor;
    const kept: Waiter[] = [];
    let moved = 0;
    for (let i = 0; i < this.waiters.length; i++) {
      const w = this.waiters[i]!;
      if (w.removed) continue;
      if (i < cursor) moved++;
      kept.push(w);
    }
    this.waiters = kept;
    this.firstIndex = 0;
    return moved;
  }

  /** Forgets every waiter (the queue closed). */
  clear(): void {
    this.waiters = [];
    this.firstIndex = 0;
  }
}
