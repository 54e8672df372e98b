/**
 * The admission queue: requests that do not fit yet wait here, first come first served, and are
 * admitted the moment they fit and it is their turn.
 *
 * Nothing polls. Waiters are re-checked only when something can have changed the answer: a
 * reservation changed (admitted, build released, consumed, released), the running tally changed, a
 * new machine sample arrived, or the policy changed. In FIFO only the first waiter can be admitted,
 * so a re-check evaluates the first waiter and stops at the first request that does not fit:
 * O(1) for any number of waiters, and a sample that changes nothing the gates look at changes
 * nothing else.
 *
 * Backfill (`queueMode: "backfill"`) lets a request behind a blocked first waiter go first only when
 * that cannot delay the first waiter. The rule, for a candidate C behind the first waiter F:
 *   1. C fits now on its own (every gate, with its own skipLoadGate);
 *   2. for every resource C takes, F still fits with C admitted: if C takes memory, F's memory
 *      still fits the memory budget and free memory less C and F stays above the reserve; if C
 *      takes cpu, F's cpu still fits the cpu budget;
 *   3. if F waits for the CPU to calm down (PSI or load), C takes no cpu: C's work would add to
 *      the very saturation F waits out.
 * So C only ever uses room that F cannot use anyway: whatever F waits for is unaffected by C,
 * and once it clears, F fits with C still holding its share. (Work registered outside the queue,
 * and work using more than it declared, can still delay F, as they can in FIFO.)
 *
 * What waiters hear while they wait is the notifier's (queue-notifier.ts); the line they wait in
 * is queue-line.ts, their deadlines a heap behind one timer (deadline-heap.ts), and the refusals
 * they may get queue-refusals.ts.
 *
 * Every wait, deadline and heartbeat is measured on the clock's monotonic reading: a step of the
 * wall clock neither ends a wait early nor stretches it. Times shown (`entries()`) are wall time.
 */
import { wallTimesOf, type Clock } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import type { Logger } from "@berth/shared/logger";
import type { Need, Resources } from "./costs.js";
import { isZero, total } from "./costs.js";
import { DeadlineHeap } from "./deadline-heap.js";
import { estimateEtas, etaMsAt, type EtaEstimate, type Holding } from "./eta.js";
import type { Page } from "./paging.js";
import type { Policy } from "./policy.js";
import { QueueLine, type FirstWaiterState, type QueuedUpdate, type Waiter } from "./queue-line.js";
import { QueueNotifier } from "./queue-notifier.js";
import { cancelledError, closedError, etaOf, impossibleError, queueFullError, queueReason, waitExhaustedError } from "./queue-refusals.js";
import type { Reservation } from "./reservations.js";
import type { UsualTime } from "./run-times.js";
import type { Reason, VerdictContext } from "./verdict.js";
import { CPU_GATES, GATE, IMPOSSIBLE, freeMemory, reasonsFor, reasonsText, refusingGates } from "./verdict.js";

/** Options of one admission. */
export interface AdmitOptions {
  /** Give up after waiting this long (default: the policy's maxWaitMs); 0: never queue (admitted at once or refused). */
  maxWaitMs?: number | undefined;
  /** A wake of work that ran recently: the CPU gate is skipped, the memory gates still apply. */
  skipLoadGate?: boolean | undefined;
  /** The caller went away: a queued request is dropped. */
  signal?: AbortSignal | undefined;
  /** Hears the position, ETA and reason while queued. */
  onQueued?: ((update: QueuedUpdate) => void) | undefined;
  /** Given the queued request when it queues (not when admitted or refused at once): see {@link QueuedRequest}. */
  onQueuedRequest?: ((request: QueuedRequest) => void) | undefined;
}

/**
 * A queued request as the one who queued it steers it: several calls may wait on one request (a
 * request id's repeats, a resumed Admit), each until its own deadline, so the request's own wait
 * moves with them.
 */
export interface QueuedRequest {
  /** When its wait runs out (monotonic clock). */
  readonly deadline: number;
  /** Moves the end of its wait (monotonic clock): a call that waits longer joined, or a resume counts its own wait. */
  waitUntil(deadline: number): void;
  /** RESOURCE_EXHAUSTED WAIT_EXHAUSTED as the queue would refuse it now, for a call on it whose own wait of `waitedMs` ran out. */
  exhausted(waitedMs: number): BerthError;
}

