/**
 * The one place where domain errors become RPC errors. Handlers throw `BerthError` (or let a bug
 * throw anything); the interceptor here turns that into a `ConnectError` with the matching code,
 * the same message, and the error's `details` where every client can read them. Every error leaves
 * with a `google.rpc.ErrorInfo` naming its case (AIP-193), a `RetryInfo` when a retry can succeed,
 * and a `BadRequest` naming the field of an INVALID_ARGUMENT.
 */
import { Code, ConnectError, type Interceptor, type StreamResponse } from "@connectrpc/connect";
import { create, fromJson, type JsonObject } from "@bufbuild/protobuf";
import { durationFromMs, StructSchema } from "@bufbuild/protobuf/wkt";
import { BadRequestSchema, ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { ANY_CALL_REASONS } from "@berth/wire/reasons";
import { isBerthError, UNAVAILABLE_RETRY_AFTER_MS, type BerthCode, type BerthError } from "../errors.js";
import type { Logger } from "../logger.js";
import { REQUEST_REASONS, requestErrorOf } from "./request-errors.js";
import { descriptorShortageIn, relieveDescriptorShortage } from "../descriptors.js";
import { descriptorRefusal, TOO_MANY_OPEN_FILES } from "../state-errors.js";

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
    // The system is not in the state the call needs, and retrying will not change that until the
    // caller does something else first (a fence whose lock was lost: re-acquire it).
    case "failed_precondition":
      return Code.FailedPrecondition;
    // A concurrency conflict the client resolves by re-reading and redoing its change (an
    // `expected_seq` that moved on).
    case "aborted":
      return Code.Aborted;
    // A position past the end of what exists (a journal read from beyond its last seq).
    case "out_of_range":
      return Code.OutOfRange;
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
    // The request asks for something this server does not do (a compression it does not speak).
    case "unimplemented":
      return Code.Unimplemented;
    // The caller went away or cancelled the work.
    case "cancelled":
      return Code.Canceled;
    // An invariant of berth broke on purpose-built checks (e.g. a damaged journal line).
    case "internal":
      return Code.Internal;
  }
}

/**
 * The longest error message sent, in characters. A rule may quote what the caller sent, and the
 * caller may have sent megabytes; over gRPC the message travels in a trailer, and a trailer past
 * HTTP/2's header limits kills the stream (the client sees a reset, not the refusal). Longer
 * messages are cut, saying how much was left out.
 */
export const MAX_ERROR_MESSAGE_CHARS = 1024;
/** Strings in error details are cut to this many characters, for the same reason. */
export const MAX_DETAIL_STRING_CHARS = 256;
/** Details whose JSON is still longer than this travel in neither the header nor the Struct (the message says enough). */
const MAX_DETAILS_JSON_CHARS = 8192;

/**
 * `text` cut to `max` characters (noting how many were left out), with lone surrogates replaced:
 * the gRPC trailer is percent-encoded, and `encodeURIComponent` throws on a lone surrogate.
 */
export function boundedText(text: string, max: number): string {
  let out = text;
  if (out.length > max) {
    let cut = out.slice(0, max);
    if (/[\ud800-\udbff]$/.test(cut)) cut = cut.slice(0, -1);
    out = `${cut}… (${text.length - cut.length} more characters)`;
  }
  return out.replace(LONE_SURROGATES, "\ufffd");
}

/** A UTF-16 surrogate without its pair: a string holding one is not Unicode text, and no UTF-8 carries it. */
export const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;
const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, "g");

/**
 * `BerthError` → `ConnectError`: same message (bounded), matching code, an ErrorInfo with the
 * error's reason and its details as string metadata, a RetryInfo when it has a retry delay, a
 * BadRequest for a bad field, and the details as a Struct and as a JSON header (with the reason).
 */
