/**
 * What the cgroup's files say: its limits over it and its ancestors, and what a level uses. cgroup
 * v2 keeps them in one directory per cgroup (`memory.max`, `cpu.max`, `cpuset.cpus.effective`,
 * `memory.current`); v1 in one hierarchy per controller (`memory.limit_in_bytes`,
 * `cpu.cfs_quota_us`/`cpu.cfs_period_us`, `cpuset.cpus`, `memory.usage_in_bytes`). Both are read
 * into the same figures, so the sampler weighs them alike.
 */
import * as path from "node:path";
import type { CgroupLocation, CgroupVersion } from "./cgroup-hierarchies.js";

/** A file's text, or undefined when it cannot be read (the sampler's reader). */
export type ReadText = (file: string) => Promise<string | undefined>;

/** A memory limit set over the cgroup, and the directory whose usage counts against it. */
export interface MemoryLimit {
  limitBytes: number;
  dir: string;
}

/** What the limit files said (each undefined where no level sets it or its files are missing). */
export interface CgroupLimitsReading {
  /** Every memory limit set on the cgroup or an ancestor, innermost first. */
  memoryLimits: MemoryLimit[];
  /** The smallest cpu quota over the levels, in cpus. */
  cpuQuota?: number | undefined;
  /** How many cpus the cgroup's cpuset lists. */
  cpusetCpus?: number | undefined;
  /** The cgroup's own directory in the memory hierarchy: its usage is the cgroup's. */
  memoryDir?: string | undefined;
  /** Whether the process is in a cgroup of its own (below the true root, or the root of a namespace). */
  inCgroup: boolean;
  /** Where the cgroup's own PSI files are: v2 only. */
  pressureDir?: string | undefined;
}

/** What one level uses. */
export interface UsageReading {
  /** `memory.current` (v2) or `memory.usage_in_bytes` (v1). */
  current?: number | undefined;
  /** Inactive page cache from `memory.stat`: what the kernel reclaims before it runs short. */
  inactiveFile?: number | undefined;
  /** The usage minus reclaimable page cache: what the level cannot simply drop. */
  used?: number | undefined;
}

/** Parses a file holding one count (`memory.max`, `memory.current`): undefined for "max" (no limit) and anything unreadable. */
export function parseCount(text: string | undefined): number | undefined {
  const value = text?.trim();
  if (value === undefined || !/^\d+$/.test(value)) return undefined;
  return Number(value);
}

/** Parses `cpu.max` ("quota period", or "max period"): the quota in cpus, or undefined when unlimited. */
export function parseCpuMax(text: string | undefined): number | undefined {
  const [quota, period] = text?.trim().split(/\s+/) ?? [];
  if (quota === undefined || quota === "max" || !/^\d+$/.test(quota)) return undefined;
  const periodUs = period !== undefined && /^\d+$/.test(period) ? Number(period) : 100_000;
  return periodUs > 0 ? Number(quota) / periodUs : undefined;
}

/** Parses v1's `cpu.cfs_quota_us` and `cpu.cfs_period_us`: the quota in cpus, or undefined for -1 (no quota) and anything unreadable. */
export function parseCfsQuota(quotaText: string | undefined, periodText: string | undefined): number | undefined {
  const quota = parseCount(quotaText);
  const period = parseCount(periodText);
  return quota === undefined || period === undefined || quota === 0 || period === 0 ? undefined : quota / period;
}

/**
 * v1 says "no limit" with the largest page-aligned figure its counters hold: LONG_MAX rounded down
 * to the page size (9223372036854771712 with 4 KiB pages, a little less with larger ones). Anything
 * from 2^62 up is taken as that: no machine has 4 EiB, and a double cannot tell those figures apart
 * anyway. Not "anything above MemTotal": v2's `memory.max` is reported as set whatever its size, and
 * v1's limit is read the same way (the sample's total is the smaller of MemTotal and the limit, so a
 * limit above the machine changes no gate); MemTotal may also be missing, or be the container's own
 * under lxcfs.
 */
const V1_UNLIMITED_FROM = 2 ** 62;

/** A v1 memory limit in bytes, or undefined for "no limit". */
export function v1MemoryLimit(bytes: number | undefined): number | undefined {
  return bytes === undefined || bytes >= V1_UNLIMITED_FROM ? undefined : bytes;
}

/** Counts the cpus of a cpuset list ("0-3,6,8-9" is 7). */
export function countCpuset(text: string | undefined): number | undefined {
  const list = text?.trim();
  if (!list) return undefined;
  let count = 0;
  for (const part of list.split(",")) {
    const match = /^(\d+)(?:-(\d+))?$/.exec(part.trim());
    if (!match) return undefined;
    count += match[2] === undefined ? 1 : Number(match[2]) - Number(match[1]) + 1;
  }
  return count > 0 ? count : undefined;
}

