/**
 * `berth lock hold FILE -- CMD`, `berth lock inspect FILE` and `berth lock limits`: source locks
 * from a shell.
 *
 * `hold` is flock(1) over the sessions service: one Hold stream carries the whole hold. While it
 * waits, the service's `waiting` messages say who holds the file; once granted, CMD runs with the
 * terminal inherited and the fencing token in its environment. CMD's exit releases the lock. If
 * this process dies instead (killed, crashed), its connection closes, the stream ends and the
 * service frees the lock at once.
 */
import { spawn } from "node:child_process";
import { hostname, userInfo } from "node:os";
import * as path from "node:path";
import { toJson } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampMs, type Duration, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import {
  GetLimitsResponseSchema,
  HolderKind,
  InspectResponseSchema,
  LockHeldSchema,
  LockService,
  type GetLimitsResponse,
  type Holder,
  type HoldResponse,
  type InspectResponse,
  type Lease,
  type LockHeld,
} from "@berth/api/berth/locks/v1/lock_service_pb";
import { formatDuration } from "@berth/shared/units";
import { parseFlags, stringFlag, usageError, type FlagSpec } from "../args.js";
import { durationFlag } from "../client/budget-need.js";
import { createTransport, resolveEndpoint, UsageError, type Endpoint } from "../client/connect.js";
import { describeFailure, reportFailure } from "../client/errors.js";
import { createHttp2Transport } from "../client/http2-transport.js";
import { absoluteLockPath } from "../client/lock-path.js";
import { progressFor, type Progress } from "../client/progress.js";
import { relaySignals, signalExit } from "../client/wrapped-command.js";
import { EXIT, type Command, type SubcommandHelp } from "../command.js";
import { DEFAULT_SESSIONS_URL, SESSIONS_ENDPOINT_FLAGS, callExitRows } from "../common-help.js";
import { renderHelp } from "../help.js";
import { styleFor } from "../terminal.js";

const HOLD_HELP = renderHelp({
  usage: ["berth lock hold FILE [flags] -- CMD [ARGS…]"],
  about:
    "Like flock(1): waits for FILE's lock, runs CMD while holding it (stdin, stdout and stderr inherited) and releases " +
    "it when CMD exits, whatever ends this command (exit, Ctrl-C, kill -9: the service frees the lock the moment the " +
    "connection goes). These are the same locks as every berth client's and every process still using the seed's " +
    "source-lock library on the same project. FILE is resolved against the current directory, as flock(1) and the seed do, " +
    "and every spelling of one file is one lock: through a symlinked directory, with '..', from another directory.\n\n" +
    "CMD gets BERTH_FENCING_TOKEN (the grant's fencing token) and BERTH_LOCK_FILE (the locked file's canonical path) in its environment, " +
    "for fenced writes: berth sessions append … --fence-file \"$BERTH_LOCK_FILE\" --fence-token \"$BERTH_FENCING_TOKEN\".",
  flags: [
    ["--max-wait DURATION", "give up after waiting this long: 0 tries once; 30s, 5m (default and cap: the service's longest wait, 10m; berth lock limits)"],
    ["--owner TEXT", "who holds the lock, shown to everyone who waits (default: user@host pid N)"],
    ["--json", "progress as JSON lines on stderr even on a terminal"],
    ...SESSIONS_ENDPOINT_FLAGS,
  ],
  notes:
    "Progress goes to stderr (stdout is CMD's). On a terminal a status line, rewritten in place, shows who holds FILE, " +
    "since when, and the place in line; anywhere else (or with --json) each step is a JSON line with an \"event\": " +
    "waiting, acquired, exited, released, lost, timeout, interrupted, error. An \"exited\" event means the exit code " +
    "is CMD's.\n\n" +
    "While CMD runs, SIGTERM and SIGHUP are passed on to it, and so is SIGINT unless stdin is a terminal (there Ctrl-C " +
    "reaches CMD already); while waiting they withdraw the request. If the service goes away while CMD runs, the lock " +
    "is gone: a warning says so and CMD keeps running (fenced writes with its token are then refused).",
  exitCodes: [
    ["CMD's", "once CMD ran: its own exit code (128+N when signal N killed it)"],
    [String(EXIT.timedOut), "timed out: FILE stayed locked for the whole --max-wait (the message names the holder), or too many wait for it; retry later"],
    [String(EXIT.commandNotFound), "CMD was not found"],
    [String(EXIT.cannotRun), "CMD could not be run (not executable)"],
    ["130/143", "interrupted (SIGINT/SIGTERM) while waiting; the request was withdrawn"],
    ...callExitRows("sessions"),
  ],
  examples: [
    "berth lock hold src/app.ts -- npm run codegen",
    'berth lock hold src/app.ts --max-wait 5m --owner "codegen bot" -- ./regen.sh',
    'berth lock hold src/app.ts --max-wait 0 -- true || echo "busy"',
    "berth lock hold src/app.ts --json -- make 2>lock-events.jsonl",
  ],
});

