/** What the budget's encoder tests encode: a committed total with its holders, and two wait reasons. */
import type { Committed, Reason } from "../index.js";

export const G = 1024 ** 3;

export const committed: Committed = {
  memoryBytes: 7 * G,
  cpu: 3,
  items: [
    { kind: "running", id: "r1", label: "db", memoryBytes: 1 * G, cpu: 2 },
    { kind: "reservation", id: "a1", label: "up web", memoryBytes: 6 * G, cpu: 1 },
  ],
};

export const memoryReason: Reason = {
  gate: "memory_budget",
  message: "memory: needs 2G, the budget has 1G of 8G free (berth has committed 7G)",
  needed: 2 * G,
  available: G,
  limit: 8 * G,
  setting: "BERTH_BUDGET_MEMORY",
};

export const queueReason = (ahead: number): Reason => ({ gate: "queue", message: `${ahead} request(s) ahead in the queue` });
