/**
 * What the admission queue's waiters hear (`onQueued`): at once when queued, whenever their
 * position or the first waiter's refusing gates change, and as a heartbeat when nothing changes.
 * Waiter k's reason is "k-1 request(s) ahead in the queue; <the first waiter's reasons>": the
 * first waiter's reasons are computed once per event, not once per waiter. Position updates are
 * batched: any number of admissions, cancellations and expiries in one turn of the event loop cost
 * one walk of the queue.
 *
 * Heartbeats are capped server-wide at {@link HEARTBEAT_RATE_CAP} messages a second, whatever the
 * queue length: each waiter's heartbeat period is max(heartbeatMs, waiters / cap), so up to 500
 * waiters each hear every 5 s (the default) and 10,000 each hear every 100 s (their ETA is hours by
 * then; HTTP/2 keepalive pings hold the connection meanwhile). One shared timer drives a rolling
 * cursor over the line, a few waiters per tick, so the heartbeats are spread over the period rather
 * than sent in a burst. Only heartbeats are capped: a changed position or reason still goes at once.
 */
import type { Clock, TimerHandle } from "@berth/shared/clock";
import type { Logger } from "@berth/shared/logger";
import type { AheadEntry, FirstWaiterState, QueueLine, Waiter } from "./queue-line.js";
import { gatesKeyOf } from "./queue-line.js";
import { etaMsAt, type EtaEstimate } from "./eta.js";
import { queueReason } from "./queue-refusals.js";
import type { Reason, VerdictContext } from "./verdict.js";

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

/** How many requests ahead a waiter is told about by name (from the first waiter on). */
export const AHEAD_LIMIT = 10;

/** What the notifier reads from the queue it speaks for. */
export interface NotifierHost {
  clock: Clock;
  logger: Logger;
  line: QueueLine;
  /** The policy's heartbeat interval, read at each tick (a reload changes it). */
  heartbeatMs(): number;
  /** Every waiter's ETA, in queue order (computed once, shared by every waiter told). */
  etas(): EtaEstimate[];
  context(): VerdictContext;
  /** The first waiter while it is still queued. */
  firstWaiter(): FirstWaiterState | undefined;
  /** The first waiter's reasons and their text for `context` (the queue memoizes them). */
  firstWaiterReasons(context: VerdictContext): { reasons: Reason[]; text: string | undefined };
  /** Re-checks the queue: a heartbeat refreshes the first waiter's verdict. */
  recheck(): void;
  /** Runs `fn` soon, after the current event. */
  defer(fn: () => void): void;
}

/** Tells waiters where they stand: on joining, on a change (batched), and by heartbeat. */
export class QueueNotifier {
  /** The first waiter's refusing gates when waiters last heard: a change means everyone hears again. */
  firstWaiterKey = "";
  private heartbeatTimer: TimerHandle | undefined;
  /** The next waiter (index into the line) the heartbeat visits: it sweeps the line once per period. */
  private heartbeatCursor = 0;
  /** Visits earned since the last tick, at waiters / period per ms; a fraction carries over. */
  private heartbeatCredit = 0;
  private lastHeartbeatTickAt = 0;
  /** When the heartbeat last refreshed the first waiter's verdict (once per heartbeatMs, as before the cap). */
  private lastHeartbeatRecheckAt = 0;
  private flushScheduled = false;
  private closed = false;

  constructor(private readonly host: NotifierHost) {}

  /** A waiter joined an empty queue, so it is the first waiter, refused by `gates`: the heartbeat starts its sweep from it. */
  firstJoined(gates: number): void {
    this.firstWaiterKey = gatesKeyOf(gates);
    this.startHeartbeat();
  }

  /** After a re-check: everyone hears again when someone was admitted or the first waiter's refusal changed. */
  rechecked(admitted: boolean, firstWaiter: FirstWaiterState | undefined): void {
    const key = firstWaiter ? gatesKeyOf(firstWaiter.gates) : "";
    if (admitted || key !== this.firstWaiterKey) this.scheduleFlush();
  }

  /** The policy changed: the heartbeat re-arms at its new interval. */
  policyChanged(): void {
    if (this.heartbeatTimer !== undefined) {
      this.host.clock.clearTimeout(this.heartbeatTimer);
      this.heartbeatTimer = undefined;
      this.armHeartbeat();
    }
  }

  /** Positions may have changed: everyone whose position or reason did hears, once, after this event. */
  scheduleFlush(): void {
    if (this.flushScheduled || this.closed) return;
    this.flushScheduled = true;
    this.host.defer(() => {
      this.flushScheduled = false;
      this.flush();
    });
  }

  /** Tells one waiter where it stands (at once when it joins). */
  notify(waiter: Waiter, position: number, context: VerdictContext): void {
    const line = this.host.line;
    const { reasons: firstWaiterReasons, text: firstWaiterText } = this.host.firstWaiterReasons(context);
    const ahead = line.waiters.slice(line.firstIndex, line.firstIndex + AHEAD_LIMIT + 1).filter((w) => !w.removed);
    this.tell(
      waiter,
      position,
      firstWaiterReasons,
      firstWaiterText,
      ahead.slice(0, AHEAD_LIMIT).map((w) => ({ owner: w.owner, needs: w.want })),
      this.host.clock.monotonicNow(),
      this.host.etas(),
    );
  }

  stopHeartbeat(): void {
    if (this.heartbeatTimer !== undefined) this.host.clock.clearTimeout(this.heartbeatTimer);
    this.heartbeatTimer = undefined;
  }

  /** Nothing is told after this. */
  close(): void {
    this.closed = true;
    this.stopHeartbeat();
  }

