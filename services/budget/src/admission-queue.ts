/**
 * The admission queue: requests that do not fit yet wait here, first come first served, and are
 * admitted the moment they fit and it is their turn.
 *
 * Nothing polls. Waiters are re-checked only when something can have changed the answer: a
 * reservation changed (admitted, build released, consumed, released), the running tally changed, a
 * new machine sample arrived, or the policy changed. In FIFO only the head can be admitted, so a
 * re-check evaluates the head and stops at the first request that does not fit: O(1) for any
 * number of waiters, and a sample that changes nothing the gates look at changes nothing else.
 *
 * Backfill (`queueMode: "backfill"`) lets a request behind a blocked head go first only when that
 * cannot delay the head. The rule, for a candidate C behind the head H:
 *   1. C fits now on its own (every gate, with its own skipLoadGate);
 *   2. for every resource C takes, H still fits with C admitted: if C takes memory, H's memory
 *      still fits the memory budget and free memory less C and H stays above the reserve; if C
 *      takes cpu, H's cpu still fits the cpu budget;
 *   3. if H waits for the CPU to calm down (PSI or load), C takes no cpu: C's work would add to
 *      the very saturation H waits out.
 * So C only ever uses room that H cannot use anyway: whatever H waits for is unaffected by C,
 * and once it clears, H fits with C still holding its share. (Work registered outside the queue,
 * and work using more than it declared, can still delay H, as they can in FIFO.)
 *
 * What waiters hear (`onQueued`): at once when queued, whenever their position or the head's
 * refusing gates change, and as a heartbeat when nothing changes. Waiter k's reason is
 * "k-1 request(s) ahead in the queue; <the head's reasons>": the head's reasons are computed once
 * per event, not once per waiter. Position updates are batched: any number of admissions,
 * cancellations and expiries in one turn of the event loop cost one walk of the queue.
 *
 * Heartbeats are capped server-wide at {@link HEARTBEAT_RATE_CAP} messages a second, whatever the
 * queue length: each waiter's heartbeat period is max(heartbeatMs, waiters / cap), so up to 500
 * waiters each hear every 5 s (the default) and 10,000 each hear every 100 s (their ETA is hours by
 * then; HTTP/2 keepalive pings hold the connection meanwhile). One shared timer drives a rolling
 * cursor over the line, a few waiters per tick, so the heartbeats are spread over the period rather
 * than sent in a burst. Only heartbeats are capped: a changed position or reason still goes at once.
 *
 * Every wait, deadline and heartbeat is measured on the clock's monotonic reading: a step of the
 * wall clock neither ends a wait early nor stretches it. Times shown (`entries()`) are wall time.
 */
import { wallTimesOf, type Clock, type TimerHandle } from "@berth/shared/clock";
import { BerthError } from "@berth/shared/errors";
import { formatDuration } from "@berth/shared/units";
import type { Need, Resources } from "./costs.js";
import { isZero, total } from "./costs.js";
import type { Logger } from "./logger.js";
import type { Policy } from "./policy.js";
import type { Reservation } from "./reservations.js";
import type { Reason, VerdictContext } from "./verdict.js";
import { CPU_GATES, IMPOSSIBLE, freeMemory, reasonsFor, reasonsText, refusingGates } from "./verdict.js";

/**
 * At most this many heartbeat messages a second for the whole queue. Each one costs ~250 µs in the
 * RPC layer's streaming, and with 10,000 streams open ~370 µs once the full collections its garbage
 * brings are counted, so 100/s bounds heartbeats to ~25–40 ms of CPU a second however many wait; a
 * long queue stretches each waiter's period instead (see {@link heartbeatPeriodMs}).
 */
export const HEARTBEAT_RATE_CAP = 100;

/**
 * The shortest gap between two heartbeat ticks: at most 10 wake-ups a second, each telling up to
 * cap x tick / 1000 (10) waiters. A short queue ticks less often (once per waiter's share of the period).
 */
