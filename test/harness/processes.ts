/**
 * Berth services as child processes for end-to-end tests: spawn the built entry point on ephemeral
 * ports with a fresh state directory, wait for its "listening" log lines, collect its output, stop
 * or kill it, and clean up whatever a test left running. Only processes started here are ever
 * signalled, and only while this module still knows them to be running.
 */
import { spawn, type ChildProcess } from "node:child_process";
import * as http from "node:http";
import { mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { entryPoint, REPO_ROOT, SERVERS_OF, type ServiceKind } from "./repo.js";

/** How a process ended: exactly one of the two is set. */
export interface ExitStatus {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
}

/** Base URLs of the servers a process runs (`http://127.0.0.1:PORT`, or `unix:/path`). */
export interface ServiceUrls {
  sessions?: string;
  budget?: string;
}

/** One parsed pino log line. */
export type LogEntry = Record<string, unknown> & { msg?: string; level?: number };

/** Options of {@link startService} and {@link launchService}. */
export interface ServiceOptions {
  /**
   * The state directory. Default: `<fresh temp dir>/state`, which does not exist yet, so the
   * service creates it (and the temp dir is removed by {@link stopAll}). A directory passed here is
   * never removed by the harness: make it with {@link makeTempDir} to have it cleaned up.
   */
  stateDir?: string;
  /**
   * More command-line flags, placed after the harness's own (`--state-dir`, `--*-port 0`,
   * `--log-level info`): a later flag wins, so `["--log-level", "debug"]` overrides the default.
   */
  args?: readonly string[];
  /**
   * Environment additions; a value of `undefined` removes the variable. The child starts from this
   * process's environment without any `BERTH_*`/`BACKLOT_*` variable, so a developer's own
   * settings never leak into a test.
   */
  env?: Readonly<Record<string, string | undefined>>;
  /** Run the service under this umask (e.g. `0o000` to check it sets its own modes). Default: inherited. */
  umask?: number;
  /** Run the service with this limit on open descriptors (`ulimit -n`, soft and hard). Default: inherited. */
  fdLimit?: number;
  /** Pass `--sessions-port 0` / `--budget-port 0` (default true). */
  ephemeralPorts?: boolean;
  /** How long {@link startService} waits for every "listening" line and a SERVING health answer. Default 15 s. */
  readyTimeoutMs?: number;
}

/** What became of a launched process first: it listened on every port, or it exited. */
export type LaunchOutcome = { readonly state: "listening"; readonly urls: ServiceUrls } | { readonly state: "exited"; readonly status: ExitStatus };

/** A launched service process (maybe not listening yet: see `ready` and `outcome`). */
export interface ServiceProcess {
  readonly kind: ServiceKind;
  readonly pid: number;
  readonly stateDir: string;
  /** The full command line, for error messages. */
  readonly command: readonly string[];
  /** Filled in as the "listening" lines arrive. */
  readonly urls: ServiceUrls;
  /**
   * Settles once the process listens on every port (`listening`) or exits before that (`exited`).
   * Rejects only when neither happens within `readyTimeoutMs` (the process is then killed).
   */
  readonly outcome: Promise<LaunchOutcome>;
  /**
   * Resolves with the URLs once every server listens and has answered a health Check with SERVING
   * (Connect JSON over HTTP/1.1); rejects, with the process's output, if it exited or timed out first.
   */
  readonly ready: Promise<ServiceUrls>;
  /** Resolves when the process has exited and its output is fully read. */
  readonly exited: Promise<ExitStatus>;
  /** The exit status once exited, else undefined. */
  exitStatus(): ExitStatus | undefined;
  /** The base URL of one of its servers; throws if that server is not (yet) listening. */
  url(server: "sessions" | "budget"): string;
  /** Complete stdout lines so far (pino JSON, one per line). */
  logs(): string[];
  /** The stdout lines that parse as JSON objects. */
  entries(): LogEntry[];
  /** Everything written to stderr so far (refusals such as "already served by pid N" go there). */
  stderr(): string;
  /** stdout and stderr together, labelled, for assertion messages. */
  output(): string;
  /**
   * Resolves with the first log entry (already written or still to come) matching `predicate`;
   * rejects after `timeoutMs` (default 10 s) or when the process exits without writing one.
   */
  waitForLog(predicate: (entry: LogEntry) => boolean, timeoutMs?: number): Promise<LogEntry>;
  /**
   * Sends `signal` (default SIGTERM) and resolves with the exit status. If the process has not
   * exited after `timeoutMs` (default 10 s), it is SIGKILLed and the promise rejects with its
   * output: a service that ignores SIGTERM is a bug to see, not to wait out.
   */
  stop(signal?: NodeJS.Signals, timeoutMs?: number): Promise<ExitStatus>;
  /** SIGKILL; resolves with the exit status. */
  kill(): Promise<ExitStatus>;
}

/** A service process that was listening on every port of its kind when `startService` resolved. */
export type StartedService = ServiceProcess;

/** The default wait for "listening": generous, for a loaded 2-core machine. */
export const DEFAULT_READY_TIMEOUT_MS = 15_000;
const DEFAULT_STOP_TIMEOUT_MS = 10_000;

const live = new Set<ServiceProcess & { child: ChildProcess }>();
const tempDirs = new Set<string>();
const cleanups = new Set<() => void | Promise<void>>();

// If the test worker dies without running afterAll, do not leave services behind. Only children
// this module started and that have not exited are signalled (ChildProcess.kill is a no-op after exit).
process.once("exit", () => {
  for (const service of live) service.child.kill("SIGKILL");
});

/** A fresh directory under the system temp dir, removed by {@link stopAll}. */
export function makeTempDir(prefix = "berth-e2e-"): string {
  const dir = mkdtempSync(path.join(tmpdir(), prefix));
  tempDirs.add(dir);
  return dir;
}

/** Runs `cleanup` in {@link stopAll} (after the processes are gone): for clients, files... */
export function onStopAll(cleanup: () => void | Promise<void>): () => void {
  cleanups.add(cleanup);
  return () => void cleanups.delete(cleanup);
}

/**
 * Starts a service and waits until it listens on every port of its kind (one for `sessions` and
 * `budget`, both for `up`) and each server answers health Check with SERVING. Rejects, with the
 * process's output, if it exits first or is not ready within `readyTimeoutMs`.
 *
 * ```ts
 * const sessions = await startService("sessions");
 * const health = grpcJsHealthClient(sessions.url("sessions"));
 * afterAll(stopAll);
 * ```
 */
export async function startService(kind: ServiceKind, options: ServiceOptions = {}): Promise<StartedService> {
  const service = launchService(kind, options);
  await service.ready;
  return service;
}

/**
 * Spawns a service without waiting for it: for races and for instances expected to refuse to
 * start. `outcome` says whether it came to listen or exited.
 */
export function launchService(kind: ServiceKind, options: ServiceOptions = {}): ServiceProcess {
  const entry = entryPoint(kind);
  const stateDir = options.stateDir ?? path.join(makeTempDir(), "state");
  const ports = options.ephemeralPorts === false ? [] : SERVERS_OF[kind].flatMap((server) => [`--${server}-port`, "0"]);
  const nodeArgs = [entry.script, ...entry.args, "--state-dir", stateDir, ...ports, "--log-level", "info", ...(options.args ?? [])];

  let file = process.execPath;
  let args = nodeArgs;
  if (options.umask !== undefined || options.fdLimit !== undefined) {
    // `exec` keeps the pid: the shell becomes node, so `pid` still names the service.
    const umask = options.umask === undefined ? "" : `umask ${options.umask.toString(8).padStart(3, "0")} && `;
    const limit = options.fdLimit === undefined ? "" : `ulimit -n ${options.fdLimit} && `;
    file = "/bin/sh";
    args = ["-c", `${umask}${limit}exec "$@"`, "sh", process.execPath, ...nodeArgs];
  }

  const child = spawn(file, args, { cwd: REPO_ROOT, env: childEnv(options.env), stdio: ["ignore", "pipe", "pipe"] });
  if (child.pid === undefined) throw new Error(`could not spawn ${[file, ...args].join(" ")}`);
  const pid = child.pid;
  const command = [process.execPath, ...nodeArgs];

  const lines: string[] = [];
  const entries: LogEntry[] = [];
  let partial = "";
  let stderrText = "";
  let status: ExitStatus | undefined;
  const urls: ServiceUrls = {};
  const expected = SERVERS_OF[kind];
  // resolve(undefined) means the process exited first.
  const logWaiters = new Set<{ predicate: (entry: LogEntry) => boolean; resolve: (entry: LogEntry | undefined) => void }>();

  let settleOutcome: (outcome: LaunchOutcome) => void = () => {};
  let failOutcome: (error: Error) => void = () => {};
  const outcome = new Promise<LaunchOutcome>((resolve, reject) => {
    settleOutcome = resolve;
    failOutcome = reject;
  });
  let outcomeSettled = false;

  const onLine = (line: string) => {
    lines.push(line);
    let entry: LogEntry | undefined;
    try {
      const parsed: unknown = JSON.parse(line);
      if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) entry = parsed as LogEntry;
    } catch {
      // not JSON: kept in logs() only
    }
    if (entry === undefined) return;
    entries.push(entry);
    for (const waiter of logWaiters) {
      if (waiter.predicate(entry)) {
        logWaiters.delete(waiter);
        waiter.resolve(entry);
      }
    }
    if (entry.msg === "listening" && typeof entry.server === "string" && typeof entry.url === "string") {
      if (entry.server === "sessions" || entry.server === "budget") urls[entry.server] = entry.url;
      if (!outcomeSettled && expected.every((server) => urls[server] !== undefined)) {
        outcomeSettled = true;
        settleOutcome({ state: "listening", urls: { ...urls } });
      }
    }
  };

  child.stdout!.setEncoding("utf8");
  child.stdout!.on("data", (chunk: string) => {
    partial += chunk;
    let newline: number;
    while ((newline = partial.indexOf("\n")) >= 0) {
      onLine(partial.slice(0, newline));
      partial = partial.slice(newline + 1);
    }
  });
  child.stderr!.setEncoding("utf8");
  child.stderr!.on("data", (chunk: string) => {
    stderrText += chunk;
  });

  // 'close' comes after 'exit' and after stdio has ended: by then every line has been seen.
  const exited = new Promise<ExitStatus>((resolve) => {
    child.once("close", (code, signal) => {
      if (partial.length > 0) {
        onLine(partial);
        partial = "";
      }
      status = { code, signal };
      live.delete(handle);
      for (const waiter of logWaiters) waiter.resolve(undefined);
      logWaiters.clear();
      if (!outcomeSettled) {
        outcomeSettled = true;
        settleOutcome({ state: "exited", status });
      }
      resolve(status);
    });
  });

  const output = () => `--- command: ${command.join(" ")}\n--- stdout:\n${lines.join("\n")}${partial}\n--- stderr:\n${stderrText}`;

  const readyTimeoutMs = options.readyTimeoutMs ?? DEFAULT_READY_TIMEOUT_MS;
  const readyTimer = setTimeout(() => {
    if (outcomeSettled) return;
    outcomeSettled = true;
    child.kill("SIGKILL");
    failOutcome(new Error(`${kind} (pid ${pid}) was not listening on ${expected.join(" and ")} within ${readyTimeoutMs} ms; killed it\n${output()}`));
  }, readyTimeoutMs);
  void outcome.finally(() => clearTimeout(readyTimer)).catch(() => {});

  const readyBy = Date.now() + readyTimeoutMs;
  const ready = outcome.then(async (result) => {
    if (result.state === "exited") {
      const how = result.status.signal !== null ? `was killed by ${result.status.signal}` : `exited with code ${result.status.code}`;
      throw new Error(`${kind} (pid ${pid}) ${how} before listening\n${output()}`);
    }
    // The "listening" line is written before the process has finished starting (its signal
    // handlers are installed after every server listens): an RPC answered means the start-up code
    // has run to its end, so a signal sent now meets the service's own handlers.
    for (const url of Object.values(result.urls)) {
      await probeHealth(url, readyBy, () => status !== undefined).catch((error: Error) => {
        throw new Error(`${kind} (pid ${pid}) listens at ${url} but health did not answer SERVING: ${error.message}\n${output()}`);
      });
    }
    return result.urls;
  });
  ready.catch(() => {}); // a caller of launchService may only look at `outcome`

  const handle: ServiceProcess & { child: ChildProcess } = {
    child,
    kind,
    pid,
    stateDir,
    command,
    urls,
    outcome,
    ready,
    exited,
    exitStatus: () => status,
    url(server) {
      const url = urls[server];
      if (url === undefined) throw new Error(`${kind} (pid ${pid}) has no ${server} server listening\n${output()}`);
      return url;
    },
    logs: () => [...lines],
    entries: () => [...entries],
    stderr: () => stderrText,
    output,
    waitForLog(predicate, timeoutMs = 10_000) {
      const seen = entries.find(predicate);
      if (seen !== undefined) return Promise.resolve(seen);
      if (status !== undefined) return Promise.reject(new Error(`${kind} (pid ${pid}) exited without the awaited log line\n${output()}`));
      return new Promise<LogEntry>((resolve, reject) => {
        const timer = setTimeout(() => {
          logWaiters.delete(waiter);
          reject(new Error(`${kind} (pid ${pid}) wrote no matching log line within ${timeoutMs} ms\n${output()}`));
        }, timeoutMs);
        const waiter = {
          predicate,
          resolve: (entry: LogEntry | undefined) => {
            clearTimeout(timer);
            if (entry === undefined) reject(new Error(`${kind} (pid ${pid}) exited without the awaited log line\n${output()}`));
            else resolve(entry);
          },
        };
        logWaiters.add(waiter);
      });
    },
    async stop(signal = "SIGTERM", timeoutMs = DEFAULT_STOP_TIMEOUT_MS) {
      if (status !== undefined) return status;
      child.kill(signal);
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<"timeout">((resolve) => (timer = setTimeout(() => resolve("timeout"), timeoutMs)));
      const result = await Promise.race([exited, timedOut]);
      clearTimeout(timer);
      if (result !== "timeout") return result;
      child.kill("SIGKILL");
      await exited;
      throw new Error(`${kind} (pid ${pid}) did not exit within ${timeoutMs} ms of ${signal}; killed it\n${output()}`);
    },
    async kill() {
      if (status !== undefined) return status;
      child.kill("SIGKILL");
      return exited;
    },
  };
  live.add(handle);
  return handle;
}

