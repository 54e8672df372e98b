import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { ManualClock } from "@berth/shared/clock";
import { afterEach, describe, expect, it } from "vitest";
import { MIN_READ_INTERVAL_MS, parseStat, ProcessTable, topConsumers } from "./process-table.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

/** A /proc with the given processes: pid, name, cpu ticks (user + system), rss pages. */
function fakeProc(processes: Array<[number, string, number, number]>, dir = mkdtempSync(path.join(tmpdir(), "berth-proc-"))): string {
  if (!dirs.includes(dir)) dirs.push(dir);
  for (const [pid, name, ticks, rss] of processes) {
    mkdirSync(path.join(dir, String(pid)), { recursive: true });
    // Fields 3..: state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss
    writeFileSync(
      path.join(dir, String(pid), "stat"),
      `${pid} (${name}) S 1 1 1 0 -1 0 0 0 0 0 ${ticks} 0 0 0 20 0 1 0 ${1000 + pid} 100000 ${rss} 18446744073709551615\n`,
    );
  }
  mkdirSync(path.join(dir, "self"), { recursive: true });
  writeFileSync(path.join(dir, "meminfo"), "MemTotal: 1 kB\n");
  return dir;
}

describe("parseStat", () => {
  it("reads the name even with spaces and parentheses in it, and the cpu ticks, start time and rss", () => {
    expect(parseStat("42 (Web Content (x)) S 1 1 1 0 -1 0 0 0 0 0 300 50 0 0 20 0 1 0 7777 1000 256 0\n")).toEqual({
      pid: 42,
      name: "Web Content (x)",
      ticks: 350,
      startTime: 7777,
      rssPages: 256,
    });
    expect(parseStat("garbage")).toBeUndefined();
  });
});

describe("ProcessTable", () => {
  it("reads every process's memory, and its cpu from the second reading on, at most every few seconds", () => {
    const clock = new ManualClock();
    const proc = fakeProc([
      [10, "chromium", 100, 1000],
      [11, "chromium", 100, 2000],
      [20, "node", 0, 500],
      [30, "kthreadd", 0, 0],
    ]);
    const table = new ProcessTable({ clock, procRoot: proc });
    const first = table.reading();
    expect(first.processes.map((p) => [p.pid, p.name, p.rssBytes, p.cpu])).toEqual([
      [10, "chromium", 1000 * 4096, undefined],
      [11, "chromium", 2000 * 4096, undefined],
      [20, "node", 500 * 4096, undefined],
    ]);
    fakeProc([[20, "node", 1000, 500]], proc);
    clock.advance(MIN_READ_INTERVAL_MS - 1);
    expect(table.reading()).toBe(first);
    clock.advance(1);
    // 1000 ticks (10 s of cpu) in 5 s: 2 cores.
    expect(table.reading().processes.find((p) => p.pid === 20)?.cpu).toBe(2);
  });

  it("adds up the processes of one name and names berth's running work by its pid", () => {
    const clock = new ManualClock();
    const proc = fakeProc([
      [10, "chromium", 0, 1000],
      [11, "chromium", 0, 2000],
      [20, "node", 0, 500],
      [21, "node", 0, 400],
    ]);
    const reading = new ProcessTable({ clock, procRoot: proc }).reading();
    expect(topConsumers(reading, "memory", 3, new Map([[21, "npm run build"]]))).toEqual([
      { name: "chromium", pid: undefined, processes: 2, memoryBytes: 3000 * 4096, cpu: 0, berth: false },
      { name: "node", pid: 20, processes: 1, memoryBytes: 500 * 4096, cpu: 0, berth: false },
      { name: "npm run build", pid: 21, processes: 1, memoryBytes: 400 * 4096, cpu: 0, berth: true },
    ]);
    // Nobody used any cpu yet: nobody is named for it.
    expect(topConsumers(reading, "cpu", 3)).toEqual([]);
  });

  it("reads nothing, and fails nothing, where there is no /proc", () => {
    expect(new ProcessTable({ clock: new ManualClock(), procRoot: "/nonexistent" }).reading().processes).toEqual([]);
  });
});
