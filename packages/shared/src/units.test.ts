import { describe, expect, it } from "vitest";
import fc from "fast-check";
import { isBerthError } from "./errors.js";
import { formatDuration, formatSize, parseCpu, parseDuration, parseMemory, parseSize } from "./units.js";

describe("parseSize", () => {
  it.each([
    ["1024", 1024],
    ["0", 0],
    ["100k", 100 * 1024],
    ["100K", 100 * 1024],
    ["512M", 512 * 1024 ** 2],
    ["2G", 2 * 1024 ** 3],
    ["2GB", 2 * 1024 ** 3],
    ["1.5GiB", 1.5 * 1024 ** 3],
    ["1.5 GiB", 1.5 * 1024 ** 3],
    ["900B", 900],
    ["1T", 1024 ** 4],
  ])("%s is %d bytes", (input, bytes) => {
    expect(parseSize(input)).toBe(bytes);
  });

  it("takes a number of bytes", () => {
    expect(parseSize(4096)).toBe(4096);
  });

  it.each(["", "abc", "12X", "-1", "-1G", "1..5G", "G", "NaN", "Infinity", "1e3", "1.5.5M", "99999999999T"])("refuses %j naming the field", (input) => {
    let thrown: unknown;
    try {
      parseSize(input, "memory");
    } catch (error) {
      thrown = error;
    }
    expect(isBerthError(thrown) && thrown.code === "invalid_argument").toBe(true);
    expect((thrown as Error).message).toMatch(/^memory: /);
  });

  it.each([-1, NaN, Infinity, -Infinity, 1.5])("refuses the number %d", (input) => {
    expect(() => parseSize(input)).toThrow(/^size: /);
  });
});

describe("parseMemory / parseCpu", () => {
  it("read a declared amount; unset or empty is none declared", () => {
    expect(parseMemory("1.5GiB", "spec.memory")).toBe(1.5 * 1024 ** 3);
    expect(parseMemory(4096, "spec.memory")).toBe(4096);
    expect(parseCpu("3", "spec.cpu")).toBe(3);
    expect(parseCpu(0, "spec.cpu")).toBe(0);
    for (const none of [undefined, ""]) {
      expect(parseMemory(none, "spec.memory")).toBeUndefined();
      expect(parseCpu(none, "spec.cpu")).toBeUndefined();
    }
  });

  it.each<[() => unknown, string, string]>([
    [() => parseMemory("12Q", "spec.memory"), "spec.memory", 'spec.memory: "12Q" is not a size like 512M or 2G'],
    [() => parseMemory("lots", "spec.build.memory"), "spec.build.memory", 'spec.build.memory: "lots" is not a size like 512M or 2G'],
    [() => parseMemory(-5, "spec.memory"), "spec.memory", "spec.memory: -5 is not a size like 512M or 2G"],
    [() => parseCpu(-1, "spec.cpu"), "spec.cpu", "spec.cpu: -1 is not a number of cpus like 0.5 or 2"],
    [() => parseCpu(Number.NaN, "spec.cpu"), "spec.cpu", "spec.cpu: NaN is not a number of cpus like 0.5 or 2"],
    [() => parseCpu("two", "spec.cpu"), "spec.cpu", 'spec.cpu: "two" is not a number of cpus like 0.5 or 2'],
  ])("refuse a malformed amount naming the field (%#)", (parse, field, message) => {
    let thrown: unknown;
    try {
      parse();
    } catch (error) {
      thrown = error;
    }
    expect(isBerthError(thrown) && thrown.code).toBe("invalid_argument");
    expect((thrown as Error).message).toBe(message);
    expect((thrown as { details: { field: string } }).details.field).toBe(field);
  });
});

describe("formatSize", () => {
  it.each([
    [512 * 1024 ** 2, "512M"],
    [1.5 * 1024 ** 3, "1.5G"],
    [2 * 1024 ** 3, "2G"],
    [100 * 1024, "100K"],
    [900, "900B"],
    [0, "0B"],
    [1024 ** 3 - 1, "1G"],
  ])("%d is %s", (bytes, text) => {
    expect(formatSize(bytes)).toBe(text);
  });

  it("reads back to within 5% of the original", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 2 ** 50 }), (bytes) => {
        const back = parseSize(formatSize(bytes));
        expect(Math.abs(back - bytes)).toBeLessThanOrEqual(Math.max(1, bytes * 0.05));
      }),
    );
  });
});

describe("parseDuration", () => {
  it.each([
    ["250ms", 250],
    ["5s", 5000],
    ["2m", 120_000],
    ["1h", 3_600_000],
    ["1m30s", 90_000],
    ["1m 30s", 90_000],
    ["1.5s", 1500],
    ["0", 0],
    ["0.0", 0],
    ["1d", 86_400_000],
    [" 10s ", 10_000],
  ])("%s is %d ms", (input, ms) => {
    expect(parseDuration(input)).toBe(ms);
  });

  it.each(["5", "1500", " 30 ", "0.5"])("refuses the bare number %j naming the field and the units", (input) => {
    const text = input.trim();
    expect(() => parseDuration(input, "--wait")).toThrow(
      `--wait: "${text}" has no unit: write ${text}s, ${text}m or ${text}ms (units: ms, s, m, h, d; only 0 needs none)`,
    );
  });

  it("takes a number of milliseconds", () => {
    expect(parseDuration(42)).toBe(42);
  });

  it.each(["", "s", "5x", "-5s", "5s-", "1m30", "ms", "NaN", "Infinity", "5 s s"])("refuses %j naming the field", (input) => {
    expect(() => parseDuration(input, "wait")).toThrow(/^wait: /);
  });

  it.each([-1, NaN, Infinity])("refuses the number %d", (input) => {
    expect(() => parseDuration(input)).toThrow(/^duration: /);
  });
});

describe("formatDuration", () => {
  it.each([
    [250, "250ms"],
    [0, "0ms"],
    [5000, "5s"],
    [1500, "1.5s"],
    [90_000, "1m 30s"],
    [3_600_000, "1h"],
    [3_723_000, "1h 2m 3s"],
    [90_000_000, "1d 1h"],
  ])("%d ms is %s", (ms, text) => {
    expect(formatDuration(ms)).toBe(text);
  });

  it("reads back exactly", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 10 * 86_400_000 }), (ms) => {
        expect(parseDuration(formatDuration(ms))).toBe(ms);
      }),
    );
  });
});
