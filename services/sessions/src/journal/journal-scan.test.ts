import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { encodeJournalLine, forEachLine, LAYOUT_SLOTS, scanLine } from "./journal-format.js";
import { replayJournalFile } from "./journal-file.js";
import { sessionReducer as reducer } from "../reducer.js";
import { createScanWorker, PARALLEL_SCAN_MIN_BYTES, runScanJob, ScanResults, type ScanJob } from "./journal-scan.js";

// The compiled worker (npm test builds first): the tests run the TypeScript sources, which a
// worker thread cannot load.
const COMPILED_WORKER = fileURLToPath(new URL("../../dist/journal/journal-scan-worker.js", import.meta.url));

let dir: string;
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "berth-scan-"));
});
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const line = (seq: number, type: string, extra: Record<string, unknown> = {}, marks?: { ikey?: string; n?: number }) =>
  encodeJournalLine({ seq, id: "s1", type, ts: `2026-01-01T00:00:${String(seq % 60).padStart(2, "0")}.000Z`, event: { type, id: "s1", ...extra } }, marks);

/**
 * A journal over the parallel threshold with every kind of line a replay meets: berth's own lines
 * (single, batched, keyed), the seed's lines without a checksum, a damaged line that still parses,
 * a line that does not parse, CRLF, blank lines, non-ASCII text, an ikey line parsed whole, and a
 * torn tail. More lines than the worker's ring holds.
 */
function mixedJournal(): string {
  const parts: string[] = [];
  let seq = 1;
  for (let i = 1; i <= 16_000; i++) {
    if (i % 997 === 0) parts.push(line(seq++, "checkpoint", { revision: i }).replace(/"revision":\d/, '"revision":7'));
    else if (i % 991 === 0) parts.push("{not json\n");
    else if (i % 983 === 0)
      parts.push(`${JSON.stringify({ seq: seq++, id: "s1", type: "steer", ts: "2026-01-01T00:00:00.000Z", event: { type: "steer", id: "s1" } })}\n`);
    else if (i % 977 === 0) parts.push(line(seq++, "steer", { note: "café ✓" }));
    else if (i % 971 === 0) parts.push(line(seq++, "steer").replace(/\n$/, "\r\n"), "\n");
    else if (i % 101 === 0) {
      const first = seq;
      parts.push(line(seq++, "generate", { pageUrl: "http://x/", count: 3, token: `t${i}` }, { ikey: `k${i}`, n: 3 }));
      parts.push(line(seq++, "agent_phase", { phase: "plan" }), line(seq++, "checkpoint", { revision: first }));
    } else parts.push(line(seq++, i % 2 ? "variant_mounted" : "agent_done", { variant: i % 3, durationMs: i }));
  }
  parts.push(line(seq, "steer").slice(0, 40)); // torn tail
  const text = parts.join("");
  expect(Buffer.byteLength(text)).toBeGreaterThan(PARALLEL_SCAN_MIN_BYTES * 2);
  return text;
}

