/** The lock table's persistence in memory (a test double): tokens from 1, nothing outlives the object. */
import type { LockPersistence } from "../lock-persistence.js";

export function createMemoryLockPersistence(first = 1): LockPersistence {
  let next = first;
  return {
    next: () => next++,
    peek: () => next,
    close() {},
  };
}
