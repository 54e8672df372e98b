/**
 * Between `berth.budget.v1` messages and the budget's domain values, in both directions.
 *
 * Inbound, every field is checked here before the domain sees it, and a wrong one is refused with
 * INVALID_ARGUMENT naming it by its proto path (`need.items[2].spec.memory`, `max_wait`,
 * `started.pid`): the domain then only ever receives plain numbers it accepts. Outbound, domain
 * values become messages, with the figures the proto promises and the domain leaves implicit (a
 * gate's `observed`, the `holders` of a budget gate, `in flight: <owner>`).
 */
import { create, toBinary } from "@bufbuild/protobuf";
import { BinaryWriter, WireType } from "@bufbuild/protobuf/wire";
import type { Duration, Timestamp } from "@bufbuild/protobuf/wkt";
import { DurationSchema, TimestampSchema } from "@bufbuild/protobuf/wkt";
import { preEncodedField } from "@berth/shared/server/pre-encoded";
import {
  CgroupLimitsSchema,
  CommittedItemSchema,
  CommittedSchema,
  CostSchema,
  Gate,
  MachineSchema,
  NeedItemKind,
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
  Need as NeedMessage,
  NeedTotals,
  Policy as PolicyMessage,
  PressureAverages,
  Pressure,
  QueueEntry,
  Reservation as ReservationMessage,
  ResourceSpec as ResourceSpecMessage,
  Resources as ResourcesMessage,
  RunningEntry as RunningEntryMessage,
  Verdict as VerdictMessage,
  WaitReason,
} from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitResponse, AheadEntry as AheadEntryMessage, Queued } from "@berth/api/berth/budget/v1/budget_service_pb";
import { AdmitResponseSchema, AheadEntrySchema, QueuedSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { invalidArgument } from "@berth/shared/errors";
import { formatDuration, LONGEST_TIMER_MS } from "@berth/shared/units";
import type {
  AheadEntry,
  Committed,
  CommittedItem,
  Cost,
  MachineSample,
  Need,
  NeedItemInput,
  NeedKind,
  Policy,
  PressureFigures,
  QueueEntryInfo,
  QueuedUpdate,
  Reason,
  ReservationInfo,
  Resources,
  ResourceSpec,
  RunningEntry,
  Verdict,
} from "../index.js";
import { parseCpu, parseMemory } from "../index.js";

// --- limits ------------------------------------------------------------------------------------

/** The longest duration a request may give: 24 days, what Node's timers can wait rounded down. */
export const MAX_DURATION_MS = LONGEST_TIMER_MS;
/** The longest id accepted (reservation and running entry ids are UUIDs). */
export const MAX_ID_LENGTH = 128;
/** The longest owner or name accepted, in characters (GetLimits' `max_owner_length`). */
export const MAX_OWNER_LENGTH = 256;
/** The longest request id accepted. */
export const MAX_REQUEST_ID_LENGTH = 128;
/** How many ids one KeepAlive may renew. */
export const MAX_KEEPALIVE_IDS = 10_000;
/** How many holders a budget gate's reason lists (the largest). */
export const MAX_HOLDERS = 10;

// --- inbound: checks -----------------------------------------------------------------------------

/** An owner or name: 1 to 256 characters, not only blanks, no control characters. */
export function checkName(value: string, field: string): string {
  if (value.trim() === "" || value.length > MAX_OWNER_LENGTH) throw invalidArgument(field, `must be 1 to ${MAX_OWNER_LENGTH} characters, not only blanks`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(value)) throw invalidArgument(field, "must not contain control characters");
  return value;
}

/** A reservation or running entry id: non-empty, at most 128 printable ASCII characters. */
export function checkId(value: string, field: string): string {
  if (value === "") throw invalidArgument(field, "is required");
  if (value.length > MAX_ID_LENGTH || !/^[\x21-\x7e]+$/.test(value)) {
    throw invalidArgument(field, `must be an id as the service returned it (at most ${MAX_ID_LENGTH} printable characters)`);
  }
  return value;
}

/** A request id: undefined when empty (none), else 1 to 128 characters of `[A-Za-z0-9._-]`. */
export function checkRequestId(value: string, field = "request_id"): string | undefined {
  if (value === "") return undefined;
  if (value.length > MAX_REQUEST_ID_LENGTH || !/^[A-Za-z0-9._-]+$/.test(value)) {
    throw invalidArgument(field, `must be at most ${MAX_REQUEST_ID_LENGTH} characters of A-Z, a-z, 0-9, '.', '_' and '-' (a UUID is a good choice)`);
  }
  return value;
}

/** The lease ttls a request may give: the default for unset (or zero, see {@link leaseTtlMs}), the most it may ask. */
export interface LeaseLimits {
  defaultTtlMs: number;
  maxTtlMs: number;
}

/**
 * A lease's ttl as milliseconds: zero is the default ttl, and so is unset unless `unsetIsNone`
 * (RegisterRunning: no lease); longer than the maximum is refused naming `field`.
 */
export function leaseTtlMs(duration: Duration | undefined, field: string, limits: LeaseLimits, options: { unsetIsNone?: boolean } = {}): number | undefined {
  if (duration === undefined && options.unsetIsNone) return undefined;
  const ms = durationMs(duration, field);
  if (ms === undefined || ms === 0) return limits.defaultTtlMs;
  if (ms > limits.maxTtlMs) throw invalidArgument(field, `must be at most ${formatDuration(limits.maxTtlMs)} (the longest lease, BERTH_BUDGET_MAX_LEASE_TTL); got ${formatDuration(ms)}`);
  return ms;
}

/** A request's `max_wait` as milliseconds: unset is the policy's longest wait, zero does not queue, longer is capped to the longest wait. */
export function maxWaitMs(duration: Duration | undefined, field: string, longestMs: number): number {
  const asked = durationMs(duration, field);
  return Math.min(asked ?? longestMs, longestMs);
}

/**
 * A Duration as milliseconds, or undefined when unset. Negative, malformed (nanos out of range)
 * or longer than {@link MAX_DURATION_MS} is refused naming `field`; `positive` refuses zero too.
 */
export function durationMs(duration: Duration | undefined, field: string, options: { positive?: boolean } = {}): number | undefined {
  if (duration === undefined) return undefined;
  const { seconds, nanos } = duration;
  if (!Number.isInteger(nanos) || nanos < 0 || nanos > 999_999_999) throw invalidArgument(field, `nanos must be 0 to 999999999 for a non-negative duration; got ${nanos}`);
  if (seconds < 0n) throw invalidArgument(field, `must not be negative; got ${seconds}s`);
  const tooLong = () => invalidArgument(field, `must be at most ${formatDuration(MAX_DURATION_MS)}; got ${formatDuration(Number(seconds) * 1000 + nanos / 1e6)}`);
  if (seconds > BigInt(Math.ceil(MAX_DURATION_MS / 1000))) throw tooLong();
  const ms = Number(seconds) * 1000 + Math.round(nanos / 1e6);
  if (ms > MAX_DURATION_MS) throw tooLong();
  if (options.positive && ms <= 0) throw invalidArgument(field, "must be a positive duration (at least 1ms)");
  return ms;
}

function bytesOf(value: bigint, field: string): number {
  if (value < 0n || value > BigInt(Number.MAX_SAFE_INTEGER)) throw invalidArgument(field, `must be 0 to ${Number.MAX_SAFE_INTEGER} bytes; got ${value}`);
  return Number(value);
}

function cpuOf(value: number, field: string): number {
  if (!Number.isFinite(value) || value < 0) throw invalidArgument(field, `must be a finite, non-negative number of cpus; got ${value}`);
  return value;
}

/** Resources sent in bytes and cores, checked. */
export function resourcesFromProto(message: ResourcesMessage | CostMessage | undefined, field: string): Resources {
  if (message === undefined) return { memoryBytes: 0, cpu: 0 };
  return { memoryBytes: bytesOf(message.memoryBytes, `${field}.memory_bytes`), cpu: cpuOf(message.cpu, `${field}.cpu`) };
}

/** A spec's run part (or, with `build`, its build part), parsed: memory in bytes, cpu in cores; undefined parts stay undefined. */
function specAmount(spec: ResourceSpecMessage, field: string, build: boolean): { memory?: number | undefined; cpu?: number | undefined } {
  if (build) {
    const part = spec.build;
    if (part === undefined) return {};
    return { memory: parseMemory(part.memory, `${field}.build.memory`), cpu: parseCpu(part.cpu, `${field}.build.cpu`) };
  }
  // The build part is checked too: a malformed value is refused wherever it is.
  if (spec.build !== undefined) specAmount(spec, field, true);
  return { memory: parseMemory(spec.memory, `${field}.memory`), cpu: parseCpu(spec.cpu, `${field}.cpu`) };
}

/** A ResourceSpec as the domain takes it (sizes parsed to bytes), checked field by field. */
export function resourceSpecFromProto(spec: ResourceSpecMessage | undefined, field = "spec"): ResourceSpec | undefined {
  if (spec === undefined) return undefined;
  const run = specAmount(spec, field, false);
  const result: ResourceSpec = { memory: run.memory, cpu: run.cpu };
  if (spec.build !== undefined) result.build = specAmount(spec, field, true);
  return result;
}

function needKind(kind: NeedItemKind, field: string): NeedKind {
  switch (kind) {
    case NeedItemKind.BUILD:
      return "build";
    case NeedItemKind.START:
      return "start";
    case NeedItemKind.APPLIANCE:
      return "appliance";
    default:
      throw invalidArgument(field, `must be NEED_ITEM_KIND_BUILD, NEED_ITEM_KIND_START or NEED_ITEM_KIND_APPLIANCE; got ${kind}`);
  }
}

/**
 * A Need's items as the domain takes them: each checked (kind, name, sizes, cpu), costs in bytes and
 * cores; items without a cost keep none, for the policy's default. An unset need is empty.
 */
export function needItemsFromProto(need: NeedMessage | undefined, field = "need"): NeedItemInput[] {
  if (need === undefined) return [];
  return need.items.map((item, index) => {
    const at = `${field}.items[${index}]`;
    const kind = needKind(item.kind, `${at}.kind`);
    const input: NeedItemInput = { kind, name: checkName(item.name, `${at}.name`) };
    switch (item.costSource.case) {
      case "cost": {
        const cost = resourcesFromProto(item.costSource.value, `${at}.cost`);
        input.spec = { memory: cost.memoryBytes, cpu: cost.cpu };
        break;
      }
      case "spec":
        input.spec = specAmount(item.costSource.value, `${at}.spec`, kind === "build");
        break;
      default:
        break;
    }
    if (item.skipped !== undefined) {
      if (item.skipped.length > 1024) throw invalidArgument(`${at}.skipped`, "must be at most 1024 characters");
      // An empty reason still means "skipped": the domain reads truthiness, so give it one.
      input.skipped = item.skipped === "" ? "skipped" : item.skipped;
    }
    if (item.wave !== undefined) input.wave = item.wave;
    return input;
  });
}

/**
 * A running service's cost: `cost` as sent, the run part of `spec` with `undeclared` for what it
 * leaves out, or `undeclared` when neither is set (the domain's `runCostOf`: what its reservation
 * was admitted with for it, else the policy's default).
 */
export function runCostFromProto(
  source: { case: "cost"; value: ResourcesMessage } | { case: "spec"; value: ResourceSpecMessage } | { case: undefined; value?: undefined },
  undeclared: Resources,
  field = "",
): Resources {
  const at = (name: string) => (field === "" ? name : `${field}.${name}`);
  switch (source.case) {
    case "cost":
      return resourcesFromProto(source.value, at("cost"));
    case "spec": {
      const run = specAmount(source.value, at("spec"), false);
      return { memoryBytes: run.memory ?? undeclared.memoryBytes, cpu: run.cpu ?? undeclared.cpu };
    }
    default:
      return { ...undeclared };
  }
}

/** A pid as sent: a positive int32, or undefined when unset. */
export function pidFromProto(pid: number | undefined, field: string): number | undefined {
  if (pid === undefined) return undefined;
  if (!Number.isInteger(pid) || pid <= 0) throw invalidArgument(field, `must be a positive process id; got ${pid}`);
  return pid;
}

// --- outbound ------------------------------------------------------------------------------------

/** Milliseconds as a Duration. */
export function durationOf(ms: number): Duration {
  const whole = Math.max(0, Math.round(ms));
  return create(DurationSchema, { seconds: BigInt(Math.floor(whole / 1000)), nanos: (whole % 1000) * 1_000_000 });
}

/** Clock milliseconds as a Timestamp. */
export function timestampOf(ms: number): Timestamp {
  const whole = Math.round(ms);
  const seconds = Math.floor(whole / 1000);
  return create(TimestampSchema, { seconds: BigInt(seconds), nanos: (whole - seconds * 1000) * 1_000_000 });
}

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
 * The queue's entries as messages. Entry k waits for k-1 requests ahead, then for what the head
 * waits for (`headReasons`, judged once for the whole queue). The holders of those reasons are
 * listed on the head's entry only: they are the same for everyone, and repeating them on every
 * entry of a long queue would push GetState past the message size limit (10,000 waiters: 4.4 MB
 * with them, 3.7 MB without).
 */
export function queueToProto(entries: readonly QueueEntryInfo[], headReasons: readonly Reason[], context: ReasonContext): QueueEntry[] {
  const atHead = headReasons.map((r) => waitReasonToProto(r, context));
  const head = atHead.map((r) => (r.holders.length === 0 ? r : create(WaitReasonSchema, { ...r, holders: [] })));
  const headText = headReasons.map((r) => r.message).join("; ");
  return entries.map((entry) => {
    const ahead = entry.position - 1;
    const waitFor = ahead === 0 ? atHead : [queueWaitReason(ahead), ...head];
    const text = ahead === 0 ? headText : `${ahead} request(s) ahead in the queue${headText ? `; ${headText}` : ""}`;
    return create(QueueEntrySchema, {
      owner: entry.owner,
      position: entry.position,
      eta: durationOf(entry.etaMs),
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

/** A stream's deadline: clock ms, and its Timestamp encoded. */
export interface QueuedDeadline {
  readonly ms: number;
  readonly bytes: Uint8Array;
}

/**
 * Builds `Queued` messages for a stream of updates. Heartbeats repeat the same head reasons and the
 * same requests ahead to every waiter, so their messages are converted once (by identity: the
 * queue hands every waiter the same objects until they change) and shared.
 *
 * {@link response} picks the form: for a call whose messages are protobuf binary, the hot path
 * {@link encodeResponse}, the AdmitResponse of a heartbeat with its `queued` field already in wire
 * form; for any other call (JSON) the real message, since JSON serialization skips a pre-encoded
 * field (see the server's pre-encoded.ts). With 10,000 waiters every beat is 10,000 messages;
 * encoding each through the reflective writer cost a dozen nested messages and half a dozen growing
 * buffers apiece, while here the parts shared by every waiter are encoded once and each message is
 * one pass of a reused writer. The bytes are the same as `toBinary` of {@link encode}'s message
 * (tested).
 */
export class QueuedEncoder {
  private readonly reasons = new WeakMap<Reason, WaitReason>();
  private readonly reasonBytes = new WeakMap<Reason, Uint8Array>();
  private readonly aheadLists = new WeakMap<readonly AheadEntry[], AheadEntryMessage[]>();
  private readonly aheadBytes = new WeakMap<readonly AheadEntry[], Uint8Array>();
  /** Reused for every message: `finish()` hands out a copy and keeps the grown buffer. */
  private readonly writer = new BinaryWriter();

  constructor(private readonly context: () => ReasonContext) {}

  /** A stream's deadline (clock ms) in both forms the responses need: it never changes. */
  static deadline(ms: number): QueuedDeadline {
    return { ms, bytes: toBinary(TimestampSchema, timestampOf(ms)) };
  }

  /** `AdmitResponse{queued}` for `update`: pre-encoded when `binary` (the call's messages are protobuf binary), else a real message. */
  response(update: QueuedUpdate, deadline: QueuedDeadline, binary: boolean): AdmitResponse {
    if (binary) return this.encodeResponse(update, deadline.bytes);
    return create(AdmitResponseSchema, { kind: { case: "queued", value: this.encode(update, deadline.ms) } });
  }

  /** The Queued message for `update`, for a request whose wait runs out at `deadline` (clock ms). */
  encode(update: QueuedUpdate, deadline: number): Queued {
    const waitFor = update.waitFor.map((reason) => (reason.gate === "queue" ? queueWaitReason(update.aheadCount) : this.reason(reason)));
    let ahead = this.aheadLists.get(update.ahead);
    if (ahead === undefined) {
      ahead = update.ahead.map((entry, index) => create(AheadEntrySchema, { owner: entry.owner, position: index + 1, need: resourcesToProto(entry.needs) }));
      this.aheadLists.set(update.ahead, ahead);
    }
    return create(QueuedSchema, {
      position: update.position,
      eta: durationOf(update.etaMs),
      waitFor,
      waitForText: update.waitForText,
      ahead,
      waitExpireTime: timestampOf(deadline),
    });
  }

  /** `AdmitResponse{queued: encode(update, deadline)}`, with the queued field already encoded (see the class comment). */
  encodeResponse(update: QueuedUpdate, deadlineBytes: Uint8Array): AdmitResponse {
    const w = this.writer;
    // The queued field's payload, length-prefixed: what follows its tag on the wire.
    w.fork();
    w.tag(1, WireType.Varint).uint32(update.position);
    const eta = Math.max(0, Math.round(update.etaMs));
    w.tag(2, WireType.LengthDelimited).fork();
    if (eta >= 1000) w.tag(1, WireType.Varint).int64(Math.floor(eta / 1000));
    if (eta % 1000 !== 0) w.tag(2, WireType.Varint).int32((eta % 1000) * 1_000_000);
    w.join();
    for (const reason of update.waitFor) {
      if (reason.gate === "queue") {
        w.tag(3, WireType.LengthDelimited).fork();
        w.tag(1, WireType.Varint).int32(Gate.QUEUE);
        w.tag(2, WireType.LengthDelimited).string(`${update.aheadCount} request(s) ahead in the queue`);
        if (update.aheadCount !== 0) w.tag(8, WireType.Bit64).double(update.aheadCount);
        w.join();
      } else {
        w.tag(3, WireType.LengthDelimited).bytes(this.reasonBytesOf(reason));
      }
    }
    if (update.waitForText !== "") w.tag(4, WireType.LengthDelimited).string(update.waitForText);
    w.raw(this.aheadBytesOf(update.ahead));
    w.tag(6, WireType.LengthDelimited).bytes(deadlineBytes);
    w.join();
    const response = create(AdmitResponseSchema);
    response.$unknown = [preEncodedField(1, w.finish())];
    return response;
  }

  private reason(reason: Reason): WaitReason {
    let converted = this.reasons.get(reason);
    if (converted === undefined) {
      converted = waitReasonToProto(reason, this.context());
      this.reasons.set(reason, converted);
    }
    return converted;
  }

  private reasonBytesOf(reason: Reason): Uint8Array {
    let bytes = this.reasonBytes.get(reason);
    if (bytes === undefined) {
      bytes = toBinary(WaitReasonSchema, this.reason(reason));
      this.reasonBytes.set(reason, bytes);
    }
    return bytes;
  }

  /** Every entry of `ahead` as field 5 of Queued (tag, length, AheadEntry), in one block. */
  private aheadBytesOf(ahead: readonly AheadEntry[]): Uint8Array {
    let bytes = this.aheadBytes.get(ahead);
    if (bytes === undefined) {
      const w = new BinaryWriter();
      ahead.forEach((entry, index) => {
        const message = create(AheadEntrySchema, { owner: entry.owner, position: index + 1, need: resourcesToProto(entry.needs) });
        w.tag(5, WireType.LengthDelimited).bytes(toBinary(AheadEntrySchema, message));
      });
      bytes = w.finish();
      this.aheadBytes.set(ahead, bytes);
    }
    return bytes;
  }
}
