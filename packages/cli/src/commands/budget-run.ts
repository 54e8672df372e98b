/**
 * The calls of `berth budget …` (its help and command line are in budget.ts), through
 * `@berth/client`'s budget client: only the budget service's generated code loads.
 */
import { create, type DescMessage, type MessageShape } from "@bufbuild/protobuf";
import {
  CheckResponseSchema,
  GetFleetResponseSchema,
  GetLimitsResponseSchema,
  GetMachineResponseSchema,
  GetStateResponseSchema,
  ReleaseBuildResponseSchema,
  WatchBudgetResponseSchema,
  WatchMachineResponseSchema,
  BudgetEventKind,
  type BudgetEvent,
} from "@berth/api/berth/budget/v1/budget_service_pb";
import { BudgetClient } from "@berth/client/budget";
import { usageError, UsageError } from "../args.js";
import { formatFleet, formatLimits, formatMachine, formatMachineLine, formatState, formatVerdict, resources } from "../run/budget-format.js";
import { describeFailure, reportFailure } from "../run/errors.js";
import { jsonInteger, messageJson } from "../run/json.js";
import { needFromFlags } from "../run/need-flags.js";
import { needItems } from "../run/need-items.js";
import { EXIT } from "../command.js";
import { LiveLine, isTerminal, styleFor } from "../terminal.js";
import type { BudgetInvocation } from "./budget-invocation.js";

/** A subcommand's invocation, with the client. */
interface Invocation extends BudgetInvocation {
  readonly client: BudgetClient;
}

const RUN: Record<BudgetInvocation["subcommand"], (invocation: Invocation) => Promise<number>> = {
  check,
  state,
  limits,
  machine,
  watch,
  events,
  fleet,
  "build-done": buildDone,
};

/** Runs the subcommand; resolves with the exit code. */
export async function runBudget(invocation: BudgetInvocation, where: string): Promise<number> {
  const client = new BudgetClient({ endpoint: invocation.endpoint });
  try {
    return await RUN[invocation.subcommand]({ ...invocation, client });
  } catch (error) {
    if (error instanceof UsageError) return usageError(where, error.message);
    return reportFailure(where, describeFailure(error, "budget", invocation.endpoint.url), invocation.json);
  }
}

function printJson<D extends DescMessage>(schema: D, message: MessageShape<D>): void {
  process.stdout.write(`${JSON.stringify(messageJson(schema, message))}\n`);
}

/** The largest page the service gives (a larger --page-size is treated as this by the service). */
const MAX_PAGE_SIZE = 1000;

/** `--page-size N`: 1 to 1000, or undefined for the service's default. */
function pageSizeFlag(value: unknown): number | undefined {
  if (value === undefined) return undefined;
  const text = String(value).trim();
  const n = /^\d+$/.test(text) ? Number(text) : Number.NaN;
  if (!Number.isInteger(n) || n < 1 || n > MAX_PAGE_SIZE)
    throw new UsageError(`--page-size must be a whole number from 1 to ${MAX_PAGE_SIZE}, got ${JSON.stringify(value)}`);
  return n;
}

async function check({ client, values, json }: Invocation): Promise<number> {
  const response = await client.check(needItems(needFromFlags(values), "check"), { skipLoadGate: values["skip-load-gate"] === true });
  if (json) printJson(CheckResponseSchema, response);
  else process.stdout.write(`${formatVerdict(response.verdict)}\n`);
  const verdict = response.verdict;
  if (verdict?.impossible !== undefined) return EXIT.impossible;
  return verdict?.fits ? EXIT.ok : EXIT.wouldWait;
}

async function state({ client, values, json }: Invocation): Promise<number> {
  const response = await client.state({ pageSize: pageSizeFlag(values["page-size"]), all: values["all"] === true });
  if (json) printJson(GetStateResponseSchema, response);
  else process.stdout.write(`${formatState(response, Date.now(), styleFor(process.stdout))}\n`);
  return EXIT.ok;
}

async function limits({ client, json }: Invocation): Promise<number> {
  const response = await client.limits();
  if (json) printJson(GetLimitsResponseSchema, response);
  else process.stdout.write(`${formatLimits(response)}\n`);
  return EXIT.ok;
}

