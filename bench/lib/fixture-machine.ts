/** A machine that never changes, for benchmarks whose figures must not depend on this one's load. */
import { mkdirSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";

/**
 * A quiet 16G machine (a `--proc-root` with meminfo and loadavg, no PSI, no cgroup) and the budget
 * flags that read it, with 4G and 64 cpus to commit: every sample is the same, so only what a
 * benchmark does changes the budget. Remove `dir` afterwards.
 */
export function fixtureMachine(): { dir: string; args: string[] } {
  const dir = mkdtempSync(path.join(tmpdir(), "berth-bench-machine-"));
  const proc = path.join(dir, "proc");
  mkdirSync(proc);
  writeFileSync(path.join(proc, "meminfo"), "MemTotal:       16777216 kB\nMemFree:         8000000 kB\nMemAvailable:   16000000 kB\n");
  writeFileSync(path.join(proc, "loadavg"), "0.00 0.00 0.00 1/100 4242\n");
  return { dir, args: [`--proc-root=${proc}`, "--cgroup-root=/nonexistent", "--memory=4G", "--cpu=64"] };
}
