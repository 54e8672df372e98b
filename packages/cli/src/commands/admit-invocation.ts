import type { Endpoint } from "../client/endpoint-flags.js";
import type { DeclaredNeed } from "../client/need-flags.js";

/** An admission's command line, parsed and checked. */
export interface AdmitInvocation {
  readonly values: Record<string, unknown>;
  readonly command: string[];
  readonly need: DeclaredNeed;
  /** Unset: the service's longest wait. */
  readonly maxWaitMs: number | undefined;
  readonly endpoint: Endpoint;
}
