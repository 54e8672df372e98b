/**
 * The budget's policy: how much of the machine berth may commit, how much it keeps free, when the
 * CPU counts as saturated, how long and how many requests may wait, and what undeclared work costs.
 *
 * It comes from (highest first) flags, `BERTH_BUDGET_*` environment variables (the seed's
 * `BACKLOT_BUDGET_*` names are accepted too), a JSON config file, and defaults derived from the
 * machine. There is no shared config module yet, so the small parser lives here.
 */
import { readFileSync } from "node:fs";
import { availableParallelism, totalmem } from "node:os";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { parseDuration, parseSize } from "@berth/shared/units";
import type { Resources } from "./costs.js";

/** How the queue orders waiters: strictly first come first served, or letting small requests past a blocked head when that cannot delay it. */
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
  /** How long a request may wait in the queue unless it asks for less. */
  maxWaitMs: number;
  /** How many requests may wait at once; one more is refused with "queue full". */
  maxQueue: number;
  /** What a start or appliance that declares nothing costs. */
  defaultRun: Resources;
  /** What a build that declares nothing costs. */
  defaultBuild: Resources;
  queueMode: QueueMode;
  /** How often a waiter hears its position and reason when nothing changes. */
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

/** A raw setting value as it arrives from a flag, a variable or a JSON file. */
export type SettingValue = string | number | boolean;

/** The name of each setting in a config file and in the `flags` object. */
export type SettingKey =
  | "enabled"
  | "memory"
  | "cpu"
  | "reserve"
  | "cpuPressure"
  | "loadPerCore"
  | "wait"
  | "maxQueue"
  | "defaultRunMemory"
  | "defaultRunCpu"
  | "defaultBuildMemory"
  | "defaultBuildCpu"
  | "queue"
  | "heartbeat";

/** One setting: its config key, its environment variable (the seed's name is accepted too) and its flag. */
export interface SettingInfo {
  key: SettingKey;
  env: string;
  legacyEnv: string;
  flag: string;
  /** What it means, for `--help`. */
  help: string;
}

function setting(key: SettingKey, suffix: string, flag: string, help: string): SettingInfo {
  return { key, env: `BERTH_BUDGET_${suffix}`, legacyEnv: `BACKLOT_BUDGET_${suffix}`, flag, help };
}

/** Every policy setting, in the order `--help` lists them. */
export const POLICY_SETTINGS: readonly SettingInfo[] = [
  setting("enabled", "ENABLED", "--budget", "on|off: off admits everything at once"),
  setting("memory", "MEMORY", "--memory", "memory berth may commit: a size (8G) or a share of the machine (75%)"),
  setting("cpu", "CPU", "--cpu", "cpus berth may commit"),
  setting("reserve", "RESERVE", "--reserve", "memory kept free for other work: a size or a share of the machine"),
  setting("cpuPressure", "CPU_PRESSURE", "--cpu-pressure", "PSI cpu 'some' percent (10 s and 60 s) that counts as saturated; 100 turns it off"),
  setting("loadPerCore", "LOAD_PER_CORE", "--load-per-core", "without PSI: load average per core that counts as saturated"),
  setting("wait", "WAIT", "--wait", "longest wait in the queue (10m, 30s)"),
  setting("maxQueue", "MAX_QUEUE", "--max-queue", "most requests waiting at once"),
  setting("defaultRunMemory", "DEFAULT_RUN_MEMORY", "--default-run-memory", "memory of a start that declares none"),
  setting("defaultRunCpu", "DEFAULT_RUN_CPU", "--default-run-cpu", "cpu of a start that declares none"),
  setting("defaultBuildMemory", "DEFAULT_BUILD_MEMORY", "--default-build-memory", "memory of a build that declares none"),
  setting("defaultBuildCpu", "DEFAULT_BUILD_CPU", "--default-build-cpu", "cpu of a build that declares none"),
  setting("queue", "QUEUE", "--queue", "fifo|backfill: backfill lets a request pass a blocked head when that cannot delay it"),
  setting("heartbeat", "HEARTBEAT", "--heartbeat", "how often a waiter hears its position when nothing changes"),
];