export function berthErrorToConnect(error: BerthError, domain = ""): ConnectError {
  const code = connectCodeOf(error.code);
  const message = boundedText(error.message, MAX_ERROR_MESSAGE_CHARS);
  const details = jsonDetails(error.details);
  const wire: OutgoingDetail[] = [
    { desc: ErrorInfoSchema, value: create(ErrorInfoSchema, { reason: error.reason, domain, metadata: stringMetadata(details) }) },
  ];
  if (error.options.retryAfterMs !== undefined) wire.push(retryInfo(error.options.retryAfterMs));
  if (error.code === "invalid_argument" && typeof details?.field === "string") {
    wire.push({
      desc: BadRequestSchema,
      value: create(BadRequestSchema, {
        fieldViolations: [{ field: details.field, description: typeof details.rule === "string" ? details.rule : message, reason: error.reason }],
      }),
    });
  }
  const header = asciiJson({ reason: error.reason, ...details });
  if (details === undefined || header.length > MAX_DETAILS_JSON_CHARS)
    return new ConnectError(message, code, { [ERROR_DETAILS_HEADER]: asciiJson({ reason: error.reason }) }, wire, error);
  wire.push({ desc: StructSchema, value: fromJson(StructSchema, details) });
  return new ConnectError(message, code, { [ERROR_DETAILS_HEADER]: header }, wire, error);
}

/** A detail as a handler attaches it: a message with its schema. */
type OutgoingDetail = Extract<ConnectError["details"][number], { desc: unknown }>;

/**
 * The reason of an error that reached the client without one of berth's own (raised by Connect,
 * by the transport, or by a bug): one per code.
 */
