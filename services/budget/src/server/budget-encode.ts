/**
 * From the budget's domain values to `berth.budget.v1` messages, with the figures the proto
 * promises and the domain leaves implicit (a gate's `observed`, the `holders` of a budget gate,
 * `in flight: <owner>`).
 */
import { create } from "@bufbuild/protobuf";
import type { Duration } from "@bufbuild/protobuf/wkt";
import { durationFromMs, timestampFromMs } from "@berth/wire/time";
import {
  ConsumerSchema,
  CgroupLimitsSchema,
  CgroupVersion,
  CommittedItemSchema,
  CommittedSchema,
  CostSchema,
  Gate,
  MachineSchema,
  NeedTotalsSchema,
  PolicySchema,
  PressureAveragesSchema,
  PressureSchema,
  QueueEntrySchema,
  QueueMode,
  ReservationSchema,
  ResourcesSchema,
  RunningEntrySchema,
  SampleSource,
  VerdictSchema,
  WaitReasonSchema,
} from "@berth/api/berth/budget/v1/budget_pb";
import type {
  CommittedItem as CommittedItemMessage,
  Committed as CommittedMessage,
  Cost as CostMessage,
  Machine,
  NeedTotals,
  Policy as PolicyMessage,
  PressureAverages,
  Pressure,
  QueueEntry,
  Reservation as ReservationMessage,
  Resources as ResourcesMessage,
  RunningEntry as RunningEntryMessage,
  Verdict as VerdictMessage,
  WaitReason,
} from "@berth/api/berth/budget/v1/budget_pb";
import { FleetMachineSchema, type FleetMachine } from "@berth/api/berth/budget/v1/budget_service_pb";
import type {
  Committed,
  CommittedItem,
  Cost,
  FleetEntry,
  MachineSample,
  Need,
  Policy,
  PressureFigures,
  QueueEntryInfo,
  Reason,
  ReservationInfo,
  Resources,
  RunningAnswer,
  RunningEntry,
  Verdict,
} from "../index.js";

/** How many holders a budget gate's reason lists (the largest). */
export const MAX_HOLDERS = 10;

/** Milliseconds as a Duration; a time already past (negative) is zero. */
export function durationOf(ms: number): Duration {
  return durationFromMs(Math.max(0, ms));
}

/** Clock milliseconds as a Timestamp. */
export const timestampOf = timestampFromMs;

function bytes(n: number): bigint {
  return BigInt(Math.max(0, Math.round(n)));
}

/** Resources as a message. */
export function resourcesToProto(resources: Resources): ResourcesMessage {
  return create(ResourcesSchema, { memoryBytes: bytes(resources.memoryBytes), cpu: resources.cpu });
}

/** A cost as a message. */
export function costToProto(cost: Cost): CostMessage {
  return create(CostSchema, { memoryBytes: bytes(cost.memoryBytes), cpu: cost.cpu, declared: cost.declared });
}

/** A need's parts: start, build, and the whole. */
export function needTotalsToProto(need: Pick<Need, "start" | "build">): NeedTotals {
  return create(NeedTotalsSchema, {
    start: resourcesToProto(need.start),
    build: resourcesToProto(need.build),
    total: resourcesToProto({ memoryBytes: need.start.memoryBytes + need.build.memoryBytes, cpu: need.start.cpu + need.build.cpu }),
  });
}

/** What a committed item is, for people: "in flight: <owner>" or "running: <name>". */
export function committedWhat(item: CommittedItem): string {
  return item.kind === "reservation" ? `in flight: ${item.label}` : `running: ${item.label}`;
}

/** One committed item as a message. */
export function committedItemToProto(item: CommittedItem): CommittedItemMessage {
  return create(CommittedItemSchema, { what: committedWhat(item), memoryBytes: bytes(item.memoryBytes), cpu: item.cpu, id: item.id });
}

/**
 * What is committed, as a message (reservations holding nothing are already left out by the domain;
 * the items come largest first): with `limit`, only the first `limit` items, `item_count` saying how
 * many there are.
 */
