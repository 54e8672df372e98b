/**
 * SIGSTOP and SIGCONT for tests of an unresponsive process (a hung machine, a laptop's closed lid,
 * a long GC pause): etcd members and berth instances alike.
 */
import { readdirSync, readFileSync } from "node:fs";

/**
 * Sends SIGSTOP and returns once every thread of `pid` is stopped. SIGSTOP takes effect as each
 * thread is next scheduled: on a loaded machine one thread can still answer a request sent right
 * after the signal, which a test of an unresponsive process must not see. Synchronous, so nothing
 * of the caller runs in between; bounded: 5 s, then it throws.
 */
export function stopProcess(pid: number): void {
  process.kill(pid, "SIGSTOP");
  const tick = new Int32Array(new SharedArrayBuffer(4));
  const until = Date.now() + 5_000;
  for (;;) {
    const states = threadStates(pid);
    if (states.every((state) => state === "T" || state === "t")) return;
    if (Date.now() > until) throw new Error(`pid ${pid} did not stop within 5 s of SIGSTOP: thread states ${states.join("")}`);
    Atomics.wait(tick, 0, 0, 1);
  }
}

/** SIGCONT after {@link stopProcess}. */
export function continueProcess(pid: number): void {
  process.kill(pid, "SIGCONT");
}

/** The scheduler state letter of each thread of `pid` (/proc/PID/task/TID/stat). */
function threadStates(pid: number): string[] {
  return readdirSync(`/proc/${pid}/task`).flatMap((task) => {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${task}/stat`, "utf8");
      return [stat.charAt(stat.lastIndexOf(")") + 2)];
    } catch {
      return []; // the thread ended between the listing and the read
    }
  });
}
