import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { NAMES_KEPT, RUNS_KEPT, RunTimes, runTimesFilePath } from "./run-times.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});
function stateDir(): string {
  const dir = mkdtempSync(path.join(tmpdir(), "berth-run-times-"));
  dirs.push(dir);
  return dir;
}

describe("RunTimes", () => {
  it("answers the median of the last runs of a name, and nothing for a name never run", () => {
    const times = new RunTimes();
    expect(times.usual("build")).toBeUndefined();
    for (const ms of [40_000, 42_000, 300_000]) times.record("build", ms, 1);
    expect(times.usual("build")).toEqual({ ms: 42_000, longestMs: 300_000, runs: 3 });
    times.record("build", 41_000, 2);
    expect(times.usual("build")).toEqual({ ms: 41_500, longestMs: 300_000, runs: 4 });
  });

  it("keeps the last runs of each name and the most recently used names", () => {
    const times = new RunTimes();
    for (let i = 0; i < RUNS_KEPT + 5; i++) times.record("build", i < 5 ? 1_000_000 : 10_000, i);
    expect(times.usual("build")).toEqual({ ms: 10_000, longestMs: 10_000, runs: RUNS_KEPT });
    for (let i = 0; i <= NAMES_KEPT; i++) times.record(`name ${i}`, 1000, 100 + i);
    expect(times.usual("build")).toBeUndefined();
    expect(times.usual(`name ${NAMES_KEPT}`)).toEqual({ ms: 1000, longestMs: 1000, runs: 1 });
  });

  it("keeps the history in the state directory across a restart", async () => {
    const dir = stateDir();
    const first = new RunTimes({ stateDir: dir });
    first.record("npm run build", 30_000, 1);
    first.record("npm run build", 34_000, 2);
    await first.flushed();
    expect(JSON.parse(readFileSync(runTimesFilePath(dir), "utf8")).names["npm run build"].runs).toEqual([30_000, 34_000]);
    expect(new RunTimes({ stateDir: dir }).usual("npm run build")).toEqual({ ms: 32_000, longestMs: 34_000, runs: 2 });
  });

  it("starts empty, with a warning, from a file it cannot parse, and writes a good one next time", async () => {
    const dir = stateDir();
    const file = runTimesFilePath(dir);
    const before = new RunTimes({ stateDir: dir });
    before.record("x", 1, 1);
    await before.flushed();
    writeFileSync(file, "{not json");
    const warnings: unknown[] = [];
    const logger = { warn: (...args: unknown[]) => warnings.push(args) } as never;
    const times = new RunTimes({ stateDir: dir, logger });
    expect(warnings).toHaveLength(1);
    expect(times.usual("x")).toBeUndefined();
    times.record("y", 5, 1);
    await times.flushed();
    expect(new RunTimes({ stateDir: dir }).usual("y")).toEqual({ ms: 5, longestMs: 5, runs: 1 });
  });
});
