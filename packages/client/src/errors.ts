/**
 * The error every call of this package throws: a `ConnectError` (so code that knows Connect keeps
 * working) whose typed details are decoded once, when the call fails.
 *
 * berth sends with every error a `google.rpc.ErrorInfo` whose `reason` names the case
 * (`SEQ_CONFLICT`, `WAIT_EXHAUSTED`, …), a `google.rpc.RetryInfo` where a retry can succeed, a
 * `google.rpc.BadRequest` naming the field of an INVALID_ARGUMENT, and, where a client needs the
 * facts, a typed detail of the service (`SeqConflict`, `LockHeld`, `Refusal`, …).
 *
 * The typed details are decoded with the schemas of the service that was called, which the service
 * clients pass in: this module imports no service's generated code, so a program that only talks to
 * one service never loads the others'.
 */
import { create, type DescMessage, type DescService } from "@bufbuild/protobuf";
import { durationMs } from "@bufbuild/protobuf/wkt";
import { ConnectError, type Client, type Code } from "@connectrpc/connect";
import type { Refusal } from "@berth/api/berth/budget/v1/budget_pb";
import type { LockHeld, LocksWatcherLagged } from "@berth/api/berth/locks/v1/lock_service_pb";
import type { FenceRejected, IdempotencyKeyReused, SeqConflict, WatcherLagged } from "@berth/api/berth/sessions/v1/session_service_pb";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema, type BadRequest, type ErrorInfo } from "@berth/api/google/rpc/error_details_pb";

/** The response metadata in which berth repeats an error's facts as JSON. */
export const ERROR_DETAILS_METADATA = "berth-error-details";

/** The ErrorInfo domain of the errors this package makes itself, without the service's answer. */
export const CLIENT_ERROR_DOMAIN = "berth.client";

/** The reasons of the errors this package makes itself (domain {@link CLIENT_ERROR_DOMAIN}). */
export const CLIENT_REASONS = {
  /** An argument the client cannot send (the message names it). */
  INVALID_FIELD: "INVALID_FIELD",
  /** A page's fetch failed: refused by the browser (CORS, mixed content) or nothing listening. */
  FETCH_FAILED: "FETCH_FAILED",
  /** A call that streams requests, which fetch cannot make: the metadata names the call to make instead. */
  BIDI_STREAM_UNSUPPORTED: "BIDI_STREAM_UNSUPPORTED",
} as const;

export type ClientReason = (typeof CLIENT_REASONS)[keyof typeof CLIENT_REASONS];

export {
  ANY_CALL_REASONS,
  BUDGET_REASONS,
  LOCKS_REASONS,
  SESSIONS_REASONS,
  type AnyCallReason,
  type BerthReason,
  type BudgetReason,
  type LocksReason,
  type SessionsReason,
} from "@berth/wire/reasons";

/**
 * A failed berth call. `code`, `rawMessage`, `metadata` and `details` are ConnectError's; the rest
 * reads the details berth sends. `instanceof ConnectError` holds, and `ConnectError.from` returns it
 * as is.
 */
export class BerthClientError extends ConnectError {
  /** The typed details found, by their full name (`berth.sessions.v1.SeqConflict`). */
  private readonly typed: ReadonlyMap<string, unknown>;

  // ConnectError recognises an error by its name when the prototype is not its own; a subclass
  // keeps the name so that `instanceof ConnectError` still holds. `instanceof BerthClientError`
  // must then not use ConnectError's loose check, which any ConnectError would pass.
  static override [Symbol.hasInstance](value: unknown): boolean {
    return typeof value === "object" && value !== null && Object.prototype.isPrototypeOf.call(BerthClientError.prototype, value);
  }

  private constructor(from: ConnectError, schemas: readonly DescMessage[]) {
    super(from.rawMessage, from.code, from.metadata, undefined, from.cause ?? from);
    this.details = from.details;
    const typed = new Map<string, unknown>();
    for (const schema of [ErrorInfoSchema, RetryInfoSchema, BadRequestSchema, ...schemas]) {
      const [detail] = from.findDetails(schema);
      if (detail !== undefined) typed.set(schema.typeName, detail);
    }
    this.typed = typed;
    if (from.stack !== undefined) this.stack = from.stack;
  }

  /**
   * `error` as a BerthClientError, its details of the `schemas` given (the called service's detail
   * types) decoded. A BerthClientError is returned as is; anything else goes through
   * `ConnectError.from` first (an abort is CANCELED; given a Code instead of schemas, another error
   * gets that code, as with ConnectError.from).
   */
  static override from(error: unknown, schemas: readonly DescMessage[] | Code = []): BerthClientError {
    if (error instanceof BerthClientError) return error;
    return typeof schemas === "number" ? new BerthClientError(ConnectError.from(error, schemas), []) : new BerthClientError(ConnectError.from(error), schemas);
  }

  /** `google.rpc.ErrorInfo`: the case (`reason`), the domain (`berth.sessions`), facts as strings. */
  get errorInfo(): ErrorInfo | undefined {
    return this.typed.get(ErrorInfoSchema.typeName) as ErrorInfo | undefined;
  }

  /**
   * The case, as the service names it (`SEQ_CONFLICT`, `WAIT_EXHAUSTED`, …: compare with the tables,
   * `SESSIONS_REASONS.SEQ_CONFLICT`); undefined when the service sent none (an error on the way). A
   * string, not the tables' union: a newer service may send a case this client does not know yet.
   */
  get reason(): string | undefined {
    return this.errorInfo?.reason;
  }

