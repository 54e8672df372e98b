/**
 * Who a process is, in a way that survives pid reuse: a pid alone can name a different process after
 * the original exits, so berth records the pid together with the process's start time (clock ticks
 * since boot, from /proc/PID/stat), the boot id and the hostname. A record names a live process only
 * when all of them still match.
 */
import { readFileSync } from "node:fs";
import { hostname } from "node:os";

/** The identity of one process, as recorded in claims and lock files. */
export interface ProcessIdentity {
  pid: number;
  /** Field 22 of /proc/PID/stat (starttime, in clock ticks since boot); absent where /proc is not. */
  startTime?: number | undefined;
  /** /proc/sys/kernel/random/boot_id: start times restart from zero at every boot. */
  bootId?: string | undefined;
  hostname: string;
}

function isPid(pid: unknown): pid is number {
  return typeof pid === "number" && Number.isInteger(pid) && pid > 0;
}

/**
 * Parses the start time out of the text of /proc/PID/stat. The second field (comm) is the program
 * name in parentheses and may itself contain spaces and ')', so fields are counted from the LAST ')'.
 */
export function parseStatStartTime(stat: string): number | undefined {
  const end = stat.lastIndexOf(")");
  if (end < 0) return undefined;
  // After ")" come fields 3 (state), 4 (ppid), … so field 22 is the 20th of the rest.
  const fields = stat
    .slice(end + 1)
    .trim()
    .split(/\s+/);
  const raw = fields[22 - 3];
  if (raw === undefined || !/^\d+$/.test(raw)) return undefined;
  const value = Number(raw);
  return Number.isSafeInteger(value) ? value : undefined;
}

/** The state letter (field 3) of the text of /proc/PID/stat: "R", "S", "Z" (zombie)… */
export function parseStatState(stat: string): string | undefined {
  const end = stat.lastIndexOf(")");
  if (end < 0) return undefined;
  return /^\s*([A-Za-z])\b/.exec(stat.slice(end + 1))?.[1];
}

/**
 * True when `pid` has exited but not been reaped: it still answers signal 0, yet it runs nothing
 * and never will. Under a PID 1 that does not reap orphans (a container without an init), the
 * child of a killed `berth admit -- CMD` stays a zombie forever, and must not hold its share.
 */
function isZombie(pid: number): boolean {
  try {
    const state = parseStatState(readFileSync(`/proc/${pid}/stat`, "utf8"));
    return state === "Z" || state === "X";
  } catch {
    return false;
  }
}

/** The start time of `pid` (field 22 of /proc/PID/stat), or undefined when it is gone or unreadable. */
export function processStartTime(pid: number): number | undefined {
  if (!isPid(pid)) return undefined;
  try {
    return parseStatStartTime(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch {
    return undefined;
  }
}

/**
 * True when a process with this pid exists and has not exited (signal 0; EPERM means it exists but
 * is not ours; a zombie, exited but not yet reaped, counts as gone).
 */
export function isPidAlive(pid: number): boolean {
  if (!isPid(pid)) return false;
  try {
    process.kill(pid, 0);
  } catch (error) {
    // Only ESRCH proves the process is gone. EPERM (another user's process) and anything else
    // (EACCES from an AppArmor profile refusing signals across a container boundary) mean it is
    // there or unknown, and a lock or a running entry must never be taken from a live holder.
    if ((error as NodeJS.ErrnoException).code === "ESRCH") return false;
  }
  return !isZombie(pid);
}

/**
 * True when `pid` is alive and is the process that had `startTime`. Without a recorded start time, or
 * where /proc cannot tell, the answer falls back to "the pid is alive": unknown counts as live so a
 * holder is never broken on a guess.
 */
export function sameProcess(pid: number, startTime: number | undefined): boolean {
  if (!isPidAlive(pid)) return false;
  if (startTime === undefined) return true;
  const current = processStartTime(pid);
  if (current === undefined) return isPidAlive(pid);
  return current === startTime;
}

let cachedBootId: string | undefined | null = null;

/** This boot's id (/proc/sys/kernel/random/boot_id), or undefined where the kernel does not offer it. */
export function bootId(): string | undefined {
  if (cachedBootId === null) {
    try {
      cachedBootId = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim() || undefined;
    } catch (error) {
      // Out of descriptors this once: ask again next time rather than forget the boot for good.
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "EMFILE" || code === "ENFILE") return undefined;
      cachedBootId = undefined;
    }
  }
  return cachedBootId;
}

/** The identity of the current process. */
export function selfIdentity(): ProcessIdentity {
  return { pid: process.pid, startTime: processStartTime(process.pid), bootId: bootId(), hostname: hostname() };
}

/**
 * True when `identity` names a process that is running now: same hostname (a pid on another host or
 * container means nothing here), same boot (when both are known), and the pid alive with the same
 * start time.
 */
export function identityIsLive(identity: ProcessIdentity): boolean {
  if (!isPid(identity.pid)) return false;
  if (identity.hostname !== hostname()) return false;
  const currentBoot = bootId();
  if (identity.bootId !== undefined && currentBoot !== undefined && identity.bootId !== currentBoot) return false;
  return sameProcess(identity.pid, identity.startTime);
}