  private compact(): void {
    this.heartbeatCursor = this.host.line.compact(this.heartbeatCursor);
  }

  /** Compacts the line and tells each waiter whose position or reason changed. One walk, one verdict on the first waiter. */
  private flush(): void {
    if (this.closed) return;
    this.compact();
    const waiters = this.host.line.waiters;
    if (waiters.length === 0) {
      this.firstWaiterKey = "";
      return;
    }
    const context = this.host.context();
    const firstWaiter = this.host.firstWaiter();
    this.firstWaiterKey = firstWaiter ? gatesKeyOf(firstWaiter.gates) : "";
    const { reasons: firstWaiterReasons, text: firstWaiterText } = this.host.firstWaiterReasons(context);
    const ahead = waiters.slice(0, AHEAD_LIMIT).map((w) => ({ owner: w.owner, needs: w.want }));
    const now = this.host.clock.monotonicNow();
    let etas: EtaEstimate[] | undefined;
    for (let i = 0; i < waiters.length; i++) {
      const w = waiters[i]!;
      const position = i + 1;
      if (position === w.lastPosition && this.firstWaiterKey === w.lastKey) continue;
      etas ??= this.host.etas();
      this.tell(w, position, firstWaiterReasons, firstWaiterText, ahead, now, etas);
    }
  }

  private tell(
    w: Waiter,
    position: number,
    firstWaiterReasons: Reason[],
    firstWaiterText: string | undefined,
    ahead: AheadEntry[],
    now: number,
    etas: EtaEstimate[],
  ): void {
    w.lastPosition = position;
    w.lastKey = this.firstWaiterKey;
    w.lastNotifiedAt = now;
    if (!w.onQueued) return;
    const aheadCount = position - 1;
    const waitFor = aheadCount === 0 ? firstWaiterReasons : [queueReason(aheadCount), ...firstWaiterReasons];
    const waitForText =
      aheadCount === 0 ? (firstWaiterText ?? "its turn") : `${aheadCount} request(s) ahead in the queue${firstWaiterText ? `; ${firstWaiterText}` : ""}`;
    try {
      w.onQueued({
        position,
        etaMs: etas[position - 1] === undefined ? undefined : etaMsAt(etas[position - 1]!, now),
        etaBasis: etas[position - 1]?.basis ?? "",
        waitFor,
        waitForText,
        ahead: aheadCount >= ahead.length ? ahead : ahead.slice(0, aheadCount),
        aheadCount,
      });
    } catch (error) {
      this.host.logger.warn({ err: error, owner: w.owner }, "budget: a queued request's listener failed");
    }
  }

  private startHeartbeat(): void {
    if (this.heartbeatTimer !== undefined || this.closed || this.host.line.live === 0) return;
    const now = this.host.clock.monotonicNow();
    this.heartbeatCursor = 0;
    this.heartbeatCredit = 0;
    this.lastHeartbeatTickAt = now;
    this.lastHeartbeatRecheckAt = now;
    this.armHeartbeat();
  }

  /** Arms the one shared heartbeat timer: one waiter's share of the period, but no sooner than a tick. */
  private armHeartbeat(): void {
    const live = this.host.line.live;
    if (this.heartbeatTimer !== undefined || this.closed || live === 0) return;
    const delay = Math.max(HEARTBEAT_TICK_MS, heartbeatPeriodMs(live, this.host.heartbeatMs()) / live);
    this.heartbeatTimer = this.host.clock.setTimeout(() => this.heartbeatTick(), delay);
  }

  /**
   * One heartbeat tick: visits the next few waiters on the rolling cursor (waiters / period per ms
   * since the last tick, so the cursor sweeps the line once per period and the queue never sends
   * more than the cap), telling each one not told within the last half period.
   */
  private heartbeatTick(): void {
    this.heartbeatTimer = undefined;
    const line = this.host.line;
    if (line.live === 0 || this.closed) return;
    const now = this.host.clock.monotonicNow();
    const heartbeatMs = this.host.heartbeatMs();
    if (now - this.lastHeartbeatRecheckAt >= heartbeatMs) {
      // The first waiter's verdict is refreshed (it reads the cached sample, not /proc) and shared by every waiter.
      this.lastHeartbeatRecheckAt = now;
      this.host.recheck();
      if (line.live === 0 || this.closed) return;
    }
    this.compact();
    const waiters = line.waiters.length;
    const period = heartbeatPeriodMs(waiters, heartbeatMs);
    this.heartbeatCredit = Math.min(HEARTBEAT_BURST, this.heartbeatCredit + ((now - this.lastHeartbeatTickAt) * waiters) / period);
    this.lastHeartbeatTickAt = now;
    const visits = Math.min(waiters, Math.floor(this.heartbeatCredit));
    this.heartbeatCredit -= visits;
    if (visits > 0) {
      const { reasons: firstWaiterReasons, text: firstWaiterText } = this.host.firstWaiterReasons(this.host.context());
      const ahead = line.waiters.slice(0, AHEAD_LIMIT).map((w) => ({ owner: w.owner, needs: w.want }));
      const etas = this.host.etas();
      const quiet = period / 2;
      for (let v = 0; v < visits; v++) {
        if (this.heartbeatCursor >= waiters) this.heartbeatCursor = 0;
        const w = line.waiters[this.heartbeatCursor]!;
        if (now - w.lastNotifiedAt >= quiet) this.tell(w, this.heartbeatCursor + 1, firstWaiterReasons, firstWaiterText, ahead, now, etas);
        this.heartbeatCursor++;
      }
    }
    this.armHeartbeat();
  }
}
