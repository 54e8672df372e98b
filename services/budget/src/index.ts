/**
 * @berth/budget: admission control for a developer's machine, as a library. The RPC layer
 * (`server/`) maps `berth.budget.v1.BudgetService` onto {@link createBudget}.
 */
export * from "./costs.js";
export * from "./policy.js";
export * from "./sampler.js";
export * from "./verdict.js";
export * from "./reservations.js";
export * from "./running-tally.js";
export * from "./admission-queue.js";
export type { AheadEntry, QueuedUpdate } from "./queue-line.js";
export { AHEAD_LIMIT, HEARTBEAT_RATE_CAP, heartbeatPeriodMs } from "./queue-notifier.js";
// The seed's ETA rule, which the ETA benchmark measures berth's estimate against, and the usual
// times it follows beside the service's to tell why an estimate missed.
export { etaOf } from "./queue-refusals.js";
export { RunTimes, type UsualTime } from "./run-times.js";
export * from "./budget-interface.js";
export * from "./budget.js";
export type { BudgetAnswer, RunningAnswer } from "./keyed-requests.js";
export { DEFAULT_ADMIT_RESUME_GRACE_MS, type AdmitAttachment, type AdmitStreamEnd, type AdmitStreamHooks, type AttachResult } from "./resumable-admissions.js";
export * from "./fleet.js";
export { ProcessTable, topConsumers, type Consumer, type ProcessReading, type ProcessUsage } from "./process-table.js";
