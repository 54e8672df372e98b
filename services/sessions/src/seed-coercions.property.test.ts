import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { parseEntryTime } from "./seed-coercions.js";

describe("parseEntryTime", () => {
  const pad = (n: number, width: number): string => String(n).padStart(width, "0");

  it("agrees with Date.parse on ISO timestamps, impossible dates included", () => {
    fc.assert(
      fc.property(
        fc.tuple(
          fc.integer({ min: 0, max: 9999 }),
          fc.integer({ min: 0, max: 13 }),
          fc.integer({ min: 0, max: 32 }),
          fc.integer({ min: 0, max: 25 }),
          fc.integer({ min: 0, max: 60 }),
          fc.integer({ min: 0, max: 60 }),
          fc.integer({ min: 0, max: 999 }),
        ),
        ([y, mo, d, h, mi, s, ms]) => {
          const ts = `${pad(y, 4)}-${pad(mo, 2)}-${pad(d, 2)}T${pad(h, 2)}:${pad(mi, 2)}:${pad(s, 2)}.${pad(ms, 3)}Z`;
          expect(parseEntryTime(ts)).toBe(Date.parse(ts));
        },
      ),
      { numRuns: 3000 },
    );
  });

  it("agrees with Date.parse on real clock readings and on anything else", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 8.64e15 }), (ms) => {
        const ts = new Date(ms).toISOString();
        expect(parseEntryTime(ts)).toBe(Date.parse(ts));
      }),
      { numRuns: 2000 },
    );
    const odd = [
      "",
      "not a date",
      "2024-02-29T24:00:00.000Z",
      "2023-02-29T00:00:00.000Z",
      "2024-01-01T00:00:00.000+01:00",
      "2024-01-01",
      0,
      null,
      "2024-01-01T00:00:00.000z",
      "+002024-01-01T00:00:00.000Z",
    ];
    for (const ts of odd) expect(parseEntryTime(ts)).toBe(Date.parse(ts as string));
    fc.assert(fc.property(fc.string({ maxLength: 30 }), (ts) => void expect(parseEntryTime(ts)).toBe(Date.parse(ts))));
  });
});
