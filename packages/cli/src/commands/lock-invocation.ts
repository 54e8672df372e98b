import type { Endpoint } from "../run/endpoint-flags.js";

/** A `hold` or `inspect` command line, parsed. */
export interface LockInvocation {
  readonly action: "hold" | "inspect";
  readonly file: string;
  /** Unset: the client's default, user@host pid N. */
  readonly owner: string | undefined;
  /** Unset: the service's longest wait. */
  readonly maxWaitMs: number | undefined;
  readonly json: boolean;
  readonly command: string[];
  readonly endpoint: Endpoint;
}

/** A `limits` command line, parsed. */
export interface LimitsInvocation {
  readonly action: "limits";
  readonly json: boolean;
  readonly endpoint: Endpoint;
}

/** A `watch` command line, parsed. */
export interface WatchInvocation {
  readonly action: "watch";
  readonly file: string | undefined;
  readonly includeCurrent: boolean;
  readonly startRevision: bigint;
  readonly progressIntervalMs: number | undefined;
  readonly json: boolean;
  readonly endpoint: Endpoint;
}
