/**
 * Scanning a journal's lines on a second thread while the replay turns them into entries.
 *
 * A replay's time splits in two halves of about equal weight: the bytes-only work of each line
 * (find it, check its CRC, find its fields: {@link scanLine}) and the rest (parse the event, build
 * the entry, apply it). The first needs nothing but the bytes, so a worker thread does it ahead of
 * the replay over a SharedArrayBuffer holding the file, and hands each line's layout over through
 * a ring of shared slots. The replay never waits for the worker: a line the worker has not reached
 * yet, it scans itself. So the worker can only make a replay faster, never change what it reads —
 * the same {@link decodeJournalLine} decides every line, with or without a layout found ahead.
 */
import * as fs from "node:fs";
import { fileURLToPath } from "node:url";
import { Worker } from "node:worker_threads";
import { LAYOUT_SLOTS, scanLine, type ScannedLine } from "./journal-format.js";

/** Lines the ring holds: how far the worker may run ahead of the replay. */
const RING_LINES = 8192;
/** Per slot: the line's start and end, whether {@link scanLine} accepted it, then its layout. */
const SLOT = 3 + LAYOUT_SLOTS;
// Shared control words (Int32Array).
const PRODUCED = 0;
const CONSUMED = 1;
const CANCELLED = 2;
const FINISHED = 3;
const CONTROL_WORDS = 4;
/** The replay tells the worker how far it got every this many lines (the worker waits on it when the ring is full). */
const CONSUMED_STRIDE = 1024;

/** A journal smaller than this is replayed on one thread: handing it over would cost more than it saves. */
export const PARALLEL_SCAN_MIN_BYTES = 1 << 20;

/** What the worker is sent for one journal. */
export interface ScanJob {
  /** The file's bytes (a SharedArrayBuffer, `length` of them used). */
  bytes: SharedArrayBuffer;
  length: number;
  /** Offset of the first line to scan. */
  from: number;
  control: SharedArrayBuffer;
  ring: SharedArrayBuffer;
}

/**
 * The worker's side: scans every newline-terminated line of the job in order into the ring,
 * publishing each, until the last line or until the replay cancels. Waits while the ring is full.
 */
export function runScanJob(job: ScanJob): void {
  const buf = new Uint8Array(job.bytes, 0, job.length);
  const control = new Int32Array(job.control);
  const ring = new Float64Array(job.ring);
  let line = 0;
  let start = job.from;
  try {
    while (start < buf.length) {
      if (Atomics.load(control, CANCELLED) !== 0) return;
      while (line - Atomics.load(control, CONSUMED) >= RING_LINES) {
        Atomics.wait(control, CONSUMED, Atomics.load(control, CONSUMED), 50);
        if (Atomics.load(control, CANCELLED) !== 0) return;
      }
      const nl = buf.indexOf(0x0a, start);
      if (nl < 0) return;
      const at = (line % RING_LINES) * SLOT;
      ring[at] = start;
      ring[at + 1] = nl;
      ring[at + 2] = scanLine(buf, start, nl, ring, at + 3) ? 1 : 0;
      Atomics.store(control, PRODUCED, ++line);
      start = nl + 1;
    }
  } finally {
    Atomics.store(control, FINISHED, 1);
  }
}

/**
 * The replay's side of one job: `next(line)` gives the worker's findings for the replay's
 * `line`-th line (0-based from the job's `from`) if the worker has got there, else undefined.
 */
export class ScanResults {
  private readonly control: Int32Array;
  private readonly ring: Float64Array;
  private readonly scanned: ScannedLine;

  constructor(job: ScanJob) {
    this.control = new Int32Array(job.control);
    this.ring = new Float64Array(job.ring);
    this.scanned = { valid: false, layout: this.ring, at: 0 };
  }

  /** The worker's layout of `line` (which starts at `start`), or undefined; valid until the next call. */
  take(line: number, start: number): ScannedLine | undefined {
    if (line % CONSUMED_STRIDE === 0) {
      Atomics.store(this.control, CONSUMED, line);
      Atomics.notify(this.control, CONSUMED);
    }
    if (line >= Atomics.load(this.control, PRODUCED)) return undefined;
    const at = (line % RING_LINES) * SLOT;
    // Both threads walk the same lines from the same offset; a mismatch would be a bug, and the
    // replay then simply scans the line itself.
    if (this.ring[at] !== start) return undefined;
    this.scanned.valid = this.ring[at + 2] === 1;
    this.scanned.at = at + 3;
    return this.scanned;
  }

