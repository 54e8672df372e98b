/**
 * @berth/budget: admission control for a developer's machine, as a library. The RPC layer
 * (`server/`) maps `berth.budget.v1.BudgetService` onto {@link createBudget}.
 */
export {
  checkResources,
  type Cost,
  type CostDefaults,
  costsOf,
  isZero,
  type Need,
  needFromItems,
  type NeedItem,
  type NeedItemInput,
  type NeedKind,
  needOf,
  resolveItems,
  type Resources,
  total,
} from "./costs.js";
export {
  defaultPolicy,
  loadPolicy,
  type MachineFacts,
  type MemoryAmount,
  parseMemoryAmount,
  type Policy,
  POLICY_SETTINGS,
  policyFromConfig,
  type PolicyValues,
  type QueueMode,
  validatePolicy,
} from "./policy.js";
export {
  type CgroupFigures,
  createSampler,
  machineFactsOf,
  type MachineSample,
  type MachineSampler,
  ManualSampler,
  parsePressure,
  type PressureFigures,
  readMachineSample,
  type ReadOptions,
  type Sampler,
  SAMPLER_SETTINGS,
  type SamplerOptions,
  samplerOptionsFromConfig,
  type SampleSource,
} from "./sampler.js";
export {
  check,
  type CheckOptions,
  type Committed,
  type CommittedItem,
  CONSUMERS_NAMED,
  consumerText,
  CPU_GATES,
  cpuGate,
  freeMemory,
  GATE,
  type Gate,
  gatesKey,
  IMPOSSIBLE,
  type Reason,
  reasonsFor,
  reasonsText,
  refusingGates,
  type Verdict,
  type VerdictContext,
} from "./verdict.js";
export {
  type ConsumeOptions,
  INITIAL_HOLD_MS,
  Reservation,
  ReservationBook,
  type ReservationBookOptions,
  type ReservationChange,
  reservationNotFound,
  type ReservationSnapshot,
  type ReservedNeed,
} from "./reservations.js";
export { type RegisterOptions, type RunningChange, type RunningEntry, runningFilePath, RunningTally, type RunningTallyOptions } from "./running-tally.js";
export { AdmissionQueue, type AdmitOptions, type QueuedRequest, type QueueEntryInfo, type QueueHost, type QueueRequestChange } from "./admission-queue.js";
export type { AheadEntry, QueuedUpdate } from "./queue-line.js";
export { AHEAD_LIMIT, HEARTBEAT_RATE_CAP, heartbeatPeriodMs } from "./queue-notifier.js";
// The seed's ETA rule, which the ETA benchmark measures berth's estimate against, and the usual
// times it follows beside the service's to tell why an estimate missed.
export { etaOf } from "./queue-refusals.js";
export { RunTimes, type UsualTime } from "./run-times.js";
export {
  type Budget,
  type BudgetChange,
  type BudgetOptions,
  type BudgetState,
  type BudgetWatch,
  type BudgetWatchOptions,
  DEFAULT_WATCH_BUFFER,
  DEFAULT_WATCH_HISTORY,
  type KeyedOptions,
  type KeyLimits,
  type ReservationInfo,
  type ReserveOptions,
  type RevisionedSample,
  type RunningOptions,
  SAMPLE_HISTORY,
} from "./budget-interface.js";
export { createBudget } from "./budget.js";
export type { BudgetAnswer, RunningAnswer } from "./keyed-requests.js";
export { DEFAULT_ADMIT_RESUME_GRACE_MS, type AdmitAttachment, type AdmitStreamEnd, type AdmitStreamHooks, type AttachResult } from "./resumable-admissions.js";
export {
  DEFAULT_FLEET_MIN_INTERVAL_MS,
  type FleetEntry,
  fleetEntryOf,
  type FleetIdentity,
  type FleetPublisher,
  type FleetReportOptions,
  type FleetReports,
  startFleetReports,
} from "./fleet.js";
export { ProcessTable, topConsumers, type Consumer, type ProcessReading, type ProcessUsage } from "./process-table.js";