export function committedToProto(committed: Committed, limit = Number.POSITIVE_INFINITY): CommittedMessage {
  const items = committed.items.length > limit ? committed.items.slice(0, limit) : committed.items;
  return create(CommittedSchema, {
    memoryBytes: bytes(committed.memoryBytes),
    cpu: committed.cpu,
    items: items.map(committedItemToProto),
    itemCount: committed.items.length,
  });
}

function pressureAverages(figures: PressureFigures): PressureAverages {
  return create(PressureAveragesSchema, { avg10: figures.avg10, avg60: figures.avg60, avg300: figures.avg300, total: durationOf(figures.total / 1000) });
}

function pressureToProto(figures: PressureFigures | undefined): Pressure | undefined {
  // The sampler keeps the "some" line only (the one the cpu gate reads): "full" stays unset.
  return figures === undefined ? undefined : create(PressureSchema, { some: pressureAverages(figures) });
}

const optionalBytes = (n: number | undefined) => (n === undefined ? undefined : bytes(n));

/** The cores a sample lets the service use: online cpus capped by the cgroup's quota and cpuset, at least 1. */
export function coresOf(sample: MachineSample): number {
  const limit = sample.cpuLimit === undefined ? sample.cores : Math.min(sample.cores, Math.ceil(sample.cpuLimit));
  return Math.max(1, Math.floor(limit));
}

/** A machine sample as a message; undefined before the first sample. */
export function machineToProto(sample: MachineSample | undefined): Machine | undefined {
  if (sample === undefined) return undefined;
  const cgroup = sample.cgroup;
  return create(MachineSchema, {
    sampleTime: timestampOf(sample.at),
    totalBytes: optionalBytes(sample.totalBytes),
    availableBytes: optionalBytes(sample.availableBytes),
    load1: sample.load1,
    load5: sample.load5,
    load15: sample.load15,
    cores: coresOf(sample),
    cpuPressure: pressureToProto(sample.pressure.cpu),
    memoryPressure: pressureToProto(sample.pressure.memory),
    ioPressure: pressureToProto(sample.pressure.io),
    cgroup:
      cgroup === undefined
        ? undefined
        : create(CgroupLimitsSchema, {
            path: cgroup.path,
            memoryMax: optionalBytes(cgroup.memoryLimitBytes),
            memoryCurrent: optionalBytes(cgroup.memoryCurrentBytes),
            memoryInactiveFile: optionalBytes(cgroup.inactiveFileBytes),
            // What the cgroup can still take is the sample's available memory when the cgroup is the source.
            memoryAvailable: sample.source === "cgroup" ? optionalBytes(sample.availableBytes) : undefined,
            cpuQuota: cgroup.cpuQuota,
            cpusetCpus: cgroup.cpusetCpus,
            version: cgroup.version === "v1" ? CgroupVersion.V1 : CgroupVersion.V2,
          }),
    source: sample.source === "cgroup" ? SampleSource.CGROUP : SampleSource.HOST,
  });
}

/** Settings the proto's Policy reports besides the domain policy (they belong to the server). */
export interface PolicyExtras {
  sampleIntervalMs: number;
  defaultLeaseTtlMs: number;
}

/** The policy as a message. */
export function policyToProto(policy: Policy, extras: PolicyExtras): PolicyMessage {
  return create(PolicySchema, {
    enabled: policy.enabled,
    memoryBytes: bytes(policy.memoryBytes),
    cpu: policy.cpu,
    reserveBytes: bytes(policy.reserveBytes),
    cpuPressure: policy.cpuPressure,
    loadPerCore: policy.loadPerCore,
    maxWait: durationOf(policy.maxWaitMs),
    maxQueue: policy.maxQueue,
    defaultRun: resourcesToProto(policy.defaultRun),
    defaultBuild: resourcesToProto(policy.defaultBuild),
    queueMode: policy.queueMode === "backfill" ? QueueMode.BACKFILL : QueueMode.FIFO,
    heartbeat: durationOf(policy.heartbeatMs),
    sampleInterval: durationOf(extras.sampleIntervalMs),
    defaultLeaseTtl: durationOf(extras.defaultLeaseTtlMs),
  });
}

function gateOf(gate: Reason["gate"]): Gate {
  switch (gate) {
    case "memory_budget":
      return Gate.MEMORY_BUDGET;
    case "cpu_budget":
      return Gate.CPU_BUDGET;
    case "free_memory":
      return Gate.FREE_MEMORY;
    case "cpu_pressure":
      return Gate.CPU_PRESSURE;
    case "load":
      return Gate.LOAD;
    case "queue":
      return Gate.QUEUE;
  }
}

