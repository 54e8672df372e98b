/**
 * When each queued request will be admitted, from what its wait is for: the budget frees up as the
 * work holding it ends, and the queue admits in order. What holds the budget ends at a known time
 * when there is a basis for it — its usual run time (run-times.ts: the same name's past runs), or
 * its lease running out — and the estimate replays those ends in time order, admitting each
 * request in turn once its need fits, and counting its own end by its usual time when it has one.
 *
 * A holder that has run past its usual time is expected to end by its longest run. When the wait
 * rests on something nothing predicts (a holder with no lease and no past runs, or one that has run
 * longer than any of its past runs; a request ahead with no past runs, which will end but nobody
 * knows when; the machine's free memory or cpu pressure), the estimate says "unknown" and why, for
 * that request and every one behind it: a number with no basis teaches people to ignore ETAs. The estimate is of the budget gates only; a machine gate
 * that closes later (free memory, cpu) can still hold a request its estimate says is due.
 */
import { formatDuration, formatSize } from "@berth/shared/units";
import type { Resources } from "./costs.js";
import type { UsualTime } from "./run-times.js";

/** Something holding part of the budget, and when it is expected to let go. */
export interface Holding {
  /** For people: the owner or name, quoted. */
  label: string;
  memoryBytes: number;
  cpu: number;
  /** When it is expected to end (monotonic ms); undefined when nothing says. */
  endsAt?: number | undefined;
  /** Why then, in words ("it usually runs 42s, 5 runs"); with `endsAt`. */
  endBasis?: string | undefined;
  /** Without `endsAt`: why nothing says when it ends (default: it has no lease and no past runs). */
  noEnd?: string | undefined;
  /**
   * Without `endsAt`: work that will end (a reservation's), nobody knows when, rather than work
   * that runs until stopped (a service counted as running), which the estimate may count as held.
   */
  ends?: boolean | undefined;
}

/** A queued request as the estimate sees it. */
export interface QueuedWork {
  want: Resources;
  /** Its owner: the name its usual time is kept under. */
  name: string;
}

/** The estimate for one request: when it is expected to be admitted (monotonic ms; undefined: unknown) and what that rests on, or why there is none. */
export interface EtaEstimate {
  at: number | undefined;
  basis: string;
}

/** The wait an estimate leaves at `now` (undefined: unknown). */
export function etaMsAt(estimate: EtaEstimate, now: number): number | undefined {
  return estimate.at === undefined ? undefined : Math.max(0, Math.round(estimate.at - now));
}

export interface EtaInput {
  /** Now, on the monotonic clock the holdings' ends are on. */
  now: number;
  /** The whole budget. */
  budget: Resources;
  /** What holds the budget now. */
  holdings: readonly Holding[];
  /** The queue, in order. */
  queue: readonly QueuedWork[];
  /** A name's usual time, if its past runs say. */
  usual(name: string): UsualTime | undefined;
  /** The machine gates closed to the first waiter now, in words (free memory, cpu pressure, load); undefined when none is. */
  machineGates?: string | undefined;
}

/** A holding's end as the estimate uses it: when, why, and what it frees. */
interface End {
  at: number;
  label: string;
  basis: string;
  memoryBytes: number;
  cpu: number;
}

/** The words of a usual time: "it usually runs 42s (5 runs)". */
export function usualWords(usual: UsualTime): string {
  return `it usually runs ${formatDuration(roughly(usual.ms))} (${usual.runs} run${usual.runs === 1 ? "" : "s"})`;
}

/** A run time as people say it: whole seconds from a second on ("6s", not "6.017s"). */
export function roughly(ms: number): number {
  return ms < 1000 ? Math.round(ms) : Math.round(ms / 1000) * 1000;
}

