/**
 * Reservations: what an admitted request holds until it lets go. The start share (everything it
 * will run) is held until release; the build share only until the build is over. When one of the
 * things it starts is running, its share leaves the reservation and moves to the running tally
 * (`consume`), so nothing is counted twice.
 *
 * A reservation made for a client that cannot hold a stream has a lease: it must be renewed within
 * its ttl, or it is released on its own. Leases and hold times are measured on the clock's
 * monotonic reading, so a step of the wall clock neither ends a lease early nor keeps it longer.
 */
import { randomUUID } from "node:crypto";
import { STALL_MS, wallTimeOf, type Clock, type TimerHandle } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import type { Need, NeedItem, Resources } from "./costs.js";
import { checkResources } from "./costs.js";
import { pageAfter, type Page } from "./paging.js";
import type { Logger } from "@berth/shared/logger";
import type { RunningEntry, RunningTally } from "./running-tally.js";
import type { CommittedItem } from "./verdict.js";

/** The hold time the ETA starts from before any reservation was released: one minute, as in the seed. */
export const INITIAL_HOLD_MS = 60_000;

/** What a reservation is made of: its shares and (when known) the items they were added up from. */
export type ReservedNeed = Pick<Need, "start" | "build"> & { readonly items?: readonly NeedItem[] | undefined };

/** What changed in a reservation, for the queue to re-check its first waiter. */
export type ReservationChange = "admitted" | "build_released" | "consumed" | "released" | "expired" | "renewed";

/**
 * A reservation as one answer showed it, frozen: what a request id's repeat is answered (the first
 * answer, identical), whatever became of the reservation since.
 */
export interface ReservationSnapshot {
  readonly id: string;
  readonly seq: number;
  readonly owner: string;
  readonly start: Resources;
  readonly build: Resources;
  readonly admittedAt: number;
  /** Its lease's end as shown then (wall-clock ms); undefined for one held by a stream. */
  readonly leaseExpiresAt: number | undefined;
  readonly runningIds: readonly string[];
  readonly waitedMs: number;
}

/** One admitted request and what it still holds. */
export class Reservation {
  /** The share of everything it starts, held until released (less what was consumed). */
  start: Resources;
  /** The costliest build wave, held until `releaseBuild()`. */
  build: Resources;
  released = false;
  /** How long the lease lasts when renewed without a ttl. */
  leaseTtlMs: number | undefined;
  /** The caller's id for the request that made it (Reserve's `request_id`): a repeat answers this reservation. */
  requestId: string | undefined;
  /** @internal When the lease runs out (monotonic clock); undefined for a reservation held by a stream. */
  leaseDeadline: number | undefined;
  private leaseTimer: TimerHandle | undefined;
  /** When it was admitted on the monotonic clock: what its hold time and a sample's age are measured from. */
  readonly admittedAtMonotonic: number;
  /** The items it starts (starts and appliances), each with the cost it was admitted with. */
  private readonly started: readonly NeedItem[];
  /** The running entries started from it, in the order they started. */
  private readonly running: string[] = [];

  /** @internal Reservations are made by a {@link ReservationBook}. */
  constructor(
    /** An unguessable id: it is the capability to release or renew. */
    readonly id: string,
    /** Its place in admission order, for paging. */
    readonly seq: number,
    readonly owner: string,
    need: ReservedNeed,
    /** When it was admitted (wall clock: shown, never measured from). */
    readonly admittedAt: number,
    /** How long it waited in the queue before (0 when admitted at once). */
    readonly waitedMs: number,
    private readonly book: ReservationBook,
  ) {
    this.admittedAtMonotonic = book.clock.monotonicNow();
    this.start = { ...need.start };
    this.build = { ...need.build };
    this.started = (need.items ?? []).filter((item) => item.kind !== "build");
  }

  /** The running cost it was admitted with for the thing it starts named `name`; undefined when it starts nothing by that name. */
  runCostOf(name: string): Resources | undefined {
    const item = this.started.find((candidate) => candidate.name === name);
    return item === undefined ? undefined : { memoryBytes: item.cost.memoryBytes, cpu: item.cost.cpu };
  }

  /** The ids of the running entries started from it (`consume`), oldest first. */
  get runningIds(): readonly string[] {
    return this.running;
  }

  /** @internal A running entry started from it is on disk: listed once, however often its start is repeated. */
  recordRunning(entryId: string): void {
    if (!this.running.includes(entryId)) this.running.push(entryId);
  }

  /** It as it stands now, frozen (see {@link ReservationSnapshot}). */
  snapshot(): ReservationSnapshot {
    return {
      id: this.id,
      seq: this.seq,
      owner: this.owner,
      start: { ...this.start },
      build: { ...this.build },
      admittedAt: this.admittedAt,
      leaseExpiresAt: this.leaseExpiresAt,
      runningIds: [...this.running],
      waitedMs: this.waitedMs,
    };
  }

  /** What it holds now: start share plus build share. */
  held(): Resources {
    return { memoryBytes: this.start.memoryBytes + this.build.memoryBytes, cpu: this.start.cpu + this.build.cpu };
  }

