/**
 * One log line and one metrics record per RPC, written when the call ends: for a unary call when
 * the handler returns, for a stream when its last message is out (a server interceptor's `next()`
 * returns as soon as a stream starts, so the response iterator is wrapped to see the end).
 */
import { Code, ConnectError, createContextKey, type Interceptor, type StreamResponse } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import type { Logger } from "../logger.js";
import type { ServerMetrics } from "./metrics.js";
import { openStreamKey, type OpenStream } from "./open-streams.js";

/** The health service: polled by supervisors every few seconds, so its calls are logged at debug. */
const HEALTH_SERVICE = "grpc.health.v1.Health";

/** What the server knows of one HTTP request before and after the RPC layer sees it. */
export interface CallState {
  /** The remote address of the connection (`address:port`, or `unix` for a unix socket). */
  readonly peer: string;
  /** When the request arrived (`performance.now()`). */
  readonly started: number;
  /** The wall time (`Date.now()`) as the request arrived: what connect's deadline is measured from (call-deadline.ts). */
  readonly arrivedAtWallMs: number;
  /** Set by the observer interceptor: the call reached a handler and was logged there. */
  observed: boolean;
  /**
   * Set by the route guard: the code (`unauthenticated`, `invalid_argument`…) of an error answered
   * before any interceptor ran. gRPC-Web and Connect streams carry it in the body, where the HTTP
   * layer that logs such calls cannot read it.
   */
  refusedWith?: string;
  /** Whether the call's connection is gone (see call-connection.ts). */
  readonly connectionGone?: () => boolean;
}

/** The context value carrying a call's `CallState` from the HTTP layer to the interceptors. */
export const callStateKey = createContextKey<CallState | undefined>(undefined, { description: "berth call state" });

/** What a finished RPC reports. */
export interface RpcRecord {
  /** `/pkg.Service/Method` */
  readonly method: string;
  /** `ok`, or the Connect code name (`not_found`, `unavailable`…). */
  readonly code: string;
  readonly durationMs: number;
  readonly peer: string;
  /** `grpc`, `grpc-web` or `connect`. */
  readonly protocol: string;
}

/** `ok` for success, else the Connect code name (`resource_exhausted`, `unavailable`…). */
export function codeName(error: unknown): string {
  if (error === undefined) return "ok";
  return codeToString(error instanceof ConnectError ? error.code : Code.Unknown);
}

/** The protocol of a request, from its content type. */
export function protocolOf(contentType: string | null): string {
  if (contentType === null) return "connect";
  if (contentType.startsWith("application/grpc-web")) return "grpc-web";
  if (contentType.startsWith("application/grpc")) return "grpc";
  return "connect";
}

/** Options of `createObserverInterceptor`. */
export interface ObserverOptions {
  readonly logger: Logger;
  readonly metrics?: ServerMetrics;
}

/**
 * Logs each RPC at its end (`info`, health checks at `debug`; message `rpc`, fields method, code, ms, peer, protocol) and
 * records it in the metrics. Put it outermost so it sees the code the client gets.
 */
export function createObserverInterceptor({ logger, metrics }: ObserverOptions): Interceptor {
  return (next) => async (req) => {
    const state = req.contextValues.get(callStateKey);
    if (state !== undefined) state.observed = true;
    const started = state?.started ?? performance.now();
    const method = `/${req.service.typeName}/${req.method.name}`;
    const peer = state?.peer ?? "unknown";
    const finish = (error: unknown) => {
      const durationMs = performance.now() - started;
      const code = codeName(error);
      metrics?.recordRpc(method, code, durationMs / 1000);
      // Health checks come every few seconds from supervisors and say nothing new: debug level.
      const log = req.service.typeName === HEALTH_SERVICE ? logger.debug : logger.info;
      log.call(logger, { method, code, ms: roundMs(durationMs), peer, protocol: protocolOf(req.header.get("content-type")) }, "rpc");
    };

    if (!req.stream) {
      if (metrics) metrics.inFlight++;
      try {
        const res = await next(req);
        finish(undefined);
        return res;
      } catch (error) {
        finish(error);
        throw error;
      } finally {
        if (metrics) metrics.inFlight--;
      }
    }

    // Its record, where the handler says what it holds (`streamHolds`) and `GET /debug/streams` finds it.
    const open = metrics?.streams.open(method, peer, protocolOf(req.header.get("content-type")), started, req.signal);
    if (open !== undefined) req.contextValues.set(openStreamKey, open);
    const end = (error: unknown) => {
      if (open !== undefined) metrics?.streams.close(open);
      finish(error);
    };
    let res: StreamResponse;
    try {
      res = (await next(req)) as StreamResponse;
    } catch (error) {
      end(error);
      throw error;
    }
    return { ...res, message: onStreamEnd(res.message, end, open) };
  };
}

