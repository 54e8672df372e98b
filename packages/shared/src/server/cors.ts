/**
 * Cross-origin calls from web pages: an allow-list of origins, nothing by default.
 *
 * A browser sends `Origin` with every cross-origin call (and with a same-origin POST); for a call
 * that is not "simple" — every Connect and gRPC-Web RPC but a Connect GET — it first sends a
 * preflight `OPTIONS` asking whether the real call may follow. berth answers both for the origins
 * it was given (`--cors-origin`), echoing the one origin (never `*`, see origins.ts: a page anywhere on the web
 * could otherwise read a developer's local service) and never allowing credentials (the bearer
 * token travels in `authorization`, a header a page sets itself; cookies are never involved).
 *
 * A call from any other origin is refused with 403 before it reaches an RPC, preflight or not: a
 * page cannot read the answer without CORS headers anyway, and refusing also keeps a foreign page
 * from making a call whose answer it does not need (a "simple" request, which skips the
 * preflight). That includes a page whose own address equals the service's (Origin matching Host):
 * berth serves no page on its RPC port, so that is a name rebound to loopback (DNS rebinding), not
 * a page of its own. Calls without `Origin` (every non-browser client) pass.
 */
import { cors as connectCors } from "@connectrpc/connect";
import { ERROR_DETAILS_HEADER } from "./connect-errors.js";
import type { NodeRequestHandler } from "./listener.js";

function lowerCase(name: string): string {
  return name.toLowerCase();
}

/** Headers a page may send: what Connect and gRPC-Web need, and the bearer token. */
export const CORS_ALLOWED_HEADERS: readonly string[] = [...connectCors.allowedHeaders.map(lowerCase), "authorization"];
/**
 * Headers a page may read: gRPC-Web's status and message, and the error details (gRPC's binary
 * trailer, and berth's JSON facts, which a Connect unary error carries as a header and
 * `BerthClientError.facts` reads).
 */
export const CORS_EXPOSED_HEADERS: readonly string[] = [...connectCors.exposedHeaders.map(lowerCase), ERROR_DETAILS_HEADER];
/** Methods a page may use: POST for every RPC, GET for the reads (Connect GET). */
export const CORS_ALLOWED_METHODS: readonly string[] = connectCors.allowedMethods;
/** How long a browser may cache a preflight's answer (seconds): Chromium caps it at 2 hours. */
export const CORS_MAX_AGE_SECONDS = 7200;

/** What {@link answerCors} did with a request. */
export type CorsOutcome = "pass" | "answered";

/**
 * Applies the allow-list to one request: "answered" when it wrote the whole response (a preflight,
 * or a refused origin), "pass" when the call goes on (with the CORS headers of an allowed origin
 * already set on `res`).
 */
export function answerCors(req: Parameters<NodeRequestHandler>[0], res: Parameters<NodeRequestHandler>[1], allowed: ReadonlySet<string>): CorsOutcome {
  const origin = req.headers.origin;
  if (origin === undefined) return "pass";
  const preflight = req.method === "OPTIONS" && req.headers["access-control-request-method"] !== undefined;
  if (!allowed.has(origin)) {
    const body = `origin ${origin} is not allowed to call this service: start it with --cors-origin ${origin} (or BERTH_CORS_ORIGINS)\n`;
    res.writeHead(403, { "content-type": "text/plain; charset=utf-8", "content-length": Buffer.byteLength(body), vary: "Origin" });
    if (req.method === "HEAD") res.end();
    else res.end(body);
    return "answered";
  }
  res.setHeader("access-control-allow-origin", origin);
  res.setHeader("vary", "Origin");
  if (!preflight) {
    res.setHeader("access-control-expose-headers", CORS_EXPOSED_HEADERS.join(", "));
    return "pass";
  }
  const headers: Record<string, string> = {
    "access-control-allow-methods": CORS_ALLOWED_METHODS.join(", "),
    "access-control-allow-headers": CORS_ALLOWED_HEADERS.join(", "),
    "access-control-max-age": String(CORS_MAX_AGE_SECONDS),
    "content-length": "0",
  };
  // Chromium's Private Network Access: a page of a public address calling loopback asks first.
  if (req.headers["access-control-request-private-network"] === "true") headers["access-control-allow-private-network"] = "true";
  res.writeHead(204, headers);
  res.end();
  return "answered";
}
