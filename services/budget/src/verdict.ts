/**
 * The verdict: would a need be admitted right now, ignoring the queue? A pure function of the need,
 * the policy, what berth has committed and the latest machine sample, with the seed's rules and
 * words:
 *
 * - a disabled budget or a need of nothing always fits;
 * - a need bigger than the whole budget (memory, then cpu) can never fit: `impossible`;
 * - otherwise it waits while committed + need exceeds the memory or cpu budget, while free memory
 *   minus the need would fall below the reserve, or while the CPU is saturated: PSI cpu "some" at or
 *   over the limit over both the last 10 s and the last minute (a spike that is over holds no one),
 *   or, without PSI, the 1-minute load average above `loadPerCore` x cores. `skipLoadGate` skips
 *   only that CPU gate.
 *
 * Beyond the seed: memory admitted since the sample was taken is not in the sample yet, so it is
 * taken off the sampled free memory (`unseenMemoryBytes`); two requests admitted within one
 * sample interval cannot both spend the same free memory.
 */
import { formatSize } from "@berth/shared/units";
import type { Resources } from "./costs.js";
import { isZero } from "./costs.js";
import type { Policy } from "./policy.js";
import type { Consumer } from "./process-table.js";
import type { MachineSample } from "./sampler.js";

/** The gate a reason comes from. `queue` is the queue itself: requests ahead, or a full queue. */
export type Gate = "memory_budget" | "cpu_budget" | "free_memory" | "cpu_pressure" | "load" | "queue";

/** One reason a need does not fit (or can never fit): the facts, and the words. */
export interface Reason {
  gate: Gate;
  /** The seed's sentence for it, naming the setting that changes it. */
  message: string;
  /** What the need asks of this gate (bytes or cpus). */
  needed?: number | undefined;
  /** What the gate has for it now (bytes or cpus). */
  available?: number | undefined;
  /** The gate's limit: the budget, the reserve, the pressure percent, the load ceiling. */
  limit?: number | undefined;
  /** What the machine shows, for the CPU gates: PSI avg10 percent, or the 1-minute load. */
  observed?: number | undefined;
  /** The environment variable that changes the limit. */
  setting?: string | undefined;
  /** The largest users of what the gate is short of, largest first: berth's own work for the budget gates, the machine's processes for the others. */
  consumers?: Consumer[] | undefined;
}

/** How many consumers a reason names. */
export const CONSUMERS_NAMED = 3;

/** One contributor to what berth has committed. */
export interface CommittedItem {
  kind: "reservation" | "running";
  /** The reservation's or running entry's id. */
  id: string;
  /** For people: the reservation's owner, or the running entry's name. */
  label: string;
  memoryBytes: number;
  cpu: number;
}

/** What berth has committed: running work plus every in-flight reservation, and who holds it. */
export interface Committed extends Resources {
  items: CommittedItem[];
}

/** What the verdict is judged against. */
export interface VerdictContext {
  policy: Policy;
  committed: Committed;
  /** The latest machine sample; without one, only the budget gates apply. */
  sample?: MachineSample | undefined;
  /** Memory admitted since `sample` was taken, which it cannot show yet. */
  unseenMemoryBytes?: number | undefined;
  /** The machine's largest users of memory and of cpu (process-table.ts), asked for only when a machine gate refuses. */
  machineConsumers?: { memory(): Consumer[]; cpu(): Consumer[] } | undefined;
}

/** Options of a check. */
export interface CheckOptions {
  /** A wake of work that ran recently: the CPU gate is skipped, the memory gates still apply. */
  skipLoadGate?: boolean | undefined;
}

/** The answer to "would this fit now?". */
export interface Verdict {
  fits: boolean;
  /** Set when the need can never fit, whatever is released: the seed's sentence. */
  impossible?: string | undefined;
  /** Why it does not fit (the impossible reason alone when impossible), in gate order. */
  reasons: Reason[];
  /** The reasons' messages joined with "; ", or undefined when it fits. */
  waitFor?: string | undefined;
  /** The need's whole (start + build). */
  need: Resources;
  committed: Committed;
  sample?: MachineSample | undefined;
  policy: Policy;
  /** Sampled free memory less what was admitted since the sample (undefined without a sample). */
  freeMemoryBytes?: number | undefined;
  unseenMemoryBytes: number;
}

/** Bit flags of the gates that refuse a need, for the hot path (no strings, no allocation). */
export const GATE = {
  memoryBudget: 1,
  cpuBudget: 2,
  freeMemory: 4,
  cpuPressure: 8,
  load: 16,
  impossibleMemory: 32,
  impossibleCpu: 64,
} as const;

/** The CPU gates' bits. */
export const CPU_GATES = GATE.cpuPressure | GATE.load;
/** The bits of "can never fit". */
export const IMPOSSIBLE = GATE.impossibleMemory | GATE.impossibleCpu;