const INSPECT_HELP = renderHelp({
  usage: ["berth lock inspect FILE [flags]"],
  about:
    "Who holds FILE's lock (owner, kind, fencing token, since when, expiry), who waits for it, in order, and the last " +
    "fencing token granted. FILE is resolved against the current directory; the answer names its canonical path (symlinked " +
    "directories and '..' resolved), the same for every spelling of the file.",
  flags: [["--json", "print the answer as one JSON line: {file, holder, waiters, lastFencingToken, lockPath}"], ...SESSIONS_ENDPOINT_FLAGS],
  exitCodes: [[String(EXIT.ok), "done (held or free)"], ...callExitRows("sessions")],
  examples: ["berth lock inspect src/app.ts", "berth lock inspect src/app.ts --json | jq .holder"],
});

const LIMITS_HELP = renderHelp({
  usage: ["berth lock limits [flags]"],
  about:
    "The limits the sessions service's locks enforce: a lease's default and longest ttl, the longest wait (what an " +
    "unset --max-wait means, and the cap of a longer one), how often a held lock's stream gets a heartbeat, how many may " +
    "wait for one file, and the longest owner.",
  flags: [["--json", "print the answer as one JSON line: {defaultTtl, maxTtl, maxWait, heartbeatInterval, maxWaitersPerFile, maxOwnerLength}"], ...SESSIONS_ENDPOINT_FLAGS],
  exitCodes: [[String(EXIT.ok), "done"], ...callExitRows("sessions")],
  examples: ["berth lock limits", "berth lock limits --json | jq -r .maxWait"],
});

const HELP = renderHelp({
  usage: ["berth lock hold FILE [flags] -- CMD [ARGS…]", "berth lock inspect FILE [flags]", "berth lock limits [flags]"],
  about:
    "Source locks of the sessions service: the same locks as every berth client and every process still using the " +
    "seed's source-lock library on the same project.",
  commands: [
    ["hold FILE -- CMD", "like flock(1): wait for FILE's lock, run CMD while holding it, release when CMD exits"],
    ["inspect FILE", "who holds FILE's lock, who waits, and the last fencing token"],
    ["limits", "the lease ttls, the longest wait and the other limits the locks enforce"],
  ],
  flags: [
    ["--max-wait DURATION", "hold: give up after waiting this long: 0 tries once; 30s, 5m (default and cap: the service's longest wait, 10m)"],
    ["--owner TEXT", "hold: who holds the lock, shown to everyone who waits (default: user@host pid N)"],
    ["--json", "inspect, limits: one JSON line; hold: progress as JSON lines on stderr (the default when stderr is not a terminal)"],
    ...SESSIONS_ENDPOINT_FLAGS,
  ],
  exitCodes: [
    ["CMD's", "hold, once CMD ran: its own exit code (128+N when signal N killed it)"],
    [String(EXIT.timedOut), "hold timed out: FILE stayed locked (the message names the holder), or too many wait for it"],
    ["126/127", "hold: CMD could not be run / was not found"],
    ["130/143", "hold: interrupted (SIGINT/SIGTERM) while waiting"],
    ...callExitRows("sessions"),
  ],
  examples: [
    "berth lock hold src/app.ts -- npm run codegen",
    'berth lock hold src/app.ts --max-wait 5m --owner "codegen bot" -- ./regen.sh',
    'berth lock hold src/app.ts --max-wait 0 -- true || echo "busy"',
    "berth lock inspect src/app.ts",
    "berth lock inspect src/app.ts --json | jq .holder",
    "berth lock limits",
  ],
  footer: "Run 'berth lock hold --help', 'berth lock inspect --help' or 'berth lock limits --help' for more.",
});