  /** How long to wait before retrying the same call, when the service says a retry can succeed (`google.rpc.RetryInfo`). */
  get retryAfterMs(): number | undefined {
    const delay = (this.typed.get(RetryInfoSchema.typeName) as { retryDelay?: Parameters<typeof durationMs>[0] } | undefined)?.retryDelay;
    return delay === undefined ? undefined : durationMs(delay);
  }

  /** `google.rpc.BadRequest` of an INVALID_ARGUMENT: the field that was wrong and why. */
  get badRequest(): BadRequest | undefined {
    return this.typed.get(BadRequestSchema.typeName) as BadRequest | undefined;
  }

  /** ABORTED SEQ_CONFLICT: the session was not as the append or delete expected. */
  get seqConflict(): SeqConflict | undefined {
    return this.typed.get("berth.sessions.v1.SeqConflict") as SeqConflict | undefined;
  }

  /** FAILED_PRECONDITION FENCE_REJECTED: the fence's token is no longer the lock's. */
  get fenceRejected(): FenceRejected | undefined {
    return this.typed.get("berth.sessions.v1.FenceRejected") as FenceRejected | undefined;
  }

  /** ALREADY_EXISTS IDEMPOTENCY_KEY_REUSED: the key named another request. */
  get idempotencyKeyReused(): IdempotencyKeyReused | undefined {
    return this.typed.get("berth.sessions.v1.IdempotencyKeyReused") as IdempotencyKeyReused | undefined;
  }

  /** RESOURCE_EXHAUSTED WATCHER_LAGGED: where to resume a watch that fell behind. */
  get watcherLagged(): WatcherLagged | undefined {
    return this.typed.get("berth.sessions.v1.WatcherLagged") as WatcherLagged | undefined;
  }

  /** RESOURCE_EXHAUSTED WATCHER_LAGGED of WatchLocks: the revision to resume from. */
  get locksWatcherLagged(): LocksWatcherLagged | undefined {
    return this.typed.get("berth.locks.v1.LocksWatcherLagged") as LocksWatcherLagged | undefined;
  }

  /** RESOURCE_EXHAUSTED WAIT_EXHAUSTED of a lock: who held it for the whole wait. */
  get lockHeld(): LockHeld | undefined {
    return this.typed.get("berth.locks.v1.LockHeld") as LockHeld | undefined;
  }

  /** A refused admission: impossible, queue full or wait exhausted, and why. */
  get refusal(): Refusal | undefined {
    return this.typed.get("berth.budget.v1.Refusal") as Refusal | undefined;
  }

  /** The facts of the `berth-error-details` metadata (the same as the typed details, as JSON); empty when none came. */
  get facts(): Record<string, unknown> {
    const text = this.metadata.get(ERROR_DETAILS_METADATA);
    if (text === null || text === "") return {};
    try {
      const parsed = JSON.parse(text) as unknown;
      return parsed !== null && typeof parsed === "object" && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : {};
    } catch {
      return {};
    }
  }
}

/** A detail of an error made here: a message with its schema, as Connect takes it. */
type OutgoingDetail = Extract<ConnectError["details"][number], { desc: unknown }>;

/**
 * An error this package makes itself (a call its platform cannot make, an argument it cannot send,
 * a service it cannot reach), read as the service's refusals are: `code`, `reason` (from an
 * ErrorInfo of the domain `berth.client`, with `metadata` as its facts), any further `details`.
 */
export function clientError(
  message: string,
  code: Code,
  reason: ClientReason,
  options: { readonly metadata?: Record<string, string>; readonly details?: readonly OutgoingDetail[]; readonly cause?: unknown } = {},
): BerthClientError {
  const errorInfo = create(ErrorInfoSchema, { reason, domain: CLIENT_ERROR_DOMAIN, metadata: options.metadata ?? {} });
  return BerthClientError.from(
    new ConnectError(message, code, undefined, [{ desc: ErrorInfoSchema, value: errorInfo }, ...(options.details ?? [])], options.cause),
  );
}

/**
 * `client` with every error of its calls made a BerthClientError with `schemas`' details decoded: a
 * unary call's, and a response stream's while it is read. Wrapping the client rather than the
 * transport keeps it true for any transport (a test's in-memory one included).
 */
export function withBerthErrors<S extends DescService>(service: S, client: Client<S>, schemas: readonly DescMessage[]): Client<S> {
  const wrapped: Record<string, unknown> = {};
  for (const method of service.methods) {
    const call = (client as Record<string, (...args: unknown[]) => unknown>)[method.localName]!;
    if (method.methodKind === "unary" || method.methodKind === "client_streaming") {
      wrapped[method.localName] = async (...args: unknown[]) => {
        try {
          return await call(...args);
        } catch (error) {
          throw BerthClientError.from(error, schemas);
        }
      };
    } else {
      wrapped[method.localName] = (...args: unknown[]) => rethrowing(call(...args) as AsyncIterable<unknown>, schemas);
    }
  }
  return wrapped as Client<S>;
}

async function* rethrowing<T>(messages: AsyncIterable<T>, schemas: readonly DescMessage[]): AsyncGenerator<T> {
  try {
    yield* messages;
  } catch (error) {
    throw BerthClientError.from(error, schemas);
  }
}