/** What a reason is judged against, for the figures the domain leaves implicit. */
export interface ReasonContext {
  committed: Committed;
  sample?: MachineSample | undefined;
}

/** The largest holders of a budget gate's resource. */
function holdersOf(committed: Committed, by: "memoryBytes" | "cpu"): CommittedItemMessage[] {
  return committed.items
    .filter((item) => item[by] > 0)
    .sort((a, b) => b[by] - a[by])
    .slice(0, MAX_HOLDERS)
    .map(committedItemToProto);
}

/**
 * A reason as a WaitReason, with `observed` per the proto's table (committed amount for the budget
 * gates, sampled free memory, min(avg10, avg60) of cpu pressure, the 1-minute load, requests ahead)
 * and, for the budget gates, the largest holders.
 */
export function waitReasonToProto(reason: Reason, context: ReasonContext, aheadCount = 0): WaitReason {
  let observed = reason.observed ?? 0;
  let holders: CommittedItemMessage[] = [];
  switch (reason.gate) {
    case "memory_budget":
      observed = context.committed.memoryBytes;
      holders = holdersOf(context.committed, "memoryBytes");
      break;
    case "cpu_budget":
      observed = context.committed.cpu;
      holders = holdersOf(context.committed, "cpu");
      break;
    case "free_memory":
      observed = context.sample?.availableBytes ?? 0;
      break;
    case "cpu_pressure": {
      const psi = context.sample?.pressure.cpu;
      if (psi) observed = Math.min(psi.avg10, psi.avg60);
      break;
    }
    case "queue":
      observed = aheadCount;
      break;
    case "load":
      break;
  }
  return create(WaitReasonSchema, {
    gate: gateOf(reason.gate),
    message: reason.message,
    needed: reason.needed ?? 0,
    available: reason.available ?? 0,
    limit: reason.limit ?? 0,
    setting: reason.setting ?? "",
    holders,
    observed,
    consumers: (reason.consumers ?? []).map((c) =>
      create(ConsumerSchema, {
        name: c.name,
        pid: c.pid ?? 0,
        processes: c.processes,
        memoryBytes: BigInt(Math.round(c.memoryBytes)),
        cpu: c.cpu,
        berth: c.berth,
      }),
    ),
  });
}

/** The parts of a verdict that repeat across checks, converted once by the caller (see {@link verdictToProto}). */
export interface VerdictParts {
  policy: PolicyMessage;
  machine?: Machine | undefined;
  committed: CommittedMessage;
}

/** The parts of a verdict converted here (for callers that do not cache them). */
export function verdictParts(verdict: Verdict, extras: PolicyExtras): VerdictParts {
  return { policy: policyToProto(verdict.policy, extras), machine: machineToProto(verdict.sample), committed: committedToProto(verdict.committed) };
}

/** The verdict as a message; `need` is the need judged (for its start and build parts). */
export function verdictToProto(verdict: Verdict, need: Pick<Need, "start" | "build">, parts: VerdictParts): VerdictMessage {
  const context = { committed: verdict.committed, sample: verdict.sample };
  const reasons = verdict.reasons.map((r) => waitReasonToProto(r, context));
  const impossible = verdict.impossible !== undefined;
  return create(VerdictSchema, {
    fits: verdict.fits,
    impossible: verdict.impossible,
    impossibleReason: impossible ? reasons[0] : undefined,
    waitFor: impossible ? [] : reasons,
    waitForText: impossible ? "" : (verdict.waitFor ?? ""),
    need: needTotalsToProto(need),
    committed: parts.committed,
    machine: parts.machine,
    policy: parts.policy,
    admittedSinceSampleBytes: bytes(verdict.unseenMemoryBytes),
  });
}