export const HEARTBEAT_TICK_MS = 100;

/** Most waiters one tick may visit: a late tick does not catch up in a burst. */
const HEARTBEAT_BURST = Math.max(1, Math.floor((HEARTBEAT_RATE_CAP * HEARTBEAT_TICK_MS) / 1000));

/** How often each of `waiters` hears a heartbeat: every `heartbeatMs`, stretched so the queue sends at most {@link HEARTBEAT_RATE_CAP} a second. */
export function heartbeatPeriodMs(waiters: number, heartbeatMs: number): number {
  return Math.max(heartbeatMs, Math.ceil((waiters * 1000) / HEARTBEAT_RATE_CAP));
}

/** How many requests ahead a waiter is told about by name (the ones nearest the head). */
export const AHEAD_LIMIT = 10;

/** A request ahead of a waiter, and what it asks for. */
export interface AheadEntry {
  owner: string;
  needs: Resources;
}

/** One page of a list kept in arrival order (the queue, the reservations, the running tally). */
export interface Page<T> {
  items: T[];
  /** The number of the page's last item when more follow (where the next page starts); undefined on the last page. */
  next?: number | undefined;
}

/** What a waiter hears while it waits. */
export interface QueuedUpdate {
  /** 1 is the head. */
  position: number;
  /** Estimated wait left: position x the moving hold time, less the time waited; at least 1 s. */
  etaMs: number;
  /** Why it waits: requests ahead (gate "queue"), then the head's refusing gates. */
  waitFor: Reason[];
  /** The same, written out as the seed does. */
  waitForText: string;
  /** Up to {@link AHEAD_LIMIT} requests ahead of it, from the head. */
  ahead: AheadEntry[];
  /** How many requests are ahead of it in all. */
  aheadCount: number;
}

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
  etaMs: number;
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
  /** The moving estimate of how long a reservation is held. */
  holdMs(): number;
  /** Runs `fn` soon, after the current event (batches position updates). Default: setImmediate. */
  defer?: ((fn: () => void) => void) | undefined;
}

interface Waiter {
  id: string;
  seq: number;
  owner: string;
  need: Need;
  want: Resources;
  skipLoadGate: boolean;
  /** When it was queued and when its wait runs out (monotonic clock). */
  queuedAt: number;
  deadline: number;
  onQueued: ((update: QueuedUpdate) => void) | undefined;
  resolve: (reservation: Reservation) => void;
  reject: (error: BerthError) => void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
  removed: boolean;
  heapIndex: number;
  /** What it was last told: a new position or head key means it hears again. */
  lastPosition: number;
  lastKey: string;
  lastNotifiedAt: number;
}

/** The head's current refusal, computed once per event. */
interface HeadState {
  waiter: Waiter;
  gates: number;
}

/** The seed's refusal when a need can never fit. */
export function impossibleError(owner: string, reasons: Reason[]): BerthError {
  return new BerthError(
    "failed_precondition",
    `the load budget can never admit '${owner}': ${reasons[0]?.message ?? "it is bigger than the whole budget"}. Declare smaller resources or raise the budget`,
    { kind: "impossible", gate: reasons[0]?.gate, reasons },
    { reason: "IMPOSSIBLE" },
  );
}

/** The FIFO (optionally backfilling) admission queue. */
export class AdmissionQueue {
  private line: Waiter[] = [];
  private headIndex = 0;
  private live = 0;
  private seq = 0;
  private head: HeadState | undefined;
  /** The head's refusing gates when waiters last heard: a change means everyone hears again. */
  private headKey = "";
  private readonly deadlines: Waiter[] = [];
  private deadlineTimer: TimerHandle | undefined;
  private deadlineAt = Number.POSITIVE_INFINITY;
  private heartbeatTimer: TimerHandle | undefined;
  /** The next waiter (index into `line`) the heartbeat visits: it sweeps the line once per period. */
  private heartbeatCursor = 0;
  /** Visits earned since the last tick, at waiters / period per ms; a fraction carries over. */
  private heartbeatCredit = 0;
  private lastHeartbeatTickAt = 0;
  /** When the heartbeat last refreshed the head's verdict (once per heartbeatMs, as before the cap). */
  private lastHeartbeatRecheckAt = 0;
  private flushScheduled = false;
  private rechecking = false;
  private recheckAgain = false;
  private closed = false;
  private readonly defer: (fn: () => void) => void;
  /** The head's reasons for the inputs they were written from: a burst of joiners writes them once. */
  private reasonsMemo: { head: HeadState; context: VerdictContext; reasons: Reason[]; text: string | undefined } | undefined;