/** One waiter as `state()` shows it. */
export interface QueueEntryInfo {
  id: string;
  /** Its place in arrival order, for paging: it never changes, whatever leaves the queue ahead of it. */
  seq: number;
  owner: string;
  position: number;
  needs: Resources;
  skipLoadGate: boolean;
  /**
   * When it was queued, and when its wait runs out: wall-clock ms as of this answer, from one
   * reading, so they are exactly its wait apart (after a wall-clock step, `queuedAt` is now less
   * `waitedMs`, not the time the clock read then).
   */
  queuedAt: number;
  waitedMs: number;
  /** The wait left (see eta.ts); undefined when nothing predicts it, or in a change event (ListQueue and GetState give ETAs). */
  etaMs: number | undefined;
  /** What `etaMs` rests on, or why there is none; "" in a change event. */
  etaBasis: string;
  deadline: number;
}

/** What the queue needs from the budget around it. */
export interface QueueHost {
  clock: Clock;
  logger: Logger;
  policy(): Policy;
  /** What a verdict is judged against right now (committed, latest sample, unseen memory). */
  context(): VerdictContext;
  /** Admits `need`: makes the reservation (`waitedMs`: how long it waited in the queue, 0 when it never queued). */
  grant(need: Need, owner: string, waitedMs: number): Reservation;
  /** The moving estimate of how long a reservation is held (the seed's retry hint of a refusal). */
  holdMs(): number;
  /** What the ETAs rest on: what holds the budget now with when each part is expected to end, and each name's usual time. Without it no ETA has a basis. */
  etaBasis?(): { holdings: Holding[]; usual(name: string): UsualTime | undefined };
  /** Runs `fn` soon, after the current event (batches position updates). Default: setImmediate. */
  defer?: ((fn: () => void) => void) | undefined;
  /**
   * Hears each request joining or leaving the queue, as it stood (`position` its place when it
   * joins, 0 when it leaves: positions of the others move with every change, and are not told).
   */
  requestChanged?: ((change: QueueRequestChange, request: QueueEntryInfo) => void) | undefined;
}

/** How a request joined or left the queue. */
export type QueueRequestChange = "queued" | "admitted" | "refused" | "timed_out" | "left";

/** The FIFO (optionally backfilling) admission queue. */
export class AdmissionQueue {
  private readonly line = new QueueLine();
  private seq = 0;
  private firstWaiter: FirstWaiterState | undefined;
  private readonly deadlines: DeadlineHeap<Waiter>;
  private readonly notifier: QueueNotifier;
  private rechecking = false;
  private recheckAgain = false;
  private closed = false;
  /** Every waiter's ETA, in queue order, as of `at`: dropped on any change of the queue or the budget, and after ETA_FRESH_MS. */
  private etaCache: { at: number; estimates: EtaEstimate[] } | undefined;
  /** The first waiter's reasons for the inputs they were written from: a burst of joiners writes them once. */
  private reasonsMemo: { firstWaiter: FirstWaiterState; context: VerdictContext; reasons: Reason[]; text: string | undefined } | undefined;

  constructor(private readonly host: QueueHost) {
    this.deadlines = new DeadlineHeap<Waiter>(host.clock, (expired, now) => this.expire(expired, now));
    this.notifier = new QueueNotifier({
      clock: host.clock,
      logger: host.logger,
      line: this.line,
      heartbeatMs: () => host.policy().heartbeatMs,
      etas: () => this.etas(),
      context: () => host.context(),
      firstWaiter: () => (this.firstWaiter && !this.firstWaiter.waiter.removed ? this.firstWaiter : undefined),
      firstWaiterReasons: (context) => this.firstWaiterReasonsFor(context),
      recheck: () => this.recheck(),
      defer: host.defer ?? ((fn) => setImmediate(fn)),
    });
  }

  /** How many requests wait. */
  get length(): number {
    return this.line.live;
  }

