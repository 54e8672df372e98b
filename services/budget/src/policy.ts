/**
 * The budget's policy: how much of the machine berth may commit, how much it keeps free, when the
 * CPU counts as saturated, how long and how many requests may wait, and what undeclared work costs.
 *
 * It comes from (highest first) flags, `BERTH_BUDGET_*` environment variables (the seed's
 * `BACKLOT_BUDGET_*` names are accepted too), a JSON config file, and defaults derived from the
 * machine, through the shared config loader: {@link POLICY_SETTINGS} declares the settings (the
 * server spreads them into its own definition), {@link policyFromConfig} turns the loaded values
 * into a Policy.
 */
import { availableParallelism, totalmem } from "node:os";
import type { ConfigDefinition, ConfigValues, LoadConfigOptions } from "@berth/shared/config";
import { defineConfig, integerParser, loadConfig, oneOf, parseBoolean } from "@berth/shared/config";
import { invalidArgument } from "@berth/shared/errors";
import { formatDuration, formatSize, parseDuration, parseSize } from "@berth/shared/units";
import type { Resources } from "./costs.js";

/** How the queue orders waiters: strictly first come first served, or letting small requests past a blocked first waiter when that cannot delay it. */
export type QueueMode = "fifo" | "backfill";

/** The budget's settings, resolved to numbers. */
export interface Policy {
  /** False: every request fits at once (the budget only counts). */
  enabled: boolean;
  /** Memory berth may commit in total (running work plus reservations). */
  memoryBytes: number;
  /** Cpus berth may commit in total. */
  cpu: number;
  /** Memory the machine keeps free for work that is not berth's: free memory minus a need must stay above it. */
  reserveBytes: number;
  /** PSI cpu "some" percent (avg10 and avg60 both) at which the CPU counts as saturated; 100 turns the gate off. */
  cpuPressure: number;
  /** Without PSI: the 1-minute load average per core above which the CPU counts as saturated. */
  loadPerCore: number;
  /** How long a request waits in the queue when it does not set its own limit. */
  maxWaitMs: number;
  /** How many requests may wait at once; one more is refused with "queue full". */
  maxQueue: number;
  /** What a start or appliance that declares nothing costs. */
  defaultRun: Resources;
  /** What a build that declares nothing costs. */
  defaultBuild: Resources;
  queueMode: QueueMode;
  /**
   * How often a waiter hears its position and reason when nothing changes. A long queue stretches
   * it: the queue sends at most HEARTBEAT_RATE_CAP (100) heartbeats a second in all, so each waiter's
   * period is max(heartbeatMs, waiters / 100 s) — 5 s up to 500 waiters, 100 s for 10,000. A changed
   * position or reason is still told at once.
   */
  heartbeatMs: number;
}

/** Facts about the machine the defaults are derived from (the sampler's effective figures). */
export interface MachineFacts {
  /** Total memory berth can use: MemTotal, or the cgroup's limit when tighter. */
  totalBytes?: number | undefined;
  /** Cpus berth can use: the cores, or the cgroup's quota when tighter. */
  cpus?: number | undefined;
}

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;

/** Share of the machine's memory the default budget takes. */
const DEFAULT_MEMORY_SHARE = 0.75;

/**
 * The default policy for a machine: 75 % of its memory, all its cpus, a reserve of 1G or 10 % of the
 * memory (whichever is smaller, so a small VM keeps a usable budget), PSI limit 80 %, load 1.5 per
 * core, waits of up to 10 minutes, up to 1,000 waiters, 512M/0.5 cpu per undeclared start and
 * 2G/1 cpu per undeclared build, FIFO, a heartbeat every 5 s.
 */
export function defaultPolicy(machine: MachineFacts = {}): Policy {
  const totalBytes = machine.totalBytes ?? totalmem();
  const cpus = machine.cpus ?? availableParallelism();
  return {
    enabled: true,
    memoryBytes: Math.floor(totalBytes * DEFAULT_MEMORY_SHARE),
    cpu: cpus,
    reserveBytes: Math.min(GiB, Math.floor(totalBytes * 0.1)),
    cpuPressure: 80,
    loadPerCore: 1.5,
    maxWaitMs: 10 * 60_000,
    maxQueue: 1000,
    defaultRun: { memoryBytes: 512 * MiB, cpu: 0.5 },
    defaultBuild: { memoryBytes: 2 * GiB, cpu: 1 },
    queueMode: "fifo",
    heartbeatMs: 5000,
  };
}

