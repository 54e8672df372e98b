import * as zlib from "node:zlib";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { crc32Hex, decodeJournalLine, encodeJournalLine, forEachLine, isBlankLine, portableCrc32 } from "./journal-format.js";

const entry = { seq: 7, id: "s1", type: "checkpoint", ts: "2026-01-01T00:00:00.000Z", event: { id: "s1", type: "checkpoint", revision: 3, note: "é ✓" } };

function decode(line: string) {
  const buf = Buffer.from(line.replace(/\n$/, ""));
  return decodeJournalLine(buf, 0, buf.length);
}

describe("journal line format", () => {
  it("writes the seed's fields in order, the marks, and the checksum last", () => {
    const line = encodeJournalLine(entry, { ikey: "k1", n: 2 });
    expect(line.endsWith("\n")).toBe(true);
    expect(Object.keys(JSON.parse(line))).toEqual(["seq", "id", "type", "ts", "event", "ikey", "n", "crc"]);
    const canonical = JSON.stringify({ ...entry, ikey: "k1", n: 2 });
    expect(JSON.parse(line).crc).toBe(crc32Hex(canonical));
  });

  it("decodes its own lines with a valid checksum", () => {
    const decoded = decode(encodeJournalLine(entry));
    expect(decoded).toMatchObject({ kind: "entry", checksum: "valid", entry: { seq: 7, event: { revision: 3 } } });
  });

  it("accepts the seed's lines, which have no checksum", () => {
    const decoded = decode(JSON.stringify(entry));
    expect(decoded).toMatchObject({ kind: "entry", checksum: "absent" });
  });

  it("detects a line that still parses but was damaged", () => {
    const line = encodeJournalLine(entry).replace('"revision":3', '"revision":8');
    const decoded = decode(line);
    expect(decoded.kind).toBe("checksum_mismatch");
  });

  it("checks a re-serialised line against the canonical form", () => {
    const parsed = JSON.parse(encodeJournalLine(entry));
    expect(decode(JSON.stringify(parsed, null, 1).replace(/\n/g, " ")).kind).toBe("entry");
    parsed.event.revision = 9;
    expect(decode(JSON.stringify(parsed)).kind).toBe("checksum_mismatch");
  });

  it("reports lines that are not JSON objects as the seed does", () => {
    expect(decode('{"seq":1,')).toMatchObject({ kind: "parse_failed" });
    expect(decode("42")).toEqual({ kind: "parse_failed", message: "entry is not object" });
    expect(decode("null")).toEqual({ kind: "parse_failed", message: "entry is not object" });
    // An array is an object to the seed: it replays (as an unknown event type).
    expect(decode("[1]").kind).toBe("entry");
  });

  it("tolerates a CRLF line ending", () => {
    expect(decode(encodeJournalLine(entry).replace("\n", "\r\n")).kind).toBe("entry");
  });

  it("decodes with the ASCII fast path the same way", () => {
    const buf = Buffer.from(encodeJournalLine({ ...entry, event: { type: "x" } }));
    expect(decodeJournalLine(buf, 0, buf.length - 1, buf.toString("latin1"))).toEqual(decodeJournalLine(buf, 0, buf.length - 1));
  });

  it("has a portable CRC-32 equal to zlib's", () => {
    for (const text of ["", "a", "hello, journal", "é ✓ 😀".repeat(40)]) {
      expect(portableCrc32(text)).toBe(zlib.crc32(text));
    }
    expect(portableCrc32("}", portableCrc32("abc"))).toBe(zlib.crc32("abc}"));
  });

  it("splits lines and reports the unterminated tail", () => {
    const buf = Buffer.from("a\n\nbc\ntail");
    const lines: string[] = [];
    const rest = forEachLine(buf, 0, (s, e) => lines.push(buf.toString("utf8", s, e)));
    expect(lines).toEqual(["a", "", "bc"]);
    expect(buf.toString("utf8", rest)).toBe("tail");
    expect(isBlankLine(Buffer.from(" \t\r"), 0, 3)).toBe(true);
  });

  it("reads its own lines to exactly what JSON.parse gives (less the verified checksum), field for field and in order", () => {
    const text = fc.string({ unit: "binary", maxLength: 12 });
    const json: fc.Arbitrary<unknown> = fc.letrec<{ value: unknown }>((tie) => ({
      value: fc.oneof(
        { depthSize: "small" },
        text,
        fc.integer(),
        fc.double({ noNaN: true, noDefaultInfinity: true }),
        fc.boolean(),
        fc.constant(null),
        fc.array(tie("value"), { maxLength: 3 }),
        fc.dictionary(text, tie("value"), { maxKeys: 3 }),
      ),
    })).value;
    fc.assert(
      fc.property(
        fc.record({
          seq: fc.oneof(fc.nat(), fc.constant(0), fc.constant(999_999_999_999_999), fc.constant(2 ** 53 + 2)),
          id: fc.stringMatching(/^[A-Za-z0-9_-]{1,12}$/),
          type: text,
          ts: fc.oneof(fc.constant("2026-01-01T00:00:00.000Z"), text),
          event: fc.dictionary(text, json, { maxKeys: 4 }),
        }),
        fc.record({ ikey: text, n: fc.integer({ min: 2, max: 20_000 }) }, { requiredKeys: [] }),
        fc.boolean(),
        (entry, marks, crlf) => {
          const line = encodeJournalLine(entry, marks).replace(/\n$/, crlf ? "\r" : "");
          const buf = Buffer.from(line);
          const { crc: _verified, ...fields } = JSON.parse(line) as Record<string, unknown>;
          const expected = { kind: "entry", checksum: "valid", entry: fields };
          for (const decoded of [
            decodeJournalLine(buf, 0, buf.length),
            ...(/^[\x00-\x7f]*$/.test(line) ? [decodeJournalLine(buf, 0, buf.length, line)] : []),
          ]) {
            expect(decoded).toEqual(expected);
            expect(Object.keys((decoded as { entry: object }).entry)).toEqual(Object.keys(expected.entry));
          }
        },
      ),
      { numRuns: 500 },
    );
  });

  it("leaves lines that only look like its own to JSON.parse's verdict", () => {
    /** A line in berth's form around `body` (a JSON object's text) with a checksum that matches it. */
    const sealed = (body: string) => `${body.slice(0, -1)},"crc":"${crc32Hex(body)}"}`;
    const cases = [
      '{"seq":1,"id":"s1","type":"a\tb","ts":"t","event":{}}', // a raw tab in a string: not JSON
      '{"seq":01,"id":"s1","type":"a","ts":"t","event":{}}', // a leading zero: not JSON
      '{"seq":1,"id":"s1","type":"a","ts":"t","event":{},"x":1}', // a field berth does not write
      '{"seq":1,"id":"s1","type":"a","ts":"t","event":{"a":1},"n":}', // no digits
      '{"seq":1,"id":"s1","type":"a","ts":"t","event":[1]}', // an event that is not an object
      '{"seq":-1,"id":"s1","type":"a","ts":"t","event":{}}',
      '{"seq":1.5,"id":"s1","type":"a","ts":"t","event":{}}',
      '{"seq":1,"id":"s\u0031","type":"a","ts":"t","event":{}}', // an escape
      '{"seq":1,"type":"a","id":"s1","ts":"t","event":{}}', // out of order
      '{"seq":1,"id":"s1","type":"a","ts":"t","event":{}} ', // trailing space before the seal
    ];
    for (const body of cases) {
      const line = sealed(body);
      let expected: unknown;
      try {
        const { crc: _verified, ...fields } = JSON.parse(line) as Record<string, unknown>;
        expected = { kind: "entry", checksum: "valid", entry: fields };
      } catch {
        expected = { kind: "parse_failed" };
      }
      expect(decode(line)).toMatchObject(expected as object);
    }
  });
});