  constructor(private readonly host: QueueHost) {
    this.defer = host.defer ?? ((fn) => setImmediate(fn));
  }

  /** How many requests wait. */
  get length(): number {
    return this.live;
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
    const gates = refusingGates(want, context, { skipLoadGate: options.skipLoadGate });
    if (gates & IMPOSSIBLE) return Promise.reject(impossibleError(owner, reasonsFor(gates, want, context)));
    if (this.live === 0 && gates === 0) return Promise.resolve(this.host.grant(need, owner, 0));
    if (this.live > 0 && gates === 0 && policy.queueMode === "backfill" && this.canBackfill(want, context)) {
      return Promise.resolve(this.host.grant(need, owner, 0));
    }
    const maxWaitMs = options.maxWaitMs ?? policy.maxWaitMs;
    if (!Number.isFinite(maxWaitMs) || maxWaitMs < 0) {
      return Promise.reject(new BerthError("invalid_argument", `max_wait: must be a non-negative duration; got ${maxWaitMs}`, { field: "max_wait" }));
    }
    // A wait of zero never queues: what does not fit now (or must wait its turn) is refused at once.
    if (maxWaitMs === 0) {
      const position = this.live + 1;
      const own = this.live === 0 ? reasonsFor(gates, want, context) : [];
      const reasons = this.live === 0 ? own : [queueReason(this.live), ...this.headReasonsFor(context).reasons];
      return Promise.reject(waitExhaustedError(owner, 0, position, reasons, etaOf(position, this.host.holdMs(), 0)));
    }
    if (this.live >= policy.maxQueue) {
      return Promise.reject(
        new BerthError(
          "resource_exhausted",
          `the load budget's queue is full (${this.live} waiting, BERTH_BUDGET_MAX_QUEUE) — '${owner}' was not queued; retry later`,
          { kind: "queue_full", waiting: this.live, setting: "BERTH_BUDGET_MAX_QUEUE", retryAfterMs: this.headEtaMs() },
          { reason: "QUEUE_FULL", retryAfterMs: this.headEtaMs() },
        ),
      );
    }
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
        waiter.onAbort = () => this.drop(waiter, cancelledError(owner));
        options.signal.addEventListener("abort", waiter.onAbort, { once: true });
      }
      this.line.push(waiter);
      this.live++;
      this.pushDeadline(waiter);
      if (this.live === 1) {
        this.head = { waiter, gates };
        this.headKey = gatesKeyOf(gates);
        this.startHeartbeat();
      }
      this.notify(waiter, this.live, this.host.context());
    });
  }

  /**
   * Re-checks the queue after something changed: admits from the head while the head fits, then
   * (backfill) lets through whoever cannot delay the head. Re-entrant calls (an admission changes
   * the reservations, which asks for a re-check) fold into the running one.
   */
  recheck(): void {
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
          const waiter = this.firstLive();
          if (!waiter) {
            this.head = undefined;
            break;
          }
          const context = this.host.context();
          const gates = refusingGates(waiter.want, context, { skipLoadGate: waiter.skipLoadGate });
          if (gates & IMPOSSIBLE) {
            // The policy shrank under it: it will never fit now.
            this.drop(waiter, impossibleError(waiter.owner, reasonsFor(gates, waiter.want, context)));
            continue;
          }
          if (gates === 0) {
            this.grant(waiter);
            admitted = true;
            continue;
          }
          this.head = { waiter, gates };
          break;
        }
        if (this.head && this.host.policy().queueMode === "backfill" && this.backfill()) admitted = true;
      } while (this.recheckAgain);
    } finally {
      this.rechecking = false;
    }
    const key = this.head ? gatesKeyOf(this.head.gates) : "";
    if (admitted || key !== this.headKey) this.scheduleFlush();
  }

  /** The policy changed: re-arm the heartbeat at its new interval and re-check everyone. */
  policyChanged(): void {
    if (this.heartbeatTimer !== undefined) {
      this.host.clock.clearTimeout(this.heartbeatTimer);
      this.heartbeatTimer = undefined;
      this.armHeartbeat();
    }
    this.recheck();
  }

  /** Every waiter with its position and ETA, head first. */
  entries(): QueueEntryInfo[] {
    return this.page(undefined, Number.POSITIVE_INFINITY).items;
  }

  /**
   * Up to `limit` waiters that arrived after the one numbered `after` (from the head when
   * undefined), head first, with positions and ETAs; `next` is the last one's number when more
   * remain. Numbers follow arrival, so a page picks up where the last ended whoever left the queue
   * meanwhile: nobody is repeated, and a newcomer appears on a later page.
   */
  page(after: number | undefined, limit: number): Page<QueueEntryInfo> {
    const now = this.host.clock.monotonicNow();
    const wallTime = wallTimesOf(this.host.clock);
    const holdMs = this.host.holdMs();
    const items: QueueEntryInfo[] = [];
    let position = 0;
    let more = false;
    for (let i = this.headIndex; i < this.line.length; i++) {
      const w = this.line[i]!;
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
        etaMs: etaOf(position, holdMs, now - w.queuedAt),
        deadline: queuedAt + Math.round(w.deadline - w.queuedAt),
      });
    }
    return { items, next: more ? items[items.length - 1]?.seq : undefined };
  }

  /** The head's current reasons (what everyone waits for), or [] when the queue is empty. */
  headReasons(): Reason[] {
    return this.headReasonsFor(this.host.context()).reasons;
  }

  /** Refuses every waiter with `unavailable` and stops the timers. */
  close(): void {
    if (this.closed) return;
    // Closed first, so that dropping the head does not admit the next one on the way out.
    this.closed = true;
    for (const w of this.line) if (!w.removed) this.drop(w, closedError(w.owner));
    if (this.deadlineTimer !== undefined) this.host.clock.clearTimeout(this.deadlineTimer);
    if (this.heartbeatTimer !== undefined) this.host.clock.clearTimeout(this.heartbeatTimer);
    this.deadlineTimer = undefined;
    this.heartbeatTimer = undefined;
    this.line = [];
    this.headIndex = 0;
  }

  /** The head's reasons and their text, written once per change of the head, its gates or what they are judged against. */
  private headReasonsFor(context: VerdictContext): { reasons: Reason[]; text: string | undefined } {
    const head = this.head && !this.head.waiter.removed ? this.head : undefined;
    if (!head) return { reasons: [], text: undefined };
    const memo = this.reasonsMemo;
    if (
      memo &&
      memo.head.waiter === head.waiter &&
      memo.head.gates === head.gates &&
      memo.context.committed === context.committed &&
      memo.context.sample === context.sample &&
      memo.context.policy === context.policy &&
      memo.context.unseenMemoryBytes === context.unseenMemoryBytes
    ) {
      return memo;
    }
    const reasons = reasonsFor(head.gates, head.waiter.want, context);
    this.reasonsMemo = { head: { ...head }, context, reasons, text: reasonsText(reasons) };
    return this.reasonsMemo;
  }

  // --- admission --------------------------------------------------------------------------------

  private firstLive(): Waiter | undefined {
    while (this.headIndex < this.line.length && this.line[this.headIndex]!.removed) this.headIndex++;
    return this.line[this.headIndex];
  }

  private grant(waiter: Waiter): void {
    this.remove(waiter);
    let reservation: Reservation;
    try {
      reservation = this.host.grant(waiter.need, waiter.owner, this.host.clock.monotonicNow() - waiter.queuedAt);
    } catch (error) {
      waiter.reject(error instanceof BerthError ? error : new BerthError("internal", `admitting '${waiter.owner}' failed: ${(error as Error).message}`));
      return;
    }
    waiter.resolve(reservation);
  }

  /** Backfill pass behind a blocked head (see the module comment for the rule). True when it admitted anyone. */
  private backfill(): boolean {
    let admitted = false;
    let context = this.host.context();
    const head = this.head!;
    for (let i = this.headIndex + 1; i < this.line.length; i++) {
      const candidate = this.line[i]!;
      if (candidate.removed) continue;
      const gates = refusingGates(candidate.want, context, { skipLoadGate: candidate.skipLoadGate });
      if (gates !== 0) continue;
      if (!this.cannotDelayHead(candidate.want, head, context)) continue;
      this.grant(candidate);
      admitted = true;
      context = this.host.context();
    }
    return admitted;
  }

  /** Rule 1 for a newcomer is checked by the caller; this checks rules 2 and 3 against the current head. */
  private canBackfill(want: Resources, context: VerdictContext): boolean {
    const waiter = this.firstLive();
    if (!waiter) return true;
    const gates = refusingGates(waiter.want, context, { skipLoadGate: waiter.skipLoadGate });
    if (gates === 0 || gates & IMPOSSIBLE) return false; // the head goes first; a re-check will see to it
    return this.cannotDelayHead(want, { waiter, gates }, context);
  }

  private cannotDelayHead(want: Resources, head: HeadState, context: VerdictContext): boolean {
    const { policy, committed } = context;
    const h = head.waiter.want;
    if (want.memoryBytes > 0) {
      if (committed.memoryBytes + want.memoryBytes + h.memoryBytes > policy.memoryBytes) return false;
      const free = freeMemory(context);
      if (free !== undefined && free - want.memoryBytes - h.memoryBytes < policy.reserveBytes) return false;
    }
    if (want.cpu > 0) {
      if (committed.cpu + want.cpu + h.cpu > policy.cpu) return false;
      if (head.gates & CPU_GATES) return false;
    }
    return true;
  }

  // --- removal and deadlines ---------------------------------------------------------------------

  private remove(waiter: Waiter): void {
    if (waiter.removed) return;
    waiter.removed = true;
    this.live--;
    this.removeDeadline(waiter);
    if (waiter.onAbort) waiter.signal?.removeEventListener("abort", waiter.onAbort);
    if (this.head?.waiter === waiter) this.head = undefined;
    if (this.live === 0) this.stopHeartbeat();
  }

  /** Takes a waiter out and refuses it; a new head may fit, so the queue is re-checked. */
  private drop(waiter: Waiter, error: BerthError): void {
    if (waiter.removed) return;
    const wasHead = this.firstLive() === waiter;
    this.remove(waiter);
    waiter.reject(error);
    if (wasHead) this.recheck();
    this.scheduleFlush();
  }

  private expire(): void {
    this.deadlineTimer = undefined;
    this.deadlineAt = Number.POSITIVE_INFINITY;
    const now = this.host.clock.monotonicNow();
    const expired: Waiter[] = [];
    while (this.deadlines.length > 0 && this.deadlines[0]!.deadline <= now) expired.push(this.popDeadline()!);
    if (expired.length > 0) {
      // Positions for every expired waiter in one walk, not one walk each.
      const positions = new Map<Waiter, number>();
      let position = 0;
      for (const w of this.line) if (!w.removed) positions.set(w, ++position);
      const head = this.head && !this.head.waiter.removed ? this.head : undefined;
      const headReasons = this.headReasonsFor(this.host.context()).reasons;
      const holdMs = this.host.holdMs();
      for (const w of expired) {
        const at = positions.get(w) ?? 1;
        const reasons = at === 1 && head?.waiter === w ? headReasons : [queueReason(at - 1), ...headReasons];
        w.heapIndex = -1;
        this.drop(w, waitExhaustedError(w.owner, now - w.queuedAt, at, reasons, etaOf(at, holdMs, now - w.queuedAt)));
      }
    }
    this.armDeadlineTimer();
  }

  private armDeadlineTimer(): void {
    if (this.closed) return;
    const next = this.deadlines[0]?.deadline ?? Number.POSITIVE_INFINITY;
    if (next === this.deadlineAt) return;
    if (this.deadlineTimer !== undefined) this.host.clock.clearTimeout(this.deadlineTimer);
    this.deadlineTimer = undefined;
    this.deadlineAt = next;
    if (next !== Number.POSITIVE_INFINITY) this.deadlineTimer = this.host.clock.setTimeout(() => this.expire(), next - this.host.clock.monotonicNow());
  }

  // A binary min-heap of waiters by deadline: one timer serves every waiter, and a batch of expiries is handled in one go.

  private pushDeadline(waiter: Waiter): void {
    waiter.heapIndex = this.deadlines.length;
    this.deadlines.push(waiter);
    this.siftUp(waiter.heapIndex);
    this.armDeadlineTimer();
  }

  private popDeadline(): Waiter | undefined {
    const top = this.deadlines[0];
    if (top) this.removeAt(0);
    return top;
  }

  private removeDeadline(waiter: Waiter): void {
    if (waiter.heapIndex < 0) return;
    this.removeAt(waiter.heapIndex);
    if (this.deadlineTimer !== undefined || this.deadlines.length > 0) this.armDeadlineTimer();
  }

  private removeAt(index: number): void {
    const heap = this.deadlines;
    const removed = heap[index]!;
    const last = heap.pop()!;
    removed.heapIndex = -1;
    if (index < heap.length) {
      heap[index] = last;
      last.heapIndex = index;
      this.siftUp(index);
      this.siftDown(last.heapIndex);
    }
  }

  private siftUp(index: number): void {
    const heap = this.deadlines;
    while (index > 0) {
      const parent = (index - 1) >> 1;
      if (heap[parent]!.deadline <= heap[index]!.deadline) break;
      this.swap(index, parent);
      index = parent;
    }
  }

  private siftDown(index: number): void {
    const heap = this.deadlines;
    for (;;) {
      const left = index * 2 + 1;
      const right = left + 1;
      let smallest = index;
      if (left < heap.length && heap[left]!.deadline < heap[smallest]!.deadline) smallest = left;
      if (right < heap.length && heap[right]!.deadline < heap[smallest]!.deadline) smallest = right;
      if (smallest === index) return;
      this.swap(index, smallest);
      index = smallest;
    }
  }

  private swap(a: number, b: number): void {
    const heap = this.deadlines;
    const wa = heap[a]!;
    const wb = heap[b]!;
    heap[a] = wb;
    heap[b] = wa;
    wa.heapIndex = b;
    wb.heapIndex = a;
  }

  private headEtaMs(): number {
    const head = this.firstLive();
    return etaOf(1, this.host.holdMs(), head ? this.host.clock.monotonicNow() - head.queuedAt : 0);
  }

  // --- what waiters hear -------------------------------------------------------------------------

  private scheduleFlush(): void {
    if (this.flushScheduled || this.closed) return;
    this.flushScheduled = true;
    this.defer(() => {
      this.flushScheduled = false;
      this.flush();
    });
  }

  /** Drops removed waiters from the line, keeping the heartbeat cursor on the same waiter. */
  private compact(): void {
    if (this.headIndex === 0 && this.line.length === this.live) return;
    const kept: Waiter[] = [];
    let cursor = 0;
    for (let i = 0; i < this.line.length; i++) {
      const w = this.line[i]!;
      if (w.removed) continue;
      if (i < this.heartbeatCursor) cursor++;
      kept.push(w);
    }
    this.line = kept;
    this.headIndex = 0;
    this.heartbeatCursor = cursor;
  }

  /** Compacts the line and tells each waiter whose position or reason changed. One walk, one head verdict. */
  private flush(): void {
    if (this.closed) return;
    this.compact();
    if (this.line.length === 0) {
      this.headKey = "";
      return;
    }
    const context = this.host.context();
    const head = this.head && !this.head.waiter.removed ? this.head : undefined;
    this.headKey = head ? gatesKeyOf(head.gates) : "";
    const { reasons: headReasons, text: headText } = this.headReasonsFor(context);
    const ahead = this.line.slice(0, AHEAD_LIMIT).map((w) => ({ owner: w.owner, needs: w.want }));
    const now = this.host.clock.monotonicNow();
    const holdMs = this.host.holdMs();
    for (let i = 0; i < this.line.length; i++) {
      const w = this.line[i]!;
      const position = i + 1;
      if (position === w.lastPosition && this.headKey === w.lastKey) continue;
      this.tell(w, position, headReasons, headText, ahead, now, holdMs);
    }
  }

  /** Tells one waiter where it stands (at once when it joins). */
  private notify(waiter: Waiter, position: number, context: VerdictContext): void {
    const { reasons: headReasons, text: headText } = this.headReasonsFor(context);
    const ahead = this.line.slice(this.headIndex, this.headIndex + AHEAD_LIMIT + 1).filter((w) => !w.removed);
    this.tell(
      waiter,
      position,
      headReasons,
      headText,
      ahead.slice(0, AHEAD_LIMIT).map((w) => ({ owner: w.owner, needs: w.want })),
      this.host.clock.monotonicNow(),
      this.host.holdMs(),
    );
  }

  private tell(w: Waiter, position: number, headReasons: Reason[], headText: string | undefined, ahead: AheadEntry[], now: number, holdMs: number): void {
    w.lastPosition = position;
    w.lastKey = this.headKey;
    w.lastNotifiedAt = now;
    if (!w.onQueued) return;
    const aheadCount = position - 1;
    const waitFor = aheadCount === 0 ? headReasons : [queueReason(aheadCount), ...headReasons];
    const waitForText =
      aheadCount === 0 ? (headText ?? "its turn") : `${aheadCount} request(s) ahead in the queue${headText ? `; ${headText}` : ""}`;
    try {
      w.onQueued({
        position,
        etaMs: etaOf(position, holdMs, now - w.queuedAt),
        waitFor,
        waitForText,
        ahead: aheadCount >= ahead.length ? ahead : ahead.slice(0, aheadCount),
        aheadCount,
      });
    } catch (error) {
      this.host.logger.warn({ err: error, owner: w.owner }, "budget: a queued request's listener failed");
    }
  }

  /** The first waiter joined: the heartbeat starts its sweep from the head. */
  private startHeartbeat(): void {
    if (this.heartbeatTimer !== undefined || this.closed || this.live === 0) return;
    const now = this.host.clock.monotonicNow();
    this.heartbeatCursor = 0;
    this.heartbeatCredit = 0;
    this.lastHeartbeatTickAt = now;
    this.lastHeartbeatRecheckAt = now;
    this.armHeartbeat();
  }

  /** Arms the one shared heartbeat timer: one waiter's share of the period, but no sooner than a tick. */
  private armHeartbeat(): void {
    if (this.heartbeatTimer !== undefined || this.closed || this.live === 0) return;
    const heartbeatMs = this.host.policy().heartbeatMs;
    const delay = Math.max(HEARTBEAT_TICK_MS, heartbeatPeriodMs(this.live, heartbeatMs) / this.live);
    this.heartbeatTimer = this.host.clock.setTimeout(() => this.heartbeatTick(), delay);
  }

  /**
   * One heartbeat tick: visits the next few waiters on the rolling cursor (waiters / period per ms
   * since the last tick, so the cursor sweeps the line once per period and the queue never sends
   * more than the cap), telling each one not told within the last half period.
   */
  private heartbeatTick(): void {
    this.heartbeatTimer = undefined;
    if (this.live === 0 || this.closed) return;
    const now = this.host.clock.monotonicNow();
    const heartbeatMs = this.host.policy().heartbeatMs;
    if (now - this.lastHeartbeatRecheckAt >= heartbeatMs) {
      // The head's verdict is refreshed (it reads the cached sample, not /proc) and shared by every waiter.
      this.lastHeartbeatRecheckAt = now;
      this.recheck();
      if (this.live === 0 || this.closed) return;
    }
    this.compact();
    const waiters = this.line.length;
    const period = heartbeatPeriodMs(waiters, heartbeatMs);
    this.heartbeatCredit = Math.min(HEARTBEAT_BURST, this.heartbeatCredit + ((now - this.lastHeartbeatTickAt) * waiters) / period);
    this.lastHeartbeatTickAt = now;
    const visits = Math.min(waiters, Math.floor(this.heartbeatCredit));
    this.heartbeatCredit -= visits;
    if (visits > 0) {
      const { reasons: headReasons, text: headText } = this.headReasonsFor(this.host.context());
      const ahead = this.line.slice(0, AHEAD_LIMIT).map((w) => ({ owner: w.owner, needs: w.want }));
      const holdMs = this.host.holdMs();
      const quiet = period / 2;
      for (let v = 0; v < visits; v++) {
        if (this.heartbeatCursor >= waiters) this.heartbeatCursor = 0;
        const w = this.line[this.heartbeatCursor]!;
        if (now - w.lastNotifiedAt >= quiet) this.tell(w, this.heartbeatCursor + 1, headReasons, headText, ahead, now, holdMs);
        this.heartbeatCursor++;
      }
    }
    this.armHeartbeat();
  }

  private stopHeartbeat(): void {
    if (this.heartbeatTimer !== undefined) this.host.clock.clearTimeout(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
  }
}