/** Memory as a setting gives it: bytes, or a share of the machine's memory (`75%`), resolved against the machine. */
export type MemoryAmount = { bytes: number } | { percent: number };

/** Parses a size (`8G`) or a share of the machine's memory (`75%`). */
export function parseMemoryAmount(raw: string, field: string): MemoryAmount {
  const text = raw.trim();
  const rule = "must be a size like 8G or a share of the machine like 75%";
  if (text.endsWith("%")) {
    const percent = Number(text.slice(0, -1));
    if (!/^\d+(\.\d+)?%$/.test(text) || percent > 100) throw invalidArgument(field, `${rule}; got ${JSON.stringify(raw)}`);
    return { percent };
  }
  try {
    return { bytes: parseSize(text, field) };
  } catch {
    throw invalidArgument(field, `${rule}; got ${JSON.stringify(raw)}`);
  }
}

function sizeParser(raw: string, field: string): number {
  try {
    return parseSize(raw.trim(), field);
  } catch {
    throw invalidArgument(field, `must be a size like 512M or 2G; got ${JSON.stringify(raw)}`);
  }
}

function numberParser(rule: string, ok: (n: number) => boolean): (raw: string, field: string) => number {
  return (raw, field) => {
    const text = raw.trim();
    const n = /^\d+(\.\d+)?$|^\.\d+$/.test(text) ? Number(text) : Number.NaN;
    if (!Number.isFinite(n) || !ok(n)) throw invalidArgument(field, `${rule}; got ${JSON.stringify(raw)}`);
    return n;
  };
}

function durationParser(positive: boolean): (raw: string, field: string) => number {
  return (raw, field) => {
    let ms: number;
    try {
      ms = parseDuration(raw.trim(), field);
    } catch {
      throw invalidArgument(field, `must be a duration like 30s or 10m; got ${JSON.stringify(raw)}`);
    }
    if (positive && ms <= 0) throw invalidArgument(field, `must be a positive duration; got ${JSON.stringify(raw)}`);
    return ms;
  };
}

function budgetSetting(suffix: string) {
  return { env: `BERTH_BUDGET_${suffix}`, aliases: [`BACKLOT_BUDGET_${suffix}`] };
}

const DEFAULTS = defaultPolicy({ totalBytes: 4 * GiB, cpus: 1 });

/**
 * The policy's settings for the shared config loader: flags (`--memory=8G`), `BERTH_BUDGET_*`
 * variables with the seed's `BACKLOT_BUDGET_*` names as aliases, and config-file keys. Settings
 * whose default depends on the machine (memory, cpu, reserve) have none here: unset, they take
 * {@link defaultPolicy}'s machine-derived value in {@link policyFromConfig}.
 */
