/**
 * The sessions benchmarks: `npm run bench -- sessions [--seconds=3] [--watch-seconds=30]
 * [--only=a,b]`. Every figure is one JSON line with, beside it, a reference measured in the same
 * run (the empty-RPC rate or latency on the same server, or the seed's store on the same data):
 * the machines are shared, so ratios are what compare across runs.
 *
 * Parts (names for `--only`): cold-open (replay, prefix snapshot + tail, hydration), stale-checkpoints (in-process: the store alone, against
 * the seed's store), append (AppendEvent × fsync × clients), append-events (AppendEvents and
 * GetSnapshot at 1k/100k events), watchers (100 watchers at 100 events/s, one entry a message and with max_batch), idle-watchers (memory
 * per watcher), logging (the per-RPC log line's cost), memory (resident memory under 10,000 sessions,
 * 1,000,000 idempotency keys and 10,000 seed lock files, against the bounds the README states).
 */
import { appendEventsAndSnapshots } from "./sessions/append-events.js";
import { appendMatrix } from "./sessions/append.js";
import { coldOpen } from "./sessions/cold-open.js";
import type { Options } from "./sessions/common.js";
import { idleWatchers } from "./sessions/idle-watchers.js";
import { loggingCost } from "./sessions/logging.js";
import { memoryBounds } from "./sessions/memory.js";
import { staleCheckpoints } from "./sessions/stale-checkpoints.js";
import { watchers } from "./sessions/watchers.js";

const PARTS = ["cold-open", "stale-checkpoints", "append", "append-events", "watchers", "idle-watchers", "logging", "memory"] as const;

function parseOptions(args: string[]): Options {
  const options: Options = { seconds: 3, watchSeconds: 30, watchers: 100, eventsPerSecond: 100, lowEventsPerSecond: 25, idleWatchers: 1000, only: undefined };
  for (const arg of args) {
    const [flag, value] = arg.split("=", 2) as [string, string | undefined];
    const number = Number(value);
    switch (flag) {
      case "--seconds":
        options.seconds = number;
        break;
      case "--watch-seconds":
        options.watchSeconds = number;
        break;
      case "--watchers":
        options.watchers = number;
        break;
      case "--events-per-second":
        options.eventsPerSecond = number;
        break;
      case "--low-events-per-second":
        options.lowEventsPerSecond = number;
        break;
      case "--idle-watchers":
        options.idleWatchers = number;
        break;
      case "--only":
        options.only = new Set((value ?? "").split(",").filter(Boolean));
        for (const part of options.only)
          if (!(PARTS as readonly string[]).includes(part)) throw new Error(`--only: unknown part ${part}; parts: ${PARTS.join(", ")}`);
        break;
      default:
        throw new Error(
          `unknown flag ${arg}; flags: --seconds=N --watch-seconds=N --watchers=N --events-per-second=N --low-events-per-second=N --idle-watchers=N --only=${PARTS.join(",")}`,
        );
    }
    if (flag !== "--only" && !(number > 0)) throw new Error(`${flag} needs a positive number`);
  }
  return options;
}

/** Runs the parts asked for; the in-process ones first, while the machine is quietest. */
export async function run(args: string[] = []): Promise<void> {
  const options = parseOptions(args);
  const wants = (part: (typeof PARTS)[number]) => options.only === undefined || options.only.has(part);
  if (wants("cold-open")) await coldOpen();
  if (wants("stale-checkpoints")) await staleCheckpoints();
  if (wants("append")) await appendMatrix(options);
  if (wants("append-events")) await appendEventsAndSnapshots(options);
  if (wants("watchers")) await watchers(options);
  if (wants("idle-watchers")) await idleWatchers(options);
  if (wants("logging")) await loggingCost(options);
  if (wants("memory")) await memoryBounds();
}