async function machine({ client, json }: Invocation): Promise<number> {
  const response = await client.rpc.getMachine({});
  if (json) printJson(GetMachineResponseSchema, response);
  else process.stdout.write(`${formatMachine(response.machine)}\n`);
  return EXIT.ok;
}

async function fleet({ client, values, json }: Invocation): Promise<number> {
  // Every page: the table sorts the whole fleet by room, and a script gets one answer.
  const pageSize = pageSizeFlag(values["page-size"]);
  const machines = [];
  let pageToken = "";
  do {
    const page = await client.rpc.getFleet({ pageSize, pageToken });
    machines.push(...page.machines);
    pageToken = page.nextPageToken;
  } while (pageToken !== "");
  if (json) printJson(GetFleetResponseSchema, create(GetFleetResponseSchema, { machines }));
  else process.stdout.write(`${formatFleet(machines, Date.now(), styleFor(process.stdout))}\n`);
  return EXIT.ok;
}

async function watch({ client, json }: Invocation): Promise<number> {
  const call = new AbortController();
  const stop = () => call.abort();
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  const live = !json && isTerminal(process.stdout) ? new LiveLine(process.stdout) : undefined;
  try {
    for await (const response of client.rpc.watchMachine({}, { signal: call.signal })) {
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
}

/** One line of `berth budget events`: revision, kind, and who or what changed. */
function eventLine(event: BudgetEvent): string {
  const kind = (BudgetEventKind[event.kind] ?? String(event.kind)).toLowerCase();
  const subject = event.subject;
  let what = "";
  if (subject.case === "request") what = `${subject.value.owner} (${subject.value.id})`;
  else if (subject.case === "reservation") what = `${subject.value.owner} (${subject.value.id})`;
  else if (subject.case === "running") what = `${subject.value.name} (${subject.value.id})`;
  else if (subject.case === "policy")
    what = `budget ${resources({ $typeName: "berth.budget.v1.Resources", memoryBytes: subject.value.memoryBytes, cpu: subject.value.cpu })}`;
  return `${event.revision} ${kind} ${what}`.trimEnd();
}

async function events({ client, json }: Invocation): Promise<number> {
  const call = new AbortController();
  const stop = () => call.abort();
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
  const err = styleFor(process.stderr);
  try {
    // The client's watch resumes by itself when the service ends it for falling behind.
    for await (const item of client.watchBudget({ includeCurrent: true, signal: call.signal })) {
      if (item.kind === "event") {
        if (json) printJson(WatchBudgetResponseSchema, create(WatchBudgetResponseSchema, { kind: { case: "event", value: item.event } }));
        else process.stdout.write(`${eventLine(item.event)}\n`);
      } else if (item.kind === "caughtUp") {
        const { revision, reset } = item;
        if (json) printJson(WatchBudgetResponseSchema, create(WatchBudgetResponseSchema, { kind: { case: "caughtUp", value: { revision, reset } } }));
        else process.stdout.write(`${revision} caught up${reset ? " (reset)" : ""}\n`);
      } else if (item.kind === "resumed") {
        if (json) process.stderr.write(`${JSON.stringify({ event: "resumed", revision: jsonInteger(item.revision), reason: "fell behind the service" })}\n`);
        else process.stderr.write(`${err.yellow(`-- fell behind the service; resuming after revision ${item.revision}`)}\n`);
      }
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
}

async function buildDone({ client, positionals, json }: Invocation): Promise<number> {
  const id = positionals[0] ?? process.env["BERTH_RESERVATION_ID"];
  if (id === undefined || id === "") throw new UsageError("give the reservation id, or run it from a command started by 'berth admit' (BERTH_RESERVATION_ID)");
  // With a request id, retried when the call fails on the way (the client's releaseBuild).
  const reservation = await client.releaseBuild(id);
  if (json) printJson(ReleaseBuildResponseSchema, create(ReleaseBuildResponseSchema, { reservation }));
  else process.stdout.write(`build phase over: '${reservation?.owner}' now holds ${resources(reservation?.start)}\n`);
  return EXIT.ok;
}
