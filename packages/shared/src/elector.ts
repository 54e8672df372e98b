/**
 * The election seam: at most one berth process serves a scope (a state directory, a project's live
 * directory) at a time. A service takes the election of its scope before it reads any state, keeps
 * it for its life and releases it last. The file backend is election.ts (flock(2) on a lock file,
 * released by the kernel when the holder dies); a backend that keeps state elsewhere implements
 * {@link Elector} there (a key bound to a lease, say), and a test double is
 * testing/memory-elector.ts. The claim is informational: it names the holder in a refusal and in
 * `berth status`, and never decides who holds the election.
 */
import { BerthError } from "./errors.js";
import { identityIsLive, type ProcessIdentity } from "./process-identity.js";

/** What the holder of an election records beside it (the file backend: inside the lock file). */
export interface ElectionClaim extends ProcessIdentity {
  /** When the holder took the lock (ISO 8601). */
  at: string;
  /** Which service holds it ("sessions", "budget", …). */
  service: string;
}

/** A held election. Keep it for the life of the process (the file backend's is released by the kernel at exit). */
export interface ElectionLock {
  /** The claim this process wrote. */
  readonly claim: ElectionClaim;
  /** Where the election is held (the file backend: its lock file), for messages and status. */
  readonly path: string;
  /** Releases the lock if this object still holds it; safe to call more than once. */
  release(): void;
}

/** Another live process holds the election lock; `holder` is its claim when it could be read. */
export class ElectionHeldError extends BerthError {
  override name = "ElectionHeldError";
  constructor(
    readonly stateDir: string,
    readonly lockPath: string,
    readonly holder: ElectionClaim | undefined,
  ) {
    super("unavailable", heldMessage(stateDir, holder), { stateDir, lockPath, holder });
  }
}

function heldMessage(stateDir: string, holder: ElectionClaim | undefined): string {
  const advice = "stop it first or choose another --state-dir";
  // The lock is held but the file does not name a live holder: the winner has the lock and has not
  // written its claim yet (the file is empty, half-written, or still names the previous, dead holder).
  if (!holder || !claimIsLive(holder)) return `${stateDir} is already served by a process that is still starting; ${advice}`;
  return `${stateDir} is already served by pid ${holder.pid} (${holder.service}, started ${holder.at}, host ${holder.hostname}); ${advice}`;
}

/** Takes elections. */
export interface Elector {
  /**
   * Takes the election `name` (`[A-Za-z0-9_-]{1,64}`) of `scope` without waiting, or rejects with
   * {@link ElectionHeldError} naming the holder. The claim records `options.service` (default:
   * `name`).
   */
  acquire(scope: string, name: string, options?: { service?: string }): Promise<ElectionLock>;
}

/**
 * True when the claim names a process running now: same pid and start time, same boot, same host.
 * For reports only — a claim can outlive its holder, and the lock itself is the authority.
 */
export function claimIsLive(claim: ElectionClaim): boolean {
  return identityIsLive(claim);
}