/** Free memory as the free-memory gate sees it: the sample's available memory less what it cannot show yet. */
export function freeMemory(context: VerdictContext): number | undefined {
  const available = context.sample?.availableBytes;
  return available === undefined ? undefined : available - (context.unseenMemoryBytes ?? 0);
}

/** Which CPU gate the machine closes now (independent of the need), or 0. */
export function cpuGate(policy: Policy, sample: MachineSample | undefined): number {
  if (!sample) return 0;
  const psi = sample.pressure.cpu;
  if (psi) {
    // PSI says what the load average only hints at: how much of the time runnable work actually
    // WAITED for a cpu. Both windows must be over the limit, so a spike that is already over holds no one.
    return policy.cpuPressure < 100 && psi.avg10 >= policy.cpuPressure && psi.avg60 >= policy.cpuPressure ? GATE.cpuPressure : 0;
  }
  if (sample.load1 !== undefined && sample.load1 > policy.loadPerCore * sample.cores) return GATE.load;
  return 0;
}

/**
 * The gates that refuse `need` now, as {@link GATE} bits (0: it fits). The same rules as
 * {@link check} without building a single string: the queue calls it for every candidate.
 */
export function refusingGates(need: Resources, context: VerdictContext, options: CheckOptions = {}): number {
  const { policy, committed } = context;
  if (!policy.enabled || isZero(need)) return 0;
  if (need.memoryBytes > policy.memoryBytes) return GATE.impossibleMemory;
  if (need.cpu > policy.cpu) return GATE.impossibleCpu;
  let gates = 0;
  if (committed.memoryBytes + need.memoryBytes > policy.memoryBytes) gates |= GATE.memoryBudget;
  if (committed.cpu + need.cpu > policy.cpu) gates |= GATE.cpuBudget;
  const free = freeMemory(context);
  if (free !== undefined && free - need.memoryBytes < policy.reserveBytes) gates |= GATE.freeMemory;
  if (!options.skipLoadGate) gates |= cpuGate(policy, context.sample);
  return gates;
}

const round = (n: number) => Math.round(n * 10) / 10;

/** Writes out the reasons for the gates in `gates` (bits from {@link refusingGates}). */
export function reasonsFor(gates: number, need: Resources, context: VerdictContext): Reason[] {
  const { policy, committed, sample } = context;
  const reasons: Reason[] = [];
  if (gates & GATE.impossibleMemory) {
    reasons.push({
      gate: "memory_budget",
      message: `it needs ${formatSize(need.memoryBytes)} of memory and the whole budget is ${formatSize(policy.memoryBytes)} (BERTH_BUDGET_MEMORY)`,
      needed: need.memoryBytes,
      available: policy.memoryBytes,
      limit: policy.memoryBytes,
      setting: "BERTH_BUDGET_MEMORY",
    });
  }
  if (gates & GATE.impossibleCpu) {
    reasons.push({
      gate: "cpu_budget",
      message: `it needs ${need.cpu} cpu and the whole budget is ${policy.cpu} (BERTH_BUDGET_CPU)`,
      needed: need.cpu,
      available: policy.cpu,
      limit: policy.cpu,
      setting: "BERTH_BUDGET_CPU",
    });
  }
  if (gates & GATE.memoryBudget) {
    const left = Math.max(0, policy.memoryBytes - committed.memoryBytes);
    reasons.push({
      gate: "memory_budget",
      message: `memory: needs ${formatSize(need.memoryBytes)}, the budget has ${formatSize(left)} of ${formatSize(policy.memoryBytes)} free (berth has committed ${formatSize(committed.memoryBytes)})`,
      needed: need.memoryBytes,
      available: left,
      limit: policy.memoryBytes,
      setting: "BERTH_BUDGET_MEMORY",
    });
  }
  if (gates & GATE.cpuBudget) {
    const left = Math.max(0, policy.cpu - committed.cpu);
    reasons.push({
      gate: "cpu_budget",
      message: `cpu: needs ${round(need.cpu)}, the budget has ${round(left)} of ${round(policy.cpu)} free`,
      needed: need.cpu,
      available: left,
      limit: policy.cpu,
      setting: "BERTH_BUDGET_CPU",
    });
  }
  if (gates & GATE.freeMemory) {
    const free = freeMemory(context) ?? 0;
    const unseen = context.unseenMemoryBytes ?? 0;
    const after = unseen > 0 ? ` (after ${formatSize(unseen)} admitted since the last sample)` : "";
    reasons.push({
      gate: "free_memory",
      message: `free memory: the box has ${formatSize(Math.max(0, free))} available${after} and keeps ${formatSize(policy.reserveBytes)} in reserve (BERTH_BUDGET_RESERVE)`,
      needed: need.memoryBytes,
      available: Math.max(0, free),
      limit: policy.reserveBytes,
      setting: "BERTH_BUDGET_RESERVE",
    });
  }
  if (gates & GATE.cpuPressure) {
    const psi = sample!.pressure.cpu!;
    reasons.push({
      gate: "cpu_pressure",
      message: `cpu pressure: runnable work waited ${psi.avg10.toFixed(0)}% of the last 10s and ${psi.avg60.toFixed(0)}% of the last minute (limit ${policy.cpuPressure}%, BERTH_BUDGET_CPU_PRESSURE)`,
      observed: psi.avg10,
      limit: policy.cpuPressure,
      setting: "BERTH_BUDGET_CPU_PRESSURE",
    });
  }
  if (gates & GATE.load) {
    const load1 = sample!.load1!;
    reasons.push({
      gate: "load",
      message: `load: ${load1.toFixed(1)} on ${sample!.cores} cores is above ${policy.loadPerCore} per core (BERTH_BUDGET_LOAD_PER_CORE)`,
      observed: load1,
      limit: policy.loadPerCore * sample!.cores,
      setting: "BERTH_BUDGET_LOAD_PER_CORE",
    });
  }
  if (!(gates & IMPOSSIBLE)) for (const reason of reasons) nameConsumers(reason, context);
  return reasons;
}

