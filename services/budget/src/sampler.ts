/**
 * The machine sampler: one for the whole service. Once per interval it reads a handful of small
 * files (meminfo, loadavg, the cgroup's limits and usage, PSI) and hands the sample to every
 * subscriber, so a thousand waiters cost one read, not a thousand.
 *
 * Where a file is missing or unreadable its field stays undefined: the gates then fall back as the
 * seed does (no PSI → load average; no MemAvailable → no free-memory gate), never on a guess.
 *
 * Roots are configurable: tests point them at fixture trees, and a container can read the host's
 * `/proc` (mounted elsewhere) to budget for the host rather than for itself.
 */
import { readFileSync } from "node:fs";
import { availableParallelism } from "node:os";
import * as path from "node:path";
import { systemClock } from "@berth/shared/clock";
import type { Clock, TimerHandle } from "@berth/shared/clock";
import type { ConfigDefinition, ConfigValues } from "@berth/shared/config";
import { isDescriptorExhaustion, relieveDescriptorShortage } from "@berth/shared/descriptors";
import { defineConfig, oneOf, parseNonEmpty } from "@berth/shared/config";
import { invalidArgument } from "@berth/shared/errors";
import { formatDuration, parseDuration } from "@berth/shared/units";
import type { Logger } from "@berth/shared/logger";
import { DEFAULT_CGROUP_ROOT, locateCgroup, type CgroupVersion } from "./cgroup-hierarchies.js";
import { minDefined, readCgroupLimits, readCgroupUsage, type ReadText } from "./cgroup-limits.js";

/** PSI "some" figures of one resource: percent of time some runnable task stalled, and the total stall in µs. */
export interface PressureFigures {
  avg10: number;
  avg60: number;
  avg300: number;
  total: number;
  /** Whose pressure this is: the service's cgroup, or the whole machine (`/proc/pressure`). */
  scope: "cgroup" | "host";
}

/** What the cgroup's files said (each undefined when its file was missing or unreadable). */
export interface CgroupFigures {
  /** Which hierarchy was read: v2's unified one, or v1's (on a v1 or hybrid host). */
  version: CgroupVersion;
  /** The cgroup's path from `/proc/self/cgroup`, on v1 the memory hierarchy's (`/` inside a cgroup namespace). */
  path: string;
  /**
   * The smallest memory limit over the cgroup and its ancestors (`memory.max`; v1's
   * `memory.limit_in_bytes` and `hierarchical_memory_limit`); undefined when none sets one.
   */
  memoryLimitBytes?: number | undefined;
  /** The cgroup's own `memory.current` (v1's `memory.usage_in_bytes`). */
  memoryCurrentBytes?: number | undefined;
  /** `inactive_file` (v1's `total_inactive_file`) from the cgroup's `memory.stat`: page cache the kernel reclaims before it runs short. */
  inactiveFileBytes?: number | undefined;
  /** The smallest quota/period over the cgroup and its ancestors, in cpus (`cpu.max`; v1's `cpu.cfs_quota_us`/`cpu.cfs_period_us`). */
  cpuQuota?: number | undefined;
  /** How many cpus `cpuset.cpus.effective` (v1's `cpuset.cpus`) lists. */
  cpusetCpus?: number | undefined;
}

