import { describe, expect, it } from "vitest";
import { estimateEtas, etaMsAt, usualWords, type EtaInput, type Holding } from "./eta.js";
import type { UsualTime } from "./run-times.js";

const G = 1024 ** 3;
const budget = { memoryBytes: 8 * G, cpu: 4 };
const work = (name: string, gb: number, cpu = 0) => ({ name, want: { memoryBytes: gb * G, cpu } });

/** The estimates as the wait each leaves at `now` (1000 unless told). */
function estimate(holdings: Holding[], queue: EtaInput["queue"], usual: Record<string, UsualTime> = {}, machineGates?: string, now = 1000) {
  return estimateEtas({ now, budget, holdings, queue, usual: (name) => usual[name], machineGates }).map(({ at, basis }) => ({
    etaMs: etaMsAt({ at, basis }, now),
    basis,
  }));
}

describe("estimateEtas", () => {
  it("waits for the holder whose end makes room: its usual run time or its lease", () => {
    const holdings: Holding[] = [
      { label: "'build'", memoryBytes: 4 * G, cpu: 0, endsAt: 31_000, endBasis: "it usually runs 40s (5 runs)" },
      { label: "'db'", memoryBytes: 3 * G, cpu: 0, endsAt: 11_000, endBasis: "its lease runs out unless renewed" },
    ];
    expect(estimate(holdings, [work("small", 2), work("big", 6)])).toEqual([
      { etaMs: 10_000, basis: "when 'db' ends (its lease runs out unless renewed)" },
      { etaMs: 30_000, basis: "when 'build' ends (it usually runs 40s (5 runs)), after the 1 ahead of it" },
    ]);
  });

  it("counts a request admitted ahead by its own usual time, and moves as time passes", () => {
    const holdings: Holding[] = [{ label: "'build'", memoryBytes: 8 * G, cpu: 0, endsAt: 21_000, endBasis: "it usually runs 20s (3 runs)" }];
    const usual = { test: { ms: 15_000, longestMs: 16_000, runs: 4 } };
    const queue = [work("test", 8), work("lint", 8)];
    const first = estimate(holdings, queue, usual);
    expect(first.map((e) => e.etaMs)).toEqual([20_000, 35_000]);
    expect(first[1]!.basis).toBe("when 'test' ends (it usually runs 15s (4 runs)), after the 1 ahead of it");
    const later = estimate(holdings, queue, usual, undefined, 11_000);
    expect(later.map((e) => e.etaMs)).toEqual([10_000, 25_000]);
  });

  it("says the budget has room when only the queue order holds a request", () => {
    expect(estimate([], [work("a", 1), work("b", 1)])).toEqual([
      { etaMs: 0, basis: "the budget has room for it now" },
      { etaMs: 0, basis: "the budget has room for it and the 1 ahead of it now" },
    ]);
  });

  it("says unknown, and why, when the wait rests on a holder with no known end, for it and everyone behind", () => {
    const holdings: Holding[] = [{ label: "'db'", memoryBytes: 7 * G, cpu: 1 }];
    expect(estimate(holdings, [work("a", 2), work("b", 1)])).toEqual([
      { etaMs: undefined, basis: "unknown: it waits for 'db' (7G, 1 cpu) to end, and nothing says when: no lease, no past runs" },
      { etaMs: undefined, basis: "unknown: a request ahead of it has no estimate" },
    ]);
  });

  it("says unknown when a request ahead of it has no usual time and holds what it needs, but not when what that one holds would not do", () => {
    const estimates = estimate([], [work("first", 6), work("second", 6)]);
    expect(estimates[0]).toEqual({ etaMs: 0, basis: "the budget has room for it now" });
    expect(estimates[1]).toEqual({
      etaMs: undefined,
      basis: "unknown: it waits for 'first' (6G, 0 cpu) to end, and nothing says when: no lease, no past runs",
    });
  });

  it("expects nothing of a stranger ahead that holds too little to matter", () => {
    const holdings: Holding[] = [{ label: "'build'", memoryBytes: 5 * G, cpu: 0, endsAt: 21_000, endBasis: "it usually runs 20s (3 runs)" }];
    // 'stranger' (1G) fits beside 'build'; 'next' (4G) needs what 'build' frees: 'stranger' could not make room for it.
    expect(estimate(holdings, [work("stranger", 1), work("next", 4)]).map((e) => e.etaMs)).toEqual([0, 20_000]);
  });

  it("has no basis when the first waiter waits for the machine (free memory, cpu pressure, load)", () => {
    expect(estimate([], [work("a", 1), work("b", 1)], {}, "cpu pressure to ease")).toEqual([
      { etaMs: undefined, basis: "unknown: it waits for cpu pressure to ease, which nothing predicts" },
      { etaMs: undefined, basis: "unknown: the head of the queue waits for the machine, which nothing predicts" },
    ]);
  });

  it("says a usual time as people say it: whole seconds from a second on", () => {
    expect(usualWords({ ms: 6017, longestMs: 6017, runs: 1 })).toBe("it usually runs 6s (1 run)");
    expect(usualWords({ ms: 302, longestMs: 400, runs: 2 })).toBe("it usually runs 302ms (2 runs)");
  });

  it("replays thousands of requests in n log n", () => {
    const queue = Array.from({ length: 10_000 }, (_, i) => work(`w${i % 7}`, 1));
    const usual = Object.fromEntries(Array.from({ length: 7 }, (_, i) => [`w${i}`, { ms: 1000 * (i + 1), longestMs: 1000 * (i + 1), runs: 3 }]));
    const estimates = estimate([], queue, usual);
    expect(estimates).toHaveLength(10_000);
    expect(estimates.every((e) => e.etaMs !== undefined)).toBe(true);
    // In order: nobody is admitted before a request ahead of it.
    for (let i = 1; i < estimates.length; i++) expect(estimates[i]!.etaMs!).toBeGreaterThanOrEqual(estimates[i - 1]!.etaMs!);
  });
});
