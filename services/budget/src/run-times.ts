/**
 * How long work usually holds the budget, by name: the hold times of released reservations (by
 * owner: `berth admit -- npm run build` asks as "npm run build") and the run times of running work
 * that stopped (by name). The ETA of a queued request rests on them: a build that took 40 s the
 * last five times will most likely take about 40 s again.
 *
 * Kept in `<stateDir>/budget/run-times.json`, so a restarted service still knows; written
 * atomically after each new run, one write at a time (a run that ends while one is being written
 * is in the next). Only clean ends are learnt: a lease that ran out says when the holder went
 * silent, not how long its work took. Bounded: the last {@link RUNS_KEPT} runs of at most
 * {@link NAMES_KEPT} names, the longest unused forgotten first.
 */
import { readFileSync } from "node:fs";
import path from "node:path";
import { ensurePrivateDir, writeFileAtomic } from "@berth/shared/files";
import type { Logger } from "@berth/shared/logger";

/** The runs of one name kept: enough for a median that one odd run does not move. */
export const RUNS_KEPT = 9;
/** The names kept. */
export const NAMES_KEPT = 1000;

/** What the history says of a name: its usual time (the median of the runs kept), its longest kept run, and how many runs that rests on. */
export interface UsualTime {
  ms: number;
  longestMs: number;
  runs: number;
}

interface NameRuns {
  /** The last runs, oldest first, in ms. */
  runs: number[];
  /** When the name was last recorded (wall clock ms): the least recent is forgotten first. */
  at: number;
}

/** Where the history is kept in a state directory. */
export function runTimesFilePath(stateDir: string): string {
  return path.join(stateDir, "budget", "run-times.json");
}

export class RunTimes {
  readonly #names = new Map<string, NameRuns>();
  readonly #file: string | undefined;
  readonly #logger: Logger | undefined;
  #writing: Promise<void> | undefined;
  #dirty = false;

  /** Reads the history kept in `stateDir` (none: in memory only). A file that cannot be read or parsed starts an empty history, with a warning. */
  constructor(options: { stateDir?: string | undefined; logger?: Logger | undefined } = {}) {
    this.#file = options.stateDir === undefined ? undefined : runTimesFilePath(options.stateDir);
    this.#logger = options.logger;
    if (this.#file !== undefined) this.#load(this.#file);
  }

  /** The name's usual time, or undefined when no run of it ended cleanly yet. */
  usual(name: string): UsualTime | undefined {
    const known = this.#names.get(name);
    if (known === undefined || known.runs.length === 0) return undefined;
    const sorted = [...known.runs].sort((a, b) => a - b);
    const middle = sorted.length >> 1;
    const ms = sorted.length % 2 === 1 ? sorted[middle]! : Math.round((sorted[middle - 1]! + sorted[middle]!) / 2);
    return { ms, longestMs: sorted[sorted.length - 1]!, runs: known.runs.length };
  }

  /** Learns one clean run of `name` that took `ms`, at wall-clock time `at`. */
  record(name: string, ms: number, at: number): void {
    if (!(ms >= 0) || name === "") return;
    const known = this.#names.get(name) ?? { runs: [], at };
    known.runs.push(Math.round(ms));
    if (known.runs.length > RUNS_KEPT) known.runs.splice(0, known.runs.length - RUNS_KEPT);
    known.at = at;
    // Re-inserted: the Map's order is then least recently recorded first.
    this.#names.delete(name);
    this.#names.set(name, known);
    while (this.#names.size > NAMES_KEPT) this.#names.delete(this.#names.keys().next().value!);
    this.#save();
  }

  /** Resolves once what was recorded is on disk. */
  async flushed(): Promise<void> {
    while (this.#writing !== undefined) await this.#writing;
  }

  #load(file: string): void {
    let text: string;
    try {
      text = readFileSync(file, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT")
        this.#logger?.warn({ err: error, file }, "budget: the run-time history could not be read; starting without it");
      return;
    }
    try {
      const body = JSON.parse(text) as { names?: Record<string, { runs?: unknown; at?: unknown }> };
      const entries = Object.entries(body.names ?? {})
        .map(
          ([name, value]) =>
            [
              name,
              {
                runs: Array.isArray(value.runs) ? value.runs.filter((ms): ms is number => typeof ms === "number" && ms >= 0) : [],
                at: typeof value.at === "number" ? value.at : 0,
              },
            ] as const,
        )
        .filter(([, value]) => value.runs.length > 0)
        .sort((a, b) => a[1].at - b[1].at);
      for (const [name, value] of entries.slice(-NAMES_KEPT)) this.#names.set(name, { runs: value.runs.slice(-RUNS_KEPT), at: value.at });
    } catch (error) {
      this.#logger?.warn({ err: error, file }, "budget: the run-time history is not valid JSON; starting without it");
    }
  }

  #save(): void {
    if (this.#file === undefined) return;
    this.#dirty = true;
    if (this.#writing !== undefined) return;
    const file = this.#file;
    this.#writing = (async () => {
      while (this.#dirty) {
        this.#dirty = false;
        const names = Object.fromEntries([...this.#names].map(([name, value]) => [name, { runs: value.runs, at: value.at }]));
        try {
          ensurePrivateDir(path.dirname(file));
          await writeFileAtomic(file, `${JSON.stringify({ version: 1, names })}\n`);
        } catch (error) {
          this.#logger?.warn({ err: error, file }, "budget: the run-time history could not be saved; it is kept in memory");
        }
      }
    })().finally(() => {
      this.#writing = undefined;
    });
  }
}