const SUBCOMMANDS: readonly SubcommandHelp[] = [
  { name: "hold", summary: "wait for FILE's lock, run CMD while holding it, release when CMD exits", help: HOLD_HELP },
  { name: "inspect", summary: "who holds FILE's lock, who waits, and the last fencing token", help: INSPECT_HELP },
  { name: "limits", summary: "the lease ttls, the longest wait and the other limits the locks enforce", help: LIMITS_HELP },
];

const FLAGS: Readonly<Record<string, FlagSpec>> = {
  owner: { type: "string" },
  "max-wait": { type: "string" },
  json: { type: "boolean" },
  "sessions-url": { type: "string" },
  "token-file": { type: "string" },
  help: { type: "boolean", short: "h" },
};

const INSPECT_FLAGS: Readonly<Record<string, FlagSpec>> = {
  json: { type: "boolean" },
  "sessions-url": { type: "string" },
  "token-file": { type: "string" },
  help: { type: "boolean", short: "h" },
};

interface Invocation {
  readonly action: "hold" | "inspect";
  readonly file: string;
  readonly owner: string;
  /** Unset: the service's longest wait. */
  readonly maxWaitMs: number | undefined;
  readonly json: boolean;
  readonly command: string[];
  readonly endpoint: Endpoint;
}

/** Splits `hold|inspect FILE [flags] [-- CMD ARGS…]`. */
function parse(action: "hold" | "inspect", argv: string[]): Invocation {
  const separator = argv.indexOf("--");
  const own = separator < 0 ? argv : argv.slice(0, separator);
  const parsed = parseFlags(own, action === "hold" ? FLAGS : INSPECT_FLAGS, true);
  const [file, ...extra] = parsed.positionals;
  if (file === undefined || file === "") throw new UsageError(`no FILE given: berth lock ${action} FILE${action === "hold" ? " -- CMD" : ""}`);
  const command = separator < 0 ? [] : argv.slice(separator + 1);
  if (action === "hold") {
    if (extra.length > 0) throw new UsageError(`unexpected argument '${extra[0]}': put -- before the command (berth lock hold FILE -- CMD)`);
    if (command.length === 0 || command[0] === "") throw new UsageError("no command to run: berth lock hold FILE [flags] -- CMD [ARGS…]");
  } else if (extra.length > 0 || separator >= 0) {
    throw new UsageError(extra.length > 0 ? `unexpected argument '${extra[0]}': inspect takes one FILE` : "inspect takes one FILE and no command");
  }
  const values = parsed.values;
  const maxWaitMs = durationFlag(values["max-wait"], "--max-wait");
  const endpoint = resolveEndpoint({ url: stringFlag(values, "sessions-url"), urlEnv: "BERTH_SESSIONS_URL", defaultUrl: DEFAULT_SESSIONS_URL, tokenFile: stringFlag(values, "token-file") });
  return {
    action,
    // Resolved here, where "the current directory" means the user's; the service refuses relative paths.
    file: absoluteLockPath(file),
    owner: stringFlag(values, "owner") ?? defaultOwner(),
    maxWaitMs,
    json: values.json === true,
    command,
    endpoint,
  };
}

function defaultOwner(): string {
  let user = process.env.USER ?? "";
  try {
    user = userInfo().username;
  } catch {
    // no passwd entry (a container's arbitrary uid): keep $USER
  }
  return `${user || "someone"}@${hostname()} pid ${process.pid}`;
}

const iso = (ts: Timestamp | undefined) => (ts === undefined ? undefined : new Date(timestampMs(ts)).toISOString());

function kindName(kind: HolderKind): string {
  switch (kind) {
    case HolderKind.LEASE:
      return "lease";
    case HolderKind.STREAM:
      return "hold";
    case HolderKind.SEED_LOCK_FILE:
      return "seed lock file";
    default:
      return "unknown";
  }
}

/** "alice (lease, fencing token 7) since 2026-… (12s ago)" */
function describeHolder(holder: { owner: string; kind: HolderKind; fencingToken: bigint; acquireTime?: Timestamp | undefined; pid?: number | undefined }): string {
  const who = holder.owner === "" ? "an unknown owner" : holder.owner;
  const facts = [kindName(holder.kind)];
  if (holder.fencingToken > 0n) facts.push(`fencing token ${holder.fencingToken}`);
  if (holder.kind === HolderKind.SEED_LOCK_FILE && holder.pid !== undefined) facts.push(`pid ${holder.pid}`);
  const since = holder.acquireTime === undefined ? "" : ` since ${iso(holder.acquireTime)} (${formatDuration(Math.max(0, Date.now() - timestampMs(holder.acquireTime)))} ago)`;
  return `${who} (${facts.join(", ")})${since}`;
}