/** One reading of the machine. */
export interface MachineSample {
  /** When the read began (wall clock): shown to clients. */
  at: number;
  /**
   * When the read began on the monotonic clock: anything admitted from then on is not yet visible
   * in it (what the sample's age is measured by; a wall-clock step does not change it).
   */
  monotonicAt: number;
  /** Whose figures the effective fields are: the host's, or the service's cgroup's. */
  source: "host" | "cgroup";
  /** `MemTotal` of the (host) meminfo. */
  memTotalBytes?: number | undefined;
  /** `MemAvailable` of the (host) meminfo. */
  memAvailableBytes?: number | undefined;
  /** Memory berth can use at most: MemTotal, or the cgroup limit when tighter. */
  totalBytes?: number | undefined;
  /** Memory available now: MemAvailable, or what the cgroup limit leaves when that is less. The free-memory gate reads this. */
  availableBytes?: number | undefined;
  /** Cores the process may run on (`os.availableParallelism()`). The load gate reads this. */
  cores: number;
  /** Cpus the cgroup allows: its quota, capped by its cpuset; undefined outside a cgroup. */
  cpuLimit?: number | undefined;
  load1?: number | undefined;
  load5?: number | undefined;
  load15?: number | undefined;
  /** PSI "some" figures; the CPU gate reads `cpu`. */
  pressure: { cpu?: PressureFigures | undefined; memory?: PressureFigures | undefined; io?: PressureFigures | undefined };
  cgroup?: CgroupFigures | undefined;
}

/** Whose figures to use: `auto` uses the cgroup's when the service runs in a limited one; `host` ignores cgroups (a container budgeting for its host). */
export type SampleSource = "auto" | "host" | "cgroup";

/** Where and how to read. */
export interface ReadOptions {
  /** The proc filesystem (default `/proc`). */
  procRoot?: string | undefined;
  /**
   * Where the cgroup mounts are (default `/sys/fs/cgroup`): mountinfo's mount points under
   * /sys/fs/cgroup are read under it (the v2 mount itself, or the directory of v1's hierarchies).
   */
  sysRoot?: string | undefined;
  source?: SampleSource | undefined;
  /** How many cores the process may use (default `os.availableParallelism()`). */
  cores?: (() => number) | undefined;
}

/** What the budget needs of a sampler: the latest sample and a way to hear of the next ones. */
export interface Sampler {
  /** The most recent sample, or undefined before the first. */
  latest(): MachineSample | undefined;
  /** Calls `listener` with every new sample; returns the function that stops it. */
  onSample(listener: (sample: MachineSample) => void): () => void;
}

/** The real sampler: reads the machine every `intervalMs`. */
export interface MachineSampler extends Sampler {
  readonly intervalMs: number;
  /** Takes a sample now (and publishes it), then keeps sampling every interval. Resolves with the first sample. */
  start(): Promise<MachineSample>;
  /** Takes and publishes one sample now. */
  sampleNow(): Promise<MachineSample>;
  /** Stops sampling. */
  close(): void;
}

/** Options of {@link createSampler}. */
export interface SamplerOptions extends ReadOptions {
  /** Milliseconds between samples (default 1000). */
  intervalMs?: number | undefined;
  clock?: Clock | undefined;
  logger?: Logger | undefined;
}

/**
 * The file's text, or undefined when it cannot be read (it does not exist here: no cgroup, no
 * PSI). No descriptor left is not "no figure": the sample fails, and the last one stays in use,
 * rather than one without free memory, which no gate would refuse.
 */
async function readText(file: string): Promise<string | undefined> {
  try {
    // Synchronously: a few microseconds for these small kernel files, where the promise API's
    // open, fstat, read and close through the thread pool cost an idle budget several ms a second.
    return readFileSync(file, "utf8");
  } catch (error) {
    if (isDescriptorExhaustion(error)) throw error;
    return undefined;
  }
}

function kiloBytes(meminfo: string | undefined, key: string): number | undefined {
  if (meminfo === undefined) return undefined;
  const match = new RegExp(`^${key}:\\s+(\\d+)\\s+kB`, "m").exec(meminfo);
  return match ? Number(match[1]) * 1024 : undefined;
}

/** Parses a PSI file's "some" line. */
export function parsePressure(text: string | undefined, scope: PressureFigures["scope"]): PressureFigures | undefined {
  const line = text?.split("\n").find((l) => l.startsWith("some "));
  if (!line) return undefined;
  const figure = (name: string) => Number(new RegExp(`${name}=([\\d.]+)`).exec(line)?.[1]);
  const figures = { avg10: figure("avg10"), avg60: figure("avg60"), avg300: figure("avg300"), total: figure("total") };
  if (!Number.isFinite(figures.avg10) || !Number.isFinite(figures.avg60)) return undefined;
  return {
    avg10: figures.avg10,
    avg60: figures.avg60,
    avg300: Number.isFinite(figures.avg300) ? figures.avg300 : 0,
    total: Number.isFinite(figures.total) ? figures.total : 0,
    scope,
  };
}