/**
 * Kills (SIGKILL) every service process still running that this module started, then runs the
 * {@link onStopAll} cleanups (clients close) and removes the temp dirs made by {@link makeTempDir}.
 * Meant for `afterAll(stopAll)` / `afterEach(stopAll)`; safe to call any number of times.
 */
export async function stopAll(): Promise<void> {
  const running = [...live];
  await Promise.all(running.map((service) => service.kill()));
  const pending = [...cleanups];
  cleanups.clear();
  await Promise.allSettled(pending.map(async (cleanup) => cleanup()));
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
  tempDirs.clear();
}

/** The processes started here that are still running (for assertions such as "nothing left behind"). */
export function runningServices(): readonly ServiceProcess[] {
  return [...live];
}

function childEnv(extra: ServiceOptions["env"]): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (name.startsWith("BERTH_") || name.startsWith("BACKLOT_")) continue;
    env[name] = value;
  }
  for (const [name, value] of Object.entries(extra ?? {})) {
    if (value === undefined) delete env[name];
    else env[name] = value;
  }
  return env;
}

/** A TCP socket in the LISTEN state. */
export interface ListeningSocket {
  /** `127.0.0.1`, `0.0.0.0`, `::1`, `::`… */
  readonly address: string;
  readonly port: number;
}