function holderJson(holder: Holder | LockHeld | undefined): Record<string, unknown> | undefined {
  if (holder === undefined) return undefined;
  return {
    owner: holder.owner,
    kind: kindName(holder.kind),
    fencing_token: Number(holder.fencingToken),
    since: iso(holder.acquireTime),
    ...(holder.pid === undefined ? {} : { pid: holder.pid }),
  };
}


/** Runs `berth lock hold`; resolves with the exit code. */
async function hold(invocation: Invocation): Promise<number> {
  const { file, owner, maxWaitMs, command, endpoint } = invocation;
  const progress = progressFor("berth lock", invocation.json);
  const client = createClient(LockService, createHttp2Transport(endpoint));
  const call = new AbortController();
  const responses = client.hold({ file, owner, maxWait: maxWaitMs === undefined ? undefined : durationFromMs(maxWaitMs) }, { signal: call.signal })[Symbol.asyncIterator]();

  const relay = relaySignals(() => call.abort());
  const started = Date.now();

  try {
    // 1. Wait for the grant.
    let lease: Lease;
    let waited = false;
    for (;;) {
      let result: IteratorResult<HoldResponse>;
      try {
        result = await responses.next();
      } catch (error) {
        progress.done();
        return refused(error, invocation, progress, relay.interrupted);
      }
      if (result.done) {
        const message = "the service ended the stream before granting the lock";
        progress.event("error", { code: "unknown", exit: EXIT.failed, message }, message, "error");
        return EXIT.failed;
      }
      const kind = result.value.kind;
      if (kind.case === "waiting") {
        const { position, holder } = kind.value;
        waited = true;
        progress.waiting("waiting", { file, position, holder: holderJson(holder) }, () => {
          const by = holder === undefined ? "" : `, held by ${describeHolderBriefly(holder)}`;
          return `waiting for ${shortPath(file)}${by}; #${position} in line, waited ${formatDuration(roundSeconds(Date.now() - started))}`;
        });
      } else if (kind.case === "acquired") {
        lease = kind.value;
        break;
      }
    }
    const waitedMs = Date.now() - started;
    progress.event(
      "acquired",
      { file: lease.file, fencing_token: Number(lease.fencingToken), owner: lease.owner, waited_ms: waitedMs },
      waited ? `acquired ${lease.file} after ${formatDuration(roundSeconds(waitedMs))} (fencing token ${lease.fencingToken})` : undefined,
    );
    progress.done();

    // 2. Run CMD; keep reading the stream (heartbeats, or its loss).
    const spawned = spawn(command[0]!, command.slice(1), {
      stdio: "inherit",
      env: { ...process.env, BERTH_FENCING_TOKEN: String(lease.fencingToken), BERTH_LOCK_FILE: lease.file },
    });
    relay.child = spawned;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: NodeJS.ErrnoException }>((resolve) => {
      spawned.once("error", (error: NodeJS.ErrnoException) => resolve({ code: null, signal: null, error }));
      spawned.once("exit", (code, signal) => resolve({ code, signal }));
    });
    let lost = false;
    // Once CMD has exited the hold is ours to end (our Release ends the stream at once): not a loss.
    let commandDone = false;
    void (async () => {
      try {
        for (;;) {
          const result = await responses.next();
          if (result.done) break;
        }
        if (call.signal.aborted || commandDone) return;
        lost = true;
        const message = `lost the lock on ${file}: the service ended the hold; ${command[0]} keeps running without it`;
        progress.event("lost", { message }, message, "warn");
      } catch (error) {
        if (call.signal.aborted || commandDone) return;
        lost = true;
        const message = `lost the lock on ${file} (${ConnectError.from(error).rawMessage}); ${command[0]} keeps running without it`;
        progress.event("lost", { message }, message, "warn");
      }
    })();

    const outcome = await exited;
    commandDone = true;
    let code: number;
    if (outcome.error !== undefined) {
      code = outcome.error.code === "ENOENT" ? EXIT.commandNotFound : EXIT.cannotRun;
      const message = `cannot run ${command[0]}: ${outcome.error.message}`;
      progress.event("error", { code: outcome.error.code, exit: code, message }, message, "error");
    } else {
      code = outcome.code ?? signalExit(outcome.signal ?? "SIGKILL");
      progress.event("exited", { code: outcome.code, signal: outcome.signal });
    }

    // 3. Release before exiting, so the next holder never races this process's exit; ending the
    // stream (below) would free it too, a moment later.
    if (!lost) {
      const released = await Promise.race([
        client.release({ leaseToken: lease.leaseToken }, { timeoutMs: 2_000 }).then(
          (r) => r.released,
          () => false,
        ),
        new Promise<false>((resolve) => setTimeout(() => resolve(false), 2_500).unref()),
      ]);
      progress.event("released", { file: lease.file, fencing_token: Number(lease.fencingToken), by: released ? "release" : "stream end" });
    }
    return code;
  } finally {
    progress.done();
    relay.dispose();
    call.abort();
  }
}

