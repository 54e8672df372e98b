/**
 * The resident memory of a process, read from /proc/PID/status (VmRSS) once a second, for the load
 * suite's leak check: what the kernel says the process holds, whatever V8 thinks of its heap.
 */
import { readFileSync } from "node:fs";

const MB = 1024 * 1024;

/** VmRSS of `pid` in bytes; undefined when the process is gone or the field is missing. */
export function readRss(pid: number): number | undefined {
  let status: string;
  try {
    status = readFileSync(`/proc/${pid}/status`, "utf8");
  } catch {
    return undefined;
  }
  const match = /^VmRSS:\s+(\d+)\s+kB$/m.exec(status);
  return match ? Number(match[1]) * 1024 : undefined;
}

/**
 * CPU seconds `pid` has used so far (user + system, /proc/PID/stat fields 14 and 15), or undefined
 * when it is gone. Assumes the usual 100 clock ticks a second.
 */
export function readCpuSeconds(pid: number): number | undefined {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return undefined;
  }
  // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** Bytes as megabytes with one decimal, for reports. */
export function toMb(bytes: number): number {
  return Math.round((bytes / MB) * 10) / 10;
}

/** One reading. */
export interface RssSample {
  /** ms since the sampler started. */
  readonly atMs: number;
  readonly bytes: number;
}

/** Samples a process's RSS every `intervalMs` until stopped; keeps every sample and the peak. */
export class RssSampler {
  readonly samples: RssSample[] = [];
  private readonly timer: NodeJS.Timeout;
  private readonly startedAt = performance.now();
  peakBytes = 0;

  constructor(
    private readonly pid: number,
    intervalMs = 1000,
  ) {
    this.sample();
    this.timer = setInterval(() => this.sample(), intervalMs);
  }

  /** Takes a reading now (also done by the timer); returns it, or undefined if the process is gone. */
  sample(): number | undefined {
    const bytes = readRss(this.pid);
    if (bytes === undefined) return undefined;
    this.samples.push({ atMs: Math.round(performance.now() - this.startedAt), bytes });
    if (bytes > this.peakBytes) this.peakBytes = bytes;
    return bytes;
  }

  /** The latest reading. */
  get lastBytes(): number {
    return this.samples.at(-1)?.bytes ?? 0;
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
