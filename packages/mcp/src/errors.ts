/**
 * A failed call as a tool error an agent can act on: the code, the reason berth's ErrorInfo names
 * (`FENCE_REJECTED`, `WAIT_EXHAUSTED`, …), what to do about it (the proto's error table, and the
 * tool to call), the facts the service sent (`lockHeld`, `refusal`, …), and how long to wait before
 * a retry when the service says. Never a stack.
 */
import type { CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { toJson, type DescMessage, type Message } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import { BerthClientError, CLIENT_ERROR_DOMAIN, EndpointError, InvalidEventError, type BerthReason, type ClientReason } from "@berth/client";
import { RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { LockHeldSchema } from "@berth/api/berth/locks/v1/lock_service_pb";
import { FenceRejectedSchema, IdempotencyKeyReusedSchema, SeqConflictSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { errorAdvice } from "./proto-docs.js";

/** The ErrorInfo domain of the refusals the MCP server makes itself (a lock this server does not hold, a wait given no condition). */
export const MCP_ERROR_DOMAIN = "berth.mcp";

/** The reasons of the refusals the MCP server makes itself (domain {@link MCP_ERROR_DOMAIN}). */
export const MCP_REASONS = {
  /** lock_release or a fenced append named a file this server holds no lock on. */
  NOT_HELD_HERE: "NOT_HELD_HERE",
  /** session_wait was given nothing to wait for. */
  NO_CONDITION: "NO_CONDITION",
  /** The services' address does not parse. */
  BAD_ENDPOINT: "BAD_ENDPOINT",
} as const;

type McpReason = (typeof MCP_REASONS)[keyof typeof MCP_REASONS];

/** What a tool error's structured content holds. */
export interface ToolFailure {
  /** The gRPC code in snake case (`failed_precondition`). */
  readonly code: string;
  /** berth's reason (`FENCE_REJECTED`); absent when the failure named none (a broken connection). */
  readonly reason?: string;
  readonly message: string;
  /** What to do about it. */
  readonly advice: string;
  /** Wait at least this long before retrying the same call. */
  readonly retryAfterMs?: number;
  /** The typed facts of the refusal, as JSON (`lockHeld`, `seqConflict`, `refusal`, …) and ErrorInfo's metadata. */
  readonly facts?: Record<string, unknown>;
}

/**
 * What an agent does next, by reason, in the tools' terms; the proto's table says it in the RPCs'
 * terms, and both are given.
 */
const TOOL_ADVICE: Readonly<Partial<Record<BerthReason | ClientReason | McpReason | "UNREACHABLE", string>>> = {
  FENCE_REJECTED: "This server no longer holds the lock under that token: call lock_acquire again, re-read what you are about to overwrite, then write.",
  SEQ_CONFLICT:
    "The session moved on: call session_snapshot (or session_journal) to see what changed, redo your change on top, and append again with the new expectedSeq.",
  IDEMPOTENCY_KEY_REUSED: "That idempotency key was used for other events: append these with a new key (or none, and one is made).",
  WAIT_EXHAUSTED: "The wait ran out: tell the user who holds it (facts) and try again later (after retryAfterMs), or with a longer maxWaitMs.",
  QUEUE_FULL: "Too many wait already: try again after retryAfterMs.",
  IMPOSSIBLE: "The need can never fit the budget: ask for less memory or cpu.",
  SESSION_NOT_FOUND: "No event was ever appended to this session: check the id (session_append creates a session).",
  APPEND_OVERTAKEN: "Call again with the same idempotencyKey: it is appended once.",
  SHUTTING_DOWN: "The service is restarting: call again in a moment (with the same idempotencyKey for an append).",
  RESERVATION_NOT_FOUND: "The reservation is gone (released or expired): call budget_reserve again if you still need it.",
  NOT_HELD_HERE: "Call lock_acquire for the file first; this server appends fenced only under a lock it holds.",
  TOKEN_MISSING: "Give berth mcp the token: BERTH_TOKEN or BERTH_TOKEN_FILE in its environment, or --token-file.",
  TOKEN_INVALID: "Give berth mcp the service's token: BERTH_TOKEN or BERTH_TOKEN_FILE in its environment, or --token-file.",
  UNREACHABLE: "Start the services (berth up, or npm start in berth's checkout), or point berth mcp at them (--sessions-url, --budget-url).",
};

/** The typed details worth handing to an agent, by their getter on BerthClientError. */
const FACTS: ReadonlyArray<readonly [keyof BerthClientError, DescMessage]> = [
  ["lockHeld", LockHeldSchema],
  ["refusal", RefusalSchema],
  ["seqConflict", SeqConflictSchema],
  ["fenceRejected", FenceRejectedSchema],
  ["idempotencyKeyReused", IdempotencyKeyReusedSchema],
];

/** The failure `error` describes, for an agent. */
export function describeFailure(error: unknown): ToolFailure {
  if (error instanceof InvalidEventError)
    return { code: "invalid_argument", reason: "INVALID_FIELD", message: error.message, advice: "Fix the field the message names and call again." };
  if (error instanceof EndpointError)
    return { code: "invalid_argument", reason: MCP_REASONS.BAD_ENDPOINT, message: error.message, advice: TOOL_ADVICE.UNREACHABLE! };
  const failure = BerthClientError.from(error);
  const reason = failure.reason === undefined || failure.reason === "" ? undefined : failure.reason;
  const domain = failure.errorInfo?.domain ?? "";
  const unreachable = reason === undefined && failure.code === Code.Unavailable;
  const advice =
    [
      // A reason from a newer service than this server knows has no advice of the tools' own.
      reason === undefined ? undefined : (TOOL_ADVICE as Readonly<Record<string, string | undefined>>)[reason],
      reason === undefined ? undefined : errorAdvice(domain, reason),
      unreachable ? TOOL_ADVICE.UNREACHABLE : undefined,
    ]
      .filter((text): text is string => text !== undefined)
      .join(" The service's own words: ") ||
    (failure.code === Code.InvalidArgument
      ? "Fix the argument the message names and call again."
      : "Look at the message; retry if it says the service was unreachable.");
  const facts: Record<string, unknown> = {};
  for (const [getter, schema] of FACTS) {
    const detail = failure[getter] as Message | undefined;
    if (detail !== undefined) facts[getter] = toJson(schema, detail as never);
  }
  const metadata = failure.errorInfo?.metadata ?? {};
  if (Object.keys(metadata).length > 0 && domain !== CLIENT_ERROR_DOMAIN) facts.metadata = { ...metadata };
  return {
    code: codeName(failure.code),
    ...(reason === undefined ? {} : { reason }),
    message: failure.rawMessage,
    advice,
    ...(failure.retryAfterMs === undefined ? {} : { retryAfterMs: failure.retryAfterMs }),
    ...(Object.keys(facts).length === 0 ? {} : { facts }),
  };
}

/** A refusal the MCP server makes itself, before any call. */
export function mcpRefusal(code: Code, reason: McpReason, message: string): ToolFailure {
  return { code: codeName(code), reason, message, advice: TOOL_ADVICE[reason] ?? "Fix the arguments and call again." };
}

/** `failure` as a tool's error result: one line to read, and the same as structured content. */
export function toolError(failure: ToolFailure): CallToolResult {
  const text = `${failure.code.toUpperCase()}${failure.reason === undefined ? "" : ` ${failure.reason}`}: ${failure.message}\nWhat to do: ${failure.advice}${
    failure.retryAfterMs === undefined ? "" : `\nRetry after: ${failure.retryAfterMs} ms`
  }${failure.facts === undefined ? "" : `\nFacts: ${JSON.stringify(failure.facts)}`}`;
  return { isError: true, content: [{ type: "text", text }], structuredContent: { error: failure } };
}

function codeName(code: Code): string {
  return (Code[code] ?? String(code)).replace(/([a-z])([A-Z])/g, "$1_$2").toLowerCase();
}
