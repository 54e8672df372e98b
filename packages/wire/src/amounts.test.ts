import { describe, expect, it } from "vitest";
import { bytesOfSize, coresOfText, SIZE_PATTERN, sizeOfBytes } from "./amounts.js";

const K = 1024;
const M = K * K;
const G = K * M;

describe("amounts", () => {
  it.each([
    ["1024", 1024],
    ["0", 0],
    ["100k", 100 * K],
    ["512M", 512 * M],
    ["512mb", 512 * M],
    ["1.5GiB", 1.5 * G],
    [" 2G ", 2 * G],
    ["2 GB", 2 * G],
    [".5K", 512],
    ["1.5K", 1536],
    ["3b", 3],
    ["1T", K * G],
  ])("reads the size %j as %d bytes", (text, bytes) => {
    expect(bytesOfSize(text)).toBe(bytes);
    expect(SIZE_PATTERN.test(text)).toBe(true);
  });

  it.each(["", " ", "12Q", "-1G", "1.", "2 gigs", "lots", "1Ki", "1e3", "0x10", "1.5.5G"])("refuses %j as a size", (text) => {
    expect(bytesOfSize(text)).toBeUndefined();
    expect(SIZE_PATTERN.test(text)).toBe(false);
  });

  it("writes bytes as a size that reads back exactly, and refuses what is not a count of bytes", () => {
    for (const bytes of [0, 1, 1536, 2 * G, Number.MAX_SAFE_INTEGER]) expect(bytesOfSize(sizeOfBytes(bytes))).toBe(bytes);
    for (const bytes of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY, 2 ** 60]) expect(() => sizeOfBytes(bytes)).toThrow(RangeError);
  });

  it("reads cpu counts: non-negative decimals only", () => {
    expect(coresOfText("0.5")).toBe(0.5);
    expect(coresOfText(" 2 ")).toBe(2);
    expect(coresOfText(".25")).toBe(0.25);
    for (const text of ["", "-1", "two", "1e2", "Infinity", "NaN", "1."]) expect(coresOfText(text)).toBeUndefined();
  });
});
