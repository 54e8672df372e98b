import * as zlib from "node:zlib";
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
});
