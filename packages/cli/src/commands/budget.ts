/**
 * `berth budget check|state|limits|machine|watch|build-done`: look at the load budget without
 * admitting anything (and end a build phase from inside `berth admit`). Human output by default
 * (tables, in bold on a terminal; `watch` rewrites its line in place there), `--json` for scripts:
 * the messages in proto JSON form, one per line.
 */
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { toJson } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { createClient } from "@connectrpc/connect";
import type { GetStateResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import {
  BudgetService,
  CheckResponseSchema,
  GetLimitsResponseSchema,
  GetMachineResponseSchema,
  GetStateResponseSchema,
  ReleaseBuildResponseSchema,
  WatchMachineResponseSchema,
} from "@berth/api/berth/budget/v1/budget_service_pb";
import { parseFlags, stringFlag, usageError, type FlagSpec, type ParsedArgs } from "../args.js";
import { formatLimits, formatMachine, formatMachineLine, formatState, formatVerdict, resources } from "../client/budget-format.js";
import { NEED_FLAGS, NEED_HELP_ROWS, needFromFlags } from "../client/budget-need.js";
import { UsageError, createTransport, resolveEndpoint, type Endpoint } from "../client/connect.js";
import { describeFailure, reportFailure } from "../client/errors.js";
import { EXIT, type Command, type SubcommandHelp } from "../command.js";
import { BUDGET_ENDPOINT_FLAGS, DEFAULT_BUDGET_URL, callExitRows } from "../common-help.js";
import { renderHelp, type HelpRow } from "../help.js";
import { LiveLine, isTerminal, styleFor } from "../terminal.js";

type BudgetClient = Client<typeof BudgetService>;

const JSON_ROW = (what: string): HelpRow => ["--json", `print ${what} as JSON (proto JSON form), one object per line`];
const OK_ROW: HelpRow = [String(EXIT.ok), "done"];

interface Subcommand extends SubcommandHelp {
  /** Flags of its own (besides --json and the endpoint's). */
  readonly flags: Readonly<Record<string, FlagSpec>>;
  /** At most this many positionals (default none). */
  readonly maxPositionals?: number;
  run(client: BudgetClient, values: ParsedArgs["values"], positionals: string[], json: boolean): Promise<number>;
}

function printJson<D extends DescMessage>(schema: D, message: MessageShape<D>): void {
  process.stdout.write(`${JSON.stringify(toJson(schema, message))}\n`);
}

/** The largest page the service gives (a larger --page-size is treated as this by the service). */
const MAX_PAGE_SIZE = 1000;

/** `--page-size N`: 1 to 1000, or undefined for the service's default. */
function pageSizeFlag(value: unknown): number | undefined {
  if (value === undefined) return undefined;
  const text = String(value).trim();
  const n = /^\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isInteger(n) || n < 1 || n > MAX_PAGE_SIZE) throw new UsageError(`--page-size must be a whole number from 1 to ${MAX_PAGE_SIZE}, got ${JSON.stringify(value)}`);
  return n;
}

