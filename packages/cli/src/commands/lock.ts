/**
 * `berth lock hold FILE -- CMD`, `berth lock inspect FILE` and `berth lock limits`: source locks
 * from a shell.
 *
 * `hold` is flock(1) over the sessions service: one Hold stream carries the whole hold. While it
 * waits, the service's `waiting` messages say who holds the file; once granted, CMD runs with the
 * terminal inherited and the fencing token in its environment. CMD's exit releases the lock. If
 * this process dies instead (killed, crashed), its connection closes, the stream ends and the
 * service frees the lock at once.
 *
 * This module is the command's help and command line; the calls are in lock-run.ts, loaded once
 * the command line is known to be right.
 */
import { absoluteLockPath } from "@berth/client/lock-path";
import { parseFlags, stringFlag, usageError, UsageError, type FlagSpec } from "../args.js";
import { durationFlag } from "../run/need-flags.js";
import { endpointFromFlags } from "../run/endpoint-flags.js";
import { findCommand, reportCommandProblem } from "../run/find-command.js";
import { progressFor } from "../run/progress.js";
import { EXIT, type Command, type SubcommandHelp } from "../command.js";
import { SESSIONS_ENDPOINT_FLAGS, callExitRows } from "../common-help.js";
import { renderHelp } from "../help.js";
import type { LimitsInvocation, LockInvocation, WatchInvocation } from "./lock-invocation.js";