  /**
   * Waits until `need` fits and it is this request's turn, and returns its reservation (which the
   * caller must release). A need of nothing never waits. Refusals, as BerthError:
   * failed_precondition IMPOSSIBLE (bigger than the whole budget), resource_exhausted QUEUE_FULL
   * and WAIT_EXHAUSTED (with a retry delay; at once when `maxWaitMs` is 0 and it does not fit now),
   * cancelled (the signal fired), unavailable (the budget closed).
   */
  admit(need: Need, owner: string, options: AdmitOptions = {}): Promise<Reservation> {
    if (this.closed) return Promise.reject(closedError(owner));
    if (options.signal?.aborted) return Promise.reject(cancelledError(owner));
    const want = total(need);
    // Nothing to build or start costs nothing: it never waits behind anyone.
    if (isZero(want)) return Promise.resolve(this.host.grant(need, owner, 0));
    const policy = this.host.policy();
    const context = this.host.context();
    const live = this.line.live;
    const gates = refusingGates(want, context, { skipLoadGate: options.skipLoadGate });
    if (gates & IMPOSSIBLE) return Promise.reject(impossibleError(owner, reasonsFor(gates, want, context)));
    if (live === 0 && gates === 0) return Promise.resolve(this.host.grant(need, owner, 0));
    if (live > 0 && gates === 0 && policy.queueMode === "backfill" && this.canBackfill(want, context)) {
      return Promise.resolve(this.host.grant(need, owner, 0));
    }
    const maxWaitMs = options.maxWaitMs ?? policy.maxWaitMs;
    if (!Number.isFinite(maxWaitMs) || maxWaitMs < 0) {
      return Promise.reject(new BerthError("invalid_argument", `max_wait: must be a non-negative duration; got ${maxWaitMs}`, { field: "max_wait" }));
    }
    // A wait of zero never queues: what does not fit now (or must wait its turn) is refused at once.
    if (maxWaitMs === 0) {
      const position = live + 1;
      const own = live === 0 ? reasonsFor(gates, want, context) : [];
      const reasons = live === 0 ? own : [queueReason(live), ...this.firstWaiterReasonsFor(context).reasons];
      return Promise.reject(waitExhaustedError(owner, 0, position, reasons, etaOf(position, this.host.holdMs(), 0)));
    }
    if (live >= policy.maxQueue) return Promise.reject(queueFullError(owner, live, this.firstWaiterEtaMs()));
    return new Promise<Reservation>((resolve, reject) => {
      const now = this.host.clock.monotonicNow();
      const seq = ++this.seq;
      const waiter: Waiter = {
        id: `q${seq}`,
        seq,
        owner,
        need,
        want,
        skipLoadGate: options.skipLoadGate ?? false,
        queuedAt: now,
        deadline: now + maxWaitMs,
        onQueued: options.onQueued,
        resolve,
        reject,
        signal: options.signal,
        onAbort: undefined,
        removed: false,
        heapIndex: -1,
        lastPosition: 0,
        lastKey: "",
        lastNotifiedAt: now,
      };
      if (options.signal) {
        waiter.onAbort = () => this.drop(waiter, cancelledError(owner), "left");
        options.signal.addEventListener("abort", waiter.onAbort, { once: true });
      }
      this.line.push(waiter);
      this.etaCache = undefined;
      this.deadlines.add(waiter);
      options.onQueuedRequest?.({
        get deadline() {
          return waiter.deadline;
        },
        waitUntil: (deadline) => this.moveDeadline(waiter, deadline),
        exhausted: (waitedMs) => this.exhaustedRefusal(waiter, waitedMs),
      });
      if (this.line.live === 1) {
        this.firstWaiter = { waiter, gates };
        this.notifier.firstJoined(gates);
      }
      this.notifier.notify(waiter, this.line.live, this.host.context());
      this.told("queued", waiter, this.line.live);
    });
  }

  /**
   * Re-checks the queue after something changed: admits in queue order while the first waiter
   * fits, then (backfill) lets through whoever cannot delay the first waiter. Re-entrant calls (an
   * admission changes the reservations, which asks for a re-check) fold into the running one.
   */
  recheck(): void {
    this.etaCache = undefined;
    if (this.closed) return;
    // Right after a pause (the service was stopped) the I/O that piled up is read first: a waiter
    // whose client left during the pause is dropped before anything is admitted.
    this.host.clock.whenAwake(() => this.recheckNow());
  }