/**
 * The TCP sockets process `pid` listens on, read from /proc (Linux): what it really bound, not what
 * it logged. Binds nothing and connects to nothing.
 */
export function listeningSockets(pid: number): ListeningSocket[] {
  const inodes = new Set<string>();
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const match = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`));
      if (match) inodes.add(match[1]!);
    } catch {
      // the descriptor closed while we read the directory
    }
  }
  const sockets: ListeningSocket[] = [];
  for (const table of ["tcp", "tcp6"]) {
    // The table of the process's own network namespace.
    const rows = readFileSync(`/proc/${pid}/net/${table}`, "utf8").split("\n").slice(1);
    for (const row of rows) {
      const fields = row.trim().split(/\s+/);
      const [local, state, inode] = [fields[1], fields[3], fields[9]];
      if (local === undefined || state !== "0A" || inode === undefined || !inodes.has(inode)) continue;
      const [hexAddress = "", hexPort = ""] = local.split(":");
      sockets.push({ address: decodeProcAddress(hexAddress), port: parseInt(hexPort, 16) });
    }
  }
  return sockets;
}

/** /proc/net/tcp{,6} addresses are 32-bit words in host (little-endian) byte order. */
function decodeProcAddress(hex: string): string {
  const words = hex.match(/.{8}/g) ?? [];
  const bytes = words.flatMap((word) => (word.match(/../g) ?? []).reverse().map((b) => parseInt(b, 16)));
  if (bytes.length === 4) return bytes.join(".");
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(((bytes[i]! << 8) | bytes[i + 1]!).toString(16));
  // Let the URL parser write the canonical (compressed) form.
  return new URL(`http://[${groups.join(":")}]/`).hostname.slice(1, -1);
}

