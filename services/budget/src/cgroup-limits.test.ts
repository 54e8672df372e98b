import { describe, expect, it } from "vitest";
import { countCpuset, parseCfsQuota, parseCpuMax, statField, v1MemoryLimit } from "./cgroup-limits.js";

describe("cgroup file parsers", () => {
  it.each([
    ["max 100000", undefined],
    ["50000 100000", 0.5],
    ["200000", 2],
    ["", undefined],
  ])("cpu.max %j", (text, cpus) => expect(parseCpuMax(text)).toBe(cpus));

  it.each([
    ["150000\n", "100000\n", 1.5],
    ["-1\n", "100000\n", undefined],
    ["50000", undefined, undefined],
    ["50000", "0", undefined],
    [undefined, "100000", undefined],
  ])("cpu.cfs_quota_us %j over cpu.cfs_period_us %j", (quota, period, cpus) => expect(parseCfsQuota(quota, period)).toBe(cpus));

  it.each([
    ["0-3", 4],
    ["0-1,4,6-7", 5],
    ["2", 1],
    ["", undefined],
    ["garbage", undefined],
  ])("cpuset %j", (text, count) => expect(countCpuset(text)).toBe(count));

  it("v1's unlimited value, whatever the page size, is no limit; a limit above the machine's memory is still a limit", () => {
    expect(v1MemoryLimit(Number("9223372036854771712"))).toBeUndefined();
    expect(v1MemoryLimit(Number("9223372036854710272"))).toBeUndefined();
    expect(v1MemoryLimit(2 ** 62)).toBeUndefined();
    expect(v1MemoryLimit(2 ** 50)).toBe(2 ** 50);
    expect(v1MemoryLimit(512 * 1024 ** 2)).toBe(512 * 1024 ** 2);
    expect(v1MemoryLimit(undefined)).toBeUndefined();
  });

  it("reads a memory.stat line by its whole key", () => {
    const stat = "inactive_file 10\ntotal_inactive_file 30\nhierarchical_memory_limit 9223372036854771712\n";
    expect(statField(stat, "inactive_file")).toBe(10);
    expect(statField(stat, "total_inactive_file")).toBe(30);
    expect(statField(stat, "active_file")).toBeUndefined();
    expect(statField(undefined, "inactive_file")).toBeUndefined();
  });
});