  private recheckNow(): void {
    if (this.closed) return;
    if (this.rechecking) {
      this.recheckAgain = true;
      return;
    }
    this.rechecking = true;
    let admitted = false;
    try {
      do {
        this.recheckAgain = false;
        for (;;) {
          const waiter = this.line.first();
          if (!waiter) {
            this.firstWaiter = undefined;
            break;
          }
          const context = this.host.context();
          const gates = refusingGates(waiter.want, context, { skipLoadGate: waiter.skipLoadGate });
          if (gates & IMPOSSIBLE) {
            // The policy shrank under it: it will never fit now.
            this.drop(waiter, impossibleError(waiter.owner, reasonsFor(gates, waiter.want, context)), "refused");
            continue;
          }
          if (gates === 0) {
            this.grant(waiter);
            admitted = true;
            continue;
          }
          this.firstWaiter = { waiter, gates };
          break;
        }
        if (this.firstWaiter && this.host.policy().queueMode === "backfill" && this.backfill()) admitted = true;
      } while (this.recheckAgain);
    } finally {
      this.rechecking = false;
    }
    this.notifier.rechecked(admitted, this.firstWaiter);
  }

  /** The policy changed: re-arm the heartbeat at its new interval and re-check everyone. */
  policyChanged(): void {
    this.notifier.policyChanged();
    this.recheck();
  }

  /** Every waiter with its position and ETA, in queue order. */
  entries(): QueueEntryInfo[] {
    return this.page(undefined, Number.POSITIVE_INFINITY).items;
  }

  /**
   * Up to `limit` waiters that arrived after the one numbered `after` (from the first waiter when
   * undefined), in queue order, with positions and ETAs; `next` is the last one's number when more
   * remain. Numbers follow arrival, so a page picks up where the last ended whoever left the queue
   * meanwhile: nobody is repeated, and a newcomer appears on a later page.
   */
  page(after: number | undefined, limit: number): Page<QueueEntryInfo> {
    const now = this.host.clock.monotonicNow();
    const wallTime = wallTimesOf(this.host.clock);
    const etas = this.etas();
    const items: QueueEntryInfo[] = [];
    let position = 0;
    let more = false;
    const waiters = this.line.waiters;
    for (let i = this.line.firstIndex; i < waiters.length; i++) {
      const w = waiters[i]!;
      if (w.removed) continue;
      position++;
      if (after !== undefined && w.seq <= after) continue;
      if (items.length >= limit) {
        more = true;
        break;
      }
      // Both ends from one reading of the clocks: shown together, they are exactly the wait apart.
      const queuedAt = wallTime(w.queuedAt);
      items.push({
        id: w.id,
        seq: w.seq,
        owner: w.owner,
        position,
        needs: { ...w.want },
        skipLoadGate: w.skipLoadGate,
        queuedAt,
        waitedMs: now - w.queuedAt,
        etaMs: etaMsAt(etas[position - 1]!, now),
        etaBasis: etas[position - 1]!.basis,
        deadline: queuedAt + Math.round(w.deadline - w.queuedAt),
      });
    }
    return { items, next: more ? items[items.length - 1]?.seq : undefined };
  }

  /** The first waiter's current reasons (what everyone waits for), or [] when the queue is empty. */
  firstWaiterReasons(): Reason[] {
    return this.firstWaiterReasonsFor(this.host.context()).reasons;
  }

  /** Refuses every waiter with `unavailable` and stops the timers. */
  close(): void {
    if (this.closed) return;
    // Closed first, so that dropping the first waiter does not admit the next one on the way out.
    this.closed = true;
    this.deadlines.close();
    this.notifier.close();
    for (const w of this.line.waiters) if (!w.removed) this.drop(w, closedError(w.owner), "refused");
    this.line.clear();
  }

  /** The first waiter's reasons and their text, written once per change of the first waiter, its gates or what they are judged against. */
  private firstWaiterReasonsFor(context: VerdictContext): { reasons: Reason[]; text: string | undefined } {
    const first = this.firstWaiter && !this.firstWaiter.waiter.removed ? this.firstWaiter : undefined;
    if (!first) return { reasons: [], text: undefined };
    const memo = this.reasonsMemo;
    if (
      memo &&
      memo.firstWaiter.waiter === first.waiter &&
      memo.firstWaiter.gates === first.gates &&
      memo.context.committed === context.committed &&
      memo.context.sample === context.sample &&
      memo.context.policy === context.policy &&
      memo.context.unseenMemoryBytes === context.unseenMemoryBytes
    ) {
      return memo;
    }
    const reasons = reasonsFor(first.gates, first.waiter.want, context);
    this.reasonsMemo = { firstWaiter: { ...first }, context, reasons, text: reasonsText(reasons) };
    return this.reasonsMemo;
  }