/** "alice (lease, fencing token 7) for 12s": the live line's short form of {@link describeHolder}. */
function describeHolderBriefly(holder: Holder | LockHeld): string {
  const who = holder.owner === "" ? "an unknown owner" : holder.owner;
  const facts = [kindName(holder.kind)];
  if (holder.fencingToken > 0n) facts.push(`fencing token ${holder.fencingToken}`);
  const since = holder.acquireTime === undefined ? "" : ` for ${formatDuration(roundSeconds(Date.now() - timestampMs(holder.acquireTime)))}`;
  return `${who} (${facts.join(", ")})${since}`;
}

/** FILE relative to the current directory when it is inside it (as the user typed it, most often). */
function shortPath(file: string): string {
  const relative = path.relative(process.cwd(), file);
  return relative !== "" && !relative.startsWith("..") && !path.isAbsolute(relative) ? relative : file;
}

/** Whole seconds above one second, so a live line does not flicker through milliseconds. */
function roundSeconds(ms: number): number {
  return ms < 1000 ? Math.max(0, Math.round(ms)) : Math.floor(ms / 1000) * 1000;
}

/** The exit code and message for a Hold that ended before the grant. */
function refused(error: unknown, invocation: Invocation, progress: Progress, interrupted: NodeJS.Signals | undefined): number {
  if (interrupted !== undefined) {
    progress.event("interrupted", { signal: interrupted, exit: signalExit(interrupted) }, `interrupted (${interrupted}) while waiting; the request was withdrawn`, "warn");
    return signalExit(interrupted);
  }
  const e = ConnectError.from(error);
  const reason = e.code === Code.ResourceExhausted ? e.findDetails(ErrorInfoSchema)[0]?.reason : undefined;
  const [held] = reason === "WAIT_EXHAUSTED" ? e.findDetails(LockHeldSchema) : [];
  if (held !== undefined) {
    const waitedMs = held.waited === undefined ? 0 : durationMs(held.waited);
    const waited = waitedMs === 0 ? "it was not free (--max-wait 0)" : `it stayed locked for ${formatDuration(waitedMs)}`;
    const holder = held.owner === "" && held.kind === HolderKind.UNSPECIFIED ? "others queued ahead" : describeHolder(held);
    progress.event(
      "timeout",
      { file: held.file, waited_ms: waitedMs, holder: holderJson(held), exit: EXIT.timedOut, message: e.rawMessage },
      `timed out: ${held.file} is held by ${holder}; ${waited}`,
      "error",
    );
    return EXIT.timedOut;
  }
  if (reason === "TOO_MANY_WAITERS") {
    progress.event("timeout", { file: invocation.file, waited_ms: 0, exit: EXIT.timedOut, message: e.rawMessage }, `too many wait: ${e.rawMessage}`, "error");
    return EXIT.timedOut;
  }
  const failure = describeFailure(e, "sessions", invocation.endpoint.url);
  progress.event("error", { code: failure.code, exit: failure.exit, message: failure.message }, failure.message, "error");
  return failure.exit;
}

