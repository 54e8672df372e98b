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
 */
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import * as path from "node:path";
import type { Clock, TimerHandle } from "@berth/shared/clock";
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { ensurePrivateDir, writeFileAtomic } from "@berth/shared/files";
import { bootId, processStartTime, sameProcess } from "@berth/shared/process-identity";
import type { Resources } from "./costs.js";
import { checkResources } from "./costs.js";
import type { Page } from "./admission-queue.js";
import type { Logger } from "./logger.js";
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
  /** When its lease runs out (clock ms), for entries registered with a ttl. */
  leaseExpiresAt?: number | undefined;
  leaseTtlMs?: number | undefined;
  /** When it was counted (clock ms). */
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
  /** The caller's id for the request: registering it again while the entry lives answers the entry (see {@link RunningTally.byRequestId}). */
  requestId?: string | undefined;
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
}

const FILE_VERSION = 1;

interface TallyFile {
  version: number;
  entries: RunningEntry[];
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
  private readonly entriesById = new Map<string, RunningEntry>();
  /** Each entry's place in the order it was counted (for paging); in memory only, numbered afresh at open. */
  private readonly seqs = new Map<string, number>();
  private seq = 0;
  /** The live entries by the request id they were registered with. */
  private readonly requestIds = new Map<string, RunningEntry>();
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
      const now = options.clock.now();
      const boot = bootId();
      let dropped = 0;
      for (const entry of loaded) {
        const gone =
          (entry.leaseExpiresAt !== undefined && entry.leaseExpiresAt <= now) ||
          (entry.pid !== undefined && entry.bootId !== undefined && boot !== undefined && entry.bootId !== boot) ||
          (entry.pid !== undefined && !tally.isAlive(entry.pid, entry.pidStartTime));
        if (gone) {
          dropped++;
          options.logger.info({ entry: entry.id, name: entry.name, pid: entry.pid }, "budget: running work from before the restart is gone; no longer counted");
          continue;
        }
        tally.add(entry);
        if (entry.leaseExpiresAt !== undefined) tally.armLease(entry, entry.leaseExpiresAt - now);
      }
      if (dropped > 0) {
        tally.version++;
        await tally.whenDurable();
      }
    }
    return tally;
  }

  private readFile(): RunningEntry[] {
    let text: string;
    try {
      text = readFileSync(this.file!, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
      throw error;
    }
    try {
      const parsed = JSON.parse(text) as Partial<TallyFile>;
      const entries = Array.isArray(parsed.entries) ? parsed.entries : [];
      const valid = entries.filter(isEntry);
      if (valid.length !== entries.length) this.options.logger.warn({ file: this.file, skipped: entries.length - valid.length }, "budget: skipped malformed running-tally entries");
      return valid;
    } catch (error) {
      // The file is written atomically, so a bad one was edited by hand: refuse to guess what runs.
      throw new BerthError("failed_precondition", `${this.file}: the running tally is not valid JSON (${(error as Error).message}); fix or remove it`, { file: this.file });
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
    if (options.pid !== undefined && (!Number.isInteger(options.pid) || options.pid <= 0)) throw invalidArgument("pid", `must be a positive whole number; got ${options.pid}`);
    if (options.requestId !== undefined && this.requestIds.has(options.requestId)) {
      throw invalidArgument("request_id", "already counts a running entry: answer the repeat with byRequestId");
    }
    if (options.ttlMs !== undefined && (!Number.isFinite(options.ttlMs) || options.ttlMs <= 0)) throw invalidArgument("ttl", `must be a positive duration; got ${options.ttlMs}`);
    const now = this.options.clock.now();
    const entry: RunningEntry = { id: randomUUID(), name, cost: checked, startedAt: now };
    if (options.pid !== undefined) {
      entry.pid = options.pid;
      entry.pidStartTime = processStartTime(options.pid);
      entry.bootId = bootId();
    }
    if (options.reservationId !== undefined) entry.reservationId = options.reservationId;
    if (options.requestId !== undefined) entry.requestId = options.requestId;
    if (options.ttlMs !== undefined) {
      entry.leaseTtlMs = options.ttlMs;
      entry.leaseExpiresAt = now + options.ttlMs;
      this.armLease(entry, options.ttlMs);
    }
    this.add(entry);
    this.changed(quiet);
    return entry;
  }

  /** The live entry registered with `requestId`, if any. */
  byRequestId(requestId: string): RunningEntry | undefined {
    return this.requestIds.get(requestId);
  }

  /** Up to `limit` entries counted after the one numbered `after` (from the oldest when undefined), oldest first, each with its number. */
  page(after: number | undefined, limit: number): Page<RunningEntry & { seq: number }> {
    const items: Array<RunningEntry & { seq: number }> = [];
    // A Map iterates in insertion order, which is the order the entries were counted.
    for (const entry of this.entriesById.values()) {
      const seq = this.seqs.get(entry.id)!;
      if (after !== undefined && seq <= after) continue;
      if (items.length >= limit) return { items, next: items[items.length - 1]?.seq };
      items.push({ ...entry, seq });
    }
    return { items };
  }

  /** Extends an entry's lease by `ttlMs` (default: its own ttl) from now. */
  renew(id: string, ttlMs?: number): RunningEntry {
    const entry = this.entriesById.get(id);
    if (!entry) throw new BerthError("not_found", `no running entry ${id}: it was stopped, its process ended or its lease ran out`, { id }, { reason: "RUNNING_NOT_FOUND" });
    const ttl = ttlMs ?? entry.leaseTtlMs;
    if (ttl === undefined || !Number.isFinite(ttl) || ttl <= 0) throw invalidArgument("ttl", `must be a positive duration; got ${ttl}`);
    entry.leaseTtlMs = ttl;
    entry.leaseExpiresAt = this.options.clock.now() + ttl;
    this.armLease(entry, ttl);
    this.changed(false);
    return entry;
  }

  /** Stops counting an entry. False when there was none by that id. */
  stop(id: string): boolean {
    if (!this.remove(id)) return false;
    this.changed(false);
    return true;
  }

  /** Drops every entry whose process is gone. Called on each sample tick: one signal and one small read per entry with a pid. */
  sweep(): RunningEntry[] {
    const gone: RunningEntry[] = [];
    for (const entry of this.entriesById.values()) {
      if (entry.pid !== undefined && !this.isAlive(entry.pid, entry.pidStartTime)) gone.push(entry);
    }
    for (const entry of gone) {
      this.remove(entry.id);
      this.options.logger.info({ entry: entry.id, name: entry.name, pid: entry.pid }, "budget: running work ended; no longer counted");
    }
    if (gone.length > 0) this.changed(false);
    return gone;
  }

  get(id: string): RunningEntry | undefined {
    return this.entriesById.get(id);
  }

  entries(): RunningEntry[] {
    return [...this.entriesById.values()];
  }

  get size(): number {
    return this.entriesById.size;
  }

  /** What the running work costs in total. */
  totals(): Resources {
    let memoryBytes = 0;
    let cpu = 0;
    for (const e of this.entriesById.values()) {
      memoryBytes += e.cost.memoryBytes;
      cpu += e.cost.cpu;
    }
    return { memoryBytes, cpu };
  }

  /** One committed item per entry. */
  committedItems(): CommittedItem[] {
    return this.entries().map((e) => ({ kind: "running" as const, id: e.id, label: e.name, memoryBytes: e.cost.memoryBytes, cpu: e.cost.cpu }));
  }

  /** Memory of entries counted at or after `at`: a sample taken at `at` cannot show it yet. */
  unseenSince(at: number): number {
    let bytes = 0;
    for (const e of this.entriesById.values()) if (e.startedAt >= at) bytes += e.cost.memoryBytes;
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
        const body: TallyFile = { version: FILE_VERSION, entries: this.entries() };
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
      else waiter.reject(new BerthError("unavailable", `the running tally could not be saved (${(error as Error).message}); retry`, { file: this.file }));
    }
  }

  private armLease(entry: RunningEntry, ms: number): void {
    const previous = this.leaseTimers.get(entry.id);
    if (previous !== undefined) this.options.clock.clearTimeout(previous);
    this.leaseTimers.set(
      entry.id,
      this.options.clock.setTimeout(() => {
        this.leaseTimers.delete(entry.id);
        if (!this.entriesById.has(entry.id)) return;
        this.options.logger.info({ entry: entry.id, name: entry.name }, "budget: a running entry's lease ran out; no longer counted");
        this.stop(entry.id);
      }, Math.max(0, ms)),
    );
  }

  private add(entry: RunningEntry): void {
    this.entriesById.set(entry.id, entry);
    this.seqs.set(entry.id, ++this.seq);
    if (entry.requestId !== undefined) this.requestIds.set(entry.requestId, entry);
  }

  private remove(id: string): boolean {
    const entry = this.entriesById.get(id);
    if (entry === undefined) return false;
    this.entriesById.delete(id);
    this.seqs.delete(id);
    // Forgotten with the entry: a later request may use the id again.
    if (entry.requestId !== undefined && this.requestIds.get(entry.requestId) === entry) this.requestIds.delete(entry.requestId);
    const timer = this.leaseTimers.get(id);
    if (timer !== undefined) this.options.clock.clearTimeout(timer);
    this.leaseTimers.delete(id);
    return true;
  }
}