export const POLICY_SETTINGS = defineConfig({
  enabled: {
    flag: "budget-enabled",
    ...budgetSetting("ENABLED"),
    default: true,
    parse: parseBoolean,
    doc: "off admits everything at once (the budget only counts)",
  },
  memory: {
    flag: "memory",
    ...budgetSetting("MEMORY"),
    parse: parseMemoryAmount,
    doc: "memory berth may commit: a size (8G) or a share of the machine (default 75%)",
  },
  cpu: {
    flag: "cpu",
    ...budgetSetting("CPU"),
    parse: numberParser("must be a positive number of cpus", (n) => n > 0),
    doc: "cpus berth may commit (default: the machine's, or the cgroup's quota)",
  },
  reserve: {
    flag: "reserve",
    ...budgetSetting("RESERVE"),
    parse: parseMemoryAmount,
    doc: "memory kept free for other work: a size or a share (default 1G or 10%, the smaller)",
  },
  cpuPressure: {
    flag: "cpu-pressure",
    ...budgetSetting("CPU_PRESSURE"),
    default: DEFAULTS.cpuPressure,
    parse: numberParser("must be a percentage above 0 and at most 100", (n) => n > 0 && n <= 100),
    doc: "PSI cpu 'some' percent (10 s and 60 s) that counts as saturated; 100 turns the PSI gate off",
  },
  loadPerCore: {
    flag: "load-per-core",
    ...budgetSetting("LOAD_PER_CORE"),
    default: DEFAULTS.loadPerCore,
    parse: numberParser("must be a positive number", (n) => n > 0),
    doc: "without PSI: 1-minute load per core that counts as saturated",
  },
  wait: {
    flag: "wait",
    ...budgetSetting("WAIT"),
    default: DEFAULTS.maxWaitMs,
    parse: durationParser(false),
    show: formatDuration,
    doc: "longest wait in the queue (30s, 10m)",
  },
  maxQueue: { flag: "max-queue", ...budgetSetting("MAX_QUEUE"), default: DEFAULTS.maxQueue, parse: integerParser(0), doc: "most requests waiting at once" },
  defaultRunMemory: {
    flag: "default-run-memory",
    ...budgetSetting("DEFAULT_RUN_MEMORY"),
    default: DEFAULTS.defaultRun.memoryBytes,
    parse: sizeParser,
    show: formatSize,
    doc: "memory of a start that declares none",
  },
  defaultRunCpu: {
    flag: "default-run-cpu",
    ...budgetSetting("DEFAULT_RUN_CPU"),
    default: DEFAULTS.defaultRun.cpu,
    parse: numberParser("must be a number of cpus, 0 or more", (n) => n >= 0),
    doc: "cpu of a start that declares none",
  },
  defaultBuildMemory: {
    flag: "default-build-memory",
    ...budgetSetting("DEFAULT_BUILD_MEMORY"),
    default: DEFAULTS.defaultBuild.memoryBytes,
    parse: sizeParser,
    show: formatSize,
    doc: "memory of a build that declares none",
  },
  defaultBuildCpu: {
    flag: "default-build-cpu",
    ...budgetSetting("DEFAULT_BUILD_CPU"),
    default: DEFAULTS.defaultBuild.cpu,
    parse: numberParser("must be a number of cpus, 0 or more", (n) => n >= 0),
    doc: "cpu of a build that declares none",
  },
  queue: {
    flag: "queue",
    ...budgetSetting("QUEUE"),
    default: DEFAULTS.queueMode as QueueMode,
    parse: oneOf(["fifo", "backfill"] as const),
    doc: "fifo, or backfill: a request may pass a blocked first waiter when that cannot delay it",
  },
  heartbeat: {
    flag: "heartbeat",
    ...budgetSetting("HEARTBEAT"),
    default: DEFAULTS.heartbeatMs,
    parse: durationParser(true),
    show: formatDuration,
    doc: "how often a waiter hears its position when nothing changes (stretched in a long queue: at most 100 heartbeats a second in all)",
  },
} satisfies ConfigDefinition);

/** The loaded values of {@link POLICY_SETTINGS} (a superset, such as the server's whole config, is fine). */
export type PolicyValues = ConfigValues<typeof POLICY_SETTINGS>;

function resolveMemory(amount: MemoryAmount | undefined, totalBytes: number, fallback: number): number {
  if (amount === undefined) return fallback;
  return "bytes" in amount ? amount.bytes : Math.floor((totalBytes * amount.percent) / 100);
}

/**
 * Turns loaded settings into a validated Policy for `machine` (the sampler's effective total memory
 * and cpus; the process's own view when omitted).
 */
export function policyFromConfig(values: PolicyValues, machine: MachineFacts = {}): Policy {
  const totalBytes = machine.totalBytes ?? totalmem();
  const defaults = defaultPolicy({ totalBytes, cpus: machine.cpus });
  return validatePolicy({
    enabled: values.enabled,
    memoryBytes: resolveMemory(values.memory, totalBytes, defaults.memoryBytes),
    cpu: values.cpu ?? defaults.cpu,
    reserveBytes: resolveMemory(values.reserve, totalBytes, defaults.reserveBytes),
    cpuPressure: values.cpuPressure,
    loadPerCore: values.loadPerCore,
    maxWaitMs: values.wait,
    maxQueue: values.maxQueue,
    defaultRun: { memoryBytes: values.defaultRunMemory, cpu: values.defaultRunCpu },
    defaultBuild: { memoryBytes: values.defaultBuildMemory, cpu: values.defaultBuildCpu },
    queueMode: values.queue,
    heartbeatMs: values.heartbeat,
  });
}