  /** The build phase is over: its share goes back. */
  releaseBuild(): void {
    if (this.released) return;
    this.build = { memoryBytes: 0, cpu: 0 };
    this.book.changed(this, "build_released");
  }

  /**
   * One of the things this reservation starts is now running: `cost` leaves the reservation's start
   * share (never below zero) and is counted in the running tally as `name` (with its pid, so the
   * tally drops it when the process is gone; with `ttlMs`, a lease). Returns the tally entry.
   */
  consume(name: string, cost: Resources, options: ConsumeOptions = {}): RunningEntry {
    if (this.released) throw reservationNotFound(this.id, `reservation '${this.owner}' was already released: start its work under a new admission`);
    checkResources(cost, "cost");
    this.start = {
      memoryBytes: Math.max(0, this.start.memoryBytes - cost.memoryBytes),
      cpu: Math.max(0, this.start.cpu - cost.cpu),
    };
    return this.book.consumed(this, name, cost, options);
  }

  /** Lets go of everything it holds. Idempotent. */
  release(): void {
    this.end("released");
  }

  /** @internal Lets go of everything it holds, released or run out. Idempotent. */
  end(why: "released" | "expired"): void {
    if (this.released) return;
    this.released = true;
    this.clearLease();
    this.book.removed(this, why);
  }

  /** Extends the lease by `ttlMs` (default: its own ttl) from now. Only for leased reservations. */
  renew(ttlMs?: number): void {
    // A renewal read after the lease ran out (the service was paused) comes too late.
    if (!this.released && this.leaseDeadline !== undefined && this.leaseDeadline <= this.book.clock.monotonicNow()) this.book.expireOverdue();
    if (this.released) throw reservationNotFound(this.id, `reservation '${this.owner}' was already released (or its lease ran out)`);
    const ttl = ttlMs ?? this.leaseTtlMs;
    if (ttl === undefined)
      throw new BerthError("failed_precondition", `reservation '${this.owner}' is held by its stream and has no lease to renew`, { reservationId: this.id });
    this.book.lease(this, ttl);
    this.book.changed(this, "renewed");
  }

  /** When the lease runs out (wall-clock ms as of now); undefined for a reservation held by a stream. */
  get leaseExpiresAt(): number | undefined {
    return this.leaseDeadline === undefined ? undefined : wallTimeOf(this.book.clock, this.leaseDeadline);
  }

  /** @internal */
  setLease(deadline: number, timer: TimerHandle): void {
    this.clearLease();
    this.leaseDeadline = deadline;
    this.leaseTimer = timer;
  }

  /** @internal Stops the lease timer (the service is closing); the lease is not ended. */
  stopLeaseTimer(): void {
    this.clearLease();
  }

  private clearLease(): void {
    if (this.leaseTimer !== undefined) this.book.clock.clearTimeout(this.leaseTimer);
    this.leaseTimer = undefined;
  }
}

/** How a consumed share is counted in the running tally. */
export interface ConsumeOptions {
  pid?: number | undefined;
  /** A lease for the running entry. */
  ttlMs?: number | undefined;
  /** The caller's id for the request (RegisterRunning's `request_id`). */
  requestId?: string | undefined;
  /** Its first answer, made from the entry as first shown: kept (and saved) with the entry for repeats of `requestId`. */
  answer?: ((entry: RunningEntry) => unknown) | undefined;
  /** The request `requestId` names, as compared: kept (and saved) with the entry. */
  requestFingerprint?: string | undefined;
  /** What the caller declared of the cost (see the budget's RunningOptions). */
  declaredCost?: Partial<Resources> | undefined;
}

/** NOT_FOUND RESERVATION_NOT_FOUND: the reservation `id` is gone. */
export function reservationNotFound(id: string, message = `no reservation ${id}: it was released, its lease ran out, or the service restarted`): BerthError {
  return new BerthError("not_found", message, { reservationId: id }, { reason: "RESERVATION_NOT_FOUND" });
}

/** Options of {@link ReservationBook}. */
export interface ReservationBookOptions {
  clock: Clock;
  tally: RunningTally;
  /** Called after any reservation changed (admitted, build released, consumed, released, renewed). */
  onChange: (reservation: Reservation, change: ReservationChange) => void;
  logger: Logger;
}

/** Every in-flight reservation, and the moving estimate of how long one is held. */
export class ReservationBook {
  readonly clock: Clock;
  private readonly reservations = new Map<string, Reservation>();
  /** A moving estimate of how long an admission is held, for the queue's ETA (the seed's rule). */
  holdMs = INITIAL_HOLD_MS;
  /** Bumped on every change of what reservations hold: cached totals compare it. */
  version = 0;
  /** The last reservation's number (admission order). */
  private seq = 0;

  constructor(private readonly options: ReservationBookOptions) {
    this.clock = options.clock;
  }

