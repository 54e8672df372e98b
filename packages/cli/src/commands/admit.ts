/**
 * `berth admit … -- CMD`: wait for room in the budget, run CMD, release when it exits.
 *
 * One Admit stream carries the whole admission: the need goes out first; while it waits, the
 * service's Queued messages drive a live status line (a terminal) or JSON lines (anything else);
 * once admitted, CMD runs with the terminal inherited and is reported started with its pid, so the
 * budget counts it as running (and forgets it the moment the process is gone, whatever happens to
 * this one). CMD's exit releases the reservation. If this process dies instead, the stream breaks
 * and the service releases the reservation by itself.
 */
import { spawn } from "node:child_process";
import * as path from "node:path";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { ConnectError, createClient } from "@connectrpc/connect";
import { RefusalKind, RefusalSchema, type RunningEntry } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema, AdmitResponse } from "@berth/api/berth/budget/v1/budget_service_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { parseFlags, stringFlag, usageError, type FlagSpec } from "../args.js";
import { EXIT, type Command } from "../command.js";
import { formatQueued, gateName, roughly } from "../client/budget-format.js";
import { NEED_FLAGS, NEED_HELP_ROWS, durationFlag, needFromFlags } from "../client/budget-need.js";
import { UsageError, resolveEndpoint, type Endpoint } from "../client/connect.js";
import { describeFailure } from "../client/errors.js";
import { createHttp2Transport } from "../client/http2-transport.js";
import { progressFor } from "../client/progress.js";
import { relaySignals, signalExit } from "../client/wrapped-command.js";
import { BUDGET_ENDPOINT_FLAGS, DEFAULT_BUDGET_URL, callExitRows } from "../common-help.js";
import { renderHelp } from "../help.js";

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
    "\"event\": queued, admitted, started, exited, released, refused, interrupted, lost (the service went away while " +
    "CMD ran: CMD keeps running), error. An \"exited\" event means the exit code is CMD's.\n\n" +
    "CMD gets BERTH_RESERVATION_ID in its environment ('berth budget build-done' ends its build phase). SIGTERM and " +
    "SIGHUP are passed on to CMD, and so is SIGINT unless stdin is a terminal (there Ctrl-C already reaches CMD); " +
    "while waiting, they withdraw the request.",
  exitCodes: [
    ["CMD's", "once CMD ran: its own exit code (128+N when signal N killed it)"],
    [String(EXIT.impossible), "refused: the need is bigger than the whole budget (it can never be admitted)"],
    [String(EXIT.queueFull), "refused: the queue was full (BERTH_BUDGET_MAX_QUEUE); retry later"],
    [String(EXIT.timedOut), "timed out: the wait ran out (--max-wait, BERTH_BUDGET_WAIT) before the need fit (at once with --max-wait 0)"],
    [String(EXIT.commandNotFound), "CMD was not found"],
    [String(EXIT.cannotRun), "CMD could not be run (not executable)"],
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

type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;

/** The requests of the stream, written as the admission goes. */
class RequestStream implements AsyncIterable<AdmitRequestInit> {
  private readonly items: AdmitRequestInit[] = [];
  private ended = false;
  private wake: (() => void) | undefined;

  push(item: AdmitRequestInit): void {
    this.items.push(item);
    this.poke();
  }

  end(): void {
    this.ended = true;
    this.poke();
  }

  private poke(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<AdmitRequestInit> {
    for (;;) {
      while (this.items.length === 0 && !this.ended) await new Promise<void>((resolve) => (this.wake = resolve));
      if (this.items.length === 0) return;
      yield this.items.shift()!;
    }
  }
}

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

/** The exit code for a refused admission, and the facts to report. */
function refusal(error: ConnectError) {
  const [detail] = error.findDetails(RefusalSchema);
  if (detail === undefined) return undefined;
  const exit = detail.kind === RefusalKind.IMPOSSIBLE ? EXIT.impossible : detail.kind === RefusalKind.QUEUE_FULL ? EXIT.queueFull : EXIT.timedOut;
  const kind = detail.kind === RefusalKind.IMPOSSIBLE ? "impossible" : detail.kind === RefusalKind.QUEUE_FULL ? "queue_full" : "wait_exhausted";
  const retryAfterMs = detail.retryAfter === undefined ? undefined : durationMs(detail.retryAfter);
  return { exit, kind, message: detail.message || error.rawMessage, retryAfterMs, settings: detail.settings, waitedMs: detail.waited === undefined ? 0 : durationMs(detail.waited) };
}

/** Runs the admission; resolves with the exit code. */
async function admit(values: Record<string, unknown>, command: string[], endpoint: Endpoint): Promise<number> {
  // The service refuses control characters in owners and names: a command line may hold newlines.
  const printable = (text: string) => text.replace(/[\u0000-\u001f\u007f\s]+/g, " ").trim().slice(0, 256);
  const name = typeof values["name"] === "string" ? values["name"] : printable(path.basename(command[0]!)) || "command";
  const given = values["owner"] ?? values["label"];
  const owner = typeof given === "string" ? given : printable(command.join(" ")) || name;
  const { need, run } = needFromFlags(values, name.slice(0, 256));
  const maxWaitMs = durationFlag(values["max-wait"], "--max-wait");
  const progress = progressFor("berth admit", values["json"] === true);

  const client = createClient(BudgetService, createHttp2Transport(endpoint));
  const requests = new RequestStream();
  const call = new AbortController();
  requests.push({
    kind: {
      case: "start",
      value: {
        need,
        owner,
        skipLoadGate: values["skip-load-gate"] === true,
        maxWait: maxWaitMs === undefined ? undefined : { seconds: BigInt(Math.floor(maxWaitMs / 1000)), nanos: (maxWaitMs % 1000) * 1_000_000 },
      },
    },
  });
  const responses = client.admit(requests, { signal: call.signal })[Symbol.asyncIterator]();

  const relay = relaySignals(() => call.abort());
  const started = Date.now();

  try {
    // 1. Wait for the admission.
    let admitted: AdmitResponse["kind"] & { case: "admitted" };
    for (;;) {
      let result: IteratorResult<AdmitResponse>;
      try {
        result = await responses.next();
      } catch (error) {
        progress.done();
        if (relay.interrupted !== undefined) {
          const exit = signalExit(relay.interrupted);
          progress.event("interrupted", { signal: relay.interrupted, exit }, `interrupted (${relay.interrupted}) while waiting; the request was withdrawn`, "warn");
          return exit;
        }
        const e = ConnectError.from(error);
        const refused = refusal(e);
        if (refused !== undefined) {
          progress.event(
            "refused",
            { kind: refused.kind, exit: refused.exit, message: refused.message, retry_after_ms: refused.retryAfterMs, settings: refused.settings, waited_ms: refused.waitedMs },
            `${refused.kind === "wait_exhausted" ? "timed out" : "refused"}: ${refused.message}${refused.retryAfterMs === undefined ? "" : ` (retry in ~${roughly(refused.retryAfterMs)})`}`,
            "error",
          );
          return refused.exit;
        }
        const failure = describeFailure(e, "budget", endpoint.url);
        progress.event("error", { code: failure.code, exit: failure.exit, message: failure.message }, failure.message, "error");
        return failure.exit;
      }
      if (result.done) {
        const message = "the budget service ended the stream before admitting";
        progress.event("error", { code: "unknown", exit: EXIT.failed, message }, message, "error");
        return EXIT.failed;
      }
      const kind = result.value.kind;
      if (kind.case === "queued") {
        const queued = kind.value;
        const at = Date.now();
        progress.waiting(
          "queued",
          {
            position: queued.position,
            eta_ms: queued.eta === undefined ? undefined : durationMs(queued.eta),
            waited_ms: at - started,
            wait_for: queued.waitForText,
            gates: queued.waitFor.map((r) => gateName(r.gate)),
            ahead: queued.ahead.map((a) => ({ owner: a.owner, position: a.position })),
            wait_expire_time: queued.waitExpireTime === undefined ? undefined : new Date(timestampMs(queued.waitExpireTime)).toISOString(),
          },
          // Rendered again every second: the wait counts up; the ETA stays the service's until its next update.
          () => formatQueued(queued, Date.now() - started),
        );
      }
      else if (kind.case === "admitted") {
        admitted = kind;
        break;
      }
    }
    const reservation = admitted.value.reservation;
    const waitedMs = admitted.value.waited === undefined ? 0 : durationMs(admitted.value.waited);
    progress.event("admitted", { reservation_id: reservation?.id, waited_ms: waitedMs }, waitedMs > 0 ? `admitted after ${roughly(waitedMs)}` : undefined);

    // 2. Run CMD. From here every event is printed by this function alone, in order: the stream
    // is read in the background (`readAnswers`), which only hands the answers over.
    const answers = readAnswers(responses, call.signal);
    const spawned = spawn(command[0]!, command.slice(1), { stdio: "inherit", env: { ...process.env, BERTH_RESERVATION_ID: reservation?.id ?? "" } });
    relay.child = spawned;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: NodeJS.ErrnoException }>((resolve) => {
      spawned.once("error", (error: NodeJS.ErrnoException) => resolve({ code: null, signal: null, error }));
      spawned.once("exit", (code, signal) => resolve({ code, signal }));
    });
    await new Promise<void>((resolve) => {
      spawned.once("spawn", resolve);
      spawned.once("error", () => resolve());
    });

    let running: RunningEntry | undefined;
    if (spawned.pid !== undefined) {
      requests.push({ kind: { case: "started", value: { name: name.slice(0, 256), costSource: { case: "spec", value: run }, pid: spawned.pid } } });
      // `started` once the service counts CMD (or cannot: the stream is gone). CMD may exit first:
      // the answer is still awaited (a little), and `exited` comes after it whatever the timing.
      running = await Promise.race([answers.running, exited.then(() => Promise.race([answers.running, delay(STARTED_ANSWER_MS)]))]);
      progress.event("started", { pid: spawned.pid, running_id: running?.id });
    }

    // 3. Wait for CMD; say so at once if the service goes away meanwhile (CMD keeps running).
    const first = await Promise.race([exited.then((outcome) => ({ outcome })), answers.lost.then((message) => ({ message }))]);
    let lost = false;
    if ("message" in first) {
      lost = true;
      const message = `lost the budget service (${first.message}); ${name} keeps running`;
      progress.event("lost", { message }, message, "warn");
    }
    const outcome = "outcome" in first ? first.outcome : await exited;
    let code: number;
    if (outcome.error !== undefined) {
      code = outcome.error.code === "ENOENT" ? EXIT.commandNotFound : EXIT.cannotRun;
      const message = `cannot run ${command[0]}: ${outcome.error.message}`;
      progress.event("error", { code: outcome.error.code, exit: code, message }, message, "error");
    } else {
      code = outcome.code ?? signalExit(outcome.signal ?? "SIGKILL");
      progress.event("exited", { code: outcome.code, signal: outcome.signal });
    }

    // 4. Release: the running entry first (CMD is gone), then the reservation.
    if (!lost) {
      if (running !== undefined) {
        // The tally would drop it at its next sample anyway (the pid is gone); this makes it immediate.
        await Promise.race([client.stopRunning({ id: running.id }, { signal: call.signal }).catch(() => undefined), delay(2000)]);
      }
      requests.push({ kind: { case: "release", value: {} } });
      requests.end();
      const released = await Promise.race([answers.released, delay(3000)]);
      if (released !== undefined) progress.event("released", { reservation_id: released });
    }
    return code;
  } finally {
    relay.dispose();
    progress.done();
    requests.end();
    call.abort();
  }
}

/** How long, once CMD has exited, the service's answer to `started` is still awaited. */
const STARTED_ANSWER_MS = 2000;

/** Resolves with undefined after `ms` (without keeping the process alive). */
function delay(ms: number): Promise<undefined> {
  return new Promise((resolve) => setTimeout(() => resolve(undefined), ms).unref());
}

/** The service's answers once admitted, as promises; reading them prints nothing. */
interface Answers {
  /** The running entry the service made for `started`; undefined if the stream ended without one. */
  running: Promise<RunningEntry | undefined>;
  /** The id in `released`; undefined if the stream ended without it. */
  released: Promise<string | undefined>;
  /** Settles with the error's text if the stream fails (not when this command ended it); else never. */
  lost: Promise<string>;
}

/** Reads the rest of the Admit stream in the background. */
function readAnswers(responses: AsyncIterator<AdmitResponse>, signal: AbortSignal): Answers {
  let running: (entry: RunningEntry | undefined) => void = () => {};
  let released: (id: string | undefined) => void = () => {};
  let lost: (message: string) => void = () => {};
  const answers: Answers = {
    running: new Promise((resolve) => (running = resolve)),
    released: new Promise((resolve) => (released = resolve)),
    lost: new Promise((resolve) => (lost = resolve)),
  };
  void (async () => {
    try {
      for (;;) {
        const result = await responses.next();
        if (result.done) return;
        const kind = result.value.kind;
        if (kind.case === "updated" && kind.value.running !== undefined) running(kind.value.running);
        else if (kind.case === "released") return released(kind.value.reservationId);
      }
    } catch (error) {
      if (!signal.aborted) lost(ConnectError.from(error).rawMessage);
    } finally {
      running(undefined);
      released(undefined);
    }
  })();
  return answers;
}

/** `berth admit`. */
export const admitCommand: Command = {
  name: "admit",
  help: HELP,
  async run(argv) {
    let parsed;
    let endpoint: Endpoint;
    try {
      parsed = parse(argv);
      endpoint = resolveEndpoint({
        url: stringFlag(parsed.values as Record<string, string>, "budget-url"),
        urlEnv: "BERTH_BUDGET_URL",
        defaultUrl: DEFAULT_BUDGET_URL,
        tokenFile: stringFlag(parsed.values as Record<string, string>, "token-file"),
      });
      // Checks the need flags before any call.
      needFromFlags(parsed.values, "check");
      durationFlag(parsed.values["max-wait"], "--max-wait");
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError("berth admit", error.message);
    }
    return admit(parsed.values, parsed.command, endpoint);
  },
};
