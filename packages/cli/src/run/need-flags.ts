/**
 * The need a budget command declares, from its flags: `--memory`/`--cpu` for what runs (one start
 * item), `--build-memory`/`--build-cpu` for a build before it (one build item). Sizes and cpu are
 * read here, once, with the budget's own readers, so a typo is a usage error before anything is
 * loaded or called; what is left unset takes the budget's defaults on the service side.
 */
import type { ItemCost } from "@berth/client/budget";
import { formatDuration, parseCpu, parseDuration, parseMemory } from "@berth/shared/units";
import { UsageError } from "../args.js";
import type { HelpRow } from "../help.js";

/** The need flags, for `parseArgs`. */
export const NEED_FLAGS = {
  memory: { type: "string" },
  cpu: { type: "string" },
  "build-memory": { type: "string" },
  "build-cpu": { type: "string" },
  "skip-load-gate": { type: "boolean" },
} as const;

/** The `--help` rows describing {@link NEED_FLAGS}. */
export const NEED_HELP_ROWS: readonly HelpRow[] = [
  ["--memory SIZE", "memory it uses while running: 512M, 2G, 1.5GiB (default: the budget's default run memory)"],
  ["--cpu N", "cpus it uses while running: 0.5, 2 (default: the budget's default run cpu)"],
  ["--build-memory SIZE", "memory of a build phase before it runs (none unless given)"],
  ["--build-cpu N", "cpus of that build phase"],
  ["--skip-load-gate", "skip the cpu gate (pressure/load); the memory gates still apply"],
];

/** The need of the flags: what runs, and the build before it when a build flag is given; sizes in bytes. */
export interface DeclaredNeed {
  readonly run: ItemCost;
  readonly build: ItemCost | undefined;
}

/**
 * A memory or cpu flag read by the budget's own reader, or undefined when not given; empty or
 * malformed is a usage error (`example` says what the flag takes).
 */
function amountFlag(read: typeof parseMemory, value: unknown, flag: string, example: string): number | undefined {
  if (typeof value !== "string") return undefined;
  let amount: number | undefined;
  try {
    amount = read(value, flag);
  } catch {
    amount = undefined;
  }
  if (amount === undefined) throw new UsageError(`${flag}: ${JSON.stringify(value)} ${example}`);
  return amount;
}

const size = (value: unknown, flag: string) => amountFlag(parseMemory, value, flag, "is not a size like 512M, 2G or 1.5GiB");
const cpu = (value: unknown, flag: string) => amountFlag(parseCpu, value, flag, "is not a number of cpus like 0.5 or 2");

/**
 * A duration flag's value in ms (`30s`, `10m`), or undefined when not given. A bare number other
 * than 0 is refused naming the flag and the units (`--max-wait 5` is not 5 ms nor 5 s: say which).
 * Longer than `maxMs` (what the service would refuse) is refused here, before anything is sent,
 * quoting the limit in the unit typed (`--max-wait 1000h`: at most 576h).
 */
export function durationFlag(value: unknown, flag: string, maxMs?: number): number | undefined {
  if (typeof value !== "string") return undefined;
  let ms: number;
  if (/^\s*\d+(\.\d+)?\s*$/.test(value)) ms = parseDurationFlag(value, flag);
  else {
    try {
      ms = parseDuration(value, flag);
    } catch {
      throw new UsageError(`${flag}: ${JSON.stringify(value)} is not a duration like 30s, 10m or 1h`);
    }
  }
  if (maxMs !== undefined && ms > maxMs) throw new UsageError(`${flag}: must be at most ${durationLike(maxMs, value)}, got ${value.trim()}`);
  return ms;
}

/**
 * `ms` in the unit `typed` ends with (`0.05s` → `0.1s` for 100 ms), so that a limit is quoted as the
 * user wrote the value that broke it; `typed` without a unit (0): as formatDuration prints it.
 */
export function durationLike(ms: number, typed: string): string {
  const unit = /(ms|s|m|h|d)\s*$/.exec(typed.trim())?.[1];
  if (unit === undefined) return formatDuration(ms);
  return `${Math.round((ms / DURATION_UNIT_MS[unit]!) * 1000) / 1000}${unit}`;
}

const DURATION_UNIT_MS: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };

function parseDurationFlag(value: string, flag: string): number {
  try {
    return parseDuration(value, flag);
  } catch (error) {
    // parseDuration's own message: it names the units, and the number with each.
    throw new UsageError((error as Error).message);
  }
}

/** The need of the flags in `values`; throws UsageError for a size or cpu that is not one. */
export function needFromFlags(values: Record<string, unknown>): DeclaredNeed {
  const run = { memory: size(values["memory"], "--memory"), cpu: cpu(values["cpu"], "--cpu") };
  const buildMemory = size(values["build-memory"], "--build-memory");
  const buildCpu = cpu(values["build-cpu"], "--build-cpu");
  // Only the build part of a build's spec counts; what it leaves out takes the default build cost.
  const build = buildMemory !== undefined || buildCpu !== undefined ? { memory: buildMemory, cpu: buildCpu } : undefined;
  return { run, build };
}
