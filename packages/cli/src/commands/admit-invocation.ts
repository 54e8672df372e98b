import type { Endpoint } from "../run/endpoint-flags.js";
import type { DeclaredNeed } from "../run/need-flags.js";

/** An admission's command line, parsed and checked. */
export interface AdmitInvocation {
  readonly values: Record<string, unknown>;
  readonly command: string[];
  readonly need: DeclaredNeed;
  /** Unset: the service's longest wait. */
  readonly maxWaitMs: number | undefined;
  readonly endpoint: Endpoint;
}
