/**
 * The transport of the browser entry: the Connect protocol over `fetch` (connect-web) with binary
 * messages, for unary calls and server streams (every watch, and a lock's Hold stream): a response
 * body read as it arrives, over HTTP/1.1 or whatever the browser speaks, no HTTP/2 needed. The
 * bearer token goes as `authorization: Bearer …` on every call, which CORS lets a page send.
 *
 * What fetch cannot do, this transport says plainly rather than letting it fail obscurely:
 * - a stream both ways (Admit, KeepAliveStream): a request body is sent whole before the answer
 *   is read, so the call is refused at once, UNIMPLEMENTED `BIDI_STREAM_UNSUPPORTED`, naming the
 *   unary calls that do the same (connect-web alone fails it with a bare message after opening
 *   nothing, which an admission would take for a broken connection and retry for seconds);
 * - a call the browser would not let through (nothing listening, or the service does not allow
 *   the page's origin: the page cannot tell which, it gets `TypeError: Failed to fetch` and nothing
 *   else): UNAVAILABLE `FETCH_FAILED`, naming the URL, the page's origin and the flag that allows it.
 */
import { Code, ConnectError, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-web";
import { bearerInterceptors } from "./bearer.js";
import { clientError } from "./errors.js";

/** Options of {@link createWebTransport}. */
export interface WebTransportOptions {
  /** More interceptors, run after the one that sends the token. */
  readonly interceptors?: readonly Interceptor[] | undefined;
}

/** What a page calls instead of each stream both ways, as unary calls fetch can make. */
const INSTEAD_OF_BIDI_STREAMS: Readonly<Record<string, { readonly method: string; readonly advice: string }>> = {
  "berth.budget.v1.BudgetService/Admit": {
    method: "Reserve",
    advice: "use reserve() instead: a reservation held by a lease (renewed by KeepAlive), then releaseBuild, registerRunning and release",
  },
  "berth.locks.v1.LockService/KeepAliveStream": { method: "KeepAlive", advice: "use keepAlive() instead, the same renewal as a unary call" },
};

/** A transport to `endpoint` over fetch. */
export function createWebTransport(endpoint: { readonly url: string; readonly token?: string | undefined }, options: WebTransportOptions = {}): Transport {
  return createConnectTransport({
    baseUrl: endpoint.url,
    useBinaryFormat: true,
    interceptors: [refuseBidiStreams, explainFailedFetch(endpoint.url), ...bearerInterceptors(endpoint.token), ...(options.interceptors ?? [])],
  });
}

/** Refuses a call that streams requests (fetch sends a body whole), naming the unary call to make instead. */
const refuseBidiStreams: Interceptor = (next) => (req) => {
  const kind = req.method.methodKind;
  if (kind === "unary" || kind === "server_streaming") return next(req);
  const name = `${req.service.typeName}/${req.method.name}`;
  const instead = INSTEAD_OF_BIDI_STREAMS[name];
  throw clientError(
    `${name} streams requests as well as answers, which fetch in a browser cannot do (it sends a request body whole): ${instead?.advice ?? "make it from Node, or use a unary call"}`,
    Code.Unimplemented,
    "BIDI_STREAM_UNSUPPORTED",
    { metadata: { method: name, ...(instead === undefined ? {} : { instead: instead.method }) } },
  );
};

/** Makes a fetch the browser refused (or that found nothing listening) an error that says where and why it may have been. */
function explainFailedFetch(url: string): Interceptor {
  return (next) => async (req) => {
    try {
      return await next(req);
    } catch (error) {
      if (req.signal.aborted || !fetchFailed(error)) throw error;
      const origin = pageOrigin();
      const why =
        origin === undefined
          ? "nothing answered there"
          : `the service is not running there, or does not allow this page's origin ${origin} (start it with --cors-origin ${origin}, or add it to BERTH_CORS_ORIGINS)`;
      throw clientError(`cannot reach ${url}: ${why} (${describe(error)})`, Code.Unavailable, "FETCH_FAILED", {
        metadata: { url, ...(origin === undefined ? {} : { origin }) },
        cause: error,
      });
    }
  };
}

/** Whether `error` is fetch's own failure (a TypeError: blocked, refused, reset), as connect-web passes it on. */
function fetchFailed(error: unknown): boolean {
  for (let cause: unknown = error, depth = 0; cause instanceof Error && depth < 4; cause = cause.cause, depth++) {
    if (cause instanceof TypeError) return true;
    if (cause instanceof ConnectError && cause.details.length > 0) return false;
  }
  return false;
}

/** The page's origin (`http://localhost:3000`); undefined outside a page. */
function pageOrigin(): string | undefined {
  const origin = (globalThis as { location?: { origin?: unknown } }).location?.origin;
  return typeof origin === "string" && origin !== "null" ? origin : undefined;
}

function describe(error: unknown): string {
  const messages: string[] = [];
  for (let cause: unknown = error, depth = 0; cause instanceof Error && depth < 4; cause = cause.cause, depth++) {
    const text = cause instanceof ConnectError ? cause.rawMessage : cause.message;
    if (text !== "" && !messages.includes(text)) messages.push(text);
  }
  return messages.join(": ") || String(error);
}
