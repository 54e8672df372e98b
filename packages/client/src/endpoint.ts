/**
 * How every berth client finds a service and its bearer token: one table, the same in the `berth`
 * command, this package and the Python and Go clients (the README's "Finding the services").
 *
 * The URL, first found wins:
 * 1. the URL given explicitly (an option, the command's `--sessions-url`/`--budget-url`);
 * 2. `BERTH_SESSIONS_URL` / `BERTH_BUDGET_URL`;
 * 3. `BERTH_SESSIONS_SOCKET` / `BERTH_BUDGET_SOCKET`, as `unix:<path>`;
 * 4. `BERTH_HOST` and `BERTH_SESSIONS_PORT` / `BERTH_BUDGET_PORT` (either one; the other takes its
 *    default), a host of `0.0.0.0` or `::` reached on `127.0.0.1`;
 * 5. `http://127.0.0.1:7301` / `http://127.0.0.1:7302`.
 *
 * Steps 3 and 4 read the variables that configure the services themselves (`berth up`), so a shell,
 * a compose file or an env file set up for the services works for their clients too.
 *
 * The token, first found wins: the token given explicitly; the file given explicitly (the
 * command's `--token-file`); the file `BERTH_TOKEN_FILE` names; `BERTH_TOKEN`; else none. A file
 * wins over `BERTH_TOKEN` because naming a file is the more deliberate choice. An empty value
 * counts as unset everywhere.
 *
 * This module imports nothing but `node:fs` and `service-urls.ts`: a command resolves its endpoint
 * (and reports a bad one as a usage error) before it loads any RPC code.
 */
import { readFileSync } from "node:fs";
import { DEFAULT_URLS, EndpointError, isHttpUrl, nonEmpty, type ServiceName } from "./service-urls.js";

export { DEFAULT_URLS, EndpointError, type ServiceName };

/** The variables of each service, by step of the table. */
export const ENDPOINT_VARIABLES: Readonly<Record<ServiceName, { url: string; socket: string; port: string }>> = {
  sessions: { url: "BERTH_SESSIONS_URL", socket: "BERTH_SESSIONS_SOCKET", port: "BERTH_SESSIONS_PORT" },
  budget: { url: "BERTH_BUDGET_URL", socket: "BERTH_BUDGET_SOCKET", port: "BERTH_BUDGET_PORT" },
};

/** What a caller may give explicitly; each wins over the environment. */
export interface EndpointOptions {
  /** The service's URL: `http://HOST:PORT` or `unix:/path/to/socket`. */
  readonly url?: string | undefined;
  /** The bearer token itself. */
  readonly token?: string | undefined;
  /** A file holding the bearer token (surrounding whitespace is dropped). */
  readonly tokenFile?: string | undefined;
  /** The environment to read. Default: `process.env`. */
  readonly env?: Readonly<Record<string, string | undefined>> | undefined;
}

/** A service's address and the token to send it. */
export interface Endpoint {
  readonly service: ServiceName;
  /** `http://127.0.0.1:7301`, or `unix:/path/to/socket` (no trailing slash). */
  readonly url: string;
  /** The row of the table the URL came from: `option`, a variable's name, or `default`. */
  readonly urlSource: string;
  /** The bearer token; undefined when none is configured. */
  readonly token?: string | undefined;
  /** Where the token came from: `option`, `token file <path>`, `BERTH_TOKEN`; undefined when none. */
  readonly tokenSource?: string | undefined;
}

type Environment = Readonly<Record<string, string | undefined>>;

/**
 * The endpoint of `service` from `options` and the environment, by the table above. Throws
 * EndpointError for a URL that is neither `http(s)://HOST[:PORT]` nor `unix:PATH`, and for a token
 * file that cannot be read or is empty.
 */
export function resolveEndpoint(service: ServiceName, options: EndpointOptions = {}): Endpoint {
  const env = options.env ?? process.env;
  const [url, urlSource] = resolveUrl(service, options.url, env);
  if (!isHttpUrl(url) && !/^unix:.+/.test(url)) {
    const what = urlSource === "option" ? `the ${service} URL` : urlSource;
    throw new EndpointError(`${what} must look like ${DEFAULT_URLS[service]} or unix:/path/to/socket, got ${JSON.stringify(url)}`);
  }
  const [token, tokenSource] = resolveToken(options, env);
  return { service, url: url.replace(/\/+$/, ""), urlSource, token, tokenSource };
}

function resolveUrl(service: ServiceName, explicit: string | undefined, env: Environment): [string, string] {
  const names = ENDPOINT_VARIABLES[service];
  const given = nonEmpty(explicit);
  if (given !== undefined) return [given, "option"];
  const fromUrl = nonEmpty(env[names.url]);
  if (fromUrl !== undefined) return [fromUrl, names.url];
  const socket = nonEmpty(env[names.socket]);
  if (socket !== undefined) return [`unix:${socket}`, names.socket];
  const port = nonEmpty(env[names.port]);
  const host = nonEmpty(env.BERTH_HOST);
  if (port !== undefined || host !== undefined) {
    // A service listening on every address is reached on loopback.
    const reachable =
      host === undefined || host === "0.0.0.0" || host === "::" ? "127.0.0.1" : host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
    const source = [host === undefined ? undefined : "BERTH_HOST", port === undefined ? undefined : names.port].filter((s) => s !== undefined).join(" and ");
    return [`http://${reachable}:${port ?? new URL(DEFAULT_URLS[service]).port}`, source];
  }
  return [DEFAULT_URLS[service], "default"];
}

function resolveToken(options: EndpointOptions, env: Environment): [string | undefined, string | undefined] {
  const token = nonEmpty(options.token);
  if (token !== undefined) return [token, "option"];
  const file = nonEmpty(options.tokenFile) ?? nonEmpty(env.BERTH_TOKEN_FILE);
  if (file !== undefined) {
    let text: string;
    try {
      text = readFileSync(file, "utf8").trim();
    } catch (error) {
      throw new EndpointError(`cannot read the token file ${file}: ${(error as NodeJS.ErrnoException).code ?? (error as Error).message}`);
    }
    if (text === "") throw new EndpointError(`the token file ${file} is empty`);
    return [text, `token file ${file}`];
  }
  const fromEnv = nonEmpty(env.BERTH_TOKEN);
  return fromEnv === undefined ? [undefined, undefined] : [fromEnv, "BERTH_TOKEN"];
}
