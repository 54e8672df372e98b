/**
 * `berth budget check|state|machine|watch|build-done`: look at the load budget without admitting
 * anything (and end a build phase from inside `berth admit`). Human output by default, `--json`
 * for scripts (the messages in proto JSON form: one object, or one per line for `watch`).
 */
import { parseArgs } from "node:util";
import type { DescMessage, MessageShape } from "@bufbuild/protobuf";
import { toJson } from "@bufbuild/protobuf";
import type { Client } from "@connectrpc/connect";
import { ConnectError, createClient } from "@connectrpc/connect";
import { BudgetService, CheckResponseSchema, GetMachineResponseSchema, GetStateResponseSchema, ReleaseBuildResponseSchema, WatchMachineResponseSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { EXIT, type Command } from "../command.js";
import { formatMachine, formatMachineLine, formatState, formatVerdict, resources } from "../client/budget-format.js";
import { NEED_FLAGS, NEED_HELP, needFromFlags } from "../client/budget-need.js";
import { UsageError, createTransport, resolveEndpoint, type Endpoint } from "../client/connect.js";
import { describeFailure } from "../client/errors.js";

const COMMON_HELP = `  --json                 the answer as proto JSON (watch: one object per line)
  --budget-url URL       the budget service (env BERTH_BUDGET_URL; default http://127.0.0.1:7302; unix:/path for a socket)
  --token-file FILE      file holding the bearer token (env BERTH_TOKEN, or BERTH_TOKEN_FILE)`;

const USAGE = `berth budget <check|state|machine|watch|build-done> [flags]

Looks at the load budget without admitting anything ('berth admit' admits).

  check       would a need be admitted now? exit 0: fits; ${EXIT.wouldWait}: it would wait (and for what); ${EXIT.impossible}: never
  state       what is committed, the queue, reservations, running work, the policy and the machine
  machine     the last machine sample (memory, load, pressure, cgroup limits)
  watch       every new machine sample, until interrupted
  build-done  end the build phase of a reservation (default: $BERTH_RESERVATION_ID, set by 'berth admit')

Flags:
${NEED_HELP}   (check)
${COMMON_HELP}

Exit codes: 0 ok; ${EXIT.unreachable} the service could not be reached; ${EXIT.usage} wrong flags; ${EXIT.notFound} no such reservation (build-done).

Examples:
  berth budget check --memory 2G --cpu 2
  berth budget check --memory 1G --build-memory 4G --build-cpu 4 --json
  berth budget state
  berth budget state --json | jq '.queue[].label'
  berth budget machine
  berth budget watch --json
  berth budget build-done        # from a command run by 'berth admit'`;

type BudgetClient = Client<typeof BudgetService>;

interface Subcommand {
  /** Flags of its own (besides --json and the endpoint's). */
  options: Record<string, { type: "string" | "boolean" }>;
  positionals?: boolean;
  run(client: BudgetClient, values: Record<string, unknown>, positionals: string[], json: boolean): Promise<number>;
}

function printJson<D extends DescMessage>(schema: D, message: MessageShape<D>, pretty = true): void {
  process.stdout.write(`${JSON.stringify(toJson(schema, message), null, pretty ? 2 : undefined)}\n`);
}

const SUBCOMMANDS: Record<string, Subcommand> = {
  check: {
    options: NEED_FLAGS,
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
  state: {
    options: {},
    async run(client, _values, _positionals, json) {
      const response = await client.getState({});
      if (json) printJson(GetStateResponseSchema, response);
      else process.stdout.write(`${formatState(response)}\n`);
      return EXIT.ok;
    },
  },
  machine: {
    options: {},
    async run(client, _values, _positionals, json) {
      const response = await client.getMachine({});
      if (json) printJson(GetMachineResponseSchema, response);
      else process.stdout.write(`${formatMachine(response.machine)}\n`);
      return EXIT.ok;
    },
  },
  watch: {
    options: {},
    async run(client, _values, _positionals, json) {
      const call = new AbortController();
      const stop = () => call.abort();
      process.once("SIGINT", stop);
      process.once("SIGTERM", stop);
      try {
        for await (const response of client.watchMachine({}, { signal: call.signal })) {
          if (json) printJson(WatchMachineResponseSchema, response, false);
          else process.stdout.write(`${formatMachineLine(response.machine)}\n`);
        }
      } catch (error) {
        // Interrupted by the user: the normal way to stop watching.
        if (call.signal.aborted) return EXIT.ok;
        throw error;
      } finally {
        process.off("SIGINT", stop);
        process.off("SIGTERM", stop);
      }
      return EXIT.ok;
    },
  },
  "build-done": {
    options: {},
    positionals: true,
    async run(client, _values, positionals, json) {
      const id = positionals[0] ?? process.env["BERTH_RESERVATION_ID"];
      if (id === undefined || id === "") throw new UsageError("build-done: give the reservation id, or run it from a command started by 'berth admit' (BERTH_RESERVATION_ID)");
      const response = await client.releaseBuild({ reservationId: id });
      if (json) printJson(ReleaseBuildResponseSchema, response);
      else process.stdout.write(`build phase over: '${response.reservation?.label}' now holds ${resources(response.reservation?.start)}\n`);
      return EXIT.ok;
    },
  },
};

export const budgetCommand: Command = {
  name: "budget",
  usage: USAGE,
  async run(argv) {
    const [name, ...rest] = argv;
    const sub = name === undefined ? undefined : SUBCOMMANDS[name];
    if (sub === undefined) {
      process.stderr.write(`berth budget: ${name === undefined ? "which one?" : `unknown subcommand '${name}'`}\n\n${USAGE}\n`);
      return EXIT.usage;
    }
    let endpoint: Endpoint;
    let values: Record<string, unknown>;
    let positionals: string[];
    try {
      const parsed = parseArgs({
        args: rest,
        options: { ...sub.options, json: { type: "boolean" }, "budget-url": { type: "string" }, "token-file": { type: "string" } },
        strict: true,
        allowPositionals: sub.positionals === true,
      });
      values = parsed.values as Record<string, unknown>;
      positionals = parsed.positionals;
      endpoint = resolveEndpoint({
        url: typeof values["budget-url"] === "string" ? values["budget-url"] : undefined,
        urlEnv: "BERTH_BUDGET_URL",
        defaultUrl: "http://127.0.0.1:7302",
        tokenFile: typeof values["token-file"] === "string" ? values["token-file"] : undefined,
      });
    } catch (error) {
      process.stderr.write(`berth budget ${name}: ${(error as Error).message}\n`);
      return EXIT.usage;
    }
    const client = createClient(BudgetService, createTransport(endpoint));
    try {
      return await sub.run(client, values, positionals, values["json"] === true);
    } catch (error) {
      if (error instanceof UsageError) {
        process.stderr.write(`berth budget ${name}: ${error.message}\n`);
        return EXIT.usage;
      }
      const failure = describeFailure(ConnectError.from(error), "budget", endpoint.url);
      process.stderr.write(`berth budget ${name}: ${failure.message}\n`);
      return failure.exit;
    }
  },
};
