/**
 * How `berth` commands reach a service: the URL (flag > environment > default), the bearer token
 * (`BERTH_TOKEN` or a token file), and a Connect transport over them. One helper for every
 * command, so that `berth sessions …` and `berth budget …` find and authenticate the same way.
 */
import { readFileSync } from "node:fs";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";

/** Where a command connects and with which token. */
export interface Endpoint {
  /** `http://127.0.0.1:7301`, or `unix:/path/to/socket`. */
  readonly url: string;
  readonly token?: string | undefined;
}

/** Options of {@link resolveEndpoint}. */
export interface EndpointOptions {
  /** The URL flag's value, when given (`--sessions-url`). */
  readonly url?: string | undefined;
  /** The variable naming the URL (`BERTH_SESSIONS_URL`). */
  readonly urlEnv: string;
  /** The URL when neither flag nor variable gives one. */
  readonly defaultUrl: string;
  /** The `--token-file` flag's value, when given. */
  readonly tokenFile?: string | undefined;
  readonly env?: NodeJS.ProcessEnv;
}

/** A command-line mistake: the command prints the message and exits with the usage code. */
export class UsageError extends Error {
  override name = "UsageError";
}

/**
 * The URL the service itself would listen on, from the variables that configure the service
 * (`BERTH_SESSIONS_SOCKET`, else `BERTH_HOST` and `BERTH_SESSIONS_PORT`): a shell, a compose file or
 * an env file set up for `berth up` then works for the commands too. `urlEnv` names the service:
 * `BERTH_SESSIONS_URL` → `BERTH_SESSIONS_*`.
 */
function serverSettingsUrl(urlEnv: string, defaultUrl: string, env: NodeJS.ProcessEnv): string | undefined {
  const prefix = urlEnv.replace(/URL$/, "");
  const socket = nonEmpty(env[`${prefix}SOCKET`]);
  if (socket !== undefined) return `unix:${socket}`;
  const port = nonEmpty(env[`${prefix}PORT`]);
  const host = nonEmpty(env.BERTH_HOST);
  if (port === undefined && host === undefined) return undefined;
  // A service listening on every address is reached on loopback.
  const reachable = host === undefined || host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host.includes(":") ? `[${host}]` : host;
  return `http://${reachable}:${port ?? new URL(defaultUrl).port}`;
}

/**
 * The endpoint from flags and environment: the URL from the flag, else `urlEnv`, else the default;
 * the token from `--token-file`, else `BERTH_TOKEN_FILE`, else `BERTH_TOKEN` (a file wins because
 * a flag naming one is the more deliberate choice). Throws UsageError for a URL that is neither
 * `http(s)://` nor `unix:`, or an unreadable or empty token file.
 */
export function resolveEndpoint(options: EndpointOptions): Endpoint {
  const env = options.env ?? process.env;
  const url = nonEmpty(options.url) ?? nonEmpty(env[options.urlEnv]) ?? serverSettingsUrl(options.urlEnv, options.defaultUrl, env) ?? options.defaultUrl;
  if (!/^https?:\/\/[^/]+/.test(url) && !/^unix:.+/.test(url)) {
    throw new UsageError(`${options.url !== undefined ? "the URL" : options.urlEnv} must look like http://127.0.0.1:7301 or unix:/path/to/socket, got ${JSON.stringify(url)}`);
  }
  const tokenFile = nonEmpty(options.tokenFile) ?? nonEmpty(env.BERTH_TOKEN_FILE);
  let token = nonEmpty(env.BERTH_TOKEN);
  if (tokenFile !== undefined) {
    try {
      token = readFileSync(tokenFile, "utf8").trim();
    } catch (error) {
      throw new UsageError(`cannot read the token file ${tokenFile}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`);
    }
    if (token === "") throw new UsageError(`the token file ${tokenFile} is empty`);
  }
  return { url: url.replace(/\/+$/, ""), token };
}

/** The interceptor that sends the endpoint's token as `authorization: Bearer …` (none without a token). */
export function bearerInterceptors(endpoint: Endpoint): Interceptor[] {
  const token = endpoint.token;
  if (token === undefined) return [];
  return [
    (next) => (req) => {
      req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    },
  ];
}

/**
 * A transport to `endpoint`: the Connect protocol with binary messages over HTTP/1.1 (the fastest
 * client here, and server streams work over it), or over a unix socket for a `unix:` URL. The
 * token, when any, goes in `authorization: Bearer …` on every call.
 */
export function createTransport(endpoint: Endpoint): Transport {
  const interceptors = bearerInterceptors(endpoint);
  if (endpoint.url.startsWith("unix:")) {
    return createConnectTransport({
      baseUrl: "http://localhost",
      httpVersion: "1.1",
      useBinaryFormat: true,
      interceptors,
      nodeOptions: { socketPath: endpoint.url.slice("unix:".length) },
    });
  }
  return createConnectTransport({ baseUrl: endpoint.url, httpVersion: "1.1", useBinaryFormat: true, interceptors });
}

function nonEmpty(value: string | undefined): string | undefined {
  return value === undefined || value.trim() === "" ? undefined : value;
}