/** Where the policy comes from. Each layer overrides the ones below it: flags, then env, then the file, then defaults. */
export interface PolicySources {
  /** Values from command-line flags, by config key (`{ memory: "8G", queue: "backfill" }`). */
  flags?: Partial<Record<SettingKey, SettingValue | undefined>>;
  /** The environment (process.env by default). */
  env?: Record<string, string | undefined>;
  /** A JSON config file: the keys of {@link SettingKey}, optionally under a top-level "budget" object; `defaultRun`/`defaultBuild` may be nested `{memory, cpu}`. */
  configFile?: string | undefined;
  /** The machine the defaults and percentages refer to. */
  machine?: MachineFacts;
}

function parseBoolean(value: SettingValue, name: string): boolean {
  if (typeof value === "boolean") return value;
  const text = String(value).trim().toLowerCase();
  if (["1", "true", "on", "yes"].includes(text)) return true;
  if (["0", "false", "off", "no"].includes(text)) return false;
  throw invalidArgument(name, `${JSON.stringify(value)} is not on/off (true/false, 1/0)`);
}

function parseNumber(value: SettingValue, name: string, rule: string, ok: (n: number) => boolean): number {
  const n = typeof value === "number" ? value : typeof value === "string" && value.trim() !== "" ? Number(value.trim().replace(/%$/, "")) : Number.NaN;
  if (!Number.isFinite(n) || !ok(n)) throw invalidArgument(name, `${rule}; got ${JSON.stringify(value)}`);
  return n;
}

/** A size, or a percentage of the machine's memory (`75%`). */
function parseMemorySetting(value: SettingValue, name: string, totalBytes: number): number {
  if (typeof value === "string" && value.trim().endsWith("%")) {
    const percent = parseNumber(value, name, "must be a size like 8G or a share of the machine like 75%", (n) => n >= 0 && n <= 100);
    return Math.floor((totalBytes * percent) / 100);
  }
  if (typeof value === "boolean") throw invalidArgument(name, `must be a size like 8G or a share of the machine like 75%; got ${value}`);
  try {
    return parseSize(value, name);
  } catch {
    throw invalidArgument(name, `must be a size like 8G or a share of the machine like 75%; got ${JSON.stringify(value)}`);
  }
}

function parseDurationSetting(value: SettingValue, name: string): number {
  if (typeof value === "boolean") throw invalidArgument(name, `must be a duration like 30s or 10m; got ${value}`);
  try {
    return parseDuration(value, name);
  } catch {
    throw invalidArgument(name, `must be a duration like 30s or 10m; got ${JSON.stringify(value)}`);
  }
}

/** Applies one raw setting to `policy`, naming the setting as `name` (the flag, the variable, or the file and key) in errors. */
function applySetting(policy: Policy, key: SettingKey, value: SettingValue, name: string, totalBytes: number): void {
  const cpuRule = "must be a positive number of cpus";
  switch (key) {
    case "enabled":
      policy.enabled = parseBoolean(value, name);
      return;
    case "memory":
      policy.memoryBytes = parseMemorySetting(value, name, totalBytes);
      return;
    case "cpu":
      policy.cpu = parseNumber(value, name, cpuRule, (n) => n > 0);
      return;
    case "reserve":
      policy.reserveBytes = parseMemorySetting(value, name, totalBytes);
      return;
    case "cpuPressure":
      policy.cpuPressure = parseNumber(value, name, "must be a percentage above 0 and at most 100", (n) => n > 0 && n <= 100);
      return;
    case "loadPerCore":
      policy.loadPerCore = parseNumber(value, name, "must be a positive number", (n) => n > 0);
      return;
    case "wait":
      policy.maxWaitMs = parseDurationSetting(value, name);
      return;
    case "maxQueue":
      policy.maxQueue = parseNumber(value, name, "must be a whole number, 0 or more", (n) => Number.isInteger(n) && n >= 0);
      return;
    case "defaultRunMemory":
      policy.defaultRun = { ...policy.defaultRun, memoryBytes: parseMemorySetting(value, name, totalBytes) };
      return;
    case "defaultRunCpu":
      policy.defaultRun = { ...policy.defaultRun, cpu: parseNumber(value, name, "must be a number of cpus, 0 or more", (n) => n >= 0) };
      return;
    case "defaultBuildMemory":
      policy.defaultBuild = { ...policy.defaultBuild, memoryBytes: parseMemorySetting(value, name, totalBytes) };
      return;
    case "defaultBuildCpu":
      policy.defaultBuild = { ...policy.defaultBuild, cpu: parseNumber(value, name, "must be a number of cpus, 0 or more", (n) => n >= 0) };
      return;
    case "queue": {
      const mode = String(value).trim().toLowerCase();
      if (mode !== "fifo" && mode !== "backfill") throw invalidArgument(name, `must be fifo or backfill; got ${JSON.stringify(value)}`);
      policy.queueMode = mode;
      return;
    }
    case "heartbeat":
      policy.heartbeatMs = parseDurationSetting(value, name);
      return;
  }
}

