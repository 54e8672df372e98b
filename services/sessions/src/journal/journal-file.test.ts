import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { crc32, encodeJournalLine } from "./journal-format.js";
import { appendDiagnostics, lastLineCrc, replayJournalFile, scanJournalPrefix, SeqIndex } from "./journal-file.js";
import { readJournalEntries } from "./journal-read.js";
import { baseSnapshot, MAX_DIAGNOSTICS, sessionReducer as reducer } from "../reducer.js";

let dir: string;
let file: string;
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-jf-"));
  file = path.join(dir, "s1.jsonl");
});
afterEach(() => fs.rmSync(dir, { recursive: true, force: true }));

const line = (seq: number, type: string, extra: Record<string, unknown> = {}, marks?: { ikey?: string; n?: number }) =>
  encodeJournalLine({ seq, id: "s1", type, ts: "2026-01-01T00:00:00.000Z", event: { type, id: "s1", ...extra } }, marks);

async function collect<T>(iterable: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of iterable) out.push(item);
  return out;
}

describe("replayJournalFile", () => {
  it("replays entries, takes max(seq)+1 and collects keys and seek points", () => {
    fs.writeFileSync(
      file,
      `${line(1, "generate", {}, { ikey: "a" }) + line(2, "agent_done", {}, { ikey: "b", n: 2 }) + line(3, "steer")}\n${line(9, "steer")}`,
    );
    const replayed = replayJournalFile(file, "s1", { repair: true, reducer });
    expect(replayed.nextSeq).toBe(10);
    expect(replayed.snapshot.phase).toBe("steer_requested");
    expect([...replayed.keys]).toEqual([
      ["a", { firstSeq: 1, lastSeq: 1 }],
      ["b", { firstSeq: 2, lastSeq: 3 }],
    ]);
    expect(replayed.size).toBe(fs.statSync(file).size);
    expect(replayed.needsNewline).toBe(false);
    expect(replayed.repaired).toBeUndefined();
  });

  it("keeps a whole last entry written without its newline and asks for one before the next", () => {
    const text = line(1, "generate") + line(2, "steer").trimEnd();
    fs.writeFileSync(file, text);
    const replayed = replayJournalFile(file, "s1", { repair: true, reducer });
    expect(replayed).toMatchObject({ nextSeq: 3, needsNewline: true, size: text.length });
    expect(fs.readFileSync(file, "utf8")).toBe(text);
  });

  it("cuts a torn tail back only when asked to repair", () => {
    const whole = line(1, "generate");
    fs.writeFileSync(file, `${whole}{"seq":2,"id"`);
    const readOnly = replayJournalFile(file, "s1", { repair: false, reducer });
    expect(readOnly).toMatchObject({ nextSeq: 2, size: whole.length, fileSize: whole.length + 13, needsNewline: true });
    expect(readOnly.snapshot.diagnostics).toEqual([]);
    const repaired = replayJournalFile(file, "s1", { repair: true, reducer });
    expect(repaired).toMatchObject({ size: whole.length, fileSize: whole.length, needsNewline: false, repaired: { bytesDropped: 13, line: 2 } });
    expect(fs.readFileSync(file, "utf8")).toBe(whole);
  });

  it("stops after a given seq (the state as of an old append)", () => {
    fs.writeFileSync(file, line(1, "generate") + line(2, "agent_done", {}, { n: 2 }) + line(3, "variant_mounted", { variant: 1 }) + line(4, "steer"));
    const replayed = replayJournalFile(file, "s1", { repair: false, reducer, stopAfterSeq: 3 });
    expect(replayed.snapshot.phase).toBe("variants_ready");
    expect(replayed.snapshot.mountedVariants).toEqual([1]);
  });
});

describe("appendDiagnostics", () => {
  it("keeps the newest MAX_DIAGNOSTICS and counts them all", () => {
    let snapshot = baseSnapshot("s1");
    snapshot = appendDiagnostics(snapshot, [{ error: "x", i: 0 }], MAX_DIAGNOSTICS);
    expect(snapshot.diagnosticsTotal).toBeUndefined();
    snapshot = appendDiagnostics(
      snapshot,
      Array.from({ length: MAX_DIAGNOSTICS + 5 }, (_, i) => ({ error: "x", i: i + 1 })),
      MAX_DIAGNOSTICS,
    );
    expect(snapshot.diagnostics).toHaveLength(MAX_DIAGNOSTICS);
    expect(snapshot.diagnostics.at(-1)).toEqual({ error: "x", i: MAX_DIAGNOSTICS + 5 });
    expect(snapshot.diagnosticsTotal).toBe(MAX_DIAGNOSTICS + 6);
  });
});

describe("SeqIndex", () => {
  it("never starts a read after an entry it should return, even with out-of-order seqs", () => {
    const index = new SeqIndex(2);
    const seqs = [1, 2, 3, 4, 2, 5, 6, 7, 8, 9];
    seqs.forEach((seq, i) => index.note(seq, i * 10));
    for (let from = 0; from <= 10; from++) {
      const start = index.startFor(from);
      const skipped = seqs.filter((_, i) => i * 10 < start);
      expect(skipped.every((seq) => seq < from)).toBe(true);
    }
    expect(index.startFor(9)).toBeGreaterThan(0);
  });
});

