/**
 * One unary gRPC exchange on an HTTP/2 stream of connect-node's session manager: the framed
 * request written at once, the response's head, body and trailer collected. What ends it early is
 * what ends connect-node's calls, with the same errors: the deadline, the caller's signal, the
 * stream's errors and resets, a head the caller refuses. Until the body has ended, a failure resets
 * the stream (CANCEL when the error is a cancellation, INTERNAL_ERROR otherwise).
 */
import { constants, type ClientHttp2Stream, type IncomingHttpHeaders, type IncomingHttpStatusHeader } from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Http2SessionManager } from "@connectrpc/connect-node";
import { getAbortSignalReason } from "@connectrpc/connect/protocol";
import { connectErrorFromH2ResetCode, connectErrorFromNodeReason, nodeErrorCodes } from "./http2-errors.js";

export type ResponseHead = IncomingHttpHeaders & IncomingHttpStatusHeader;

export interface UnaryExchangeOptions<C> {
  readonly sessionManager: Http2SessionManager;
  readonly path: string;
  readonly headers: Record<string, string>;
  readonly timeoutMs: number | undefined;
  readonly signal: AbortSignal | undefined;
  /** The framed request, made once the stream is open (its errors fail the call as the stream's would). */
  readonly body: () => Uint8Array;
  /** Reads the response's head as it arrives; throwing fails the call at once. */
  readonly checkHead: (head: ResponseHead) => C;
}

export interface UnaryExchange<C> {
  readonly head: ResponseHead;
  readonly headCheck: C;
  readonly body: Buffer;
  readonly trailer: IncomingHttpHeaders;
}

export function exchangeUnary<C>(options: UnaryExchangeOptions<C>): Promise<UnaryExchange<C>> {
  const { sessionManager, signal } = options;
  return new Promise<UnaryExchange<C>>((resolve, reject) => {
    let stream: ClientHttp2Stream | undefined;
    // Open until the body has ended or the call failed; after that the stream's events are moot.
    let open = true;
    let failure: ConnectError | undefined;
    let timer: NodeJS.Timeout | undefined;
    let head: ResponseHead | undefined;
    let headCheck: C | undefined;
    let trailer: IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];

    const finish = () => {
      open = false;
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    };
    /** Fails the call with `reason` (as connect-node reads it) or, when given, with `final`. */
    const fail = (reason: unknown, final?: ConnectError) => {
      if (!open) return;
      finish();
      failure = reason instanceof ConnectError ? reason : connectErrorFromNodeReason(reason);
      if (stream !== undefined) reset(stream, failure);
      reject(final ?? failure);
    };
    // An aborted call fails as cancelled with the abort's reason (the deadline's says it timed out).
    const abort = (reason: unknown) => fail(reason, ConnectError.from(reason, Code.Canceled));
    function onAbort(this: AbortSignal) {
      abort(getAbortSignalReason(this));
    }

    if (options.timeoutMs !== undefined) timer = setTimeout(() => abort(new ConnectError("the operation timed out", Code.DeadlineExceeded)), options.timeoutMs);
    if (signal !== undefined) {
      if (signal.aborted) return abort(getAbortSignalReason(signal));
      signal.addEventListener("abort", onAbort);
    }

    sessionManager.request("POST", options.path, options.headers, {}).then((opened) => {
      stream = opened;
      if (!open) {
        // The call failed while the manager was still connecting (or pinging an idle connection):
        // the stream it hands over now is reset at once.
        if (failure !== undefined) reset(opened, failure);
        return;
      }
      opened.on("response", (received) => {
        head = received;
        try {
          headCheck = options.checkHead(received);
        } catch (error) {
          fail(error);
        }
      });
      opened.on("data", (chunk: Buffer) => {
        if (open) chunks.push(chunk);
        sessionManager.notifyResponseByteRead(opened);
      });
      opened.on("trailers", (received) => {
        trailer = received;
      });
      opened.on("end", () => {
        if (!open || head === undefined) return;
        finish();
        resolve({ head, headCheck: headCheck as C, body: chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks), trailer });
      });
      opened.on("error", (error) => {
        // The server answered and ended the stream before the request was all written: its answer counts.
        if (opened.writableEnded && nodeErrorCodes(error).includes("ERR_STREAM_WRITE_AFTER_END")) return;
        fail(error);
      });
      opened.on("close", () => {
        const reset = connectErrorFromH2ResetCode(opened.rstCode);
        if (reset !== undefined) return fail(reset);
        // Closed before its body ended: the error a stream's reader gets, as connect passes it on.
        if (head !== undefined && open) fail(undefined, ConnectError.from(prematureClose()));
      });
      let body: Uint8Array;
      try {
        body = options.body();
      } catch (error) {
        return fail(error);
      }
      opened.end(body);
    }, fail);
  });
}

function reset(stream: ClientHttp2Stream, error: ConnectError): void {
  // A reset that is not a cancel makes Node emit an 'error' on the stream, which would throw where
  // nothing listens (a stream handed over after its call failed): the call has its answer already.
  stream.on("error", () => {});
  if (!stream.closed) stream.close(error.code === Code.Canceled ? constants.NGHTTP2_CANCEL : constants.NGHTTP2_INTERNAL_ERROR);
}

/** Node's error for a stream closed before its end (what its async iterator throws). */
function prematureClose(): Error {
  return Object.assign(new Error("Premature close"), { code: "ERR_STREAM_PREMATURE_CLOSE" });
}

/** connect-node's `nodeHeaderToWebHeader`: fetch Headers of Node's, HTTP/2 pseudo-headers left out. */
export function toWebHeaders(headers: IncomingHttpHeaders): Headers {
  const result = new Headers();
  for (const [key, value] of Object.entries(headers)) {
    if (key.startsWith(":") || value === undefined) continue;
    if (typeof value === "string") result.append(key, value);
    else if (typeof value === "number") result.append(key, String(value));
    else for (const item of value) result.append(key, item);
  }
  return result;
}