/** A reader for one sample: each file is read once however many figures come from it. */
function readEachOnce(): ReadText {
  const texts = new Map<string, Promise<string | undefined>>();
  return (file) => {
    let text = texts.get(file);
    if (text === undefined) {
      text = readText(file);
      texts.set(file, text);
    }
    return text;
  };
}

/**
 * Reads one sample. Inside a cgroup with a limit (or with `source: "cgroup"`): memory limit = the
 * smallest limit over the cgroup and its ancestors; available = the least that any limited level
 * leaves (its limit minus its usage less inactive page cache; a level that cannot say uses the
 * cgroup's own usage), and never more than the host's MemAvailable; cpus = the smallest quota over
 * the levels, capped by the cgroup's cpuset; PSI from the cgroup's own `*.pressure` files, or the
 * host's where the cgroup has none (always on v1). cgroup v2 reads `memory.max`, `memory.current`,
 * `inactive_file`, `cpu.max` and `cpuset.cpus.effective`; v1 (and a hybrid host, whose controllers
 * are v1's) `memory.limit_in_bytes` and `memory.stat`'s `hierarchical_memory_limit`,
 * `memory.usage_in_bytes` and `total_inactive_file`, `cpu.cfs_quota_us`/`cpu.cfs_period_us`, and
 * `cpuset.cpus`. Outside (or with `source: "host"`): MemAvailable, `/proc/pressure/*`. Load average
 * and cores are the host's either way.
 */
export async function readMachineSample(options: ReadOptions = {}, clock: Pick<Clock, "now" | "monotonicNow"> = systemClock): Promise<MachineSample> {
  const at = clock.now();
  const monotonicAt = clock.monotonicNow();
  const procRoot = options.procRoot ?? "/proc";
  const sysRoot = options.sysRoot ?? DEFAULT_CGROUP_ROOT;
  const source = options.source ?? "auto";
  const cores = (options.cores ?? availableParallelism)();
  const read = readEachOnce();

  const [meminfo, loadavg, selfCgroup, mountinfo] = await Promise.all([
    read(path.join(procRoot, "meminfo")),
    read(path.join(procRoot, "loadavg")),
    source === "host" ? undefined : read(path.join(procRoot, "self", "cgroup")),
    source === "host" ? undefined : read(path.join(procRoot, "self", "mountinfo")),
  ]);
  const memTotalBytes = kiloBytes(meminfo, "MemTotal");
  const memAvailableBytes = kiloBytes(meminfo, "MemAvailable");
  const loads = loadavg?.trim().split(/\s+/).slice(0, 3).map(Number) ?? [];
  const load = (i: number) => (Number.isFinite(loads[i]) ? loads[i] : undefined);

  const sample: MachineSample = {
    at,
    monotonicAt,
    source: "host",
    memTotalBytes,
    memAvailableBytes,
    totalBytes: memTotalBytes,
    availableBytes: memAvailableBytes,
    cores,
    load1: load(0),
    load5: load(1),
    load15: load(2),
    pressure: {},
  };

  const location = locateCgroup(selfCgroup, mountinfo, sysRoot);
  let pressureDir: string | undefined;
  if (location !== undefined) {
    const limits = await readCgroupLimits(location, read);
    const memoryLimitBytes = minDefined(...limits.memoryLimits.map((l) => l.limitBytes));
    const limited = memoryLimitBytes !== undefined || limits.cpuQuota !== undefined;
    if (source === "cgroup" ? limits.inCgroup : limited) {
      const { memoryDir } = limits;
      const usageDirs = [...new Set([...(memoryDir === undefined ? [] : [memoryDir]), ...limits.memoryLimits.map((l) => l.dir)])];
      const usages = new Map(await Promise.all(usageDirs.map(async (dir) => [dir, await readCgroupUsage(location.version, dir, read)] as const)));
      const leafUsage = (memoryDir === undefined ? undefined : usages.get(memoryDir)) ?? {};
      let available: number | undefined;
      for (const { limitBytes, dir } of limits.memoryLimits) {
        const used = usages.get(dir)?.used ?? leafUsage.used;
        if (used !== undefined) available = minDefined(available, Math.max(0, limitBytes - used));
      }
      sample.cgroup = {
        version: location.version,
        path: location.path,
        memoryLimitBytes,
        memoryCurrentBytes: leafUsage.current,
        inactiveFileBytes: leafUsage.inactiveFile,
        cpuQuota: limits.cpuQuota,
        cpusetCpus: limits.cpusetCpus,
      };
      sample.source = "cgroup";
      sample.totalBytes = minDefined(memTotalBytes, memoryLimitBytes);
      sample.availableBytes = minDefined(available, memAvailableBytes);
      sample.cpuLimit = minDefined(limits.cpuQuota, limits.cpusetCpus);
      pressureDir = limits.pressureDir;
    }
  }

  const kinds = ["cpu", "memory", "io"] as const;
  const pressures = await Promise.all(
    kinds.map(async (kind) => {
      if (pressureDir !== undefined) {
        const own = parsePressure(await read(path.join(pressureDir, `${kind}.pressure`)), "cgroup");
        if (own) return own;
      }
      return parsePressure(await read(path.join(procRoot, "pressure", kind)), "host");
    }),
  );
  kinds.forEach((kind, i) => {
    if (pressures[i]) sample.pressure[kind] = pressures[i];
  });
  return sample;
}