/** The seed's ETA: position x the moving hold time, less the time already waited; at least 1 s. */
export function etaOf(position: number, holdMs: number, waitedMs: number): number {
  return Math.max(1000, position * holdMs - waitedMs);
}

function queueReason(ahead: number): Reason {
  return { gate: "queue", message: `${ahead} request(s) ahead in the queue`, needed: undefined, available: undefined, limit: undefined, setting: undefined };
}

function gatesKeyOf(gates: number): string {
  return String(gates);
}

/** The refusal of a request whose wait ran out (or, with a wait of zero, that could not be admitted at once). */
function waitExhaustedError(owner: string, waitedMs: number, position: number, reasons: Reason[], retryAfterMs: number, text = reasonsText(reasons) ?? "its turn"): BerthError {
  const waited = waitedMs === 0 ? `'${owner}' does not fit now and asked not to wait` : `waited ${formatDuration(waitedMs)} for the load budget and '${owner}' still does not fit`;
  return new BerthError(
    "resource_exhausted",
    `${waited} — ${text}. Stop what you do not need ('berth budget state' shows what holds the budget), or raise the budget (BERTH_BUDGET_MEMORY, BERTH_BUDGET_CPU)`,
    { kind: "wait_exhausted", position, reasons, retryAfterMs, waitedMs },
    { reason: "WAIT_EXHAUSTED", retryAfterMs },
  );
}

function cancelledError(owner: string): BerthError {
  return new BerthError("cancelled", `'${owner}' was dropped from the load budget's queue: its caller disconnected`, { kind: "cancelled" });
}

function closedError(owner: string): BerthError {
  return new BerthError("unavailable", `the budget service is shutting down; '${owner}' was not admitted — retry once it is back`, { kind: "closed" });
}