  // --- admission --------------------------------------------------------------------------------

  private grant(waiter: Waiter): void {
    this.remove(waiter);
    let reservation: Reservation;
    try {
      reservation = this.host.grant(waiter.need, waiter.owner, this.host.clock.monotonicNow() - waiter.queuedAt);
    } catch (error) {
      waiter.reject(error instanceof BerthError ? error : new BerthError("internal", `admitting '${waiter.owner}' failed: ${(error as Error).message}`));
      return;
    }
    this.told("admitted", waiter, 0);
    waiter.resolve(reservation);
  }

  /** Backfill pass behind a blocked first waiter (see the module comment for the rule). True when it admitted anyone. */
  private backfill(): boolean {
    let admitted = false;
    let context = this.host.context();
    const first = this.firstWaiter!;
    const waiters = this.line.waiters;
    for (let i = this.line.firstIndex + 1; i < waiters.length; i++) {
      const candidate = waiters[i]!;
      if (candidate.removed) continue;
      const gates = refusingGates(candidate.want, context, { skipLoadGate: candidate.skipLoadGate });
      if (gates !== 0) continue;
      if (!this.cannotDelayFirstWaiter(candidate.want, first, context)) continue;
      this.grant(candidate);
      admitted = true;
      context = this.host.context();
    }
    return admitted;
  }

  /** Rule 1 for a newcomer is checked by the caller; this checks rules 2 and 3 against the current first waiter. */
  private canBackfill(want: Resources, context: VerdictContext): boolean {
    const waiter = this.line.first();
    if (!waiter) return true;
    const gates = refusingGates(waiter.want, context, { skipLoadGate: waiter.skipLoadGate });
    if (gates === 0 || gates & IMPOSSIBLE) return false; // the first waiter goes first; a re-check will see to it
    return this.cannotDelayFirstWaiter(want, { waiter, gates }, context);
  }

  private cannotDelayFirstWaiter(want: Resources, first: FirstWaiterState, context: VerdictContext): boolean {
    const { policy, committed } = context;
    const f = first.waiter.want;
    if (want.memoryBytes > 0) {
      if (committed.memoryBytes + want.memoryBytes + f.memoryBytes > policy.memoryBytes) return false;
      const free = freeMemory(context);
      if (free !== undefined && free - want.memoryBytes - f.memoryBytes < policy.reserveBytes) return false;
    }
    if (want.cpu > 0) {
      if (committed.cpu + want.cpu + f.cpu > policy.cpu) return false;
      if (first.gates & CPU_GATES) return false;
    }
    return true;
  }

  // --- removal and deadlines ---------------------------------------------------------------------

  private moveDeadline(waiter: Waiter, deadline: number): void {
    if (waiter.removed || waiter.deadline === deadline) return;
    this.deadlines.delete(waiter);
    waiter.deadline = deadline;
    this.deadlines.add(waiter);
  }

  /** The refusal of a waiter's wait of `waitedMs` running out now: where it stands, and what it waits for. */
  private exhaustedRefusal(waiter: Waiter, waitedMs: number): BerthError {
    let at = 0;
    for (const w of this.line.waiters) {
      if (w.removed) continue;
      at++;
      if (w === waiter) break;
    }
    const first = this.firstWaiter && !this.firstWaiter.waiter.removed ? this.firstWaiter : undefined;
    const firstWaiterReasons = this.firstWaiterReasonsFor(this.host.context()).reasons;
    const reasons = at === 1 && first?.waiter === waiter ? firstWaiterReasons : [queueReason(at - 1), ...firstWaiterReasons];
    return waitExhaustedError(waiter.owner, waitedMs, at, reasons, etaOf(at, this.host.holdMs(), this.host.clock.monotonicNow() - waiter.queuedAt));
  }

  private remove(waiter: Waiter): void {
    if (!this.line.markRemoved(waiter)) return;
    this.etaCache = undefined;
    this.deadlines.delete(waiter);
    if (waiter.onAbort) waiter.signal?.removeEventListener("abort", waiter.onAbort);
    if (this.firstWaiter?.waiter === waiter) this.firstWaiter = undefined;
    if (this.line.live === 0) this.notifier.stopHeartbeat();
  }

