/**
 * `berth budget check|state|limits|machine|watch|fleet|build-done`: look at the load budget without
 * admitting anything (and end a build phase from inside `berth admit`). Human output by default
 * (tables, in bold on a terminal; `watch` rewrites its line in place there), `--json` for scripts:
 * the messages in proto JSON form, one per line.
 *
 * This module is the command's help and command line; the calls are in budget-run.ts, loaded once
 * the command line is known to be right.
 */
import { parseFlags, usageError, UsageError, type FlagSpec } from "../args.js";
import { endpointFromFlags } from "../run/endpoint-flags.js";
import { NEED_FLAGS, NEED_HELP_ROWS } from "../run/need-flags.js";
import { EXIT, type Command, type SubcommandHelp } from "../command.js";
import { BUDGET_ENDPOINT_FLAGS, callExitRows } from "../common-help.js";
import { renderHelp, type HelpRow } from "../help.js";
import type { BudgetInvocation, SubcommandName } from "./budget-invocation.js";

const JSON_ROW = (what: string): HelpRow => ["--json", `print ${what} as JSON (proto JSON form), one object per line`];
const OK_ROW: HelpRow = [String(EXIT.ok), "done"];

interface Subcommand extends SubcommandHelp {
  readonly name: SubcommandName;
  /** Flags of its own (besides --json and the endpoint's). */
  readonly flags: Readonly<Record<string, FlagSpec>>;
  /** At most this many positionals (default none). */
  readonly maxPositionals?: number;
}

