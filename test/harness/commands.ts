/**
 * Real command-line clients for end-to-end tests: `curl` (Connect JSON over HTTP/1.1, `/metrics`)
 * and `buf curl` (a gRPC client that learns the schema from server reflection alone). Each runs as
 * a child process with a timeout, so a hung server fails the test with what the command printed.
 */
import { spawn } from "node:child_process";
import { bufBinary, REPO_ROOT } from "./repo.js";

/** The result of {@link runCommand}. */
export interface CommandResult {
  /** The exit code; null when killed by a signal (the timeout included). */
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
  /** True when the command was killed for running past its timeout. */
  readonly timedOut: boolean;
}

/** Options of {@link runCommand}. */
export interface CommandOptions {
  /** Written to the command's stdin (then closed). */
  input?: string;
  /** Default 20 s; the command is then SIGKILLed. */
  timeoutMs?: number;
  /** Environment additions (`undefined` removes a variable). */
  env?: Readonly<Record<string, string | undefined>>;
  /** Default the repository root. */
  cwd?: string;
}

/** Runs a command to completion and collects its output. Never rejects for a non-zero exit. */
export function runCommand(command: string, args: readonly string[], options: CommandOptions = {}): Promise<CommandResult> {
  const env: NodeJS.ProcessEnv = { ...process.env };
  for (const [name, value] of Object.entries(options.env ?? {})) {
    if (value === undefined) delete env[name];
    else env[name] = value;
  }
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: options.cwd ?? REPO_ROOT, env, stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    let timedOut = false;
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill("SIGKILL");
    }, options.timeoutMs ?? 20_000);
    child.once("error", (error) => {
      clearTimeout(timer);
      reject(new Error(`cannot run ${command}: ${error.message}`, { cause: error }));
    });
    child.once("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, timedOut });
    });
    // A command that exits without reading its input must not crash the test with EPIPE.
    child.stdin.on("error", () => {});
    child.stdin.end(options.input ?? "");
  });
}

/** An HTTP response as curl saw it. */
export interface CurlResponse {
  readonly status: number;
  /** Response headers, names lower-cased (the last value wins). */
  readonly headers: Readonly<Record<string, string>>;
  readonly body: string;
}

/** Options of {@link curl}. */
export interface CurlOptions {
  /** Default GET, or POST when there is a body. */
  method?: string;
  /** Request headers by name. */
  headers?: Readonly<Record<string, string>>;
  body?: string;
  /** `--max-time`; default 10 s. */
  timeoutMs?: number;
}

/**
 * One HTTP/1.1 request with the real `curl` binary to `url` + `path` (`url` is a service's base
 * URL: `http://127.0.0.1:PORT` or `unix:/path`). Rejects only when curl itself fails (connection
 * refused, timeout), with curl's message; any HTTP status resolves.
 */
export async function curl(url: string, path: string, options: CurlOptions = {}): Promise<CurlResponse> {
  const timeoutMs = options.timeoutMs ?? 10_000;
  const args = ["--silent", "--show-error", "--http1.1", "--include", "--max-time", String(timeoutMs / 1000)];
  let target = `${url}${path}`;
  if (url.startsWith("unix:")) {
    args.push("--unix-socket", url.slice("unix:".length));
    target = `http://localhost${path}`;
  }
  const method = options.method ?? (options.body !== undefined ? "POST" : "GET");
  if (method === "HEAD") args.push("--head");
  else args.push("--request", method);
  for (const [name, value] of Object.entries(options.headers ?? {})) args.push("--header", `${name}: ${value}`);
  if (options.body !== undefined) args.push("--data-binary", "@-");
  args.push(target);

  const result = await runCommand("curl", args, { input: options.body ?? "", timeoutMs: timeoutMs + 5_000 });
  if (result.code !== 0) {
    throw new Error(`curl ${method} ${target} failed (exit ${result.code ?? result.signal}): ${result.stderr.trim()}`);
  }
  return parseHttpResponse(result.stdout);
}

/** Splits curl's `--include` output; skips interim (1xx) responses. */
function parseHttpResponse(raw: string): CurlResponse {
  let rest = raw;
  for (;;) {
    const end = rest.indexOf("\r\n\r\n");
    const head = end < 0 ? rest : rest.slice(0, end);
    const body = end < 0 ? "" : rest.slice(end + 4);
    const [statusLine = "", ...headerLines] = head.split("\r\n");
    const match = /^HTTP\/[\d.]+ (\d{3})/.exec(statusLine);
    if (!match) throw new Error(`curl printed no HTTP status line: ${JSON.stringify(raw.slice(0, 200))}`);
    const status = Number(match[1]);
    if (status >= 100 && status < 200 && end >= 0) {
      rest = body;
      continue;
    }
    const headers: Record<string, string> = {};
    for (const line of headerLines) {
      const colon = line.indexOf(":");
      if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
    }
    return { status, headers, body };
  }
}

/** A Connect JSON response: the HTTP status and the parsed body (undefined when it is not JSON). */
export interface CurlJsonResponse extends CurlResponse {
  readonly json: unknown;
}

/**
 * A Connect unary call with JSON over HTTP/1.1 using the real `curl` binary: POST `url` + `path`
 * (`/package.Service/Method`) with `body` (an object, serialised, or a string sent as is).
 * Success is status 200 with the response message; an error is a non-200 status with
 * `{"code": "unauthenticated", "message": …}` (Connect's error body).
 *
 * ```ts
 * const { status, json } = await curlJson(url, "/grpc.health.v1.Health/Check", {});
 * ```
 */
export async function curlJson(url: string, path: string, body: unknown, headers: Readonly<Record<string, string>> = {}): Promise<CurlJsonResponse> {
  const response = await curl(url, path, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  let json: unknown;
  try {
    json = JSON.parse(response.body);
  } catch {
    json = undefined;
  }
  return { ...response, json };
}

/** The result of {@link bufCurl}: the command's result plus stdout parsed as JSON when it is. */
export interface BufCurlResult extends CommandResult {
  readonly json: unknown;
  /**
   * The gRPC status code of the call as buf curl reports it: 0 on success; for an RPC error buf
   * exits with the code shifted left by three bits. Undefined when buf failed before or outside
   * the RPC (exit codes 1–7: bad flags, no schema, a request it could not encode…).
   */
  readonly grpcCode: number | undefined;
}

/**
 * Runs `buf curl <args>` (the binary `npx buf` runs), a client that knows nothing of berth but what
 * server reflection tells it. Pass the flags and the URL, e.g.
 * `bufCurl(["--protocol", "grpc", "--http2-prior-knowledge", "--list-services", url])`.
 */
export async function bufCurl(args: readonly string[], options: CommandOptions = {}): Promise<BufCurlResult> {
  const result = await runCommand(bufBinary(), ["curl", ...args], { timeoutMs: 30_000, ...options });
  let json: unknown;
  try {
    json = JSON.parse(result.stdout);
  } catch {
    json = undefined;
  }
  const code = result.code;
  const grpcCode = code === 0 ? 0 : code !== null && code >= 8 && code % 8 === 0 ? code >> 3 : undefined;
  return { ...result, json, grpcCode };
}