/** Creates the service's one sampler. Call `start()` to take the first sample and keep sampling. */
export function createSampler(options: SamplerOptions = {}): MachineSampler {
  const clock = options.clock ?? systemClock;
  const intervalMs = options.intervalMs ?? 1000;
  if (!Number.isFinite(intervalMs) || intervalMs <= 0) throw new RangeError(`sampler interval must be positive; got ${intervalMs}`);
  const listeners = new Set<(sample: MachineSample) => void>();
  let latest: MachineSample | undefined;
  let timer: TimerHandle | undefined;
  let running = false;
  let closed = false;

  const publish = (sample: MachineSample) => {
    latest = sample;
    for (const listener of listeners) {
      try {
        listener(sample);
      } catch (error) {
        options.logger?.error({ err: error }, "budget: a machine sample listener failed");
      }
    }
  };

  const sampleNow = async () => {
    const sample = await readMachineSample(options, clock);
    if (!closed) publish(sample);
    return sample;
  };

  const loop = () => {
    timer = undefined;
    if (closed) return;
    sampleNow()
      .catch((error: unknown) => {
        // The idle files of the process (the journals of a sessions service beside it) are closed for the next read.
        if (isDescriptorExhaustion(error)) relieveDescriptorShortage();
        options.logger?.error({ err: error }, "budget: reading the machine failed; the last sample stays in use");
      })
      .finally(() => {
        // The next read is scheduled after this one ends, so a slow filesystem never stacks reads.
        if (!closed) timer = clock.setTimeout(loop, intervalMs);
      });
  };

  return {
    intervalMs,
    latest: () => latest,
    onSample(listener) {
      listeners.add(listener);
      return () => listeners.delete(listener);
    },
    async start() {
      if (running) return latest ?? sampleNow();
      running = true;
      const first = await sampleNow();
      if (!closed && timer === undefined) timer = clock.setTimeout(loop, intervalMs);
      return first;
    },
    sampleNow,
    close() {
      closed = true;
      if (timer !== undefined) clock.clearTimeout(timer);
      timer = undefined;
      listeners.clear();
    },
  };
}

