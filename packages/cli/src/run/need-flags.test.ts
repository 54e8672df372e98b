import { describe, expect, it } from "vitest";
import { UsageError } from "../args.js";
import { durationFlag, durationLike, needFromFlags } from "./need-flags.js";

describe("duration flags", () => {
  it("take a unit: 500ms, 30s, 5m, 1h, 1m30s; 0 alone needs none; unset is undefined", () => {
    expect(durationFlag("500ms", "--max-wait")).toBe(500);
    expect(durationFlag("30s", "--max-wait")).toBe(30_000);
    expect(durationFlag("1m30s", "--max-wait")).toBe(90_000);
    expect(durationFlag("0", "--max-wait")).toBe(0);
    expect(durationFlag(undefined, "--max-wait")).toBeUndefined();
  });

  it("refuse a bare number, naming the flag and the units", () => {
    for (const value of ["5", "30", "1.5"]) {
      expect(() => durationFlag(value, "--max-wait")).toThrow(UsageError);
      expect(() => durationFlag(value, "--max-wait")).toThrow(
        `--max-wait: "${value}" has no unit: write ${value}s, ${value}m or ${value}ms (units: ms, s, m, h, d; only 0 needs none)`,
      );
    }
    expect(() => durationFlag("soon", "--progress")).toThrow('--progress: "soon" is not a duration like 30s, 10m or 1h');
  });

  it("refuse a value over the limit before anything is sent, quoting the limit in the unit typed", () => {
    const day = 86_400_000;
    expect(durationFlag("24d", "--max-wait", 24 * day)).toBe(24 * day);
    expect(() => durationFlag("30d", "--max-wait", 24 * day)).toThrow(UsageError);
    expect(() => durationFlag("30d", "--max-wait", 24 * day)).toThrow("--max-wait: must be at most 24d, got 30d");
    expect(() => durationFlag("1000h", "--max-wait", 24 * day)).toThrow("--max-wait: must be at most 576h, got 1000h");
    expect(() => durationFlag(" 20m ", "--max-wait", 600_000)).toThrow("--max-wait: must be at most 10m, got 20m");
    expect(() => durationFlag("3000000s", "--max-wait", 24 * day)).toThrow("--max-wait: must be at most 2073600s, got 3000000s");
  });

  it("quote a limit in the unit the user typed", () => {
    expect(durationLike(100, "0.05s")).toBe("0.1s");
    expect(durationLike(100, "50ms")).toBe("100ms");
    expect(durationLike(600_000, "2h")).toBe("0.167h");
    expect(durationLike(600_000, "30m")).toBe("10m");
    expect(durationLike(100, "0")).toBe("100ms");
  });
});

describe("need flags", () => {
  it("read sizes to bytes and cpus to cores, once; a build part only when a build flag is given", () => {
    expect(needFromFlags({ memory: " 2GiB ", cpu: "0.5" })).toEqual({ run: { memory: 2 * 1024 ** 3, cpu: 0.5 }, build: undefined });
    expect(needFromFlags({ "build-memory": "1.5K" })).toEqual({ run: { memory: undefined, cpu: undefined }, build: { memory: 1536, cpu: undefined } });
  });

  it("refuse a size or cpu that is not one, empty included, naming the flag", () => {
    expect(() => needFromFlags({ memory: "12Q" })).toThrow(UsageError);
    expect(() => needFromFlags({ memory: "12Q" })).toThrow('--memory: "12Q" is not a size like 512M, 2G or 1.5GiB');
    expect(() => needFromFlags({ "build-memory": "" })).toThrow('--build-memory: "" is not a size like 512M, 2G or 1.5GiB');
    expect(() => needFromFlags({ memory: "99999999T" })).toThrow('--memory: "99999999T" is not a size like 512M, 2G or 1.5GiB');
    expect(() => needFromFlags({ cpu: "-1" })).toThrow('--cpu: "-1" is not a number of cpus like 0.5 or 2');
    expect(() => needFromFlags({ "build-cpu": "" })).toThrow('--build-cpu: "" is not a number of cpus like 0.5 or 2');
  });
});