const SUBCOMMANDS: readonly Subcommand[] = [
  {
    name: "check",
    summary: "would a need be admitted now? (exit 0: fits, 82: it would wait, 80: never)",
    help: renderHelp({
      usage: ["berth budget check [--memory SIZE] [--cpu N] [--build-memory SIZE] [--build-cpu N] [flags]"],
      about:
        "Asks whether a need would be admitted now, without admitting it: fits, would wait (and for what, held by whom), " +
        "or can never fit (and which setting is too small). The answer is the exit code too.",
      flags: [...NEED_HELP_ROWS, JSON_ROW("the verdict"), ...BUDGET_ENDPOINT_FLAGS],
      exitCodes: [
        [String(EXIT.ok), "fits: it would be admitted now"],
        [String(EXIT.wouldWait), "it fits the budget but not now: it would wait"],
        [String(EXIT.impossible), "it can never fit the budget"],
        ...callExitRows("budget"),
      ],
      examples: [
        "berth budget check --memory 2G --cpu 2",
        "berth budget check --memory 1G --build-memory 4G --build-cpu 4 --json",
        'berth budget check --memory 8G && echo "room now"',
      ],
    }),
    flags: NEED_FLAGS,
  },
  {
    name: "state",
    summary: "what is committed, the queue, reservations, running work, the policy and the machine",
    help: renderHelp({
      usage: ["berth budget state [--all] [--page-size N] [flags]"],
      about:
        "Prints the budget (committed of the policy's memory and cpu), the machine (available memory, load, pressure), " +
        "and tables of what is committed, the queue (position, need, ETA, what it waits for), the reservations and " +
        "the running work, each with how many there are in all. A long list shows its first page (100 entries, " +
        "--page-size) and how many more there are; --all fetches the rest, page by page.",
      flags: [
        ["--all", "every entry of the queue, the reservations and the running work, not only the first page"],
        ["--page-size N", "entries per page, 1 to 1000 (default: the service's, 100)"],
        JSON_ROW("the whole state"),
        ...BUDGET_ENDPOINT_FLAGS,
      ],
      exitCodes: [OK_ROW, ...callExitRows("budget")],
      examples: ["berth budget state", "berth budget state --all --json | jq -r '.queue[].owner'", "berth budget state --json | jq .queueSize"],
    }),
    flags: { all: { type: "boolean" }, "page-size": { type: "string" } },
  },
  {
    name: "limits",
    summary: "the limits the service enforces: lease ttls, the longest wait, the queue's size",
    help: renderHelp({
      usage: ["berth budget limits [flags]"],
      about:
        "Prints the limits the budget service enforces: the lease a Reserve gets when it asks for none and the longest it may ask, " +
        "the longest wait in the queue (what --max-wait defaults to, and its cap), how often a waiter hears its place, " +
        "how many requests the queue holds, and the longest owner.",
      flags: [JSON_ROW("the limits"), ...BUDGET_ENDPOINT_FLAGS],
      exitCodes: [OK_ROW, ...callExitRows("budget")],
      examples: ["berth budget limits", "berth budget limits --json | jq -r .maxWait"],
    }),
    flags: {},
  },
  {
    name: "machine",
    summary: "the last machine sample (memory, load, pressure, cgroup limits)",
    help: renderHelp({
      usage: ["berth budget machine [flags]"],
      about:
        "Prints the budget service's last sample of the machine: memory available and total, load, pressure (PSI), the cgroup's limits, and how old the sample is.",
      flags: [JSON_ROW("the sample"), ...BUDGET_ENDPOINT_FLAGS],
      exitCodes: [OK_ROW, ...callExitRows("budget")],
      examples: ["berth budget machine", "berth budget machine --json | jq .machine.availableBytes"],
    }),
    flags: {},
  },
  {
    name: "watch",
    summary: "every new machine sample, until Ctrl-C",
    help: renderHelp({
      usage: ["berth budget watch [flags]"],
      about:
        "Prints every new machine sample as the budget service takes it, until Ctrl-C or SIGTERM: on a terminal one line " +
        "rewritten in place, elsewhere one line per sample.",
      flags: [JSON_ROW("each sample"), ...BUDGET_ENDPOINT_FLAGS],
      exitCodes: [[String(EXIT.ok), "stopped with Ctrl-C or SIGTERM"], ...callExitRows("budget")],
      examples: ["berth budget watch", "berth budget watch --json | jq -c '.machine.availableBytes'"],
    }),
    flags: {},
  },
  {
    name: "events",
    summary: "every change of the queue, reservations, running tally and policy, until Ctrl-C",
    help: renderHelp({
      usage: ["berth budget events [flags]"],
      about:
        "Prints the budget's current state (one line per queued request, reservation, running entry and the policy), then one " +
        "line per change as it happens (WatchBudget), each with its revision, until Ctrl-C or SIGTERM. A watch the service ends " +
        "for falling behind resumes where the service says, missing and repeating no change (a line on stderr says so).",
      flags: [JSON_ROW("each message"), ...BUDGET_ENDPOINT_FLAGS],
      exitCodes: [[String(EXIT.ok), "stopped with Ctrl-C or SIGTERM"], ...callExitRows("budget")],
      examples: ["berth budget events", "berth budget events --json | jq -c '.event.kind'"],
    }),
    flags: {},
  },
  {
    name: "fleet",
    summary: "every live machine of the fleet (--store etcd): which box has room now",
    help: renderHelp({
      usage: ["berth budget fleet [--page-size N] [flags]"],
      about:
        "Prints every live machine whose budget publishes to the fleet view (budgets started with --store etcd on one cluster), " +
        "the roomiest first: what a new need could take there now (its budget less what is committed, and no more memory than " +
        "is free beyond its reserve), what it has committed, its queue, its memory and load, and when it last published; then " +
        "which machine has room now. Admission stays per machine: ask that machine's budget. A machine whose budget stops " +
        "leaves the list at once, one whose budget dies within its --fleet-ttl.",
      flags: [
        ["--page-size N", "machines per call, 1 to 1000 (default: the service's, 100); every page is fetched"],
        JSON_ROW("the fleet (every page in one object)"),
        ...BUDGET_ENDPOINT_FLAGS,
      ],
      exitCodes: [OK_ROW, ...callExitRows("budget")],
      examples: ["berth budget fleet", "berth budget fleet --json | jq -r '.machines[] | select(.queueLength == 0) | .machine'"],
    }),
    flags: { "page-size": { type: "string" } },
  },
  {
    name: "build-done",
    summary: "end the build phase of a reservation (default: $BERTH_RESERVATION_ID, set by 'berth admit')",
    help: renderHelp({
      usage: ["berth budget build-done [RESERVATION_ID] [flags]"],
      about:
        "Ends the build phase of a reservation: its build cost is given back and it holds only its run cost from now on. " +
        "Without RESERVATION_ID, the one in BERTH_RESERVATION_ID, which 'berth admit' sets for the command it runs.",
      flags: [JSON_ROW("the reservation as it is now"), ...BUDGET_ENDPOINT_FLAGS],
      exitCodes: [OK_ROW, [String(EXIT.notFound), "no such reservation (released already?)"], ...callExitRows("budget")],
      examples: [
        "berth budget build-done                     # from a command run by 'berth admit'",
        "berth budget build-done 0b6f2c1e-8d3a-4c55-9f0e-5a7d2b1c9e44 --json",
        "berth admit --memory 1G --build-memory 4G -- sh -c 'make && berth budget build-done && ./server'",
      ],
    }),
    flags: {},
    maxPositionals: 1,
  },
];

