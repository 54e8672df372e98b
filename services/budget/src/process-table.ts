/**
 * Who is using the machine: the processes' resident memory and cpu from `/proc/<pid>/stat`, so a
 * refusal or a wait can name what holds the memory or the cpu it is short of, not only berth's own
 * bookkeeping. Processes of one name are added up ("chromium (12 processes) 4.1G"); a process that
 * is berth's running work is named as such ("berth: 'npm run build'").
 *
 * Cheap by construction: read at most every {@link MIN_READ_INTERVAL_MS} (a caller asking more
 * often gets the last reading), only the one small `stat` file per process, at most
 * {@link MAX_PROCESSES} of them, synchronously (a few ms for a few hundred processes: `readMs` says
 * how long each reading took). CPU is the change in a process's user + system time between two
 * readings, so the first reading has none.
 */
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";
import type { Clock } from "@berth/shared/clock";

/** The least time between two readings of /proc. */
export const MIN_READ_INTERVAL_MS = 5000;
/** The most processes one reading looks at. */
export const MAX_PROCESSES = 4096;
/** Linux reports process times in clock ticks of 1/100 s (USER_HZ) to user space. */
const TICKS_PER_SECOND = 100;
/** The page size `rss` is counted in: 4 KiB on the machines berth runs on (x86-64, arm64 Linux). */
const PAGE_BYTES = 4096;

/** One process as a reading saw it. */
export interface ProcessUsage {
  pid: number;
  /** Its name (`comm`: at most 15 characters). */
  name: string;
  rssBytes: number;
  /** Cores in use between the previous reading and this one; undefined on a process's first reading. */
  cpu: number | undefined;
}

/** One reading of the processes. */
export interface ProcessReading {
  /** When it was read (monotonic clock). */
  at: number;
  processes: ProcessUsage[];
  /** How long the reading took, in ms. */
  readMs: number;
}

/** One of the largest users of a resource: a process, several processes of one name, or berth's own work. */
export interface Consumer {
  /** The process's name, or for berth's own work its owner or name. */
  name: string;
  /** The process's id when one process is meant; undefined for several, or for berth's bookkeeping. */
  pid?: number | undefined;
  /** How many processes (0 for berth's bookkeeping: a reservation or a running entry with no process seen). */
  processes: number;
  /** Resident memory, or what berth's work holds of the budget. */
  memoryBytes: number;
  /** Cores in use, or what berth's work holds of the budget. */
  cpu: number;
  /** Berth's own work: a reservation, or running work (its process, when it is seen). */
  berth: boolean;
}

interface Ticks {
  ticks: number;
  at: number;
}

export class ProcessTable {
  #latest: ProcessReading | undefined;
  /** Each process's cpu ticks at the last reading, by pid and start time (a reused pid is another process). */
  #ticks = new Map<string, Ticks>();

  constructor(private readonly options: { clock: Clock; procRoot?: string | undefined }) {}

  /** The last reading, read again first when it is older than {@link MIN_READ_INTERVAL_MS} (or there is none). */
  reading(): ProcessReading {
    const now = this.options.clock.monotonicNow();
    if (this.#latest !== undefined && now - this.#latest.at < MIN_READ_INTERVAL_MS) return this.#latest;
    return this.read(now);
  }

  /** The last reading, as it is (undefined before the first). */
  get latest(): ProcessReading | undefined {
    return this.#latest;
  }

  private read(now: number): ProcessReading {
    const started = performance.now();
    const procRoot = this.options.procRoot ?? "/proc";
    let names: string[];
    try {
      names = readdirSync(procRoot);
    } catch {
      names = [];
    }
    const processes: ProcessUsage[] = [];
    const ticks = new Map<string, Ticks>();
    for (const entry of names) {
      if (processes.length >= MAX_PROCESSES) break;
      const first = entry.charCodeAt(0);
      if (first < 48 || first > 57) continue;
      let text: string;
      try {
        text = readFileSync(path.join(procRoot, entry, "stat"), "latin1");
      } catch {
        // Gone between the listing and the read.
        continue;
      }
      const stat = parseStat(text);
      if (stat === undefined) continue;
      const key = `${stat.pid}:${stat.startTime}`;
      const before = this.#ticks.get(key);
      ticks.set(key, { ticks: stat.ticks, at: now });
      const cpu = before === undefined || now <= before.at ? undefined : (stat.ticks - before.ticks) / TICKS_PER_SECOND / ((now - before.at) / 1000);
      // Kernel threads hold no memory of their own.
      if (stat.rssPages <= 0) continue;
      processes.push({ pid: stat.pid, name: stat.name, rssBytes: stat.rssPages * PAGE_BYTES, cpu });
    }
    this.#ticks = ticks;
    this.#latest = { at: now, processes, readMs: performance.now() - started };
    return this.#latest;
  }
}

/** The fields of `/proc/<pid>/stat` used here; undefined for a line that does not parse. */
export function parseStat(text: string): { pid: number; name: string; ticks: number; startTime: number; rssPages: number } | undefined {
  // The name is in parentheses and may hold spaces and parentheses itself: it ends at the last ')'.
  const open = text.indexOf("(");
  const close = text.lastIndexOf(")");
  if (open < 0 || close < open) return undefined;
  const pid = Number(text.slice(0, open).trim());
  // From field 3 (state) on: utime is field 14, stime 15, starttime 22, rss 24.
  const fields = text.slice(close + 2).split(" ");
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  const startTime = Number(fields[19]);
  const rssPages = Number(fields[21]);
  if (![pid, utime, stime, startTime, rssPages].every(Number.isFinite)) return undefined;
  return { pid, name: text.slice(open + 1, close), ticks: utime + stime, startTime, rssPages };
}

/**
 * The largest users of memory (`by: "memory"`) or cpu in `reading`, processes of one name added
 * up, berth's running work (by pid: `berthPids` names it) named as such; at most `limit`, largest
 * first. Processes with no cpu figure yet count as none for cpu.
 */
export function topConsumers(reading: ProcessReading, by: "memory" | "cpu", limit: number, berthPids: ReadonlyMap<number, string> = new Map()): Consumer[] {
  const groups = new Map<string, Consumer>();
  for (const p of reading.processes) {
    const berthName = berthPids.get(p.pid);
    const key = berthName === undefined ? `name:${p.name}` : `pid:${p.pid}`;
    const group = groups.get(key);
    if (group === undefined) {
      groups.set(key, { name: berthName ?? p.name, pid: p.pid, processes: 1, memoryBytes: p.rssBytes, cpu: p.cpu ?? 0, berth: berthName !== undefined });
      continue;
    }
    group.pid = undefined;
    group.processes++;
    group.memoryBytes += p.rssBytes;
    group.cpu += p.cpu ?? 0;
  }
  const size = (c: Consumer) => (by === "memory" ? c.memoryBytes : c.cpu);
  return [...groups.values()]
    .filter((c) => size(c) > 0)
    .sort((a, b) => size(b) - size(a))
    .slice(0, limit);
}
