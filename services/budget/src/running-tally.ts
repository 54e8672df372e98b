/**
 * The running tally: work that was admitted and now runs, counted until it stops. An entry comes
 * from a reservation's `consume` (its share moves here) or from `register`, and stays until
 * `stop(id)`, until its process is gone (pid and start time, checked on every sample tick), or
 * until its lease runs out.
 *
 * The tally is kept in `<stateDir>/budget/running.json`, written atomically on every change, so a
 * restart of the service forgets nothing that still runs; at start every entry is checked again and
 * the dead ones dropped. Durability: writes are grouped (one write carries every change made while
 * the previous one was in flight) and `whenDurable()` resolves once the file holds every change made
 * before the call, so the RPC layer awaits it before it acknowledges.
 *
 * Leases and ages are measured on the clock's monotonic reading. The file records the monotonic
 * readings beside the wall-clock ones, with the boot they belong to: a restart within the same boot
 * carries a lease over exactly, whatever the wall clock did meanwhile (CLOCK_MONOTONIC is
 * system-wide); after a reboot only the wall-clock expiry is left to go by.
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { STALL_MS, wallTimeOf, type Clock, type TimerHandle } from "@berth/shared/clock";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { ensurePrivateDir, writeFileAtomic } from "@berth/shared/files";
import { stateWriteError } from "@berth/shared/state-errors";
import { bootId, processStartTime, sameProcess } from "@berth/shared/process-identity";
import type { Resources } from "./costs.js";
import { checkResources } from "./costs.js";
import { pageAfter, type Page } from "./paging.js";
import type { Logger } from "@berth/shared/logger";
import type { CommittedItem } from "./verdict.js";

/** One piece of running work the budget counts. */
export interface RunningEntry {
  id: string;
  name: string;
  cost: Resources;
  /** The process doing the work: the entry goes when it does. */
  pid?: number | undefined;
  /** The pid's start time (/proc/PID/stat field 22), so a reused pid is not mistaken for it. */
  pidStartTime?: number | undefined;
  /** The boot the pid belongs to: after a reboot a pid means nothing. */
  bootId?: string | undefined;
  /** When its lease runs out (wall-clock ms, as of the answer that carries it), for entries registered with a ttl. */
  leaseExpiresAt?: number | undefined;
  leaseTtlMs?: number | undefined;
  /** When it was counted (wall clock: shown, never measured from). */
  startedAt: number;
  /** The reservation it was consumed from, if any. */
  reservationId?: string | undefined;
  /** The caller's id for the request that counted it (RegisterRunning's `request_id`): a repeat answers this entry. */
  requestId?: string | undefined;
}

/** How to register running work. */
export interface RegisterOptions {
  pid?: number | undefined;
  /** Counted only while renewed within this many ms. */
  ttlMs?: number | undefined;
  reservationId?: string | undefined;
  /** The caller's id for the request: kept (and saved) with the entry, which a repeat is answered while it lives. */
  requestId?: string | undefined;
  /** The first answer of the request that counted it, made from the entry as first shown: kept (and saved) with it (see {@link RunningTally.answerOf}). */
  answer?: ((entry: RunningEntry) => unknown) | undefined;
  /** The request `requestId` names, as its repeats are compared: kept (and saved) with it. */
  requestFingerprint?: string | undefined;
}

/** Options of {@link RunningTally.open}. */
export interface RunningTallyOptions {
  clock: Clock;
  /** Where the tally is kept: `<stateDir>/budget/running.json`. Undefined keeps it in memory only. */
  stateDir?: string | undefined;
  logger: Logger;
  /** Called after the tally changed (unless the change was registered `quiet`). */
  onChange?: (() => void) | undefined;
  /** Is `pid` (started at `startTime`) still that process? Defaults to process-identity's `sameProcess`. */
  isAlive?: ((pid: number, startTime: number | undefined) => boolean) | undefined;
  /** Told of every entry that stops being counted (stopped, its pid gone, its lease run out), once it is out. */
  onRemoved?: ((entry: RunningEntry) => void) | undefined;
  /** Told of every entry counted or no longer counted after the tally opened, as it stands (what a watch of the tally hears). */
  onEntry?: ((change: RunningChange, entry: RunningEntry) => void) | undefined;
}

