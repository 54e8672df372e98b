/**
 * What the load suite counts: operations, streams, messages, how every call ended (by gRPC code),
 * which endings were intended (and why), and the violations: any ending or message that breaks a
 * promise.
 */

/** The load suite's counters, shared by every client loop. */
export class LoadTally {
  /** Unary calls answered plus streams opened. */
  operations = 0;
  streamsOpened = 0;
  /** Streams open now (opened, status not yet seen). */
  streamsOpen = 0;
  /** Stream messages received. */
  messages = 0;
  /** Every call that ended with a status other than OK, by code name (intended ones included). */
  readonly errorsByCode: Record<string, number> = {};
  /** Endings that are part of the plan, by reason (a client cancelling its own watch, a short wait running out…). */
  readonly intended: Record<string, number> = {};
  /** How many promises were broken; the first few are kept word for word. */
  violationCount = 0;
  readonly violations: string[] = [];
  private static readonly KEPT = 40;

  /** A call ended with `code` (`OK` counts nowhere). */
  ended(code: string): void {
    if (code !== "OK") this.errorsByCode[code] = (this.errorsByCode[code] ?? 0) + 1;
  }

  /** An ending that the suite planned for. */
  intend(reason: string): void {
    this.intended[reason] = (this.intended[reason] ?? 0) + 1;
  }

  /** Milliseconds of answered unary calls, by RPC. */
  private readonly latencies = new Map<string, number[]>();

  /** Records how long an answered unary call took. */
  took(rpc: string, ms: number): void {
    let list = this.latencies.get(rpc);
    if (list === undefined) this.latencies.set(rpc, (list = []));
    list.push(ms);
  }

  /** Per RPC: calls, median and slowest milliseconds (reported, never judged). */
  latencyReport(): Record<string, { calls: number; p50Ms: number; maxMs: number }> {
    const report: Record<string, { calls: number; p50Ms: number; maxMs: number }> = {};
    for (const [rpc, list] of [...this.latencies].sort(([a], [b]) => a.localeCompare(b))) {
      const sorted = [...list].sort((a, b) => a - b);
      report[rpc] = { calls: sorted.length, p50Ms: Math.round(sorted[Math.floor(sorted.length / 2)]!), maxMs: Math.round(sorted.at(-1)!) };
    }
    return report;
  }

  /** A broken promise. */
  violation(what: string): void {
    this.violationCount++;
    if (this.violations.length < LoadTally.KEPT) this.violations.push(what);
  }

  /** Counts one answered unary call. */
  answered(): void {
    this.operations++;
  }

  /** Counts a stream opened; call {@link streamClosed} at its status. */
  streamOpened(): void {
    this.operations++;
    this.streamsOpened++;
    this.streamsOpen++;
  }

  streamClosed(): void {
    this.streamsOpen--;
  }
}