/** One `key value` line of a `memory.stat`. */
export function statField(stat: string | undefined, key: string): number | undefined {
  if (stat === undefined) return undefined;
  const match = new RegExp(`^${key} (\\d+)$`, "m").exec(stat);
  return match ? Number(match[1]) : undefined;
}

export function minDefined(...values: Array<number | undefined>): number | undefined {
  let result: number | undefined;
  for (const value of values) if (value !== undefined && (result === undefined || value < result)) result = value;
  return result;
}

const readEach = (read: ReadText, dirs: readonly string[], file: string) => Promise.all(dirs.map((dir) => read(path.join(dir, file))));

async function readV2Limits(location: CgroupLocation, read: ReadText): Promise<CgroupLimitsReading> {
  const levels = location.memory ?? [];
  const leaf = levels[0];
  if (leaf === undefined) return { memoryLimits: [], inCgroup: false };
  const [memoryMaxes, cpuMaxes, cpuset] = await Promise.all([
    readEach(read, levels, "memory.max"),
    readEach(read, levels, "cpu.max"),
    read(path.join(leaf, "cpuset.cpus.effective")),
  ]);
  const memoryLimits = levels.flatMap((dir, i) => {
    const limitBytes = parseCount(memoryMaxes[i]);
    return limitBytes === undefined ? [] : [{ limitBytes, dir }];
  });
  return {
    memoryLimits,
    cpuQuota: minDefined(...cpuMaxes.map(parseCpuMax)),
    cpusetCpus: countCpuset(cpuset),
    memoryDir: leaf,
    // The true root cgroup has no memory.max or cpu.max: only a process below it (or in a namespace) is "in a cgroup".
    inCgroup: location.path !== "/" || memoryMaxes.some((t) => t !== undefined) || cpuMaxes.some((t) => t !== undefined),
    pressureDir: leaf,
  };
}

async function readV1Limits(location: CgroupLocation, read: ReadText): Promise<CgroupLimitsReading> {
  const memory = location.memory ?? [];
  const cpu = location.cpu ?? [];
  const memoryDir = memory[0];
  const cpusetDir = location.cpuset?.[0];
  const [limits, stat, quotas, periods, cpuset] = await Promise.all([
    readEach(read, memory, "memory.limit_in_bytes"),
    memoryDir === undefined ? undefined : read(path.join(memoryDir, "memory.stat")),
    readEach(read, cpu, "cpu.cfs_quota_us"),
    readEach(read, cpu, "cpu.cfs_period_us"),
    cpusetDir === undefined ? undefined : read(path.join(cpusetDir, "cpuset.cpus")),
  ]);
  const memoryLimits = memory.flatMap((dir, i) => {
    const limitBytes = v1MemoryLimit(parseCount(limits[i]));
    return limitBytes === undefined ? [] : [{ limitBytes, dir }];
  });
  // The least limit of the cgroup and all its ancestors, those above the mount's root included (a
  // container sees only its own cgroup). Their usage cannot be read: the cgroup's own stands in, as
  // for a v2 level that cannot say, and the host's MemAvailable still caps what it leaves.
  const hierarchical = v1MemoryLimit(statField(stat, "hierarchical_memory_limit"));
  if (hierarchical !== undefined && memoryDir !== undefined) memoryLimits.push({ limitBytes: hierarchical, dir: memoryDir });
  return {
    memoryLimits,
    cpuQuota: minDefined(...cpu.map((_, i) => parseCfsQuota(quotas[i], periods[i]))),
    cpusetCpus: countCpuset(cpuset),
    memoryDir,
    // Every v1 cgroup, the root too, has the limit files: a process found in the hierarchies is in a cgroup.
    inCgroup: memoryDir !== undefined || cpu.length > 0,
    // v1 keeps no PSI per cgroup: the host's /proc/pressure stands in where the kernel has it, and
    // without it the cpu gate falls back to the load average.
    pressureDir: undefined,
  };
}

/** Reads the limits of the cgroup and its ancestors. */
export function readCgroupLimits(location: CgroupLocation, read: ReadText): Promise<CgroupLimitsReading> {
  return location.version === "v1" ? readV1Limits(location, read) : readV2Limits(location, read);
}

/**
 * Reads what one level of the memory hierarchy uses. v1's `memory.usage_in_bytes` counts the
 * level's descendants too, so its reclaimable cache is `total_inactive_file` (the whole subtree's),
 * not `inactive_file` (the level's own tasks').
 */
export async function readCgroupUsage(version: CgroupVersion, dir: string, read: ReadText): Promise<UsageReading> {
  const [currentText, stat] = await Promise.all([
    read(path.join(dir, version === "v1" ? "memory.usage_in_bytes" : "memory.current")),
    read(path.join(dir, "memory.stat")),
  ]);
  const current = parseCount(currentText);
  const inactiveFile = statField(stat, version === "v1" ? "total_inactive_file" : "inactive_file");
  // Without memory.stat the page cache is counted as used: that can only understate what is free.
  return { current, inactiveFile, used: current === undefined ? undefined : Math.max(0, current - (inactiveFile ?? 0)) };
}
