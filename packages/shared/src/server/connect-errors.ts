/**
 * The one place where domain errors become RPC errors. Handlers throw `BerthError` (or let a bug
 * throw anything); the interceptor here turns that into a `ConnectError` with the matching code,
 * the same message, and the error's `details` where every client can read them.
 */
import { Code, ConnectError, type Interceptor, type StreamResponse } from "@connectrpc/connect";
import { fromJson, type JsonObject } from "@bufbuild/protobuf";
import { StructSchema } from "@bufbuild/protobuf/wkt";
import { isBerthError, type BerthCode, type BerthError } from "../errors.js";
import { asInvalidArgumentIfDecodeError } from "./decode-errors.js";
import type { ServerLogger } from "./logger.js";

/**
 * Response metadata (a gRPC trailer, or a Connect header) carrying a BerthError's details as JSON,
 * for clients that do not decode `grpc-status-details-bin`: the same facts as the Struct detail.
 */
export const ERROR_DETAILS_HEADER = "berth-error-details";

/** The generic message a client sees when a handler failed by a bug rather than on purpose. */
export const INTERNAL_ERROR_MESSAGE = "internal error: the server failed unexpectedly (see its log)";

/** The Connect code a domain error reaches the client with. */
export function connectCodeOf(code: BerthCode): Code {
  switch (code) {
    // The request itself is wrong; retrying it unchanged fails again.
    case "invalid_argument":
      return Code.InvalidArgument;
    // The session, lock or reservation named in the request does not exist.
    case "not_found":
      return Code.NotFound;
    // Creating something that is already there (an id taken by another caller).
    case "already_exists":
      return Code.AlreadyExists;
    // The system is not in the state the call expects (an `expected_seq` that moved on).
    case "failed_precondition":
      return Code.FailedPrecondition;
    // A concurrency conflict the client may retry at a higher level (a lock wait ran out,
    // a fencing token that is no longer current).
    case "aborted":
      return Code.Aborted;
    // A limit was hit: queue full, message too large, watcher too slow.
    case "resource_exhausted":
      return Code.ResourceExhausted;
    // Transient: the server is shutting down or a dependency is missing; retry with backoff.
    case "unavailable":
      return Code.Unavailable;
    // Missing or wrong credentials.
    case "unauthenticated":
      return Code.Unauthenticated;
    // A wait the caller bounded (its own deadline or a `wait` field) ran out.
    case "deadline_exceeded":
      return Code.DeadlineExceeded;
    // The caller went away or cancelled the work.
    case "cancelled":
      return Code.Canceled;
    // An invariant of berth broke on purpose-built checks (e.g. a damaged journal line).
    case "internal":
      return Code.Internal;
  }
}

/** `BerthError` → `ConnectError`: same message, matching code, details as a Struct and a header. */
export function berthErrorToConnect(error: BerthError): ConnectError {
  const code = connectCodeOf(error.code);
  const details = jsonDetails(error.details);
  if (details === undefined) return new ConnectError(error.message, code, undefined, undefined, error);
  return new ConnectError(
    error.message,
    code,
    { [ERROR_DETAILS_HEADER]: asciiJson(details) },
    [{ desc: StructSchema, value: fromJson(StructSchema, details) }],
    error,
  );
}

/**
 * Anything thrown by a handler → the `ConnectError` the client gets. ConnectErrors pass through
 * (but a request that did not decode is INVALID_ARGUMENT, see `decode-errors.ts`);
 * BerthErrors are mapped; aborts become CANCELED/DEADLINE_EXCEEDED; anything else is a bug:
 * INTERNAL with a generic message, the real error logged (never sent: it may hold paths or data).
 */
export function toConnectError(error: unknown, logger?: ServerLogger, method?: string): ConnectError {
  if (error instanceof ConnectError) return asInvalidArgumentIfDecodeError(error);
  if (isBerthError(error)) return berthErrorToConnect(error);
  if (error instanceof Error && error.name === "AbortError") {
    return new ConnectError("the call was cancelled", Code.Canceled, undefined, undefined, error);
  }
  if (error instanceof Error && error.name === "TimeoutError") {
    return new ConnectError("the call's deadline ran out", Code.DeadlineExceeded, undefined, undefined, error);
  }
  logger?.error({ err: error, method }, "handler failed unexpectedly");
  return new ConnectError(INTERNAL_ERROR_MESSAGE, Code.Internal, undefined, undefined, error);
}

/**
 * An interceptor applying `toConnectError` to every error a handler raises, whether before a
 * response (unary, or a stream that fails at once) or in the middle of a response stream.
 */
export function createErrorInterceptor(logger?: ServerLogger): Interceptor {
  return (next) => async (req) => {
    let res;
    try {
      res = await next(req);
    } catch (error) {
      throw toConnectError(error, logger, methodOf(req));
    }
    if (!res.stream) return res;
    return { ...res, message: mapStreamErrors(res.message, (e) => toConnectError(e, logger, methodOf(req))) } as StreamResponse;
  };
}

function methodOf(req: { service: { typeName: string }; method: { name: string } }): string {
  return `/${req.service.typeName}/${req.method.name}`;
}

/** `source` with every error it throws passed through `map`; one `then` per item, handlers bound once per stream. */
function mapStreamErrors<T>(source: AsyncIterable<T>, map: (error: unknown) => Error): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator]() {
      const it = source[Symbol.asyncIterator]();
      const onError = (error: unknown): never => {
        throw map(error);
      };
      return {
        next() {
          let pull: Promise<IteratorResult<T>>;
          try {
            pull = it.next();
          } catch (error) {
            return Promise.reject(map(error));
          }
          return pull.then(undefined, onError);
        },
        return: (value?: unknown) => (it.return ? it.return(value) : Promise.resolve({ done: true, value: value as T })),
        throw: (error?: unknown) => (it.throw ? it.throw(error) : Promise.reject(error)),
      };
    },
  };
}

/** Details as a JSON object (bigints as strings, undefined dropped), or undefined when empty or unserializable. */
function jsonDetails(details: Record<string, unknown> | undefined): JsonObject | undefined {
  if (details === undefined) return undefined;
  try {
    const json = JSON.parse(JSON.stringify(details, (_key, value: unknown) => (typeof value === "bigint" ? value.toString() : value))) as unknown;
    if (json === null || typeof json !== "object" || Array.isArray(json) || Object.keys(json).length === 0) return undefined;
    return json as JsonObject;
  } catch {
    return undefined;
  }
}

/** HTTP header values must be ASCII: escape everything else as JSON `\uXXXX`. */
function asciiJson(value: JsonObject): string {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}
