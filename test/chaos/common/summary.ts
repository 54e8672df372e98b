/**
 * The one line each reliability suite ends with: what it did and what it found. Printed to the
 * real stdout (not through vitest's console capture, so it is never hidden or interleaved) and,
 * when `BERTH_CHAOS_SUMMARY` names a file, appended there so `.ci/run` can repeat every suite's
 * line at the end of the run.
 */
import { appendFileSync } from "node:fs";

/** A suite's findings. `violations` counts broken promises: anything but 0 fails the suite. */
export interface SuiteSummary {
  readonly suite: string;
  readonly rounds: number;
  readonly operations: number;
  readonly violations: number;
  /** Anything else worth quoting (durations, RSS, counts by outcome). */
  readonly [figure: string]: unknown;
}

/** Prints `chaos <suite>: {json}` and records it for the end-of-run summary. */
export function reportSuite(summary: SuiteSummary): void {
  const line = `chaos ${summary.suite}: ${JSON.stringify(summary)}\n`;
  process.stdout.write(line);
  const file = process.env.BERTH_CHAOS_SUMMARY;
  if (file) appendFileSync(file, line);
}

/** A size knob for a suite: `BERTH_CHAOS_<NAME>` when set to a positive number, else the default. */
export function chaosSetting(name: string, fallback: number): number {
  const raw = process.env[`BERTH_CHAOS_${name}`];
  const value = raw === undefined ? NaN : Number(raw);
  return Number.isFinite(value) && value > 0 ? value : fallback;
}