/** The rest of GetState's three lists, page by page (ListQueue, ListReservations, ListRunning), into `state`; its tokens are spent. */
async function fetchAllPages(client: BudgetClient, state: GetStateResponse, pageSize: number | undefined): Promise<void> {
  for (let token = state.queueNextPageToken; token !== ""; ) {
    const page = await client.listQueue({ pageToken: token, pageSize });
    state.queue.push(...page.queue);
    token = page.nextPageToken;
  }
  for (let token = state.reservationsNextPageToken; token !== ""; ) {
    const page = await client.listReservations({ pageToken: token, pageSize });
    state.reservations.push(...page.reservations);
    token = page.nextPageToken;
  }
  for (let token = state.runningNextPageToken; token !== ""; ) {
    const page = await client.listRunning({ pageToken: token, pageSize });
    state.running.push(...page.running);
    token = page.nextPageToken;
  }
  state.queueNextPageToken = "";
  state.reservationsNextPageToken = "";
  state.runningNextPageToken = "";
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
    async run(client, values, _positionals, json) {
      const { need } = needFromFlags(values, "check");
      const response = await client.check({ need, skipLoadGate: values["skip-load-gate"] === true });
      if (json) printJson(CheckResponseSchema, response);
      else process.stdout.write(`${formatVerdict(response.verdict)}\n`);
      const verdict = response.verdict;
      if (verdict?.impossible !== undefined) return EXIT.impossible;
      return verdict?.fits ? EXIT.ok : EXIT.wouldWait;
    },
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
    async run(client, values, _positionals, json) {
      const pageSize = pageSizeFlag(values["page-size"]);
      const response = await client.getState({ pageSize });
      if (values["all"] === true) await fetchAllPages(client, response, pageSize);
      if (json) printJson(GetStateResponseSchema, response);
      else process.stdout.write(`${formatState(response, Date.now(), styleFor(process.stdout))}\n`);
      return EXIT.ok;
    },
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
    async run(client, _values, _positionals, json) {
      const response = await client.getLimits({});
      if (json) printJson(GetLimitsResponseSchema, response);
      else process.stdout.write(`${formatLimits(response)}\n`);
      return EXIT.ok;
    },
  },
  {
    name: "machine",
    summary: "the last machine sample (memory, load, pressure, cgroup limits)",
    help: renderHelp({
      usage: ["berth budget machine [flags]"],
      about: "Prints the budget service's last sample of the machine: memory available and total, load, pressure (PSI), the cgroup's limits, and how old the sample is.",
      flags: [JSON_ROW("the sample"), ...BUDGET_ENDPOINT_FLAGS],
      exitCodes: [OK_ROW, ...callExitRows("budget")],
      examples: ["berth budget machine", "berth budget machine --json | jq .machine.availableBytes"],
    }),
    flags: {},
    async run(client, _values, _positionals, json) {
      const response = await client.getMachine({});
      if (json) printJson(GetMachineResponseSchema, response);
      else process.stdout.write(`${formatMachine(response.machine)}\n`);
      return EXIT.ok;
    },
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
    async run(client, _values, _positionals, json) {
      const call = new AbortController();
      const stop = () => call.abort();
      process.once("SIGINT", stop);
      process.once("SIGTERM", stop);
      const live = !json && isTerminal(process.stdout) ? new LiveLine(process.stdout) : undefined;
      try {
        for await (const response of client.watchMachine({}, { signal: call.signal })) {
          if (json) printJson(WatchMachineResponseSchema, response);
          else if (live !== undefined) live.show(formatMachineLine(response.machine));
          else process.stdout.write(`${formatMachineLine(response.machine)}\n`);
        }
      } catch (error) {
        // Interrupted by the user: the normal way to stop watching.
        if (call.signal.aborted) return EXIT.ok;
        throw error;
      } finally {
        // The last sample stays on the screen.
        if (live !== undefined) process.stdout.write("\n");
        process.off("SIGINT", stop);
        process.off("SIGTERM", stop);
      }
      return EXIT.ok;
    },
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
    async run(client, _values, positionals, json) {
      const id = positionals[0] ?? process.env["BERTH_RESERVATION_ID"];
      if (id === undefined || id === "") throw new UsageError("give the reservation id, or run it from a command started by 'berth admit' (BERTH_RESERVATION_ID)");
      const response = await client.releaseBuild({ reservationId: id });
      if (json) printJson(ReleaseBuildResponseSchema, response);
      else process.stdout.write(`build phase over: '${response.reservation?.owner}' now holds ${resources(response.reservation?.start)}\n`);
      return EXIT.ok;
    },
  },
];

const HELP = renderHelp({
  usage: ["berth budget <command> [flags]"],
  about: "Looks at the load budget without admitting anything ('berth admit' admits).",
  commands: SUBCOMMANDS.map((s) => [s.name, s.summary]),
  flags: [
    ...NEED_HELP_ROWS.map(([flag, text]): HelpRow => [flag, `check: ${text}`]),
    ["--all", "state: every entry of each list, not only the first page"],
    ["--page-size N", "state: entries per page (default 100)"],
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
    let endpoint: Endpoint;
    let parsed: ParsedArgs;
    try {
      parsed = parseFlags(
        rest,
        { ...sub.flags, json: { type: "boolean" }, "budget-url": { type: "string" }, "token-file": { type: "string" }, help: { type: "boolean", short: "h" } },
        true,
      );
      const max = sub.maxPositionals ?? 0;
      if (parsed.positionals.length > max) throw new UsageError(`unexpected argument '${parsed.positionals[max]}'`);
      endpoint = resolveEndpoint({
        url: stringFlag(parsed.values, "budget-url"),
        urlEnv: "BERTH_BUDGET_URL",
        defaultUrl: DEFAULT_BUDGET_URL,
        tokenFile: stringFlag(parsed.values, "token-file"),
      });
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError(where, error.message);
    }
    const json = parsed.values["json"] === true;
    const client = createClient(BudgetService, createTransport(endpoint));
    try {
      return await sub.run(client, parsed.values, parsed.positionals, json);
    } catch (error) {
      if (error instanceof UsageError) return usageError(where, error.message);
      return reportFailure(where, describeFailure(error, "budget", endpoint.url), json);
    }
  },
};
