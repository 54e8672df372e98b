/**
 * The service clients' connection in a web page: the URL and token the page gives (a page has no
 * environment or files to find them in), the Connect protocol over fetch (`web-transport.ts`) for
 * every call, the tab as the owner, and lock paths that must already be absolute (a page has no
 * working directory to resolve a relative one against).
 */
import type { Interceptor, Transport } from "@connectrpc/connect";
import { Code } from "@connectrpc/connect";
import { BadRequestSchema } from "@berth/api/google/rpc/error_details_pb";
import { create } from "@bufbuild/protobuf";
import type { ServiceConnection } from "./connection.js";
import type { Endpoint } from "./endpoint.js";
import { clientError } from "./errors.js";
import { joinLockPath } from "./lock-path-join.js";
import { DEFAULT_URLS, EndpointError, isHttpUrl, nonEmpty, type ServiceName } from "./service-urls.js";
import { createWebTransport } from "./web-transport.js";

/** How a client in a page reaches its service. */
export interface WebClientOptions {
  /** The service's address, `http://HOST:PORT` (`https://` through a proxy). Default: `http://127.0.0.1:7301` (sessions), `:7302` (budget). */
  readonly url?: string | undefined;
  /** The bearer token, sent as `authorization: Bearer …` on every call. */
  readonly token?: string | undefined;
  /** More interceptors, run after the one that sends the token. */
  readonly interceptors?: readonly Interceptor[] | undefined;
  /** A transport of one's own for every call; wins over the URL. */
  readonly transport?: Transport | undefined;
}

/** The endpoint of `service` from a page's options. Throws EndpointError for a URL a page cannot call (`unix:`, no scheme). */
export function webEndpoint(service: ServiceName, options: WebClientOptions = {}): Endpoint {
  const given = nonEmpty(options.url);
  const url = given ?? DEFAULT_URLS[service];
  if (!isHttpUrl(url))
    throw new EndpointError(`the ${service} URL must look like ${DEFAULT_URLS[service]} (a page calls a service over HTTP), got ${JSON.stringify(url)}`);
  const token = nonEmpty(options.token);
  return {
    service,
    url: url.replace(/\/+$/, ""),
    urlSource: given === undefined ? "default" : "option",
    token,
    tokenSource: token === undefined ? undefined : "option",
  };
}

/** The connection of a service client in a page. Throws EndpointError as {@link webEndpoint} does. */
export function webConnection(service: ServiceName, options: WebClientOptions = {}): ServiceConnection {
  const given = options.transport;
  const endpoint = given === undefined ? webEndpoint(service, options) : undefined;
  const transport = given ?? createWebTransport(endpoint!, { interceptors: options.interceptors });
  // Hold streams are server streams: fetch reads them like a watch. Admit is refused by the transport.
  return { endpoint, unary: transport, streams: () => transport, defaultOwner: pageOwner, lockPath: pageLockPath };
}

/** `browser Chrome 131 tab on http://localhost:3000`: who holds a lock or waits in the queue, as a person would name the tab. */
export function pageOwner(): string {
  const { navigator, location } = globalThis as { navigator?: { userAgent?: unknown }; location?: { origin?: unknown } };
  const browser = browserOf(typeof navigator?.userAgent === "string" ? navigator.userAgent : "");
  const origin = typeof location?.origin === "string" && location.origin !== "null" ? location.origin : undefined;
  return ["browser", browser, "tab", origin === undefined ? undefined : `on ${origin}`].filter((part) => part !== undefined).join(" ");
}

/** The browser and its major version from a user agent (`Chrome 131`); undefined when none is recognised. */
export function browserOf(userAgent: string): string | undefined {
  // Most specific first: Edge and Opera name Chrome too, Chrome names Safari.
  for (const [token, name] of [
    ["Edg", "Edge"],
    ["OPR", "Opera"],
    ["Firefox", "Firefox"],
    ["HeadlessChrome", "HeadlessChrome"],
    ["Chrome", "Chrome"],
    ["Version", "Safari"],
  ] as const) {
    const version = new RegExp(`(?:^|[\\s(;])${token}/(\\d+)`).exec(userAgent)?.[1];
    if (version !== undefined) return `${name} ${version}`;
  }
  return undefined;
}

/** A lock path from a page: absolute as given, or under `cwd`; a relative one without `cwd` is refused before anything is sent. */
function pageLockPath(file: string, cwd: string | undefined): string {
  if (cwd !== undefined || file.startsWith("/")) return joinLockPath(file, cwd ?? "/");
  const rule = "must be an absolute path: a page has no working directory to resolve a relative one against (give the absolute path, or cwd)";
  throw clientError(`file: ${rule}, got ${JSON.stringify(file.slice(0, 200))}`, Code.InvalidArgument, "INVALID_FIELD", {
    metadata: { field: "file", rule },
    details: [
      { desc: BadRequestSchema, value: create(BadRequestSchema, { fieldViolations: [{ field: "file", description: rule, reason: "INVALID_FIELD" }] }) },
    ],
  });
}
