/**
 * The outside-lock seam: a second lock every grant of the lock table must also take, so that
 * processes which do not ask berth (the seed's library, today through its lock files) and berth's
 * clients exclude each other. The table depends on this interface only; the seed's lock files
 * (seed-lock-files.ts) implement it, and a backend that keeps locks elsewhere implements it there.
 * Without one, berth's table is the only lock.
 */

/** A claim on an outside lock that the table must give back on release. */
export interface ExternalLockHandle {
  readonly key: string;
  /** Where the outside lock lives (a lock file's path): shown by Inspect and in errors. */
  readonly lockFile: string;
  readonly token: string;
  /** The pid recorded with the claim. */
  readonly pid: number;
}

/** The outcome of trying to take an outside lock: taken, or held by someone (named when known). */
export type ExternalClaim = { ok: true; handle: ExternalLockHandle } | { ok: false; holder?: ForeignLockHolder };

/**
 * A second lock every grant must also take. Calls are synchronous: the table decides a handoff in
 * one turn. A call that cannot reach the lock (a read-only or full file system) throws; the table
 * refuses the request with the state error it maps to.
 */
export interface ExternalLocks {
  /** Tries once, synchronously, to take the outside lock of `key`. */
  claim(key: string, holder: { owner: string; at: number }): ExternalClaim;
  /** Gives a claim back (only while it is still the claimant's). */
  release(handle: ExternalLockHandle): void;
  /** The live outside holder of `key`, if any. */
  peek(key: string): ForeignLockHolder | undefined;
  /** Where the outside lock of `key` lives (shown by Inspect and in errors). */
  pathFor(key: string): string;
  /** Calls `onMaybeFree` whenever the outside lock of `key` may have been freed; returns the unsubscribe. */
  watch(key: string, onMaybeFree: () => void): () => void;
}

/** Who holds an outside lock berth does not own. */
export interface ForeignLockHolder {
  /** The outside lock (a lock file's path). */
  lockFile: string;
  /** The recorded owner, when the file is readable. */
  owner?: string;
  /** The recorded pid, when the file is readable. */
  pid?: number;
  /** When the holder took it (the record's `at`, else the file's mtime). */
  since: number;
  /**
   * False while the file cannot be parsed (a seed writer between create and write, or a wreck), or
   * cannot be read at all (another user's file this service's uid may not open).
   */
  readable: boolean;
  /** The record's token, when readable. */
  token?: string;
}