/** How an entry came to be counted or stopped being counted: stopped by a call, or ended with its process or lease. */
export type RunningChange = "registered" | "stopped" | "expired";

const FILE_VERSION = 1;

/** An entry's monotonic readings, as the file keeps them (meaningful within `TallyFile.bootId` only). */
interface MonotonicReadings {
  startedAt: number;
  leaseDeadline?: number | undefined;
}

interface TallyFile {
  version: number;
  /** The boot the entries' monotonic readings belong to (absent in files of older versions of berth). */
  bootId?: string | undefined;
  entries: Array<RunningEntry & { monotonic?: MonotonicReadings | undefined; answer?: unknown; requestFingerprint?: unknown }>;
}

/** An entry and its times on the monotonic clock. */
interface Tracked {
  /** Its `leaseExpiresAt` is filled in when the entry is shown. */
  entry: RunningEntry;
  startedAtMonotonic: number;
  /** When the lease runs out (monotonic clock); undefined without a lease. */
  leaseDeadline: number | undefined;
  /** The first answer of the request that counted it (see {@link RegisterOptions.answer}). */
  answer?: unknown;
  requestFingerprint?: string;
}

/** The path of the tally file under a state directory. */
export function runningFilePath(stateDir: string): string {
  return path.join(stateDir, "budget", "running.json");
}

function isEntry(value: unknown): value is RunningEntry {
  if (value === null || typeof value !== "object") return false;
  const e = value as Partial<RunningEntry>;
  return (
    typeof e.id === "string" &&
    typeof e.name === "string" &&
    typeof e.startedAt === "number" &&
    e.cost !== undefined &&
    typeof e.cost.memoryBytes === "number" &&
    typeof e.cost.cpu === "number" &&
    (e.pid === undefined || typeof e.pid === "number") &&
    (e.requestId === undefined || typeof e.requestId === "string")
  );
}

/** The running tally. Create it with {@link RunningTally.open}. */
export class RunningTally {
  private readonly entriesById = new Map<string, Tracked>();
  /** Each entry's place in the order it was counted (for paging); in memory only, numbered afresh at open. */
  private readonly seqs = new Map<string, number>();
  private seq = 0;
  private readonly leaseTimers = new Map<string, TimerHandle>();
  private readonly file: string | undefined;
  private readonly isAlive: (pid: number, startTime: number | undefined) => boolean;
  /** Bumped on every change: the writer and cached totals compare it. */
  version = 0;
  private durableVersion = 0;
  private writing: Promise<void> | undefined;
  private durableWaiters: Array<{ version: number; resolve: () => void; reject: (error: unknown) => void }> = [];
  private closed = false;

  private constructor(private readonly options: RunningTallyOptions) {
    this.file = options.stateDir === undefined ? undefined : runningFilePath(options.stateDir);
    this.isAlive = options.isAlive ?? sameProcess;
  }

