/**
 * Refused admissions as the proto defines them: a ConnectError whose code is the refusal kind's
 * (IMPOSSIBLE: FAILED_PRECONDITION; QUEUE_FULL and WAIT_EXHAUSTED: RESOURCE_EXHAUSTED) carrying a
 * `Refusal` detail, plus the same facts as JSON in the `berth-error-details` metadata for clients
 * that do not decode error details (curl).
 *
 * The domain refuses with BerthErrors whose `details.kind` names the refusal; its wait-exhausted
 * error is `deadline_exceeded`, which the API deliberately does not use (clients read that code as
 * their own deadline): the kind decides the code here.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Refusal } from "@berth/api/berth/budget/v1/budget_pb";
import { RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { isBerthError } from "@berth/shared/errors";
import { ERROR_DETAILS_HEADER } from "@berth/shared/server/index";
import type { Reason } from "../index.js";
import type { ReasonContext } from "./budget-codec.js";
import { durationOf, waitReasonToProto } from "./budget-codec.js";

/** The domain's refusal kinds and what each becomes. */
const KINDS = {
  impossible: { kind: RefusalKind.IMPOSSIBLE, code: Code.FailedPrecondition, name: "impossible" },
  queue_full: { kind: RefusalKind.QUEUE_FULL, code: Code.ResourceExhausted, name: "queue_full" },
  wait_exhausted: { kind: RefusalKind.WAIT_EXHAUSTED, code: Code.ResourceExhausted, name: "wait_exhausted" },
} as const;

/** What a refusal is judged against besides the error itself. */
export interface RefusalContext {
  /** How long the request waited in the queue (0 when it never queued). */
  waitedMs: number;
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
  const retryAfterMs = typeof details["retryAfterMs"] === "number" ? details["retryAfterMs"] : undefined;

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
    // What it waited for, a longer wait, or a bigger budget.
    case "wait_exhausted":
      settings = unique([...domainReasons.map((r) => r.setting), "BERTH_BUDGET_WAIT", "BERTH_BUDGET_MEMORY", "BERTH_BUDGET_CPU"]);
      break;
  }

  const refusal: Refusal = create(RefusalSchema, {
    kind: spec.kind,
    message: error.message,
    reasons,
    retryAfter: retryAfterMs === undefined || spec.name === "impossible" ? undefined : durationOf(retryAfterMs),
    settings,
    waited: durationOf(context.waitedMs),
  });
  const header = JSON.stringify({ kind: spec.name, settings, retryAfterMs: spec.name === "impossible" ? undefined : retryAfterMs, waitedMs: context.waitedMs });
  return new ConnectError(
    error.message,
    spec.code,
    { [ERROR_DETAILS_HEADER]: header.replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`) },
    [{ desc: RefusalSchema, value: refusal }],
    error,
  );
}
