/**
 * The lock table's persistence seam. Leases, waiters and holders live in memory only (a restart
 * ends every lease: its holders' streams end with it); what must outlive a run is the fencing
 * counter, whose tokens rise across restarts and crashes, so that a holder of a lease from an
 * earlier run is still told apart from the current one. The lock table draws tokens through
 * {@link FencingTokenSource}; the file backend is fencing-file.ts, a test double is any counter.
 */

/** Hands out fencing tokens. */
export interface FencingTokenSource {
  /** The next token: greater than every token this source (or an earlier run on its state) issued. */
  next(): number;
}

/** The fencing counter as a backend keeps it: tokens, and what a clean stop records. */
export interface LockPersistence extends FencingTokenSource {
  /** The token the next call to `next()` returns. */
  peek(): number;
  /** Records the exact next token, so the next run continues without a gap. Idempotent. */
  close(): void;
}
