/**
 * `berth admit … -- CMD`: wait for room in the budget, run CMD, release when it exits.
 *
 * One Admit stream carries the whole admission: the need goes out first; while it waits, the
 * service's Queued messages drive a live status line (a terminal) or JSON lines (anything else);
 * once admitted, CMD runs with the terminal inherited and is reported started with its pid, so the
 * budget counts it as running (and forgets it the moment the process is gone, whatever happens to
 * this one). CMD's exit releases the reservation. If this process dies instead, the stream breaks
 * and the service releases the reservation by itself.
 *
 * This module is the command's help and command line; the admission is in admit-run.ts, loaded
 * once the command line is known to be right.
 */
import { parseFlags, usageError, UsageError, type FlagSpec } from "../args.js";
import { endpointFromFlags } from "../run/endpoint-flags.js";
import { findCommand, reportCommandProblem } from "../run/find-command.js";
import { NEED_FLAGS, NEED_HELP_ROWS, durationFlag, needFromFlags } from "../run/need-flags.js";
import { progressFor } from "../run/progress.js";
import { EXIT, type Command } from "../command.js";
import { BUDGET_ENDPOINT_FLAGS, callExitRows } from "../common-help.js";
import { renderHelp } from "../help.js";
import { LONGEST_TIMER_MS } from "@berth/shared/units";
import type { AdmitInvocation } from "./admit-invocation.js";

const HELP = renderHelp({
  usage: ["berth admit [flags] -- CMD [ARGS…]"],
  about:
    "Waits until the budget service has room for what CMD needs, runs CMD (stdin, stdout and stderr inherited), reports " +
    "it started with its pid (so the budget counts it while it runs), and releases the reservation when CMD exits. If " +
    "this command dies instead, the service releases the reservation by itself.",
  flags: [
    ...NEED_HELP_ROWS,
    ["--owner TEXT", "who asks and for what, in the queue and in 'berth budget state' (default: the command line; --label is the same)"],
    ["--name NAME", "the name CMD is counted under while it runs (default: CMD's file name)"],
    ["--max-wait DURATION", "give up after waiting this long: 30s, 10m; 0: do not wait (default and cap: the service's BERTH_BUDGET_WAIT)"],
    ["--json", "progress as JSON lines on stderr even on a terminal"],
    ...BUDGET_ENDPOINT_FLAGS,
  ],
  notes:
    "Progress goes to stderr (stdout is CMD's). On a terminal a status line, rewritten in place, shows the place in the " +
    "queue, the ETA and what the need waits for; anywhere else (or with --json) each step is a JSON line with an " +
    '"event": queued, admitted, started, exited, released, refused, interrupted, lost (the service went away while ' +
    'CMD ran: CMD keeps running), error. An "exited" event means the exit code is CMD\'s. A connection that breaks is ' +
    "resumed on a new one, keeping the place in the queue or the reservation (within the service's resume grace, 15s " +
    "unless configured): lost means it could not be. The service cannot tell a berth admit killed outright (SIGKILL) " +
    "from a connection lost: it keeps that one's place or reservation until the grace ends.\n\n" +
    "CMD gets BERTH_RESERVATION_ID in its environment ('berth budget build-done' ends its build phase). SIGTERM and " +
    "SIGHUP are passed on to CMD, and so is SIGINT unless stdin is a terminal (there Ctrl-C already reaches CMD); " +
    "while waiting, they withdraw the request.",
  exitCodes: [
    ["CMD's", "once CMD ran: its own exit code (128+N when signal N killed it)"],
    [String(EXIT.impossible), "refused: the need is bigger than the whole budget (it can never be admitted)"],
    [String(EXIT.queueFull), "refused: the queue was full (BERTH_BUDGET_MAX_QUEUE); retry later"],
    [String(EXIT.timedOut), "timed out: the wait ran out (--max-wait, BERTH_BUDGET_WAIT) before the need fit (at once with --max-wait 0)"],
    [String(EXIT.commandNotFound), "CMD was not found (on PATH, or no such file): told before the service is asked"],
    [String(EXIT.cannotRun), "CMD cannot be run (no execute permission, a directory): told before the service is asked"],
    ["130/143", "interrupted (SIGINT/SIGTERM) while waiting; the request was withdrawn"],
    ...callExitRows("budget"),
  ],
  examples: [
    "berth admit --memory 2G --cpu 2 -- make -j2",
    'berth admit --memory 1G --build-memory 4G --build-cpu 4 --owner "my-tool up web" -- ./start-web.sh',
    "berth admit --memory 2G --max-wait 0 -- make    # now or not at all",
    "berth admit --memory 512M --max-wait 5m --json -- npm test 2>events.jsonl",
    "berth admit --memory 1G --build-memory 3G -- sh -c 'npm run build && berth budget build-done && npm start'",
  ],
});

const FLAGS: Readonly<Record<string, FlagSpec>> = {
  ...NEED_FLAGS,
  owner: { type: "string" },
  // Its name before v1 of the API; kept as the same flag.
  label: { type: "string" },
  name: { type: "string" },
  "max-wait": { type: "string" },
  json: { type: "boolean" },
  "budget-url": { type: "string" },
  "token-file": { type: "string" },
  help: { type: "boolean", short: "h" },
};

/** Splits `[flags] -- CMD ARGS…`. Without `--`, the first argument that is not a flag starts CMD. */
function parse(argv: string[]) {
  const separator = argv.indexOf("--");
  let parsed;
  try {
    parsed = parseFlags(separator < 0 ? argv : argv.slice(0, separator), FLAGS, separator < 0);
  } catch (error) {
    if (!(error instanceof UsageError) || separator >= 0) throw error;
    throw new UsageError(`${error.message} (a flag of CMD? put -- before the command: berth admit [flags] -- CMD)`);
  }
  const command = separator < 0 ? parsed.positionals : argv.slice(separator + 1);
  if (command.length === 0 || command[0] === "") throw new UsageError("no command to run: berth admit [flags] -- CMD [ARGS…]");
  return { values: parsed.values as Record<string, unknown>, command };
}

/** `berth admit`. */
export const admitCommand: Command = {
  name: "admit",
  help: HELP,
  async run(argv) {
    let invocation: AdmitInvocation;
    try {
      const { values, command } = parse(argv);
      invocation = {
        values,
        command,
        endpoint: endpointFromFlags("budget", values as Record<string, string>),
        need: needFromFlags(values),
        maxWaitMs: durationFlag(values["max-wait"], "--max-wait", LONGEST_TIMER_MS),
      };
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError("berth admit", error.message);
    }
    // A command that cannot run is told now, not after a wait in the queue: the service is not asked.
    const { problem } = findCommand(invocation.command[0]!);
    if (problem !== undefined) return reportCommandProblem(progressFor("berth admit", invocation.values["json"] === true), problem);
    // The admission, and the generated code it needs, load only now: help and usage errors are quick.
    const { admit } = await import("./admit-run.js");
    return admit(invocation);
  },
};