/** A reservation as the proto shows it (the domain's Reservation or a `state()` copy, `ReservationInfo`). */
export function reservationToProto(reservation: ReservationInfo, runningIds: readonly string[] = []): ReservationMessage {
  return create(ReservationSchema, {
    id: reservation.id,
    owner: reservation.owner,
    start: resourcesToProto(reservation.start),
    build: resourcesToProto(reservation.build),
    admitTime: timestampOf(reservation.admittedAt),
    expireTime: reservation.leaseExpiresAt === undefined ? undefined : timestampOf(reservation.leaseExpiresAt),
    runningIds: [...runningIds],
  });
}

/** RegisterRunning's answer (and Admit's `updated` for `started`): the entry, and the reservation as it stood then. */
export function runningAnswerToProto(answer: RunningAnswer): { running: RunningEntryMessage; reservation: ReservationMessage | undefined } {
  return {
    running: runningEntryToProto(answer.running),
    reservation: answer.reservation === undefined ? undefined : reservationToProto(answer.reservation, answer.reservation.runningIds),
  };
}

/** A running entry as a message. */
export function runningEntryToProto(entry: RunningEntry): RunningEntryMessage {
  return create(RunningEntrySchema, {
    id: entry.id,
    name: entry.name,
    cost: resourcesToProto(entry.cost),
    pid: entry.pid,
    pidStartTime: entry.pidStartTime === undefined ? undefined : BigInt(entry.pidStartTime),
    expireTime: entry.leaseExpiresAt === undefined ? undefined : timestampOf(entry.leaseExpiresAt),
    startTime: timestampOf(entry.startedAt),
    reservationId: entry.reservationId,
  });
}

/**
 * The queue's entries as messages. Entry k waits for k-1 requests ahead, then for what the first
 * waiter waits for (`firstWaiterReasons`, judged once for the whole queue). The holders of those
 * reasons are listed on the first waiter's entry only: they are the same for everyone, and repeating them on every
 * entry of a long queue would push GetState past the message size limit (10,000 waiters: 4.4 MB
 * with them, 3.7 MB without).
 */
export function queueToProto(entries: readonly QueueEntryInfo[], firstWaiterReasons: readonly Reason[], context: ReasonContext): QueueEntry[] {
  const withHolders = firstWaiterReasons.map((r) => waitReasonToProto(r, context));
  const withoutHolders = withHolders.map((r) => (r.holders.length === 0 ? r : create(WaitReasonSchema, { ...r, holders: [] })));
  const firstWaiterText = firstWaiterReasons.map((r) => r.message).join("; ");
  return entries.map((entry) => {
    const ahead = entry.position - 1;
    const waitFor = ahead === 0 ? withHolders : [queueWaitReason(ahead), ...withoutHolders];
    const text = ahead === 0 ? firstWaiterText : `${ahead} request(s) ahead in the queue${firstWaiterText ? `; ${firstWaiterText}` : ""}`;
    return create(QueueEntrySchema, {
      id: entry.id,
      owner: entry.owner,
      position: entry.position,
      ...(entry.etaMs === undefined ? {} : { eta: durationOf(entry.etaMs) }),
      etaBasis: entry.etaBasis,
      waitFor,
      waitForText: text,
      // The queue keeps a waiter's whole need only: its start and build parts are not reported.
      need: create(NeedTotalsSchema, { total: resourcesToProto(entry.needs) }),
      enqueueTime: timestampOf(entry.queuedAt),
      waitExpireTime: timestampOf(entry.deadline),
    });
  });
}

/** The GATE_QUEUE reason of a request with `ahead` requests before it. */
export function queueWaitReason(ahead: number): WaitReason {
  return create(WaitReasonSchema, { gate: Gate.QUEUE, message: `${ahead} request(s) ahead in the queue`, observed: ahead });
}

/** A machine of the fleet as its budget published it. */
export function fleetMachineToProto(entry: FleetEntry): FleetMachine {
  return create(FleetMachineSchema, {
    machine: entry.machine,
    hostname: entry.hostname,
    pid: entry.pid,
    publishTime: timestampOf(entry.publishedAt),
    sample: machineToProto(entry.sample),
    enabled: entry.enabled,
    budget: resourcesToProto(entry.budget),
    committed: resourcesToProto(entry.committed),
    room: resourcesToProto(entry.room),
    cpuBusy: entry.cpuBusy,
    queueLength: entry.queueLength,
    reservationCount: entry.reservationCount,
    runningCount: entry.runningCount,
  });
}