/**
 * Names who holds what the reason's gate is short of, after the seed's sentence: berth's own
 * reservations and running work for the budget gates, the machine's processes for free memory
 * and the cpu gates ("; held by: chromium (12 processes) 4.1G, node (pid 812) 2.2G").
 */
function nameConsumers(reason: Reason, context: VerdictContext): void {
  let consumers: Consumer[];
  let by: "memory" | "cpu";
  if (reason.gate === "memory_budget" || reason.gate === "cpu_budget") {
    by = reason.gate === "memory_budget" ? "memory" : "cpu";
    consumers = [...context.committed.items]
      .sort((a, b) => (by === "memory" ? b.memoryBytes - a.memoryBytes || b.cpu - a.cpu : b.cpu - a.cpu || b.memoryBytes - a.memoryBytes))
      .filter((item) => (by === "memory" ? item.memoryBytes > 0 : item.cpu > 0))
      .slice(0, CONSUMERS_NAMED)
      .map((item) => ({ name: item.label, processes: 0, memoryBytes: item.memoryBytes, cpu: item.cpu, berth: true }));
  } else if (context.machineConsumers === undefined) return;
  else if (reason.gate === "free_memory") {
    by = "memory";
    consumers = context.machineConsumers.memory();
  } else {
    by = "cpu";
    consumers = context.machineConsumers.cpu();
  }
  if (consumers.length === 0) return;
  reason.consumers = consumers;
  const label = reason.gate === "cpu_pressure" || reason.gate === "load" ? "busy" : "held by";
  reason.message = `${reason.message}; ${label}: ${consumers.map((c) => consumerText(c, by)).join(", ")}`;
}

/** One consumer in words: "chromium (12 processes) 4.1G", "node (pid 812) 2.2G", "berth: 'npm run build' 1G", "'db' 0.5 cpu". */
export function consumerText(consumer: Consumer, by: "memory" | "cpu"): string {
  const amount = by === "memory" ? formatSize(consumer.memoryBytes) : `${round(consumer.cpu)} cpu`;
  if (consumer.berth) return consumer.processes === 0 ? `'${consumer.name}' ${amount}` : `berth: '${consumer.name}' ${amount}`;
  const which = consumer.pid !== undefined ? `pid ${consumer.pid}` : `${consumer.processes} processes`;
  return `${consumer.name} (${which}) ${amount}`;
}

/** Joins reasons the way the seed writes them: "a; b". */
export function reasonsText(reasons: readonly Reason[]): string | undefined {
  return reasons.length === 0 ? undefined : reasons.map((r) => r.message).join("; ");
}

/** Would `need` be admitted right now, ignoring the queue? See the module comment for the rules. */
export function check(need: Resources, context: VerdictContext, options: CheckOptions = {}): Verdict {
  const gates = refusingGates(need, context, options);
  const reasons = gates === 0 ? [] : reasonsFor(gates, need, context);
  const verdict: Verdict = {
    fits: gates === 0,
    impossible: undefined,
    reasons,
    waitFor: undefined,
    need: { memoryBytes: need.memoryBytes, cpu: need.cpu },
    committed: context.committed,
    sample: context.sample,
    policy: context.policy,
    freeMemoryBytes: freeMemory(context),
    unseenMemoryBytes: context.unseenMemoryBytes ?? 0,
  };
  if (gates & IMPOSSIBLE) verdict.impossible = reasons[0]!.message;
  else verdict.waitFor = reasonsText(reasons);
  return verdict;
}

/** A key that changes only when the set of refusing gates changes (what "the reason changed" means to a waiter). */
export function gatesKey(reasons: readonly Reason[]): string {
  return reasons.map((r) => r.gate).join(",");
}