  /** Takes a waiter out and refuses it; a new first waiter may fit, so the queue is re-checked. */
  private drop(waiter: Waiter, error: BerthError, change: QueueRequestChange): void {
    if (waiter.removed) return;
    const wasFirst = this.line.first() === waiter;
    this.remove(waiter);
    this.told(change, waiter, 0);
    waiter.reject(error);
    if (wasFirst) this.recheck();
    this.notifier.scheduleFlush();
  }

  /** Waiters whose wait ran out: each is refused with where it stood. */
  private expire(expired: Waiter[], now: number): void {
    // Positions for every expired waiter in one walk, not one walk each.
    const positions = new Map<Waiter, number>();
    let position = 0;
    for (const w of this.line.waiters) if (!w.removed) positions.set(w, ++position);
    const first = this.firstWaiter && !this.firstWaiter.waiter.removed ? this.firstWaiter : undefined;
    const firstWaiterReasons = this.firstWaiterReasonsFor(this.host.context()).reasons;
    const holdMs = this.host.holdMs();
    for (const w of expired) {
      const at = positions.get(w) ?? 1;
      const reasons = at === 1 && first?.waiter === w ? firstWaiterReasons : [queueReason(at - 1), ...firstWaiterReasons];
      this.drop(w, waitExhaustedError(w.owner, now - w.queuedAt, at, reasons, etaOf(at, holdMs, now - w.queuedAt)), "timed_out");
    }
  }

  /** Tells the host a request joined (at `position`) or left (0) the queue. */
  private told(change: QueueRequestChange, waiter: Waiter, position: number): void {
    const hear = this.host.requestChanged;
    if (hear === undefined) return;
    const now = this.host.clock.monotonicNow();
    const queuedAt = wallTimesOf(this.host.clock)(waiter.queuedAt);
    hear(change, {
      id: waiter.id,
      seq: waiter.seq,
      owner: waiter.owner,
      position,
      needs: { ...waiter.want },
      skipLoadGate: waiter.skipLoadGate,
      queuedAt,
      waitedMs: now - waiter.queuedAt,
      etaMs: undefined,
      etaBasis: "",
      deadline: queuedAt + Math.round(waiter.deadline - waiter.queuedAt),
    });
  }

  /**
   * Every waiter's ETA, in queue order (eta.ts): from what holds the budget and when each part is
   * expected to end, the queue's order and each owner's usual time; none when the first waiter
   * waits for the machine. Kept until the queue or the budget changes, and at most ETA_FRESH_MS:
   * the ends it rests on move (a lease renewed, a run past its usual time).
   */
  etas(): EtaEstimate[] {
    const now = this.host.clock.monotonicNow();
    if (this.etaCache !== undefined && now - this.etaCache.at < ETA_FRESH_MS) return this.etaCache.estimates;
    const queue: { want: Resources; name: string }[] = [];
    for (const w of this.line.waiters) if (!w.removed) queue.push({ want: w.want, name: w.owner });
    const basis = this.host.etaBasis?.();
    let estimates: EtaEstimate[];
    if (basis === undefined) estimates = queue.map(() => ({ at: undefined, basis: "unknown: this queue keeps no record of what holds the budget" }));
    else {
      const policy = this.host.policy();
      const first = this.firstWaiter && !this.firstWaiter.waiter.removed ? this.firstWaiter : undefined;
      estimates = estimateEtas({
        now,
        budget: { memoryBytes: policy.memoryBytes, cpu: policy.cpu },
        holdings: basis.holdings,
        queue,
        usual: basis.usual,
        machineGates: first === undefined ? undefined : machineGateWords(first.gates),
      });
    }
    this.etaCache = { at: now, estimates };
    return estimates;
  }

  private firstWaiterEtaMs(): number {
    const first = this.line.first();
    return etaOf(1, this.host.holdMs(), first ? this.host.clock.monotonicNow() - first.queuedAt : 0);
  }
}

/** How long a set of ETAs stays in use while nothing changes: the ends it rests on move with time. */
const ETA_FRESH_MS = 1000;

/** The machine gates in `gates` (bits), as what a wait for them waits for; undefined when none is closed. */
function machineGateWords(gates: number): string | undefined {
  const words: string[] = [];
  if (gates & GATE.freeMemory) words.push("free memory on the machine");
  if (gates & GATE.cpuPressure) words.push("cpu pressure to ease");
  if (gates & GATE.load) words.push("the load average to fall");
  return words.length === 0 ? undefined : words.join(" and ");
}