const HOLD_HELP = renderHelp({
  usage: ["berth lock hold FILE [flags] -- CMD [ARGS…]"],
  about:
    "Like flock(1): waits for FILE's lock, runs CMD while holding it (stdin, stdout and stderr inherited) and releases " +
    "it when CMD exits, whatever ends this command (exit, Ctrl-C, kill -9: the service frees the lock the moment the " +
    "connection goes). These are the same locks as every berth client's and every process still using the seed's " +
    "source-lock library on the same project. FILE is resolved against the current directory, as flock(1) and the seed do, " +
    "and every spelling of one file is one lock: through a symlinked directory, with '..', from another directory.\n\n" +
    "CMD gets BERTH_FENCING_TOKEN (the grant's fencing token) and BERTH_LOCK_FILE (the locked file's canonical path) in its environment, " +
    'for fenced writes: berth sessions append … --fence-file "$BERTH_LOCK_FILE" --fence-token "$BERTH_FENCING_TOKEN".',
  flags: [
    ["--max-wait DURATION", "give up after waiting this long: 0 tries once; 30s, 5m (default and cap: the service's longest wait, 10m; berth lock limits)"],
    ["--owner TEXT", "who holds the lock, shown to everyone who waits (default: user@host pid N)"],
    ["--json", "progress as JSON lines on stderr even on a terminal"],
    ...SESSIONS_ENDPOINT_FLAGS,
  ],
  notes:
    "Progress goes to stderr (stdout is CMD's). On a terminal a status line, rewritten in place, shows who holds FILE, " +
    'since when, and the place in line; anywhere else (or with --json) each step is a JSON line with an "event": ' +
    'waiting, acquired, exited, released, lost, timeout, interrupted, error. An "exited" event means the exit code ' +
    "is CMD's.\n\n" +
    "While CMD runs, SIGTERM and SIGHUP are passed on to it, and so is SIGINT unless stdin is a terminal (there Ctrl-C " +
    "reaches CMD already); while waiting they withdraw the request. If the service goes away while CMD runs, the lock " +
    "is gone: a warning says so and CMD keeps running (fenced writes with its token are then refused).",
  exitCodes: [
    ["CMD's", "once CMD ran: its own exit code (128+N when signal N killed it)"],
    [String(EXIT.timedOut), "timed out: FILE stayed locked for the whole --max-wait (the message names the holder), or too many wait for it; retry later"],
    [String(EXIT.commandNotFound), "CMD was not found (on PATH, or no such file): told before the service is asked"],
    [String(EXIT.cannotRun), "CMD cannot be run (no execute permission, a directory): told before the service is asked"],
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
  flags: [
    ["--json", "print the answer as one JSON line: {defaultTtl, maxTtl, maxWait, heartbeatInterval, maxWaitersPerFile, maxOwnerLength}"],
    ...SESSIONS_ENDPOINT_FLAGS,
  ],
  exitCodes: [[String(EXIT.ok), "done"], ...callExitRows("sessions")],
  examples: ["berth lock limits", "berth lock limits --json | jq -r .maxWait"],
});

const WATCH_HELP = renderHelp({
  usage: ["berth lock watch [FILE] [--current] [--from-revision N] [--progress DURATION] [flags]"],
  about:
    "Follows the locks of FILE (or of every file without one): one line per grant, release, expiry, waiter joining " +
    "or leaving, each with its revision, until Ctrl-C or SIGTERM. --current first describes the holders and waiters " +
    "now; --from-revision N replays every change after revision N (the service describes the current state instead, " +
    "marked reset, when it cannot). A watcher that falls behind resumes where it stopped: nothing is missed.",
  flags: [
    ["--current", "first describe the current holders and waiters"],
    ["--from-revision N", "replay the changes after revision N (the last one a watch printed)"],
    ["--progress DURATION", "a progress line whenever DURATION passes without a change (at least 100ms)"],
    ["--json", "one JSON line per event: {event}, {caughtUp} or {progress}"],
    ...SESSIONS_ENDPOINT_FLAGS,
  ],
  exitCodes: [[String(EXIT.ok), "stopped (Ctrl-C, SIGTERM)"], ...callExitRows("sessions")],
  examples: ["berth lock watch", "berth lock watch src/app.ts --current", "berth lock watch --from-revision 1767225600000000042 --json"],
});

const HELP = renderHelp({
  usage: ["berth lock hold FILE [flags] -- CMD [ARGS…]", "berth lock inspect FILE [flags]", "berth lock watch [FILE] [flags]", "berth lock limits [flags]"],
  about:
    "Source locks of the sessions service: the same locks as every berth client and every process still using the " +
    "seed's source-lock library on the same project.",
  commands: [
    ["hold FILE -- CMD", "like flock(1): wait for FILE's lock, run CMD while holding it, release when CMD exits"],
    ["inspect FILE", "who holds FILE's lock, who waits, and the last fencing token"],
    ["watch [FILE]", "one line per grant, release, expiry, waiter joining or leaving, until Ctrl-C"],
    ["limits", "the lease ttls, the longest wait and the other limits the locks enforce"],
  ],
  flags: [
    ["--max-wait DURATION", "hold: give up after waiting this long: 0 tries once; 30s, 5m (default and cap: the service's longest wait, 10m)"],
    ["--owner TEXT", "hold: who holds the lock, shown to everyone who waits (default: user@host pid N)"],
    ["--current", "watch: first describe the current holders and waiters"],
    ["--from-revision N", "watch: replay the changes after revision N"],
    ["--progress DURATION", "watch: a progress line whenever DURATION passes without a change"],
    ["--json", "inspect, limits: one JSON line; watch: one per event; hold: progress as JSON lines on stderr (the default when stderr is not a terminal)"],
    ...SESSIONS_ENDPOINT_FLAGS,
  ],
  exitCodes: [
    ["CMD's", "hold, once CMD ran: its own exit code (128+N when signal N killed it)"],
    [String(EXIT.timedOut), "hold timed out: FILE stayed locked (the message names the holder), or too many wait for it"],
    ["126/127", "hold: CMD cannot be run / was not found (told before the lock is asked for)"],
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
  footer: "Run 'berth lock hold --help', 'berth lock inspect --help', 'berth lock watch --help' or 'berth lock limits --help' for more.",
});

const SUBCOMMANDS: readonly SubcommandHelp[] = [
  { name: "hold", summary: "wait for FILE's lock, run CMD while holding it, release when CMD exits", help: HOLD_HELP },
  { name: "inspect", summary: "who holds FILE's lock, who waits, and the last fencing token", help: INSPECT_HELP },
  { name: "watch", summary: "one line per grant, release, expiry, waiter joining or leaving, until Ctrl-C", help: WATCH_HELP },
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

/** Splits `hold|inspect FILE [flags] [-- CMD ARGS…]`. */
function parse(action: "hold" | "inspect", argv: string[]): LockInvocation {
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
  const endpoint = endpointFromFlags("sessions", values);
  return {
    action,
    // Resolved here, where "the current directory" means the user's; the service refuses relative paths.
    file: absoluteLockPath(file),
    owner: stringFlag(values, "owner"),
    maxWaitMs,
    json: values.json === true,
    command,
    endpoint,
  };
}

const WATCH_FLAGS: Readonly<Record<string, FlagSpec>> = {
  ...INSPECT_FLAGS,
  current: { type: "boolean" },
  "from-revision": { type: "string" },
  progress: { type: "string" },
};

/** Parses `watch [FILE] [flags]`. */
function parseWatch(argv: string[]): WatchInvocation {
  const parsed = parseFlags(argv, WATCH_FLAGS, true);
  const [file, ...extra] = parsed.positionals;
  if (extra.length > 0) throw new UsageError(`unexpected argument '${extra[0]}': watch takes at most one FILE`);
  const values = parsed.values;
  const from = stringFlag(values, "from-revision");
  if (from !== undefined && !/^[0-9]{1,19}$/.test(from)) throw new UsageError(`--from-revision must be a revision a watch printed, not '${from}'`);
  const progressIntervalMs = durationFlag(values.progress, "--progress");
  if (progressIntervalMs !== undefined && progressIntervalMs < 100) throw new UsageError("--progress must be at least 100ms");
  return {
    action: "watch",
    file: file === undefined || file === "" ? undefined : absoluteLockPath(file),
    includeCurrent: values.current === true,
    startRevision: from === undefined ? 0n : BigInt(from),
    progressIntervalMs,
    json: values.json === true,
    endpoint: endpointFromFlags("sessions", values),
  };
}

/** Parses `limits [flags]`. */
function parseLimits(argv: string[]): LimitsInvocation {
  const parsed = parseFlags(argv, INSPECT_FLAGS, true);
  if (parsed.positionals.length > 0) throw new UsageError(`unexpected argument '${parsed.positionals[0]}': limits takes no arguments`);
  return { action: "limits", json: parsed.values.json === true, endpoint: endpointFromFlags("sessions", parsed.values) };
}

export const lockCommand: Command = {
  name: "lock",
  help: HELP,
  subcommands: SUBCOMMANDS,
  async run(argv) {
    const [action, ...rest] = argv;
    if (action !== "hold" && action !== "inspect" && action !== "limits" && action !== "watch")
      return usageError("berth lock", `unknown command '${action ?? ""}': hold, inspect, watch or limits`);
    let invocation: LockInvocation | LimitsInvocation | WatchInvocation;
    try {
      invocation = action === "limits" ? parseLimits(rest) : action === "watch" ? parseWatch(rest) : parse(action, rest);
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError(`berth lock ${action}`, error.message);
    }
    if (invocation.action === "hold") {
      // A command that cannot run is told now, before the lock is asked for (or waited for).
      const { problem } = findCommand(invocation.command[0]!);
      if (problem !== undefined) return reportCommandProblem(progressFor("berth lock hold", invocation.json), problem);
    }
    // The calls, and the generated code they need, load only now: help and usage errors are quick.
    const run = await import("./lock-run.js");
    if (invocation.action === "watch") return run.watch(invocation);
    return invocation.action === "limits" ? run.limits(invocation) : invocation.action === "hold" ? run.hold(invocation) : run.inspect(invocation);
  },
};
