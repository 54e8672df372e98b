/**
 * Refused admissions as the proto defines them: a ConnectError whose code is the refusal kind's
 * (IMPOSSIBLE: FAILED_PRECONDITION; QUEUE_FULL and WAIT_EXHAUSTED: RESOURCE_EXHAUSTED), with the
 * `google.rpc.ErrorInfo` every error carries (reason: the kind), a `RetryInfo` where a retry can
 * succeed (QUEUE_FULL, WAIT_EXHAUSTED), and the `Refusal` detail; the same facts as JSON in the
 * `berth-error-details` metadata for clients that do not decode error details (curl).
 *
 * The domain refuses with BerthErrors whose `details.kind` names the refusal and whose reason and
 * retry delay are already the wire's; this adds what only the RPC layer knows (the settings to
 * change, how long the call waited, the reasons' figures).
 */
import { create } from "@bufbuild/protobuf";
import type { ConnectError } from "@connectrpc/connect";
import type { Refusal } from "@berth/api/berth/budget/v1/budget_pb";
import { RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { BerthError, isBerthError } from "@berth/shared/errors";
import { berthErrorToConnect } from "@berth/shared/server/index";
import type { Reason } from "../index.js";
import { durationOf, waitReasonToProto } from "./budget-encode.js";
import type { ReasonContext } from "./budget-encode.js";

/** The ErrorInfo domain of the budget's errors. */
export const BUDGET_ERROR_DOMAIN = "berth.budget";

/** The domain's refusal kinds and what each becomes. */
const KINDS = {
  impossible: { kind: RefusalKind.IMPOSSIBLE, code: "failed_precondition", name: "impossible", reason: "IMPOSSIBLE" },
  queue_full: { kind: RefusalKind.QUEUE_FULL, code: "resource_exhausted", name: "queue_full", reason: "QUEUE_FULL" },
  wait_exhausted: { kind: RefusalKind.WAIT_EXHAUSTED, code: "resource_exhausted", name: "wait_exhausted", reason: "WAIT_EXHAUSTED" },
} as const;

/** What a refusal is judged against besides the error itself. */
export interface RefusalContext {
  /** The committed items and sample, for the reasons' figures (read only when there are reasons). */
  reasons: () => ReasonContext;
}

function unique(values: Iterable<string | undefined>): string[] {
  return [...new Set([...values].filter((v): v is string => v !== undefined && v !== ""))];
}

/**
 * The error to end an Admit or Reserve with: a refusal (impossible, queue full, wait exhausted)
 * becomes a ConnectError with its Refusal detail; anything else is returned as it is, for the
 * server's error mapping.
 */
export function refusalError(error: unknown, context: RefusalContext): unknown {
  if (!isBerthError(error)) return error;
  const details = error.details ?? {};
  const spec = KINDS[details["kind"] as keyof typeof KINDS];
  if (spec === undefined) return error;

  const domainReasons = Array.isArray(details["reasons"]) ? (details["reasons"] as Reason[]) : [];
  const position = typeof details["position"] === "number" ? details["position"] : 1;
  const reasonContext = domainReasons.length > 0 ? context.reasons() : undefined;
  const reasons = domainReasons.map((reason) => waitReasonToProto(reason, reasonContext!, position - 1));
  const retryAfterMs = error.options.retryAfterMs ?? (typeof details["retryAfterMs"] === "number" ? details["retryAfterMs"] : undefined);
  // Only a wait that ran out waited; the other refusals come before the request queues.
  const waitedMs = typeof details["waitedMs"] === "number" ? details["waitedMs"] : 0;

  let settings: string[];
  switch (spec.name) {
    // Only a smaller need or a bigger budget changes it.
    case "impossible":
      settings = unique(domainReasons.map((r) => r.setting));
      break;
    // A longer queue would have taken it.
    case "queue_full":
      settings = ["BERTH_BUDGET_MAX_QUEUE"];
      break;
    // What its gates would need changed, or a longer wait: only the settings of the gates that held it.
    case "wait_exhausted":
      settings = unique([...domainReasons.map((r) => r.setting), "BERTH_BUDGET_WAIT"]);
      break;
  }

  const retryAfter = spec.name === "impossible" ? undefined : retryAfterMs;
  const refusal: Refusal = create(RefusalSchema, {
    kind: spec.kind,
    message: error.message,
    reasons,
    retryAfter: retryAfter === undefined ? undefined : durationOf(retryAfter),
    settings,
    waited: durationOf(waitedMs),
  });
  const wire = new BerthError(
    spec.code,
    error.message,
    { kind: spec.name, settings, retryAfterMs: retryAfter, waitedMs: waitedMs },
    { reason: spec.reason, retryAfterMs: retryAfter },
  );
  const connectError: ConnectError = berthErrorToConnect(wire, BUDGET_ERROR_DOMAIN);
  connectError.details.push({ desc: RefusalSchema, value: refusal });
  return connectError;
}
