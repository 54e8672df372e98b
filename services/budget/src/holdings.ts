/**
 * What holds the budget now, as the queue's ETAs see it: each reservation and running entry with
 * when it is expected to end.
 */
import { formatDuration } from "@berth/shared/units";
import type { Resources } from "./costs.js";
import { roughly, usualWords, type Holding } from "./eta.js";
import type { Reservation } from "./reservations.js";
import type { RunTimes } from "./run-times.js";
import type { RunningTally } from "./running-tally.js";

/**
 * Each part with when it is expected to end: at its usual run time while it has not run past it,
 * else when its lease runs out, else nothing says. `now` is monotonic.
 */
export function holdingsOf(
  reservations: Iterable<Reservation>,
  tally: Pick<RunningTally, "timings">,
  runTimes: Pick<RunTimes, "usual">,
  now: number,
): Holding[] {
  const holding = (name: string, held: Resources, startedAt: number, leaseDeadline: number | undefined, ends: boolean): Holding => {
    const label = `'${name}'`;
    const usual = runTimes.usual(name);
    if (usual !== undefined && startedAt + usual.ms > now) return { label, ...held, endsAt: startedAt + usual.ms, endBasis: usualWords(usual) };
    // Past its usual time: by its longest run, while it has not run longer than that too.
    if (usual !== undefined && startedAt + usual.longestMs > now)
      return {
        label,
        ...held,
        endsAt: startedAt + usual.longestMs,
        endBasis: `${usualWords(usual)} and has run longer; its longest run took ${formatDuration(roughly(usual.longestMs))}`,
      };
    if (leaseDeadline !== undefined) {
      const lease = "its lease runs out unless renewed";
      return {
        label,
        ...held,
        endsAt: leaseDeadline,
        endBasis: usual === undefined ? lease : `${usualWords(usual)}, has run longer than ever, and ${lease}`,
      };
    }
    return {
      label,
      ...held,
      ends,
      noEnd: usual === undefined ? "no lease, no past runs" : `no lease, and it has run longer than any of its ${usual.runs} past runs`,
    };
  };
  const found: Holding[] = [];
  for (const r of reservations) {
    const held = r.held();
    // A reservation's work ends; running work may be a service that runs until stopped.
    if (held.memoryBytes > 0 || held.cpu > 0) found.push(holding(r.owner, held, r.admittedAtMonotonic, r.leaseDeadline, true));
  }
  for (const t of tally.timings()) found.push(holding(t.name, t.cost, t.startedAt, t.leaseDeadline, false));
  return found;
}
