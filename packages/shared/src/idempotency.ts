/**
 * Idempotency keys: what makes a retried call safe. A call that creates or changes something may
 * carry a key (its `request_id`); the service remembers which request each key named and the answer
 * it gave, so that
 * - the same key with the same request is answered the first answer, and nothing is done again;
 * - the same key with another request (another rpc, or another value of a field that shapes what
 *   the call makes) is refused ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED, naming what the key named;
 * - a call that was refused records nothing: its retry runs anew.
 *
 * A key is remembered while what its call made lives (a lease, a reservation, a running entry, a
 * call still waiting) and for the idempotency window after that ended (`--idempotency-window`, an
 * hour by default). Ended keys are capped (the oldest forgotten first), so the memory stays bounded
 * whatever the window; the keys of what still lives are bounded by what lives. Times are measured
 * on the clock's monotonic reading.
 */
import type { Clock } from "./clock.js";
import { parseDuration, formatDuration } from "./units.js";
import { BerthError, invalidArgument } from "./errors.js";

/** How long a key is remembered after what its call made ended, by default: an hour. */
export const DEFAULT_IDEMPOTENCY_WINDOW_MS = 3_600_000;

/** How many ended keys a service remembers at most by default: beyond, the oldest are forgotten first. */
export const DEFAULT_MAX_ENDED_KEYS = 100_000;

/** The longest window the setting accepts: a week. */
const MAX_IDEMPOTENCY_WINDOW_MS = 7 * 86_400_000;

/** The setting every service with keyed calls reads (one definition, so `berth up` has one flag). */
export const IDEMPOTENCY_SETTINGS = {
  idempotencyWindow: {
    flag: "idempotency-window",
    env: "BERTH_IDEMPOTENCY_WINDOW",
    default: DEFAULT_IDEMPOTENCY_WINDOW_MS,
    parse: (raw: string, field: string): number => {
      const ms = parseDuration(raw.trim(), field);
      if (ms > MAX_IDEMPOTENCY_WINDOW_MS) throw invalidArgument(field, `must be at most 7d; got ${JSON.stringify(raw)}`);
      return ms;
    },
    show: formatDuration,
    doc: `how long a request id (idempotency key) is remembered after what its call made ended (a lease, a reservation, a running entry; a release at once): a repeat within it is answered the first answer (0: forgotten as it ends; at most ${DEFAULT_MAX_ENDED_KEYS} ended keys, the oldest forgotten first; a restart forgets them)`,
  },
} as const;

/** A keyed request as the memory compares it. */
export interface KeyedRequest {
  /** The rpc (`Acquire`, `Reserve`, …): the same key for another rpc is another request. */
  readonly rpc: string;
  /**
   * The values of every field that shapes what the call makes, written canonically: equal strings
   * mean the same request. What only bounds the wait (`max_wait`, the deadline) is left out.
   */
  readonly fingerprint: string;
  /** What the key named, for people and the refusal's metadata (the file, the reservation id…). Never a secret. */
  readonly named: Readonly<Record<string, string | number>>;
}

/** What a key names now. */
export type RecalledKey<A> =
  /** Its call still waits (no answer yet): a repeat joins it. */
  | { readonly phase: "pending"; readonly request: KeyedRequest }
  /** Answered; what it made lives (`live`) or has ended (`ended`): a repeat gets `answer`. */
  | { readonly phase: "live" | "ended"; readonly request: KeyedRequest; readonly answer: A };

interface Remembered<A> {
  request: KeyedRequest;
  answered: boolean;
  answer: A | undefined;
  /** Monotonic ms; undefined while what the call made lives. */
  endedAt: number | undefined;
}

/** Options of an {@link IdempotencyMemory}. */
export interface IdempotencyOptions {
  readonly clock: Pick<Clock, "monotonicNow">;
  /** How long an ended key is remembered. Default {@link DEFAULT_IDEMPOTENCY_WINDOW_MS}. */
  readonly windowMs?: number | undefined;
  /** The most ended keys remembered. Default {@link DEFAULT_MAX_ENDED_KEYS}. */
  readonly maxEnded?: number | undefined;
}

/** Counts for metrics and tests. */
export interface IdempotencyStats {
  /** Keys whose call waits or whose work lives. */
  live: number;
  /** Keys remembered after their work ended. */
  ended: number;
}