  /** Admits `need` as a new reservation owned by `owner` (after waiting `waitedMs`); with `ttlMs`, it is leased. */
  create(need: ReservedNeed, owner: string, options: { ttlMs?: number | undefined; waitedMs?: number | undefined } = {}): Reservation {
    const reservation = new Reservation(randomUUID(), ++this.seq, owner, need, this.clock.now(), options.waitedMs ?? 0, this);
    this.reservations.set(reservation.id, reservation);
    if (options.ttlMs !== undefined) this.lease(reservation, options.ttlMs);
    this.options.logger.debug({ reservation: reservation.id, owner }, "budget: admitted");
    this.changed(reservation, "admitted");
    return reservation;
  }

  /** The reservation `id`; undefined when it is gone, or its lease has run out (its timer may not have run yet, after a pause). */
  get(id: string): Reservation | undefined {
    const found = this.reservations.get(id);
    if (found?.leaseDeadline !== undefined && found.leaseDeadline <= this.clock.monotonicNow()) {
      this.expireOverdue();
      return undefined;
    }
    return found;
  }

  /**
   * Releases every leased reservation whose lease has run out, in the order they ran out: after a
   * pause of the service several are overdue at once, and the first looked at (a renewal read
   * before the timers ran) need not be the first that ran out.
   */
  expireOverdue(): void {
    const now = this.clock.monotonicNow();
    const due = [...this.reservations.values()].filter((r) => r.leaseDeadline !== undefined && r.leaseDeadline <= now);
    due.sort((a, b) => a.leaseDeadline! - b.leaseDeadline!);
    for (const reservation of due) this.leaseRanOut(reservation);
  }

  private leaseRanOut(reservation: Reservation): void {
    if (reservation.released) return;
    this.options.logger.info({ reservation: reservation.id, owner: reservation.owner }, "budget: a reservation's lease ran out; releasing it");
    reservation.end("expired");
  }

  all(): Reservation[] {
    return [...this.reservations.values()];
  }

  get size(): number {
    return this.reservations.size;
  }

  /** Up to `limit` reservations admitted after the one numbered `after` (from the oldest when undefined), oldest first. */
  page(after: number | undefined, limit: number): Page<Reservation> {
    // A Map iterates in insertion order, which is admission order.
    return pageAfter(
      this.reservations.values(),
      (r) => r.seq,
      (r) => r,
      after,
      limit,
    );
  }

  /** What every reservation holds, in total. */
  totals(): Resources {
    let memoryBytes = 0;
    let cpu = 0;
    for (const r of this.reservations.values()) {
      memoryBytes += r.start.memoryBytes + r.build.memoryBytes;
      cpu += r.start.cpu + r.build.cpu;
    }
    return { memoryBytes, cpu };
  }

  /** One committed item per reservation that still holds something. */
  committedItems(): CommittedItem[] {
    const items: CommittedItem[] = [];
    for (const r of this.reservations.values()) {
      const held = r.held();
      if (held.memoryBytes === 0 && held.cpu === 0) continue;
      items.push({ kind: "reservation", id: r.id, label: r.owner, memoryBytes: held.memoryBytes, cpu: held.cpu });
    }
    return items;
  }

  /**
   * Memory held by reservations admitted at or after `at` (monotonic clock): a sample whose read
   * began at `at` cannot show it yet.
   */
  unseenSince(at: number): number {
    let bytes = 0;
    for (const r of this.reservations.values()) if (r.admittedAtMonotonic >= at) bytes += r.start.memoryBytes + r.build.memoryBytes;
    return bytes;
  }

  /** Releases every reservation (the service is closing). */
  releaseAll(): void {
    for (const r of [...this.reservations.values()]) r.release();
  }

  /** @internal */
  lease(reservation: Reservation, ttlMs: number): void {
    if (!Number.isFinite(ttlMs) || ttlMs <= 0) throw new BerthError("invalid_argument", `ttl: must be a positive duration; got ${ttlMs}`, { field: "ttl" });
    reservation.leaseTtlMs = ttlMs;
    const deadline = this.clock.monotonicNow() + ttlMs;
    reservation.setLease(
      deadline,
      this.clock.setTimeout(() => {
        // Late by more than a moment (the process was paused): others may be overdue too, and earlier.
        if (this.clock.monotonicNow() - deadline > STALL_MS) this.expireOverdue();
        else this.leaseRanOut(reservation);
      }, ttlMs),
    );
  }

  /** @internal */
  changed(reservation: Reservation, change: ReservationChange): void {
    this.version++;
    this.options.onChange(reservation, change);
  }

  /** @internal */
  consumed(reservation: Reservation, name: string, cost: Resources, options: ConsumeOptions): RunningEntry {
    const entry = this.options.tally.register(name, cost, { ...options, reservationId: reservation.id }, { quiet: true });
    this.changed(reservation, "consumed");
    return entry;
  }

  /** @internal */
  removed(reservation: Reservation, why: "released" | "expired"): void {
    if (!this.reservations.delete(reservation.id)) return;
    const heldMs = this.clock.monotonicNow() - reservation.admittedAtMonotonic;
    this.holdMs = Math.round(this.holdMs * 0.7 + heldMs * 0.3);
    this.options.logger.debug({ reservation: reservation.id, owner: reservation.owner, why }, "budget: reservation ended");
    this.changed(reservation, why);
  }
}
