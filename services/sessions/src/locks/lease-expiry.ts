/**
 * Lease timers of the lock table (lock-table.ts): one timer per lease on the injected clock,
 * measured on its monotonic reading, and the catching up after a pause, when several leases ran
 * out at once and must end in the order their times came.
 */
import { STALL_MS, type Clock } from "@berth/shared/clock";
import type { Entry, Held } from "./lock-entries.js";

/** What expiry needs of the table. */
export interface ExpiryHost {
  readonly clock: Clock;
  /** Every lease held. */
  leases(): Iterable<Held>;
  /** The entry `held` holds now; undefined once it holds nothing. */
  entryHeldBy(held: Held): Entry | undefined;
  /** Ends `held` as expired (it holds `entry`). */
  expire(entry: Entry, held: Held): void;
  /** Hands the freed lock of `entry` to its queue. */
  pump(entry: Entry): void;
}

/** Whether `held`'s time is up, whether or not its timer fired yet (a busy event loop, a pause). */
export function isDue(clock: Clock, held: Held | undefined): held is Held {
  return held !== undefined && held.deadline !== null && clock.monotonicNow() >= held.deadline;
}

/**
 * Ends every lease whose time is up, in the order their times came, and hands on each freed lock
 * but `except`'s (its caller does). After a pause several leases are overdue at once, and the
 * first to be looked at (a renewal read before the timers ran) need not be the first that ran out.
 */
export function expireOverdue(host: ExpiryHost, except?: Entry): void {
  const now = host.clock.monotonicNow();
  const due: Held[] = [];
  for (const held of host.leases()) if (held.deadline !== null && held.deadline <= now) due.push(held);
  due.sort((a, b) => a.deadline! - b.deadline!);
  const freed: Entry[] = [];
  for (const held of due) {
    const entry = host.entryHeldBy(held);
    if (!entry) continue;
    host.expire(entry, held);
    if (entry !== except) freed.push(entry);
  }
  for (const entry of freed) host.pump(entry);
}

/** (Re)starts the timer that ends `held` when its time is up; a hold has none. */
export function scheduleExpiry(host: ExpiryHost, held: Held): void {
  if (held.timer !== undefined) host.clock.clearTimeout(held.timer);
  const deadline = held.deadline;
  if (deadline === null) return;
  held.timer = host.clock.setTimeout(() => {
    delete held.timer;
    const entry = host.entryHeldBy(held);
    if (!entry) return;
    // A real timer may fire a hair early; never cut a lease short.
    const now = host.clock.monotonicNow();
    if (now < deadline) return scheduleExpiry(host, held);
    // Late by more than a moment (the process was paused): others may be overdue too, and earlier.
    if (now - deadline > STALL_MS) return expireOverdue(host);
    host.expire(entry, held);
    host.pump(entry);
  }, deadline - host.clock.monotonicNow());
}