/** The keys of one service: see the module comment. */
export class IdempotencyMemory<A> {
  readonly windowMs: number;
  private readonly maxEnded: number;
  private readonly clock: Pick<Clock, "monotonicNow">;
  private readonly keys = new Map<string, Remembered<A>>();
  /** The ended keys in the order they ended, which is the order their windows close. */
  private readonly ended = new Map<string, Remembered<A>>();

  constructor(options: IdempotencyOptions) {
    this.clock = options.clock;
    this.windowMs = options.windowMs ?? DEFAULT_IDEMPOTENCY_WINDOW_MS;
    this.maxEnded = options.maxEnded ?? DEFAULT_MAX_ENDED_KEYS;
  }

  /**
   * What `key` names when it names `request`; undefined when the key is unknown (never used, its
   * window closed, or its call was refused). Throws already_exists IDEMPOTENCY_KEY_REUSED when it
   * names another request.
   */
  recall(key: string, request: KeyedRequest): RecalledKey<A> | undefined {
    this.prune();
    const known = this.keys.get(key);
    if (known === undefined) return undefined;
    if (known.request.rpc !== request.rpc || known.request.fingerprint !== request.fingerprint) throw idempotencyKeyReused(key, known.request);
    if (!known.answered) return { phase: "pending", request: known.request };
    return { phase: known.endedAt === undefined ? "live" : "ended", request: known.request, answer: known.answer as A };
  }

  /** A call with `key` is under way (it waits): remembered, unanswered, until {@link answered} or {@link forget}. */
  begin(key: string, request: KeyedRequest): void {
    this.keys.set(key, { request, answered: false, answer: undefined, endedAt: undefined });
  }

  /**
   * The call with `key` answered `answer`: remembered while what it made lives (until {@link end}),
   * or, with `ended`, for the window from now (a release makes nothing that lives). `request` may
   * name more than when the call began (what was made is known now: the fencing token, the
   * reservation id); its rpc and fingerprint are the same.
   */
  answered(key: string, request: KeyedRequest, answer: A, options: { ended?: boolean } = {}): void {
    const remembered: Remembered<A> = { request, answered: true, answer, endedAt: undefined };
    this.ended.delete(key);
    this.keys.set(key, remembered);
    if (options.ended) this.endRemembered(key, remembered);
  }

  /** The call with `key` was refused (or given up) before it answered: nothing is kept. An answered key stays. */
  forget(key: string): void {
    const known = this.keys.get(key);
    if (known !== undefined && !known.answered) this.keys.delete(key);
  }

  /** What the call with `key` made ended now: the key is remembered for the window from now. */
  end(key: string): void {
    const known = this.keys.get(key);
    if (known === undefined || !known.answered || known.endedAt !== undefined) return;
    this.endRemembered(key, known);
  }

  stats(): IdempotencyStats {
    this.prune();
    return { live: this.keys.size - this.ended.size, ended: this.ended.size };
  }

  private endRemembered(key: string, remembered: Remembered<A>): void {
    remembered.endedAt = this.clock.monotonicNow();
    this.ended.delete(key);
    this.ended.set(key, remembered);
    this.prune();
  }

  /** Forgets the ended keys whose window closed, and the oldest beyond the cap. */
  private prune(): void {
    if (this.ended.size === 0) return;
    const closesBefore = this.clock.monotonicNow() - this.windowMs;
    for (const [key, remembered] of this.ended) {
      if (this.ended.size <= this.maxEnded && remembered.endedAt! > closesBefore) break;
      this.ended.delete(key);
      if (this.keys.get(key) === remembered) this.keys.delete(key);
    }
  }
}

/**
 * The refusal of a key that named another request: ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED, the same
 * code and reason in every service. Its details (the ErrorInfo's metadata) name the key and what it
 * named: the rpc and `first.named`.
 */
export function idempotencyKeyReused(key: string, first: KeyedRequest): BerthError {
  const named = Object.entries(first.named)
    .map(([name, value]) => `${name} ${typeof value === "string" ? JSON.stringify(value) : value}`)
    .join(", ");
  return new BerthError(
    "already_exists",
    `request_id ${JSON.stringify(key)} was used for a different request (${first.rpc}${named === "" ? "" : ` of ${named}`}); nothing was done — use a new request id for a new request`,
    { requestId: key, rpc: first.rpc, ...first.named },
    { reason: "IDEMPOTENCY_KEY_REUSED" },
  );
}
