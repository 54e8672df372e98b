/** Printing and summarising figures: one JSON line each. */

/** Prints one figure as a JSON line (with the time it was measured). */
export function emit(figure: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ ...figure, at: new Date().toISOString() })}\n`);
}

/** Percentiles (nearest rank) of durations in ms, rounded to µs. */
export function percentiles(samples: number[], ranks: readonly number[] = [50, 99]): Record<string, number> {
  const sorted = [...samples].sort((a, b) => a - b);
  const out: Record<string, number> = {};
  for (const rank of ranks) {
    const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil((rank / 100) * sorted.length) - 1));
    out[`p${rank}_ms`] = sorted.length === 0 ? NaN : Math.round((sorted[index] ?? NaN) * 1000) / 1000;
  }
  return out;
}

/** The ratio of two figures to three decimals (benchmarks quote ratios: the machine is shared). */
export function ratio(value: number, reference: number): number {
  return Math.round((value / reference) * 1000) / 1000;
}
