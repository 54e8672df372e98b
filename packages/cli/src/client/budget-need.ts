/**
 * The need a budget command sends, from its flags: `--memory`/`--cpu` for what runs (one start
 * item), `--build-memory`/`--build-cpu` for a build before it (one build item). Sizes and cpu are
 * checked here, so a typo is a usage error before any call; what is left unset takes the budget's
 * defaults on the service side.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import type { NeedSchema, ResourceSpecSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { parseDuration, parseSize } from "@berth/shared/units";
import type { HelpRow } from "../help.js";
import { UsageError } from "./connect.js";

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

type NeedInit = MessageInitShape<typeof NeedSchema>;
type SpecInit = MessageInitShape<typeof ResourceSpecSchema>;

function size(value: unknown, flag: string): string | undefined {
  if (typeof value !== "string") return undefined;
  try {
    parseSize(value, flag);
  } catch {
    throw new UsageError(`${flag}: ${JSON.stringify(value)} is not a size like 512M, 2G or 1.5GiB`);
  }
  return value.trim();
}

function cpu(value: unknown, flag: string): number | undefined {
  if (typeof value !== "string") return undefined;
  const n = /^\s*(\d+(\.\d+)?|\.\d+)\s*$/.test(value) ? Number(value) : Number.NaN;
  if (!Number.isFinite(n) || n < 0) throw new UsageError(`${flag}: ${JSON.stringify(value)} is not a number of cpus like 0.5 or 2`);
  return n;
}

/** A duration flag's value in ms (`30s`, `10m`), or undefined when not given. */
export function durationFlag(value: unknown, flag: string): number | undefined {
  if (typeof value !== "string") return undefined;
  try {
    return parseDuration(value, flag);
  } catch {
    throw new UsageError(`${flag}: ${JSON.stringify(value)} is not a duration like 30s, 10m or 1h`);
  }
}

/** The need of the flags in `values`, for a thing called `name`; and its run spec (what `Started` reports). */
export function needFromFlags(values: Record<string, unknown>, name: string): { need: NeedInit; run: SpecInit } {
  const run: SpecInit = { memory: size(values["memory"], "--memory"), cpu: cpu(values["cpu"], "--cpu") };
  const buildMemory = size(values["build-memory"], "--build-memory");
  const buildCpu = cpu(values["build-cpu"], "--build-cpu");
  const items: NonNullable<NeedInit["items"]> = [{ kind: NeedItemKind.START, name, costSource: { case: "spec", value: run } }];
  if (buildMemory !== undefined || buildCpu !== undefined) {
    // Only the build part of a build's spec counts; what it leaves out takes the default build cost.
    items.unshift({ kind: NeedItemKind.BUILD, name, costSource: { case: "spec", value: { build: { memory: buildMemory, cpu: buildCpu } } } });
  }
  return { need: { items }, run };
}
