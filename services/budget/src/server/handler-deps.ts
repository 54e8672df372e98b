/** What the budget's RPC handlers share: the unary handlers with the Admit stream, and their counters with the server's gauges. */
import type { Clock } from "@berth/shared/clock";
import type { Budget } from "../index.js";
import type { LeaseLimits } from "./budget-decode.js";
import type { ReasonContext } from "./budget-encode.js";
import type { QueuedEncoder } from "./queued-encoder.js";

/** What the handlers count. */
export interface BudgetHandlerStats {
  /** Queued messages sent on Admit streams (position changes and heartbeats). */
  queuedMessages: number;
}

/** What the Admit stream shares with the unary handlers. */
export interface BudgetHandlerDeps {
  budget: Budget;
  clock: Clock;
  encoder: QueuedEncoder;
  /** The committed items and latest sample, for the figures of wait reasons. */
  reasonContext: () => ReasonContext;
  /** The lease ttls in force now. */
  leaseLimits(): LeaseLimits;
  stats: BudgetHandlerStats;
}