/** Estimates every queued request's wait; see the module comment. O(n log n) in the queue and the holdings. */
export function estimateEtas(input: EtaInput): EtaEstimate[] {
  const { now, budget, queue } = input;
  const estimates: EtaEstimate[] = [];
  if (queue.length === 0) return estimates;
  if (input.machineGates !== undefined) {
    estimates.push({ at: undefined, basis: `unknown: it waits for ${input.machineGates}, which nothing predicts` });
    for (let i = 1; i < queue.length; i++)
      estimates.push({ at: undefined, basis: "unknown: the head of the queue waits for the machine, which nothing predicts" });
    return estimates;
  }
  let freeMemory = budget.memoryBytes;
  let freeCpu = budget.cpu;
  const ends = new MinHeap();
  /** The largest holding with no known end: what an unknown wait names. */
  let endless: Holding | undefined;
  /** What work that will end at a time nothing predicts holds (reservations, requests admitted in the replay with no usual time), named by the first. */
  let stranger: { label: string; memoryBytes: number; cpu: number; noEnd: string | undefined } | undefined;
  const strange = (label: string, memoryBytes: number, cpu: number, noEnd?: string) => {
    stranger =
      stranger === undefined ? { label, memoryBytes, cpu, noEnd } : { ...stranger, memoryBytes: stranger.memoryBytes + memoryBytes, cpu: stranger.cpu + cpu };
  };
  /** Why a wait for `holding` has no estimate. */
  const noEstimate = (holding: { label: string; memoryBytes: number; cpu: number; noEnd?: string | undefined }) =>
    `it waits for ${holding.label} (${formatSize(holding.memoryBytes)}, ${round(holding.cpu)} cpu) to end, and nothing says when: ${holding.noEnd ?? "no lease, no past runs"}`;
  for (const holding of input.holdings) {
    freeMemory -= holding.memoryBytes;
    freeCpu -= holding.cpu;
    if (holding.endsAt !== undefined) {
      ends.push({ at: holding.endsAt, label: holding.label, basis: holding.endBasis ?? "", memoryBytes: holding.memoryBytes, cpu: holding.cpu });
      continue;
    }
    if (holding.ends) strange(holding.label, holding.memoryBytes, holding.cpu, holding.noEnd);
    if (endless === undefined || holding.memoryBytes > endless.memoryBytes) endless = holding;
  }
  let at = now;
  let lastEnd: End | undefined;
  for (let i = 0; i < queue.length; i++) {
    const work = queue[i]!;
    let waitedFor: End | undefined;
    // Small slack: cpu shares add up in floating point.
    while (freeMemory < work.want.memoryBytes || freeCpu + 1e-9 < work.want.cpu) {
      // What a request ahead with no past runs holds would make room, and nothing says when it
      // ends: the replay, which counts it as held for good, would make this wait look too long.
      if (stranger !== undefined && freeMemory + stranger.memoryBytes >= work.want.memoryBytes && freeCpu + stranger.cpu + 1e-9 >= work.want.cpu) {
        estimates.push({ at: undefined, basis: `unknown: ${noEstimate(stranger)}` });
        for (let j = i + 1; j < queue.length; j++) estimates.push({ at: undefined, basis: "unknown: a request ahead of it has no estimate" });
        return estimates;
      }
      const end = ends.pop();
      if (end === undefined) {
        const why = endless === undefined ? "what holds the budget has no known end" : noEstimate(endless);
        estimates.push({ at: undefined, basis: i === 0 ? `unknown: ${why}` : `unknown: ${why}, or for a request ahead of it` });
        for (let j = i + 1; j < queue.length; j++) estimates.push({ at: undefined, basis: "unknown: a request ahead of it has no estimate" });
        return estimates;
      }
      at = Math.max(at, end.at);
      freeMemory += end.memoryBytes;
      freeCpu += end.cpu;
      waitedFor = end;
    }
    if (waitedFor !== undefined) lastEnd = waitedFor;
    let basis: string;
    if (lastEnd === undefined) basis = i === 0 ? "the budget has room for it now" : `the budget has room for it and the ${i} ahead of it now`;
    else basis = `when ${lastEnd.label} ends (${lastEnd.basis})${i === 0 ? "" : `, after the ${i} ahead of it`}`;
    estimates.push({ at, basis });
    freeMemory -= work.want.memoryBytes;
    freeCpu -= work.want.cpu;
    const usual = input.usual(work.name);
    if (usual !== undefined) {
      ends.push({ at: at + usual.ms, label: quote(work.name), basis: usualWords(usual), memoryBytes: work.want.memoryBytes, cpu: work.want.cpu });
    } else {
      strange(quote(work.name), work.want.memoryBytes, work.want.cpu);
      if (endless === undefined || work.want.memoryBytes > endless.memoryBytes)
        endless = { label: quote(work.name), memoryBytes: work.want.memoryBytes, cpu: work.want.cpu };
    }
  }
  return estimates;
}

const round = (n: number) => Math.round(n * 10) / 10;
const quote = (name: string) => `'${name}'`;

/** The ends by time: a binary min-heap (the queue may hold thousands, each adding an end). */
class MinHeap {
  readonly #items: End[] = [];

  push(item: End): void {
    const items = this.#items;
    items.push(item);
    let i = items.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (items[parent]!.at <= item.at) break;
      items[i] = items[parent]!;
      i = parent;
    }
    items[i] = item;
  }

  pop(): End | undefined {
    const items = this.#items;
    const top = items[0];
    const last = items.pop();
    if (items.length === 0 || last === undefined) return top;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= items.length) break;
      const child = left + 1 < items.length && items[left + 1]!.at < items[left]!.at ? left + 1 : left;
      if (items[child]!.at >= last.at) break;
      items[i] = items[child]!;
      i = child;
    }
    items[i] = last;
    return top;
  }
}