const SETTING_KEYS = new Set<string>(POLICY_SETTINGS.map((s) => s.key));

/** Flattens a config file's object into setting keys, refusing keys it does not know (a typo should not pass silently). */
function configEntries(raw: unknown, file: string): Array<[SettingKey, SettingValue]> {
  let body = raw;
  if (body !== null && typeof body === "object" && !Array.isArray(body) && "budget" in body) body = (body as { budget: unknown }).budget;
  if (body === null || typeof body !== "object" || Array.isArray(body)) {
    throw new BerthError("invalid_argument", `${file}: must hold a JSON object of budget settings`, { field: file });
  }
  const entries: Array<[SettingKey, SettingValue]> = [];
  for (const [key, value] of Object.entries(body as Record<string, unknown>)) {
    if ((key === "defaultRun" || key === "defaultBuild") && value !== null && typeof value === "object") {
      for (const [part, inner] of Object.entries(value as Record<string, unknown>)) {
        const flat = `${key}${part.charAt(0).toUpperCase()}${part.slice(1)}`;
        if (!SETTING_KEYS.has(flat)) throw invalidArgument(`${file}: ${key}.${part}`, "is not a budget setting (memory or cpu)");
        entries.push([flat as SettingKey, checkJsonValue(inner, `${file}: ${key}.${part}`)]);
      }
      continue;
    }
    if (!SETTING_KEYS.has(key)) throw invalidArgument(`${file}: ${key}`, `is not a budget setting (known: ${[...SETTING_KEYS].join(", ")})`);
    entries.push([key as SettingKey, checkJsonValue(value, `${file}: ${key}`)]);
  }
  return entries;
}

function checkJsonValue(value: unknown, name: string): SettingValue {
  if (typeof value === "string" || typeof value === "number" || typeof value === "boolean") return value;
  throw invalidArgument(name, `must be a string, a number or a boolean; got ${JSON.stringify(value)}`);
}

function readConfigFile(file: string): unknown {
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (error) {
    throw new BerthError("invalid_argument", `${file}: cannot read the budget config file (${(error as Error).message})`, { field: file });
  }
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new BerthError("invalid_argument", `${file}: is not valid JSON (${(error as Error).message})`, { field: file });
  }
}

/**
 * Loads the policy from its sources (see {@link PolicySources}) over the machine's defaults, and
 * validates it. A malformed value is invalid_argument naming where it came from: the flag
 * (`--memory`), the variable (`BERTH_BUDGET_MEMORY`) or the file and key (`/etc/berth.json: memory`).
 */
export function loadPolicy(sources: PolicySources = {}): Policy {
  const machine = sources.machine ?? {};
  const totalBytes = machine.totalBytes ?? totalmem();
  const policy = defaultPolicy({ totalBytes, cpus: machine.cpus });
  if (sources.configFile) {
    for (const [key, value] of configEntries(readConfigFile(sources.configFile), sources.configFile)) {
      applySetting(policy, key, value, `${sources.configFile}: ${key}`, totalBytes);
    }
  }
  const env = sources.env ?? process.env;
  for (const info of POLICY_SETTINGS) {
    // The seed's name first, so that berth's own name wins when both are set.
    for (const name of [info.legacyEnv, info.env]) {
      const value = env[name];
      if (value !== undefined && value !== "") applySetting(policy, info.key, value, name, totalBytes);
    }
  }
  for (const info of POLICY_SETTINGS) {
    const value = sources.flags?.[info.key];
    if (value !== undefined && value !== "") applySetting(policy, info.key, value, info.flag, totalBytes);
  }
  return validatePolicy(policy);
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