describe("scanning a journal on a second thread", () => {
  it("gives each line the layout scanLine gives it, in order", () => {
    // Fewer lines than the ring holds: the job runs to its end on this thread.
    const text = mixedJournal().split("\n").slice(0, 6000).join("\n");
    const bytes = new SharedArrayBuffer(Buffer.byteLength(text));
    const buf = Buffer.from(bytes);
    buf.write(text);
    const job: ScanJob = { bytes, length: buf.length, from: 0, control: new SharedArrayBuffer(16), ring: new SharedArrayBuffer(8192 * (3 + LAYOUT_SLOTS) * 8) };
    runScanJob(job);
    const results = new ScanResults(job);
    const own = new Float64Array(LAYOUT_SLOTS);
    let lineIndex = 0;
    let valid = 0;
    forEachLine(buf, 0, (start, end) => {
      const scanned = results.take(lineIndex++, start);
      expect(scanned).toBeDefined();
      expect(scanned!.valid).toBe(scanLine(buf, start, end, own, 0));
      if (scanned!.valid) {
        valid++;
        expect([...scanned!.layout.subarray(scanned!.at, scanned!.at + LAYOUT_SLOTS)]).toEqual([...own]);
      }
    });
    expect(lineIndex).toBe(5999);
    expect(valid).toBeGreaterThan(5000);
    expect(valid).toBeLessThan(lineIndex);
  });

  it("replays to the same result with the worker as without it", async () => {
    expect(fs.existsSync(COMPILED_WORKER), "run `npm run build` first").toBe(true);
    const file = path.join(dir, "mixed.jsonl");
    const text = mixedJournal();
    const worker = createScanWorker(COMPILED_WORKER);
    worker.warm();
    await waitForWorker(worker);
    const copy = path.join(dir, "mixed-copy.jsonl");
    for (let round = 0; round < 3; round++) {
      fs.writeFileSync(file, text);
      fs.writeFileSync(copy, text);
      const alone = replayJournalFile(copy, "s1", { repair: true, reducer, scanner: null, now: () => 0 });
      const helped = replayJournalFile(file, "s1", { repair: true, reducer, scanner: worker, now: () => 0 });
      expect(helped.snapshot).toEqual(alone.snapshot);
      expect(helped.nextSeq).toBe(alone.nextSeq);
      expect(helped.size).toBe(alone.size);
      expect(helped.repaired).toEqual(alone.repaired);
      expect([...helped.keys]).toEqual([...alone.keys]);
      expect(helped.index).toEqual(alone.index);
      expect(fs.readFileSync(file).equals(fs.readFileSync(copy))).toBe(true);
      const kinds = alone.snapshot.diagnostics.map((d) => d.error);
      for (const kind of ["journal_checksum_mismatch", "journal_parse_failed", "journal_torn_tail_repaired"]) expect(kinds).toContain(kind);
      await waitForWorker(worker);
    }
  });

  it("the worker thread scans ahead of the replay, a ring's worth of lines, then waits for it", async () => {
    const text = mixedJournal();
    const bytes = new SharedArrayBuffer(Buffer.byteLength(text));
    const buf = Buffer.from(bytes);
    buf.write(text);
    const worker = createScanWorker(COMPILED_WORKER);
    worker.warm();
    await waitForWorker(worker);
    const results = worker.start(bytes, buf.length, 0)!;
    for (let i = 0; i < 500 && results.produced() < 8192; i++) await new Promise((resolve) => setTimeout(resolve, 10));
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(results.produced()).toBe(8192); // the ring is full: the worker waits for the replay
    const own = new Float64Array(LAYOUT_SLOTS);
    let lineIndex = 0;
    let ahead = 0;
    forEachLine(buf, 0, (start, end) => {
      const scanned = results.take(lineIndex++, start);
      if (scanned === undefined) return;
      ahead++;
      expect(scanned.valid).toBe(scanLine(buf, start, end, own, 0));
      if (scanned.valid) expect([...scanned.layout.subarray(scanned.at, scanned.at + LAYOUT_SLOTS)]).toEqual([...own]);
    });
    results.finish();
    expect(ahead).toBeGreaterThanOrEqual(8192);
    await waitForWorker(worker);
  });

  it("the worker thread exits after an idle period and starts again for the next replay", async () => {
    const file = path.join(dir, "idle.jsonl");
    fs.writeFileSync(file, mixedJournal());
    const worker = createScanWorker(COMPILED_WORKER, 200);
    worker.warm();
    await waitForWorker(worker);
    expect(worker.running()).toBe(true);
    for (let i = 0; i < 100 && worker.running(); i++) await new Promise((resolve) => setTimeout(resolve, 20));
    expect(worker.running()).toBe(false);
    await waitForWorker(worker); // available() starts it again
    expect(worker.running()).toBe(true);
    const helped = replayJournalFile(file, "s1", { repair: false, reducer, scanner: worker, now: () => 0 });
    const alone = replayJournalFile(file, "s1", { repair: false, reducer, scanner: null, now: () => 0 });
    expect(helped.snapshot).toEqual(alone.snapshot);
  });

  it("a replay that finds the worker busy replays alone, to the same result", async () => {
    const file = path.join(dir, "busy.jsonl");
    fs.writeFileSync(file, mixedJournal());
    const worker = createScanWorker(COMPILED_WORKER);
    worker.warm();
    await waitForWorker(worker);
    // A job that never finishes on its own: nothing consumes its ring.
    const bytes = new SharedArrayBuffer(PARALLEL_SCAN_MIN_BYTES * 2);
    new Uint8Array(bytes).fill(0x0a);
    const stuck = worker.start(bytes, bytes.byteLength, 0)!;
    expect(stuck).toBeDefined();
    expect(worker.available()).toBe(false);
    const busy = replayJournalFile(file, "s1", { repair: false, reducer, scanner: worker, now: () => 0 });
    const alone = replayJournalFile(file, "s1", { repair: false, reducer, scanner: null, now: () => 0 });
    expect(busy.snapshot).toEqual(alone.snapshot);
    stuck.finish();
    await waitForWorker(worker);
  });
});

async function waitForWorker(worker: ReturnType<typeof createScanWorker>): Promise<void> {
  for (let i = 0; i < 500 && !worker.available(); i++) await new Promise((resolve) => setTimeout(resolve, 10));
  expect(worker.available()).toBe(true);
}