/** Health Check (Connect JSON over HTTP/1.1, no keep-alive) until SERVING, the deadline, or `gone()`. */
async function probeHealth(url: string, deadline: number, gone: () => boolean): Promise<void> {
  let last = "no answer";
  while (Date.now() < deadline && !gone()) {
    try {
      const answer = await healthCheckOnce(url, Math.max(1, deadline - Date.now()));
      if (answer === "SERVING") return;
      last = `status ${answer}`;
    } catch (error) {
      last = (error as Error).message;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  throw new Error(gone() ? `the process exited (last: ${last})` : `last: ${last}`);
}

/**
 * One health Check over Connect JSON on a fresh HTTP/1.1 connection (no client library, no pooled
 * connection): the status string (`SERVING`…), or `HTTP <status>: <body>` when the answer is not one.
 * `url` may be `unix:/path`.
 */
export function healthCheckOnce(url: string, timeoutMs = 5_000): Promise<string> {
  const socketPath = url.startsWith("unix:") ? url.slice("unix:".length) : undefined;
  const target = new URL(`${socketPath === undefined ? url : "http://localhost"}/grpc.health.v1.Health/Check`);
  return new Promise((resolve, reject) => {
    const request = http.request(
      target,
      { method: "POST", agent: false, socketPath, timeout: timeoutMs, headers: { "content-type": "application/json" } },
      (response) => {
        let body = "";
        response.setEncoding("utf8");
        response.on("data", (chunk: string) => (body += chunk));
        response.on("end", () => {
          try {
            resolve(String((JSON.parse(body) as { status?: unknown }).status ?? `HTTP ${response.statusCode}: ${body}`));
          } catch {
            resolve(`HTTP ${response.statusCode}: ${body.slice(0, 200)}`);
          }
        });
        response.on("error", reject);
      },
    );
    request.on("timeout", () => request.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    request.on("error", reject);
    request.end("{}");
  });
}