const HELP = renderHelp({
  usage: ["berth budget <command> [flags]"],
  about: "Looks at the load budget without admitting anything ('berth admit' admits).",
  commands: SUBCOMMANDS.map((s) => [s.name, s.summary]),
  flags: [
    ...NEED_HELP_ROWS.map(([flag, text]): HelpRow => [flag, `check: ${text}`]),
    ["--all", "state: every entry of each list, not only the first page"],
    ["--page-size N", "state, fleet: entries per page (default 100)"],
    ["--json", "the answer as JSON (proto JSON form), one object per line"],
    ...BUDGET_ENDPOINT_FLAGS,
  ],
  exitCodes: [
    [String(EXIT.ok), "done (check: the need fits now)"],
    [String(EXIT.wouldWait), "check: the need would wait"],
    [String(EXIT.impossible), "check: the need can never fit"],
    [String(EXIT.notFound), "build-done: no such reservation"],
    ...callExitRows("budget"),
  ],
  examples: [
    "berth budget check --memory 2G --cpu 2",
    "berth budget state",
    "berth budget state --all --json | jq -r '.queue[].owner'",
    "berth budget limits",
    "berth budget machine",
    "berth budget watch --json",
    "berth budget fleet             # with --store etcd: which box has room now",
    "berth budget build-done        # from a command run by 'berth admit'",
  ],
  footer: "Run 'berth budget <command> --help' for a command's own flags, exit codes and examples.",
});

/** `berth budget …`. */
export const budgetCommand: Command = {
  name: "budget",
  help: HELP,
  subcommands: SUBCOMMANDS,
  async run(argv) {
    const [name, ...rest] = argv;
    const sub = SUBCOMMANDS.find((s) => s.name === name);
    // main checks the subcommand first; this is for a caller that did not.
    if (sub === undefined) return usageError("berth budget", `unknown command '${name ?? ""}'`);
    const where = `berth budget ${sub.name}`;
    let invocation: BudgetInvocation;
    try {
      const parsed = parseFlags(
        rest,
        { ...sub.flags, json: { type: "boolean" }, "budget-url": { type: "string" }, "token-file": { type: "string" }, help: { type: "boolean", short: "h" } },
        true,
      );
      const max = sub.maxPositionals ?? 0;
      if (parsed.positionals.length > max) throw new UsageError(`unexpected argument '${parsed.positionals[max]}'`);
      invocation = {
        subcommand: sub.name,
        values: parsed.values,
        positionals: parsed.positionals,
        endpoint: endpointFromFlags("budget", parsed.values),
        json: parsed.values["json"] === true,
      };
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError(where, error.message);
    }
    // The calls, and the generated code they need, load only now: help and usage errors are quick.
    const { runBudget } = await import("./budget-run.js");
    return runBudget(invocation, where);
  },
};
