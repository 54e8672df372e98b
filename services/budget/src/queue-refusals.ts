/** The admission queue's refusals, its ETA and the reason every waiter behind the first waiter shares. */
import { BerthError } from "@berth/shared/errors";
import { formatDuration } from "@berth/shared/units";
import type { Reason } from "./verdict.js";
import { reasonsText } from "./verdict.js";

/** The seed's ETA: position x the moving hold time, less the time already waited; at least 1 s. */
export function etaOf(position: number, holdMs: number, waitedMs: number): number {
  return Math.max(1000, position * holdMs - waitedMs);
}

/** The reason of a waiter with `ahead` requests before it. */
export function queueReason(ahead: number): Reason {
  return { gate: "queue", message: `${ahead} request(s) ahead in the queue`, needed: undefined, available: undefined, limit: undefined, setting: undefined };
}

/** The seed's refusal when a need can never fit. */
export function impossibleError(owner: string, reasons: Reason[]): BerthError {
  return new BerthError(
    "failed_precondition",
    `the load budget can never admit '${owner}': ${reasons[0]?.message ?? "it is bigger than the whole budget"}. Declare smaller resources or raise the budget`,
    { kind: "impossible", gate: reasons[0]?.gate, reasons },
    { reason: "IMPOSSIBLE" },
  );
}

/**
 * What would help, for the gates that hold a need: each gate's own remedies, so that a request the
 * cpu holds is not told to raise a memory budget that would change nothing.
 */
export function adviceFor(reasons: readonly Reason[]): string {
  const gates = new Set(reasons.map((r) => r.gate));
  const advice: string[] = [];
  if (gates.has("memory_budget"))
    advice.push(
      "For memory: stop berth work you do not need (named above; 'berth budget state' lists it), declare less memory, or raise BERTH_BUDGET_MEMORY: the budget, not the machine, is the limit",
    );
  if (gates.has("cpu_budget"))
    advice.push("For cpu: stop berth work you do not need, declare fewer cpus, or raise BERTH_BUDGET_CPU: the budget, not the machine, is the limit");
  if (gates.has("free_memory"))
    advice.push(
      "The machine itself is short of memory: stop a process named above, or declare less memory; a bigger budget would not help (BERTH_BUDGET_RESERVE is what it keeps free)",
    );
  if (gates.has("cpu_pressure") || gates.has("load"))
    advice.push(
      "The cpu is busy: wait and try again, stop a process named above, or, when the work is light, skip the load gate (--skip-load-gate; it skips this gate only, the memory gates still apply)",
    );
  if (advice.length === 0) advice.push("Requests ahead of it hold its turn: wait longer (--max-wait, BERTH_BUDGET_WAIT) or try again later");
  return advice.join(". ");
}

/** The refusal of a request whose wait ran out (or, with a wait of zero, that could not be admitted at once). */
export function waitExhaustedError(
  owner: string,
  waitedMs: number,
  position: number,
  reasons: Reason[],
  retryAfterMs: number,
  text = reasonsText(reasons) ?? "its turn",
): BerthError {
  const waited =
    waitedMs === 0
      ? `'${owner}' does not fit now and asked not to wait`
      : `waited ${formatDuration(waitedMs)} for the load budget and '${owner}' still does not fit`;
  return new BerthError(
    "resource_exhausted",
    `${waited} — ${text}. ${adviceFor(reasons)}`,
    { kind: "wait_exhausted", position, reasons, retryAfterMs, waitedMs },
    { reason: "WAIT_EXHAUSTED", retryAfterMs },
  );
}

/** The refusal of a full queue. */
export function queueFullError(owner: string, waiting: number, retryAfterMs: number): BerthError {
  return new BerthError(
    "resource_exhausted",
    `the load budget's queue is full (${waiting} waiting, BERTH_BUDGET_MAX_QUEUE) — '${owner}' was not queued; retry later`,
    { kind: "queue_full", waiting, setting: "BERTH_BUDGET_MAX_QUEUE", retryAfterMs },
    { reason: "QUEUE_FULL", retryAfterMs },
  );
}

export function cancelledError(owner: string): BerthError {
  return new BerthError("cancelled", `'${owner}' was dropped from the load budget's queue: its caller disconnected`, { kind: "cancelled" });
}

export function closedError(owner: string): BerthError {
  return new BerthError("unavailable", `the budget service is shutting down; '${owner}' was not admitted — retry once it is back`, { kind: "closed" });
}
