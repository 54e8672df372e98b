/**
 * The rules of a lease that both lock stores keep (the file store's lock table and the etcd
 * store), written once so that the stores cannot drift apart: the limits, what a lease token is,
 * what a renewal does, how a call on a lease that no longer holds is refused, and what Inspect and
 * CheckToken answer. How long a lease lasts, and what ends it, is each store's to time.
 */
import { BerthError, invalidArgument } from "@berth/shared/errors";
import { checkTtl, DEFAULT_LOCK_LIMITS, type LockLimits } from "./lock-input.js";
import type { LeaseEndReason, LockHolderInfo, TokenCheck } from "./source-locks-api.js";

/** The limits a store enforces: the defaults, overridden by what it was configured with. */
export function lockLimits(configured: Partial<LockLimits> | undefined): Readonly<LockLimits> {
  return Object.freeze({ ...DEFAULT_LOCK_LIMITS, ...configured });
}

/** A lease token as Renew and Release take it: non-empty and short (they are UUIDs). */
export function checkLeaseToken(leaseToken: unknown): string {
  if (typeof leaseToken !== "string" || leaseToken.length === 0 || leaseToken.length > 128) {
    throw invalidArgument("lease_token", "is required: the lease token Acquire returned");
  }
  return leaseToken;
}

/** The signal a hold lasts as long as. */
export function checkHoldSignal(signal: unknown): AbortSignal {
  if (!(signal instanceof AbortSignal)) throw invalidArgument("signal", "a hold needs an AbortSignal that ends it");
  return signal;
}

/**
 * The lease length a renewal sets: a hold has none and keeps none; a lease takes the ttl asked
 * (checked against the limits), or keeps its own when none is asked. The lease then runs that long
 * from the renewal.
 */
export function renewedTtl(current: number | null, asked: number | undefined, limits: LockLimits): number | null {
  if (current === null) return null;
  return asked === undefined ? current : checkTtl(asked, limits);
}

/**
 * How a lease ended, as a store knows it: the API's reasons, and on etcd "lost" (its etcd lease ran
 * out or was revoked elsewhere), which whoever holds the lock through it is told as an expiry.
 */
export type LeaseEnd = LeaseEndReason | "lost";

export function asLeaseEndReason(end: LeaseEnd): LeaseEndReason {
  return end === "lost" ? "expired" : end;
}

const ENDED_AS: Record<LeaseEnd, string> = {
  expired: "expired",
  released: "was released",
  lost: "was lost in etcd",
  closed: "ended when the service shut down",
};

/** How many ended leases are remembered, to tell "ended" from "never existed" on a late renewal. */
const ENDED_MEMORY = 1024;

interface EndedLease {
  readonly file: string;
  readonly reason: LeaseEnd;
  /** Wall-clock ms. */
  readonly at: number;
}

/** The leases that ended here lately, so that a late call on one is refused saying how it ended. */
export class EndedLeases {
  private readonly ended = new Map<string, EndedLease>();

  /**
   * @param unknownHint Why a token may be unknown to this store (the refusal's not_found message):
   *   the file store forgets its leases on a restart, the etcd store knows those of its own instance.
   */
  constructor(private readonly unknownHint: string) {}

  remember(leaseToken: string, ended: EndedLease): void {
    this.ended.set(leaseToken, ended);
    if (this.ended.size > ENDED_MEMORY) this.ended.delete(this.ended.keys().next().value!);
  }

  get(leaseToken: string): EndedLease | undefined {
    return this.ended.get(leaseToken);
  }

  /** How the lease ended, for a lease-end listener that comes late ("expired" once no longer remembered). */
  reasonOf(leaseToken: string): LeaseEndReason {
    return asLeaseEndReason(this.ended.get(leaseToken)?.reason ?? "expired");
  }

  /**
   * The refusal of a renewal of `leaseToken`, which holds no lock here now: failed_precondition
   * saying how and when it ended, or not_found when it is not (or no longer) known.
   */
  notHeld(leaseToken: string): BerthError {
    const shown = `${leaseToken.slice(0, 8)}…`;
    const ended = this.ended.get(leaseToken);
    if (ended === undefined) return new BerthError("not_found", `no lease ${shown} is held here: ${this.unknownHint}`, {});
    return new BerthError(
      "failed_precondition",
      `lease ${shown} on ${ended.file} ${ENDED_AS[ended.reason]} at ${new Date(ended.at).toISOString()}; acquire the lock again (and renew sooner than the lease length)`,
      { file: ended.file, ended: ended.reason, endedAt: ended.at },
    );
  }
}

/**
 * Inspect's last fencing token of a file: the last one granted on it, whether or not it is held
 * now (never below the holder's, which a store may learn of before its record of grants does);
 * null when the store knows of none.
 */
export function lastFencingToken(lastGranted: number | null, holder: LockHolderInfo | null): number | null {
  const held = holder === null || holder.kind === "seed-file" ? null : holder.fencingToken;
  if (lastGranted === null) return held;
  return held === null ? lastGranted : Math.max(lastGranted, held);
}

/** CheckToken's answer: whether `token` is the fencing token of the lease holding `file` now. */
export function tokenCheck(file: string, token: number, currentToken: number | null): TokenCheck {
  return { file, current: currentToken === token, currentToken };
}