  /**
   * Opens the tally: reads the file a previous run left, drops entries whose process is gone, whose
   * boot is over or whose lease ran out, and re-arms the leases of the rest.
   */
  static async open(options: RunningTallyOptions): Promise<RunningTally> {
    const tally = new RunningTally(options);
    if (tally.file !== undefined) {
      ensurePrivateDir(path.dirname(tally.file));
      const loaded = tally.readFile();
      const clock = options.clock;
      const monotonicNow = clock.monotonicNow();
      const boot = bootId();
      // The monotonic readings of this boot are exact; after a reboot only the wall clock is left.
      const sameBoot = boot !== undefined && loaded.bootId === boot;
      let dropped = 0;
      for (const { monotonic, answer, requestFingerprint, ...entry } of loaded.entries) {
        let leaseDeadline: number | undefined;
        if (entry.leaseExpiresAt !== undefined) {
          leaseDeadline =
            sameBoot && typeof monotonic?.leaseDeadline === "number" ? monotonic.leaseDeadline : monotonicNow + (entry.leaseExpiresAt - clock.now());
        }
        const gone =
          (leaseDeadline !== undefined && leaseDeadline <= monotonicNow) ||
          (entry.pid !== undefined && entry.bootId !== undefined && boot !== undefined && entry.bootId !== boot) ||
          (entry.pid !== undefined && !tally.isAlive(entry.pid, entry.pidStartTime));
        if (gone) {
          dropped++;
          options.logger.info({ entry: entry.id, name: entry.name, pid: entry.pid }, "budget: running work from before the restart is gone; no longer counted");
          continue;
        }
        // Counted before any sample this run takes: not "unseen" by them.
        const startedAtMonotonic = sameBoot && typeof monotonic?.startedAt === "number" ? monotonic.startedAt : Number.NEGATIVE_INFINITY;
        const tracked: Tracked = { entry, startedAtMonotonic, leaseDeadline };
        if (answer !== undefined) tracked.answer = answer;
        if (typeof requestFingerprint === "string") tracked.requestFingerprint = requestFingerprint;
        tally.add(tracked);
        if (leaseDeadline !== undefined) tally.armLease(tracked);
      }
      if (dropped > 0) {
        tally.version++;
        await tally.whenDurable();
      }
    }
    return tally;
  }

