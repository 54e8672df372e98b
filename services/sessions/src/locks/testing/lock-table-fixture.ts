/** For the lock table's tests: a table on a manual clock, its fencing counter in memory. */
import { ManualClock } from "@berth/shared/clock";
import { LockTable, type LockTableOptions } from "../lock-table.js";
import { createMemoryLockPersistence } from "./memory-lock-persistence.js";

/** A fencing counter in memory, for a table a test builds itself. */
export function counter() {
  return createMemoryLockPersistence();
}

export function table(clock = new ManualClock(), options: Pick<LockTableOptions, "limits" | "maxEndedKeys"> = {}) {
  return { clock, locks: new LockTable({ clock, fencing: counter(), ...options }) };
}