describe("seek points and appends of several events", () => {
  /** Four appends of 300 events each (keyed "b0".."b3"), then single events; the journal's text. */
  function batches(): string {
    const lines: string[] = [];
    let seq = 1;
    for (let b = 0; b < 4; b++) {
      for (let i = 0; i < 300; i++, seq++) lines.push(line(seq, "checkpoint", { revision: seq }, i === 0 ? { ikey: `b${b}`, n: 300 } : undefined));
    }
    for (; seq <= 1500; seq++) lines.push(line(seq, "steer", {}, { ikey: `s${seq}` }));
    return lines.join("");
  }

  it("are put only where an append starts, by the replay and by the light scan alike", () => {
    const text = batches();
    fs.writeFileSync(file, text);
    const firstLines = new Set([0, 300, 600, 900].map((i) => text.split("\n").slice(0, i).join("\n").length + (i > 0 ? 1 : 0)));
    for (const index of [replayJournalFile(file, "s1", { repair: false, reducer }).index, scanJournalPrefix(file, text.length).index]) {
      for (let from = 1; from <= 1200; from += 37) expect(firstLines.has(index.startFor(from))).toBe(true);
      expect(index.startFor(1400)).toBeGreaterThan(900 * 100);
    }
  });

  it("a read from inside an append gets the append's key on every one of its entries", async () => {
    const text = batches();
    fs.writeFileSync(file, text);
    const { index } = scanJournalPrefix(file, text.length);
    const read = await collect(readJournalEntries(file, { fromSeq: 750, limit: 200, start: index.startFor(750), end: text.length }));
    expect(read.map((e) => e.entry.seq)).toEqual(Array.from({ length: 200 }, (_, i) => 750 + i));
    expect(read.map((e) => e.idempotencyKey)).toEqual([...Array<string>(151).fill("b2"), ...Array<string>(49).fill("b3")]);
    const singles = await collect(readJournalEntries(file, { fromSeq: 1499, start: index.startFor(1499), end: text.length }));
    expect(singles.map((e) => [e.entry.seq, e.idempotencyKey, e.integrity])).toEqual([
      [1499, "s1499", "verified"],
      [1500, "s1500", "verified"],
    ]);
  });

  it("tells berth's checksummed lines from the seed's lines without a checksum", async () => {
    const seedLine = `${JSON.stringify({ seq: 2, id: "s1", type: "steer", ts: "2026-01-01T00:00:00.000Z", event: { type: "steer", id: "s1" } })}\n`;
    const damaged = line(3, "steer").replace('"type":"steer"', '"type":"stees"');
    const text = line(1, "generate") + seedLine + damaged + line(4, "agent_done");
    fs.writeFileSync(file, text);
    const read = await collect(readJournalEntries(file, { fromSeq: 1, start: 0, end: text.length }));
    expect(read.map((e) => [e.entry.seq, e.integrity, e.idempotencyKey])).toEqual([
      [1, "verified", undefined],
      [2, "unchecked", undefined],
      [4, "verified", undefined],
    ]);
  });
});

describe("lastLineCrc", () => {
  it("is the CRC of the whole line ending at the offset, however long, and only at a line's end", () => {
    const long = line(2, "steer", { pad: "x".repeat(200_000) });
    const lines = [line(1, "generate"), long, "\n", line(3, "steer")];
    fs.writeFileSync(file, `${lines.join("")}{"seq":4`);
    let end = 0;
    for (const text of lines) {
      end += Buffer.byteLength(text);
      expect(lastLineCrc(file, end)).toBe(crc32(text));
    }
    expect(lastLineCrc(file, end + 3)).toBeUndefined(); // inside the unterminated tail
    expect(lastLineCrc(file, end - 1)).toBeUndefined(); // not just past a newline
    expect(lastLineCrc(file, 0)).toBeUndefined();
    expect(lastLineCrc(file, 10_000_000)).toBeUndefined(); // past the end of the file
  });
});

describe("scanJournalPrefix", () => {
  it("finds top-level keys only and the seek points", () => {
    const lines = [line(1, "generate", { ikey: "inside-the-event" }), line(2, "steer", {}, { ikey: "k2", n: 3 }), line(3, "a"), line(4, "b")];
    for (let seq = 5; seq <= 600; seq++) lines.push(line(seq, "checkpoint", { revision: seq }));
    fs.writeFileSync(file, lines.join(""));
    const { keys, index } = scanJournalPrefix(file, fs.statSync(file).size);
    expect([...keys]).toEqual([["k2", { firstSeq: 2, lastSeq: 4 }]]);
    expect(index.size).toBeGreaterThan(1);
    const offset = index.startFor(550);
    expect(offset).toBeGreaterThan(0);
    expect(JSON.parse(fs.readFileSync(file, "utf8").slice(offset).split("\n")[0]!).seq).toBeLessThanOrEqual(550);
  });
});

describe("readJournalEntries", () => {
  it("streams entries in chunks, skipping bad lines, from a seq, up to an end offset", async () => {
    const lines = [line(1, "generate"), "garbage\n", line(2, "steer").replace('"type":"steer"', '"type":"stees"')];
    for (let seq = 3; seq <= 3000; seq++) lines.push(line(seq, "checkpoint", { revision: seq, pad: "x".repeat(50) }));
    const text = lines.join("");
    fs.writeFileSync(file, text + line(3001, "late"));
    const all = await collect(readJournalEntries(file, { fromSeq: 1, start: 0, end: Buffer.byteLength(text) }));
    expect(all.map((e) => e.entry.seq)).toEqual([1, ...Array.from({ length: 2998 }, (_, i) => i + 3)]);
    expect(Object.keys(all[0]!.entry)).toEqual(["seq", "id", "type", "ts", "event"]);
    const some = await collect(readJournalEntries(file, { fromSeq: 2990, limit: 3, start: 0, end: Buffer.byteLength(text) }));
    expect(some.map((e) => e.entry.seq)).toEqual([2990, 2991, 2992]);
    expect(await collect(readJournalEntries(path.join(dir, "missing.jsonl"), { fromSeq: 1, start: 0, end: 100 }))).toEqual([]);
  });
});