/**
 * Loads the policy alone (flags in `argv`, the environment, a config file) for `machine`. The
 * server, which has settings of its own, loads `{...commonServerConfig(7302), ...POLICY_SETTINGS}`
 * with `loadConfig` and passes the values to {@link policyFromConfig} instead; on SIGHUP it does the
 * same again and hands the result to `budget.reloadPolicy`.
 */
export function loadPolicy(options: LoadConfigOptions & { machine?: MachineFacts } = {}): Policy {
  const { machine, ...load } = options;
  return policyFromConfig(loadConfig(POLICY_SETTINGS, load).values, machine);
}

function checkNumber(value: number, field: string, rule: string, ok: (n: number) => boolean): void {
  if (typeof value !== "number" || !Number.isFinite(value) || !ok(value)) throw invalidArgument(field, `${rule}; got ${value}`);
}

/**
 * Checks a policy given as numbers (a reload, a test) and returns a copy: every amount finite and in
 * range, else invalid_argument naming the setting (`policy.memoryBytes: must be …; got NaN`).
 */
export function validatePolicy(policy: Policy): Policy {
  checkNumber(policy.memoryBytes, "policy.memoryBytes", "must be a positive number of bytes (BERTH_BUDGET_MEMORY)", (n) => n > 0);
  checkNumber(policy.cpu, "policy.cpu", "must be a positive number of cpus (BERTH_BUDGET_CPU)", (n) => n > 0);
  checkNumber(policy.reserveBytes, "policy.reserveBytes", "must be 0 or more bytes (BERTH_BUDGET_RESERVE)", (n) => n >= 0);
  checkNumber(policy.cpuPressure, "policy.cpuPressure", "must be a percentage above 0 and at most 100 (BERTH_BUDGET_CPU_PRESSURE)", (n) => n > 0 && n <= 100);
  checkNumber(policy.loadPerCore, "policy.loadPerCore", "must be a positive number (BERTH_BUDGET_LOAD_PER_CORE)", (n) => n > 0);
  checkNumber(policy.maxWaitMs, "policy.maxWaitMs", "must be 0 or more milliseconds (BERTH_BUDGET_WAIT)", (n) => n >= 0);
  checkNumber(policy.maxQueue, "policy.maxQueue", "must be a whole number, 0 or more (BERTH_BUDGET_MAX_QUEUE)", (n) => Number.isInteger(n) && n >= 0);
  checkNumber(policy.heartbeatMs, "policy.heartbeatMs", "must be a positive number of milliseconds (BERTH_BUDGET_HEARTBEAT)", (n) => n > 0);
  for (const [name, cost] of [
    ["defaultRun", policy.defaultRun],
    ["defaultBuild", policy.defaultBuild],
  ] as const) {
    const env = name === "defaultRun" ? "BERTH_BUDGET_DEFAULT_RUN" : "BERTH_BUDGET_DEFAULT_BUILD";
    checkNumber(cost?.memoryBytes, `policy.${name}.memoryBytes`, `must be 0 or more bytes (${env}_MEMORY)`, (n) => n >= 0);
    checkNumber(cost?.cpu, `policy.${name}.cpu`, `must be 0 or more cpus (${env}_CPU)`, (n) => n >= 0);
  }
  if (policy.queueMode !== "fifo" && policy.queueMode !== "backfill") {
    throw invalidArgument("policy.queueMode", `must be fifo or backfill (BERTH_BUDGET_QUEUE); got ${JSON.stringify(policy.queueMode)}`);
  }
  if (typeof policy.enabled !== "boolean") throw invalidArgument("policy.enabled", `must be true or false; got ${JSON.stringify(policy.enabled)}`);
  return {
    ...policy,
    defaultRun: { ...policy.defaultRun },
    defaultBuild: { ...policy.defaultBuild },
  };
}