/** Runs `berth lock inspect`; resolves with the exit code. */
async function inspect(invocation: Invocation): Promise<number> {
  const client = createClient(LockService, createTransport(invocation.endpoint));
  let response: InspectResponse;
  try {
    response = await client.inspect({ file: invocation.file }, { timeoutMs: 10_000 });
  } catch (error) {
    return reportFailure("berth lock inspect", describeFailure(error, "sessions", invocation.endpoint.url), invocation.json);
  }
  if (invocation.json) {
    process.stdout.write(`${JSON.stringify(toJson(InspectResponseSchema, response, { alwaysEmitImplicit: true }))}\n`);
    return EXIT.ok;
  }
  const out = styleFor(process.stdout);
  const lines = [out.bold(response.file)];
  const holder = response.holder;
  if (holder === undefined) lines.push(`  ${out.green("free")}`);
  else {
    const expiry = holder.expireTime === undefined ? "" : `; expires ${iso(holder.expireTime)} unless renewed`;
    lines.push(`  ${out.yellow("held")} by ${describeHolder(holder)}${expiry}`);
  }
  if (response.waiters.length > 0) {
    lines.push(`  ${response.waiters.length} waiting:`);
    response.waiters.forEach((w, i) => {
      lines.push(`    ${i + 1}. ${w.owner} (${kindName(w.kind)}) since ${iso(w.waitStartTime)}, gives up at ${iso(w.waitExpireTime)}`);
    });
  }
  lines.push(`  last fencing token: ${response.lastFencingToken === 0n ? "none granted by this service run" : String(response.lastFencingToken)}`);
  if (response.lockPath !== "") lines.push(`  lock file: ${out.dim(response.lockPath)}`);
  process.stdout.write(`${lines.join("\n")}\n`);
  return EXIT.ok;
}

/** Runs `berth lock limits [flags]`; resolves with the exit code. */
async function limits(argv: string[]): Promise<number> {
  let endpoint: Endpoint;
  let json: boolean;
  try {
    const parsed = parseFlags(argv, INSPECT_FLAGS, true);
    if (parsed.positionals.length > 0) throw new UsageError(`unexpected argument '${parsed.positionals[0]}': limits takes no arguments`);
    json = parsed.values.json === true;
    endpoint = resolveEndpoint({ url: stringFlag(parsed.values, "sessions-url"), urlEnv: "BERTH_SESSIONS_URL", defaultUrl: DEFAULT_SESSIONS_URL, tokenFile: stringFlag(parsed.values, "token-file") });
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    return usageError("berth lock limits", error.message);
  }
  const client = createClient(LockService, createTransport(endpoint));
  let response: GetLimitsResponse;
  try {
    response = await client.getLimits({}, { timeoutMs: 10_000 });
  } catch (error) {
    return reportFailure("berth lock limits", describeFailure(error, "sessions", endpoint.url), json);
  }
  if (json) {
    process.stdout.write(`${JSON.stringify(toJson(GetLimitsResponseSchema, response, { alwaysEmitImplicit: true }))}\n`);
    return EXIT.ok;
  }
  const take = (d: Duration | undefined) => formatDuration(d === undefined ? 0 : durationMs(d));
  const rows: Array<[string, string]> = [
    ["lease ttl", `${take(response.defaultTtl)} unless Acquire asks another, at most ${take(response.maxTtl)}`],
    ["longest wait", `${take(response.maxWait)} (an unset --max-wait; longer ones are capped to it)`],
    ["hold heartbeat", `every ${take(response.heartbeatInterval)}`],
    ["waiters per file", String(response.maxWaitersPerFile)],
    ["owner", `at most ${response.maxOwnerLength} characters`],
  ];
  const width = Math.max(...rows.map(([name]) => name.length));
  process.stdout.write(rows.map(([name, value]) => `${name.padEnd(width)}  ${value}\n`).join(""));
  return EXIT.ok;
}

/** `berth lock …`. */
export const lockCommand: Command = {
  name: "lock",
  help: HELP,
  subcommands: SUBCOMMANDS,
  async run(argv) {
    const [action, ...rest] = argv;
    if (action === "limits") return limits(rest);
    if (action !== "hold" && action !== "inspect") return usageError("berth lock", `unknown command '${action ?? ""}': hold, inspect or limits`);
    let invocation: Invocation;
    try {
      invocation = parse(action, rest);
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError(`berth lock ${action}`, error.message);
    }
    return action === "hold" ? hold(invocation) : inspect(invocation);
  },
};
