/**
 * Closed-loop load: `concurrency` workers each call `op` back to back until `durationMs` has passed.
 * Returns the rate and the latency of every call (ms).
 */
export async function closedLoop(
  concurrency: number,
  durationMs: number,
  op: (worker: number, i: number) => Promise<unknown>,
): Promise<{ ops: number; perSecond: number; latenciesMs: number[]; errors: number; firstError?: unknown }> {
  const latenciesMs: number[] = [];
  let errors = 0;
  let firstError: unknown;
  const start = performance.now();
  const end = start + durationMs;
  await Promise.all(
    Array.from({ length: concurrency }, async (_, worker) => {
      for (let i = 0; performance.now() < end; i++) {
        const t0 = performance.now();
        try {
          await op(worker, i);
          latenciesMs.push(performance.now() - t0);
        } catch (error) {
          errors++;
          firstError ??= error;
        }
      }
    }),
  );
  const elapsed = performance.now() - start;
  const ops = latenciesMs.length;
  return { ops, perSecond: Math.round((ops / elapsed) * 1000), latenciesMs, errors, firstError };
}