function reasonOfCode(code: Code): string {
  switch (code) {
    // A request Connect could not read (every refusal of berth's own is a BerthError).
    case Code.InvalidArgument:
      return REQUEST_REASONS.MALFORMED_REQUEST;
    // The server closing its streams as it stops.
    case Code.Unavailable:
      return ANY_CALL_REASONS.SHUTTING_DOWN;
    case Code.Canceled:
      return ANY_CALL_REASONS.CANCELLED;
    case Code.Unauthenticated:
      return ANY_CALL_REASONS.TOKEN_INVALID;
    default:
      return Code[code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
  }
}

function retryInfo(ms: number): OutgoingDetail {
  return { desc: RetryInfoSchema, value: create(RetryInfoSchema, { retryDelay: durationFromMs(Math.max(0, Math.round(ms))) }) };
}

/** `error` with an ErrorInfo of `domain` when it has none yet (and a RetryInfo for UNAVAILABLE); the same object when it has one. */
export function withErrorInfo(error: ConnectError, domain: string): ConnectError {
  if (error.findDetails(ErrorInfoSchema).length > 0) return error;
  const copy = new ConnectError(error.rawMessage, error.code, error.metadata, undefined, error.cause);
  copy.details.push(...error.details, { desc: ErrorInfoSchema, value: create(ErrorInfoSchema, { reason: reasonOfCode(error.code), domain }) });
  if (error.code === Code.Unavailable && error.findDetails(RetryInfoSchema).length === 0) copy.details.push(retryInfo(UNAVAILABLE_RETRY_AFTER_MS));
  return copy;
}

/**
 * The ErrorInfo domain of a method's errors: the first two parts of its service's name
 * (`berth.sessions`, `berth.locks`, `berth.budget`, `grpc.health`).
 */
export function errorDomainOf(method: string | undefined): string {
  if (method === undefined) return "";
  const typeName = method.split("/")[1] ?? "";
  return typeName.split(".").slice(0, 2).join(".");
}

/**
 * Node's ways of saying the client hung up while a handler read its request or wrote its answer
 * (a reset stream, a closed socket): a cancellation, not a failure of the server.
 */
const PEER_GONE_CODES = new Set(["ERR_STREAM_PREMATURE_CLOSE", "ERR_STREAM_DESTROYED", "ERR_HTTP2_INVALID_STREAM", "ECONNRESET", "EPIPE"]);

function isPeerGone(error: unknown): boolean {
  return error instanceof Error && PEER_GONE_CODES.has((error as NodeJS.ErrnoException).code ?? "");
}

/**
 * `mapped` with the response metadata Connect put on `original` besides (the encodings it accepts,
 * on a refused encoding).
 */
function withMetadataOf(original: ConnectError, mapped: ConnectError): ConnectError {
  original.metadata.forEach((value, name) => {
    if (!mapped.metadata.has(name)) mapped.metadata.set(name, value);
  });
  return mapped;
}

/** A ConnectError with its message bounded (see {@link MAX_ERROR_MESSAGE_CHARS}); the same object when already short. */
function boundedConnectError(error: ConnectError): ConnectError {
  const message = boundedText(error.rawMessage, MAX_ERROR_MESSAGE_CHARS);
  if (message === error.rawMessage) return error;
  const bounded = new ConnectError(message, error.code, error.metadata, undefined, error);
  bounded.details.push(...error.details);
  return bounded;
}

/**
 * Anything thrown by a handler → the `ConnectError` the client gets. ConnectErrors pass through
 * (an overlong message is cut), but for those Connect raised about the request's bytes, which get
 * berth's code and reason (see `request-errors.ts`); BerthErrors
 * are mapped; aborts become CANCELED/DEADLINE_EXCEEDED, and so does a client that hung up
 * mid-call; anything else is a bug: INTERNAL with a generic message, the real error logged (never
 * sent: it may hold paths or data).
 */
export function toConnectError(error: unknown, logger?: Logger, method?: string): ConnectError {
  const mapped = withErrorInfo(toConnectErrorAsThrown(error, logger, method), errorDomainOf(method));
  // Whatever ran out of descriptors, the idle ones are closed now, so that the retry finds one.
  if (mapped.findDetails(ErrorInfoSchema)[0]?.reason === TOO_MANY_OPEN_FILES) relieveDescriptorShortage();
  return mapped;
}

function toConnectErrorAsThrown(error: unknown, logger?: Logger, method?: string): ConnectError {
  // No descriptor left is the machine's condition, not a bug, wherever the open was (a file, or a
  // client library's connection, which connect-node calls INTERNAL): the same retryable refusal as
  // a journal or lock file that could not be opened (its message names no path).
  const shortage = error instanceof ConnectError && error.code !== Code.Internal ? undefined : descriptorShortageIn(error);
  const descriptors = descriptorRefusal(shortage, "the call could not be served");
  if (descriptors !== undefined) {
    logger?.warn({ err: error, method }, "no descriptor left to serve a call");
    return berthErrorToConnect(descriptors, errorDomainOf(method));
  }
  if (error instanceof ConnectError) {
    if (error.findDetails(ErrorInfoSchema).length > 0) return boundedConnectError(error);
    const refusal = requestErrorOf(error);
    return refusal === undefined ? boundedConnectError(error) : withMetadataOf(error, berthErrorToConnect(refusal, errorDomainOf(method)));
  }
  if (isBerthError(error)) return berthErrorToConnect(error, errorDomainOf(method));
  if (isPeerGone(error)) return new ConnectError("the client went away", Code.Canceled, undefined, undefined, error);
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
export function createErrorInterceptor(logger?: Logger): Interceptor {
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

/** Details as a JSON object (bigints as strings, long strings cut, undefined dropped), or undefined when empty or unserializable. */
function jsonDetails(details: Record<string, unknown> | undefined): JsonObject | undefined {
  if (details === undefined) return undefined;
  try {
    const replacer = (_key: string, value: unknown) => {
      if (typeof value === "bigint") return value.toString();
      if (typeof value === "string") return boundedText(value, MAX_DETAIL_STRING_CHARS);
      return value;
    };
    const json = JSON.parse(JSON.stringify(details, replacer)) as unknown;
    if (json === null || typeof json !== "object" || Array.isArray(json) || Object.keys(json).length === 0) return undefined;
    return json as JsonObject;
  } catch {
    return undefined;
  }
}

/** Details as ErrorInfo metadata: strings as they are, other values as their JSON. */
function stringMetadata(details: JsonObject | undefined): Record<string, string> {
  const metadata: Record<string, string> = {};
  if (details === undefined) return metadata;
  for (const [key, value] of Object.entries(details)) {
    metadata[key] = typeof value === "string" ? value : boundedText(JSON.stringify(value), MAX_DETAIL_STRING_CHARS);
  }
  return metadata;
}

/** HTTP header values must be ASCII: escape everything else as JSON `\uXXXX`. */
function asciiJson(value: JsonObject): string {
  return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}