const CLIENT_WENT_AWAY = new ConnectError("the client stopped reading the stream", Code.Canceled);

/**
 * Passes `source` through and calls `end` exactly once: with undefined when it completes, with
 * the error it throws, or with CANCELED when the consumer stops early (`return()`) or throws in a
 * failure to deliver (`throw()` with anything but a ConnectError). With `open`, also records on it
 * whose turn it is: the handler's (a message was asked for) or the client's (one is being
 * written). Each item costs one `then` on the source's promise with handlers bound once per
 * stream: this wraps every message of every stream.
 */
export function onStreamEnd<T>(source: AsyncIterable<T>, end: (error: unknown) => void, open?: OpenStream): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator]: () => new StreamEndObserver<T>(source[Symbol.asyncIterator](), end, open),
  };
}

class StreamEndObserver<T> implements AsyncIterator<T> {
  private ended = false;

  constructor(
    private readonly it: AsyncIterator<T>,
    private readonly end: (error: unknown) => void,
    private readonly open: OpenStream | undefined,
  ) {}

  next(): Promise<IteratorResult<T>> {
    this.open?.pulled();
    let pull: Promise<IteratorResult<T>>;
    try {
      pull = this.it.next();
    } catch (error) {
      this.settle(error);
      return Promise.reject(error);
    }
    return pull.then(this.onItem, this.onError);
  }

  return(value?: unknown): Promise<IteratorResult<T>> {
    this.settle(CLIENT_WENT_AWAY);
    return this.it.return ? this.it.return(value) : Promise.resolve({ done: true, value: value as T });
  }

  throw(error?: unknown): Promise<IteratorResult<T>> {
    // The consumer throws in when it cannot deliver: connect-node's response writer passes the
    // Node error of a write to a stream the client has reset. That is the client gone (CANCELED,
    // as for return()), not an UNKNOWN failure; a ConnectError thrown in keeps its code.
    this.settle(error instanceof ConnectError ? error : new ConnectError(CLIENT_WENT_AWAY.rawMessage, Code.Canceled, undefined, undefined, error));
    return this.it.throw ? this.it.throw(error) : Promise.reject(error);
  }

  private readonly onItem = (result: IteratorResult<T>): IteratorResult<T> => {
    if (result.done === true) this.settle(undefined);
    else this.open?.produced();
    return result;
  };

  private readonly onError = (error: unknown): never => {
    this.settle(error);
    throw error;
  };

  private settle(error: unknown): void {
    if (this.ended) return;
    this.ended = true;
    this.end(error);
  }
}

/**
 * Logs and counts an RPC the protocol layer refused before any interceptor ran (an undecodable or
 * oversize unary request, a bad content type), so that every RPC still gets its line. The code is
 * read from what was sent: `grpc-status` for gRPC over HTTP/2, else the HTTP status.
 */
export function recordRefusedCall(
  options: ObserverOptions,
  state: CallState,
  path: string,
  contentType: string | undefined,
  httpStatus: number,
  grpcStatus: string | undefined,
): void {
  const durationMs = performance.now() - state.started;
  let code: string;
  if (state.refusedWith !== undefined) {
    code = state.refusedWith;
  } else if (grpcStatus !== undefined && /^\d+$/.test(grpcStatus)) {
    code = grpcStatus === "0" ? "ok" : codeToString(Number(grpcStatus) as Code);
  } else {
    code = codeOfHttpStatus(httpStatus);
  }
  options.metrics?.recordRpc(path, code, durationMs / 1000);
  const log = path.startsWith(`/${HEALTH_SERVICE}/`) ? options.logger.debug : options.logger.info;
  log.call(options.logger, { method: path, code, ms: roundMs(durationMs), peer: state.peer, protocol: protocolOf(contentType ?? null) }, "rpc");
}

/**
 * The code behind an HTTP status the Connect protocol answered an error with: the inverse of its
 * code → status table, taking the likeliest code where several codes share a status.
 */
function codeOfHttpStatus(status: number): string {
  switch (status) {
    case 200:
      return "ok";
    // Also failed_precondition and out_of_range; a refused request is most likely malformed.
    case 400:
      return "invalid_argument";
    case 401:
      return "unauthenticated";
    case 403:
      return "permission_denied";
    case 404:
      return "not_found";
    // Also already_exists.
    case 409:
      return "aborted";
    // The message size limit.
    case 429:
      return "resource_exhausted";
    case 499:
      return "canceled";
    // Also unknown and data_loss.
    case 500:
      return "internal";
    case 501:
      return "unimplemented";
    case 503:
      return "unavailable";
    case 504:
      return "deadline_exceeded";
    // Not a Connect error at all (415 wrong content type, 405 wrong method…).
    default:
      return `http_${status}`;
  }
}

function roundMs(ms: number): number {
  return Math.round(ms * 10) / 10;
}