/**
 * A sampler driven by hand, for tests and tools: `set()` changes fields of the current sample and
 * publishes it (stamped with the clock's time), `emit()` publishes a whole sample.
 */
export class ManualSampler implements Sampler {
  private current: MachineSample | undefined;
  private readonly listeners = new Set<(sample: MachineSample) => void>();

  constructor(
    initial?: Partial<MachineSample>,
    private readonly clock: Pick<Clock, "now" | "monotonicNow"> = systemClock,
  ) {
    if (initial) this.current = { at: clock.now(), monotonicAt: clock.monotonicNow(), source: "host", cores: 4, pressure: {}, ...initial };
  }

  latest(): MachineSample | undefined {
    return this.current;
  }

  onSample(listener: (sample: MachineSample) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Publishes the current sample with `changes` applied, stamped now. */
  set(changes: Partial<MachineSample> = {}): MachineSample {
    return this.emit({
      source: "host",
      cores: 4,
      pressure: {},
      ...this.current,
      ...changes,
      at: changes.at ?? this.clock.now(),
      monotonicAt: changes.monotonicAt ?? this.clock.monotonicNow(),
    });
  }

  /** Publishes `sample` as it is. */
  emit(sample: MachineSample): MachineSample {
    this.current = sample;
    for (const listener of this.listeners) listener(sample);
    return sample;
  }

  /** How many listeners are subscribed (tests check nothing is left behind). */
  listenerCount(): number {
    return this.listeners.size;
  }
}

/** The machine facts a default policy derives from a sample: the memory and cpus berth can use. */
export function machineFactsOf(sample: MachineSample | undefined): { totalBytes?: number | undefined; cpus?: number | undefined } {
  if (!sample) return {};
  return { totalBytes: sample.totalBytes, cpus: sample.cpuLimit ?? sample.cores };
}

function intervalParser(raw: string, field: string): number {
  let ms: number;
  try {
    ms = parseDuration(raw.trim(), field);
  } catch {
    throw invalidArgument(field, `must be a duration like 1s or 500ms; got ${JSON.stringify(raw)}`);
  }
  if (ms < 10) throw invalidArgument(field, `must be at least 10ms; got ${JSON.stringify(raw)}`);
  return ms;
}

/** The sampler's settings for the shared config loader (the server spreads them into its own definition). */
export const SAMPLER_SETTINGS = defineConfig({
  sampleInterval: {
    flag: "sample-interval",
    env: "BERTH_BUDGET_SAMPLE_INTERVAL",
    default: 1000,
    parse: intervalParser,
    show: formatDuration,
    doc: "how often the machine is read",
  },
  sampleSource: {
    flag: "sample-source",
    env: "BERTH_BUDGET_SAMPLE_SOURCE",
    default: "auto" as SampleSource,
    parse: oneOf(["auto", "host", "cgroup"] as const),
    doc: "whose figures to budget for: auto (the cgroup's when limited), host, or cgroup",
  },
  procRoot: {
    flag: "proc-root",
    env: "BERTH_PROC_ROOT",
    default: "/proc",
    parse: parseNonEmpty,
    doc: "the proc filesystem to read (a container may mount the host's)",
  },
  cgroupRoot: {
    flag: "cgroup-root",
    env: "BERTH_CGROUP_ROOT",
    default: DEFAULT_CGROUP_ROOT,
    parse: parseNonEmpty,
    doc: "where the cgroup mounts are (the v2 mount, or the directory of the v1 hierarchies)",
  },
} satisfies ConfigDefinition);

/** Sampler options from loaded {@link SAMPLER_SETTINGS} values. */
export function samplerOptionsFromConfig(values: ConfigValues<typeof SAMPLER_SETTINGS>): SamplerOptions {
  return { intervalMs: values.sampleInterval, source: values.sampleSource, procRoot: values.procRoot, sysRoot: values.cgroupRoot };
}