  private readFile(): TallyFile {
    let text: string;
    try {
      text = readFileSync(this.file!, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return { version: FILE_VERSION, entries: [] };
      throw error;
    }
    try {
      const parsed = JSON.parse(text) as Partial<TallyFile>;
      const entries = Array.isArray(parsed.entries) ? parsed.entries : [];
      const valid = entries.filter(isEntry);
      if (valid.length !== entries.length)
        this.options.logger.warn({ file: this.file, skipped: entries.length - valid.length }, "budget: skipped malformed running-tally entries");
      return { version: FILE_VERSION, bootId: typeof parsed.bootId === "string" ? parsed.bootId : undefined, entries: valid };
    } catch (error) {
      // The file is written atomically, so a bad one was edited by hand: refuse to guess what runs.
      throw new BerthError("failed_precondition", `${this.file}: the running tally is not valid JSON (${(error as Error).message}); fix or remove it`, {
        file: this.file,
      });
    }
  }

  /**
   * Counts `cost` as running under `name` until stopped, until `pid` is gone, or until the lease
   * (`ttlMs`) runs out unrenewed. `quiet` skips the change callback (the caller reports the change).
   */
  register(name: string, cost: Resources, options: RegisterOptions = {}, { quiet = false }: { quiet?: boolean } = {}): RunningEntry {
    if (this.closed) throw new BerthError("unavailable", "the budget is shutting down");
    if (typeof name !== "string" || name.length === 0 || name.length > 256) throw invalidArgument("name", "must be 1 to 256 characters");
    const checked = checkResources(cost, "cost");
    if (options.pid !== undefined && (!Number.isInteger(options.pid) || options.pid <= 0))
      throw invalidArgument("pid", `must be a positive whole number; got ${options.pid}`);
    if (options.ttlMs !== undefined && (!Number.isFinite(options.ttlMs) || options.ttlMs <= 0))
      throw invalidArgument("ttl", `must be a positive duration; got ${options.ttlMs}`);
    const entry: RunningEntry = { id: randomUUID(), name, cost: checked, startedAt: this.options.clock.now() };
    if (options.pid !== undefined) {
      entry.pid = options.pid;
      entry.pidStartTime = processStartTime(options.pid);
      entry.bootId = bootId();
    }
    if (options.reservationId !== undefined) entry.reservationId = options.reservationId;
    if (options.requestId !== undefined) entry.requestId = options.requestId;
    const monotonicNow = this.options.clock.monotonicNow();
    const tracked: Tracked = { entry, startedAtMonotonic: monotonicNow, leaseDeadline: undefined };
    if (options.ttlMs !== undefined) {
      entry.leaseTtlMs = options.ttlMs;
      tracked.leaseDeadline = monotonicNow + options.ttlMs;
      this.armLease(tracked);
    }
    const shown = this.view(tracked);
    if (options.answer !== undefined) tracked.answer = options.answer(shown);
    if (options.requestFingerprint !== undefined) tracked.requestFingerprint = options.requestFingerprint;
    this.add(tracked);
    this.options.onEntry?.("registered", shown);
    this.changed(quiet);
    return shown;
  }

  /** The first answer kept with the entry `id` (see {@link RegisterOptions.answer}); undefined when it has none or is gone. */
  answerOf(id: string): unknown {
    return this.entriesById.get(id)?.answer;
  }

  /** The request fingerprint kept with the entry `id`, if any. */
  requestFingerprintOf(id: string): string | undefined {
    return this.entriesById.get(id)?.requestFingerprint;
  }

  /** Up to `limit` entries counted after the one numbered `after` (from the oldest when undefined), oldest first, each with its number. */
  page(after: number | undefined, limit: number): Page<RunningEntry & { seq: number }> {
    // A Map iterates in insertion order, which is the order the entries were counted.
    return pageAfter(
      this.entriesById.values(),
      (tracked) => this.seqs.get(tracked.entry.id)!,
      (tracked, seq) => ({ ...this.view(tracked), seq }),
      after,
      limit,
    );
  }

  /** Extends an entry's lease by `ttlMs` (default: its own ttl) from now. */
  renew(id: string, ttlMs?: number): RunningEntry {
    // A renewal read after the lease ran out (the service was paused) comes too late.
    const overdue = this.entriesById.get(id)?.leaseDeadline;
    if (overdue !== undefined && overdue <= this.options.clock.monotonicNow()) this.expireOverdue();
    const tracked = this.entriesById.get(id);
    if (!tracked)
      throw new BerthError(
        "not_found",
        `no running entry ${id}: it was stopped, its process ended or its lease ran out`,
        { id },
        { reason: "RUNNING_NOT_FOUND" },
      );
    const ttl = ttlMs ?? tracked.entry.leaseTtlMs;
    if (ttl === undefined || !Number.isFinite(ttl) || ttl <= 0) throw invalidArgument("ttl", `must be a positive duration; got ${ttl}`);
    tracked.entry.leaseTtlMs = ttl;
    tracked.leaseDeadline = this.options.clock.monotonicNow() + ttl;
    this.armLease(tracked);
    this.changed(false);
    return this.view(tracked);
  }

  /** Stops counting an entry. False when there was none by that id. */
  stop(id: string): boolean {
    if (!this.remove(id, "stopped")) return false;
    this.changed(false);
    return true;
  }

  /**
   * {@link register}, resolved once the file holds it. When it cannot be saved (a full disk) the
   * entry is dropped again, as the file never had it, and the refusal thrown: a refused
   * registration counts nothing, and its retry cannot count the work twice.
   */
  async registerDurably(name: string, cost: Resources, options: RegisterOptions = {}): Promise<RunningEntry> {
    const entry = this.register(name, cost, options);
    try {
      await this.whenDurable();
    } catch (error) {
      this.stop(entry.id);
      throw error;
    }
    return entry;
  }

  /**
   * {@link stop}, resolved once the file no longer holds the entry. When that cannot be saved the
   * entry is counted again, as the file still has it, and the refusal thrown.
   */
  async stopDurably(id: string): Promise<boolean> {
    const tracked = this.entriesById.get(id);
    if (tracked === undefined || !this.stop(id)) return false;
    try {
      await this.whenDurable();
    } catch (error) {
      if (!this.entriesById.has(id) && !this.closed) {
        this.add(tracked);
        if (tracked.leaseDeadline !== undefined) this.armLease(tracked);
        this.options.onEntry?.("registered", this.view(tracked));
        this.changed(false);
      }
      throw error;
    }
    return true;
  }

  /** Drops every entry whose process is gone. Called on each sample tick: one signal and one small read per entry with a pid. */
  sweep(): RunningEntry[] {
    const gone: RunningEntry[] = [];
    for (const { entry } of this.entriesById.values()) {
      if (entry.pid !== undefined && !this.isAlive(entry.pid, entry.pidStartTime)) gone.push(entry);
    }
    for (const entry of gone) {
      this.remove(entry.id, "expired");
      this.options.logger.info({ entry: entry.id, name: entry.name, pid: entry.pid }, "budget: running work ended; no longer counted");
    }
    if (gone.length > 0) this.changed(false);
    return gone;
  }

  /**
   * Each counted entry's name and cost with when it started and when its lease runs out, on the
   * monotonic clock (what an ETA is reckoned on); `startedAt` is -Infinity for an entry counted
   * before a reboot, whose start this clock cannot place.
   */
  timings(): { name: string; cost: Resources; startedAt: number; leaseDeadline: number | undefined }[] {
    return [...this.entriesById.values()].map((t) => ({
      name: t.entry.name,
      cost: t.entry.cost,
      startedAt: t.startedAtMonotonic,
      leaseDeadline: t.leaseDeadline,
    }));
  }

  get(id: string): RunningEntry | undefined {
    const tracked = this.entriesById.get(id);
    return tracked === undefined ? undefined : this.view(tracked);
  }

  entries(): RunningEntry[] {
    return [...this.entriesById.values()].map((tracked) => this.view(tracked));
  }

  get size(): number {
    return this.entriesById.size;
  }

  /** What the running work costs in total. */
  totals(): Resources {
    let memoryBytes = 0;
    let cpu = 0;
    for (const { entry } of this.entriesById.values()) {
      memoryBytes += entry.cost.memoryBytes;
      cpu += entry.cost.cpu;
    }
    return { memoryBytes, cpu };
  }

  /** One committed item per entry. */
  committedItems(): CommittedItem[] {
    return this.entries().map((e) => ({ kind: "running" as const, id: e.id, label: e.name, memoryBytes: e.cost.memoryBytes, cpu: e.cost.cpu }));
  }

  /** Memory of entries counted at or after `at` (monotonic clock): a sample whose read began at `at` cannot show it yet. */
  unseenSince(at: number): number {
    let bytes = 0;
    for (const tracked of this.entriesById.values()) if (tracked.startedAtMonotonic >= at) bytes += tracked.entry.cost.memoryBytes;
    return bytes;
  }

  /** Resolves once the file holds every change made before this call (at once without a state dir). */
  whenDurable(): Promise<void> {
    if (this.file === undefined || this.durableVersion >= this.version) return Promise.resolve();
    const promise = new Promise<void>((resolve, reject) => this.durableWaiters.push({ version: this.version, resolve, reject }));
    this.writing ??= this.writeLoop();
    return promise;
  }

  /** Stops the lease timers and waits for the last write. */
  async close(): Promise<void> {
    this.closed = true;
    for (const timer of this.leaseTimers.values()) this.options.clock.clearTimeout(timer);
    this.leaseTimers.clear();
    await this.whenDurable().catch(() => undefined);
  }

  private changed(quiet: boolean): void {
    this.version++;
    // Start writing at once: the write is usually done before anyone asks whenDurable().
    if (this.file !== undefined) this.writing ??= this.writeLoop();
    if (!quiet) this.options.onChange?.();
  }

  private async writeLoop(): Promise<void> {
    try {
      while (this.durableVersion < this.version) {
        const version = this.version;
        const body: TallyFile = {
          version: FILE_VERSION,
          bootId: bootId(),
          entries: [...this.entriesById.values()].map((tracked) => ({
            ...this.view(tracked),
            monotonic: { startedAt: tracked.startedAtMonotonic, leaseDeadline: tracked.leaseDeadline },
            ...(tracked.answer === undefined ? {} : { answer: tracked.answer }),
            ...(tracked.requestFingerprint === undefined ? {} : { requestFingerprint: tracked.requestFingerprint }),
          })),
        };
        try {
          await writeFileAtomic(this.file!, `${JSON.stringify(body, null, 1)}\n`);
          this.durableVersion = version;
          this.settle(version, undefined);
        } catch (error) {
          this.options.logger.error({ err: error, file: this.file }, "budget: could not write the running tally");
          this.settle(version, error);
          // Stop here: the next change (or whenDurable call) tries again rather than spinning on a broken disk.
          return;
        }
      }
    } finally {
      this.writing = undefined;
    }
  }

  private settle(version: number, error: unknown): void {
    const waiting = this.durableWaiters;
    this.durableWaiters = [];
    for (const waiter of waiting) {
      if (waiter.version > version) this.durableWaiters.push(waiter);
      else if (error === undefined) waiter.resolve();
      else {
        const what = `the running tally was not saved to ${this.file}`;
        const stateDir = this.options.stateDir ?? path.dirname(this.file!);
        waiter.reject(
          stateWriteError(error, what, stateDir, { file: this.file }) ??
            new BerthError(
              "unavailable",
              `the running tally could not be saved (${(error as Error).message}); retry`,
              { file: this.file },
              { reason: "STATE_READ_ONLY" },
            ),
        );
      }
    }
  }

  /** Stops counting every entry whose lease has run out, in the order they ran out (after a pause, several at once). */
  private expireOverdue(): void {
    const now = this.options.clock.monotonicNow();
    const due = [...this.entriesById.values()].filter((t) => t.leaseDeadline !== undefined && t.leaseDeadline <= now);
    due.sort((a, b) => a.leaseDeadline! - b.leaseDeadline!);
    for (const tracked of due) this.leaseRanOut(tracked);
  }

  private leaseRanOut(tracked: Tracked): void {
    if (this.entriesById.get(tracked.entry.id) !== tracked) return;
    this.options.logger.info({ entry: tracked.entry.id, name: tracked.entry.name }, "budget: a running entry's lease ran out; no longer counted");
    if (this.remove(tracked.entry.id, "expired")) this.changed(false);
  }

  /** The entry as shown: a copy, its lease's end in wall-clock time as of now. */
  private view(tracked: Tracked): RunningEntry {
    const shown: RunningEntry = { ...tracked.entry, cost: { ...tracked.entry.cost } };
    if (tracked.leaseDeadline !== undefined) shown.leaseExpiresAt = wallTimeOf(this.options.clock, tracked.leaseDeadline);
    return shown;
  }

  private armLease(tracked: Tracked): void {
    const { entry } = tracked;
    const previous = this.leaseTimers.get(entry.id);
    if (previous !== undefined) this.options.clock.clearTimeout(previous);
    if (tracked.leaseDeadline === undefined) return;
    this.leaseTimers.set(
      entry.id,
      this.options.clock.setTimeout(
        () => {
          this.leaseTimers.delete(entry.id);
          // Late by more than a moment (the process was paused): others may be overdue too, and earlier.
          if (tracked.leaseDeadline !== undefined && this.options.clock.monotonicNow() - tracked.leaseDeadline > STALL_MS) this.expireOverdue();
          else this.leaseRanOut(tracked);
        },
        Math.max(0, tracked.leaseDeadline - this.options.clock.monotonicNow()),
      ),
    );
  }

  private add(tracked: Tracked): void {
    const { entry } = tracked;
    this.entriesById.set(entry.id, tracked);
    this.seqs.set(entry.id, ++this.seq);
  }

  private remove(id: string, why: Exclude<RunningChange, "registered">): boolean {
    const tracked = this.entriesById.get(id);
    if (tracked === undefined) return false;
    const { entry } = tracked;
    this.entriesById.delete(id);
    this.seqs.delete(id);
    const timer = this.leaseTimers.get(id);
    if (timer !== undefined) this.options.clock.clearTimeout(timer);
    this.leaseTimers.delete(id);
    this.options.onRemoved?.(entry);
    this.options.onEntry?.(why, this.view(tracked));
    return true;
  }
}