  /** How many lines the worker has scanned so far. */
  produced(): number {
    return Atomics.load(this.control, PRODUCED);
  }

  /** The replay is done with this job: the worker stops at its next line. */
  finish(): void {
    Atomics.store(this.control, CANCELLED, 1);
    Atomics.notify(this.control, CONSUMED);
  }
}

/** How long the worker thread stays without a job before it exits (it costs ~10 MB of RSS idle). */
export const SCAN_WORKER_IDLE_MS = 60_000;

/**
 * The one scanning worker of the process. Started on first use (or by {@link warm}), it exits
 * after {@link SCAN_WORKER_IDLE_MS} without a job and starts again for the next one; it never
 * keeps the process alive. One job at a time: a replay that finds it busy (another journal's
 * replay, or the cancelled rest of one) or still starting does without.
 */
class ScanWorker {
  private worker: Worker | undefined;
  private failed = false;
  private busy: Int32Array | undefined;
  private idleTimer: NodeJS.Timeout | undefined;

  constructor(
    private readonly script: string,
    private readonly idleMs = SCAN_WORKER_IDLE_MS,
  ) {}

  /** Starts the worker thread now, so the first replay does not pay its start-up. */
  warm(): void {
    this.ensure();
  }

  /** True while the worker thread exists (started and not yet exited for being idle). */
  running(): boolean {
    return this.worker !== undefined;
  }

  /** True when a job handed over now would be taken (the worker runs and is not busy). */
  available(): boolean {
    return this.ensure() !== undefined && !this.jobInFlight();
  }

  private jobInFlight(): boolean {
    return this.busy !== undefined && Atomics.load(this.busy, FINISHED) === 0;
  }

  /** Hands `bytes` to the worker and returns the replay's side, or undefined when it cannot help now. */
  start(bytes: SharedArrayBuffer, length: number, from: number): ScanResults | undefined {
    if (!this.available()) return undefined;
    const job: ScanJob = {
      bytes,
      length,
      from,
      control: new SharedArrayBuffer(CONTROL_WORDS * Int32Array.BYTES_PER_ELEMENT),
      ring: new SharedArrayBuffer(RING_LINES * SLOT * Float64Array.BYTES_PER_ELEMENT),
    };
    this.busy = new Int32Array(job.control);
    this.worker!.postMessage(job);
    this.keepForIdlePeriod();
    return new ScanResults(job);
  }

  /** (Re)arms the idle exit: the worker goes once it has had no job for `idleMs`. */
  private keepForIdlePeriod(): void {
    clearTimeout(this.idleTimer);
    this.idleTimer = setTimeout(() => {
      if (this.jobInFlight()) return this.keepForIdlePeriod();
      const worker = this.worker;
      this.worker = undefined;
      this.busy = undefined;
      void worker?.terminate();
    }, this.idleMs);
    this.idleTimer.unref();
  }

  private ensure(): Worker | undefined {
    if (this.worker !== undefined || this.failed) return this.worker;
    if (!fs.existsSync(this.script)) {
      // Running from TypeScript sources (the tests): there is no compiled worker to start.
      this.failed = true;
      return undefined;
    }
    try {
      const worker = new Worker(this.script);
      worker.unref();
      worker.on("error", () => {
        // A replay in progress carries on scanning by itself; later ones do without the worker.
        this.failed = true;
        if (this.worker === worker) this.worker = undefined;
      });
      this.worker = worker;
      this.keepForIdlePeriod();
    } catch {
      this.failed = true;
    }
    return this.worker;
  }
}

let shared: ScanWorker | undefined;

/** The process's scanning worker (journal-scan-worker.js beside this module). */
export function scanWorker(): ScanWorker {
  shared ??= new ScanWorker(fileURLToPath(new URL("./journal-scan-worker.js", import.meta.url)));
  return shared;
}

/** A scanning worker running `script` (for tests that load the compiled worker explicitly). */
export function createScanWorker(script: string, idleMs = SCAN_WORKER_IDLE_MS): ScanWorker {
  return new ScanWorker(script, idleMs);
}

export type { ScanWorker };
