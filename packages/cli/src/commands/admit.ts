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
import { parseArgs } from "node:util";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { durationMs, timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema, AdmitResponse, Queued } from "@berth/api/berth/budget/v1/budget_service_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { EXIT, type Command } from "../command.js";
import { formatQueued, gateName, roughly } from "../client/budget-format.js";
import { NEED_FLAGS, NEED_HELP, durationFlag, needFromFlags } from "../client/budget-need.js";
import { UsageError, resolveEndpoint, type Endpoint } from "../client/connect.js";
import { relaySignals, signalExit } from "../client/wrapped-command.js";
import { describeFailure } from "../client/errors.js";
import { createHttp2Transport } from "../client/http2-transport.js";

const USAGE = `berth admit [flags] -- CMD [ARGS…]

Waits until the budget service has room for what CMD needs, runs CMD (stdin, stdout and stderr
inherited), reports it started with its pid, and releases the reservation when CMD exits. While
it waits, a live line on the terminal shows its place in the queue, the ETA and what it waits for.

Flags:
${NEED_HELP}
  --label TEXT           what this is, in the queue and in 'berth budget state' (default: the command line)
  --name NAME            the name CMD is counted under while it runs (default: CMD's file name)
  --max-wait DURATION    give up after waiting this long: 30s, 10m (default and cap: BERTH_BUDGET_WAIT)
  --json                 JSON lines on stderr instead of the status line (the default when stderr is not a terminal)
  --budget-url URL       the budget service (env BERTH_BUDGET_URL; default http://127.0.0.1:7302; unix:/path for a socket)
  --token-file FILE      file holding the bearer token (env BERTH_TOKEN, or BERTH_TOKEN_FILE)

Status goes to stderr (stdout is CMD's). JSON lines have an "event": queued, admitted, started,
exited, released, refused, lost (the service went away while CMD ran: CMD keeps running).
CMD gets BERTH_RESERVATION_ID in its environment ('berth budget build-done' ends its build phase).
SIGTERM and SIGHUP are passed on to CMD, and so is SIGINT unless stdin is a terminal (there
Ctrl-C already reaches CMD); while waiting, they withdraw the request.

Exit codes: CMD's own (128+N when signal N killed it); otherwise
  ${EXIT.impossible}  the need is bigger than the whole budget (it can never be admitted)
  ${EXIT.queueFull}  the queue was full (BERTH_BUDGET_MAX_QUEUE); retry later
  ${EXIT.waitExhausted}  the wait ran out before the need fit
  ${EXIT.unreachable}  the budget service could not be reached
  ${EXIT.usage}   wrong flags;  127: CMD not found;  126: CMD not executable
  130/143  interrupted (SIGINT/SIGTERM) while waiting

Examples:
  berth admit --memory 2G --cpu 2 -- make -j2
  berth admit --memory 1G --build-memory 4G --build-cpu 4 --label "up web" -- ./start-web.sh
  berth admit --memory 512M --max-wait 5m --json -- npm test 2>events.jsonl`;

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

/** Where the admission's progress goes: a live line on a terminal, or JSON lines. */
interface Reporter {
  queued(queued: Queued, waitedMs: number): void;
  event(name: string, fields: Record<string, unknown>, line?: string): void;
  /** Clears the live line (before CMD takes the terminal, or before exiting). */
  done(): void;
}

function jsonReporter(write: (text: string) => void): Reporter {
  return {
    queued(q, waitedMs) {
      write(
        `${JSON.stringify({
          event: "queued",
          position: q.position,
          eta_ms: q.eta === undefined ? undefined : durationMs(q.eta),
          waited_ms: waitedMs,
          wait_for: q.waitForText,
          gates: q.waitFor.map((r) => gateName(r.gate)),
          ahead: q.ahead.map((a) => ({ label: a.label, position: a.position })),
          deadline: q.deadline === undefined ? undefined : new Date(timestampMs(q.deadline)).toISOString(),
        })}\n`,
      );
    },
    event(name, fields) {
      write(`${JSON.stringify({ event: name, ...fields })}\n`);
    },
    done() {},
  };
}

/** The live line: rewritten in place (`\r\x1b[K`) on every update and once a second, cut to the terminal's width. */
function lineReporter(stream: NodeJS.WriteStream): Reporter {
  let last: { queued: Queued; waitedMs: number; at: number } | undefined;
  let timer: NodeJS.Timeout | undefined;
  let shown = false;
  const render = () => {
    if (!last) return;
    const elapsed = Date.now() - last.at;
    const etaMs = last.queued.eta === undefined ? 0 : Math.max(0, durationMs(last.queued.eta) - elapsed);
    const text = `berth admit: ${formatQueued(last.queued, last.waitedMs + elapsed, etaMs)}`;
    // A terminal whose size is unknown (0 columns, as under script(1)) gets a generous line.
    const width = Math.max(20, (stream.columns > 0 ? stream.columns : 160) - 1);
    stream.write(`\r\x1b[K${text.length > width ? `${text.slice(0, width - 1)}…` : text}`);
    shown = true;
  };
  return {
    queued(queued, waitedMs) {
      last = { queued, waitedMs, at: Date.now() };
      render();
      timer ??= setInterval(render, 1000);
    },
    event(_name, _fields, line) {
      this.done();
      if (line !== undefined) stream.write(`berth admit: ${line}\n`);
    },
    done() {
      if (timer !== undefined) clearInterval(timer);
      timer = undefined;
      last = undefined;
      if (shown) stream.write("\r\x1b[K");
      shown = false;
    },
  };
}

/** Splits `[flags] -- CMD ARGS…`. Without `--`, the first argument that is not a flag starts CMD. */
function parse(argv: string[]) {
  const options = {
    ...NEED_FLAGS,
    label: { type: "string" },
    name: { type: "string" },
    "max-wait": { type: "string" },
    json: { type: "boolean" },
    "budget-url": { type: "string" },
    "token-file": { type: "string" },
  } as const;
  const separator = argv.indexOf("--");
  let parsed;
  try {
    parsed = parseArgs({ args: separator < 0 ? argv : argv.slice(0, separator), options, strict: true, allowPositionals: separator < 0 });
  } catch (error) {
    throw new UsageError(`${(error as Error).message}${separator < 0 ? " (put -- before the command: berth admit [flags] -- CMD)" : ""}`);
  }
  const command = separator < 0 ? parsed.positionals : argv.slice(separator + 1);
  if (command.length === 0 || command[0] === "") throw new UsageError("no command to run: berth admit [flags] -- CMD [ARGS…]");
  return { values: parsed.values as Record<string, unknown>, command };
}


/** The exit code for a refused admission, and the facts to report. */
function refusal(error: ConnectError) {
  const [detail] = error.findDetails(RefusalSchema);
  if (detail === undefined) return undefined;
  const exit = detail.kind === RefusalKind.IMPOSSIBLE ? EXIT.impossible : detail.kind === RefusalKind.QUEUE_FULL ? EXIT.queueFull : EXIT.waitExhausted;
  const kind = detail.kind === RefusalKind.IMPOSSIBLE ? "impossible" : detail.kind === RefusalKind.QUEUE_FULL ? "queue_full" : "wait_exhausted";
  const retryAfterMs = detail.retryAfter === undefined ? undefined : durationMs(detail.retryAfter);
  return { exit, kind, message: detail.message || error.rawMessage, retryAfterMs, settings: detail.settings, waitedMs: detail.waited === undefined ? 0 : durationMs(detail.waited) };
}

/** Runs the admission; resolves with the exit code. */
async function admit(values: Record<string, unknown>, command: string[], endpoint: Endpoint): Promise<number> {
  // The service refuses control characters in labels and names: a command line may hold newlines.
  const printable = (text: string) => text.replace(/[\u0000-\u001f\u007f\s]+/g, " ").trim().slice(0, 256);
  const name = typeof values["name"] === "string" ? values["name"] : printable(path.basename(command[0]!)) || "command";
  const label = typeof values["label"] === "string" ? values["label"] : printable(command.join(" ")) || name;
  const { need, run } = needFromFlags(values, name.slice(0, 256));
  const maxWaitMs = durationFlag(values["max-wait"], "--max-wait");
  const json = values["json"] === true || !process.stderr.isTTY;
  const reporter = json ? jsonReporter((text) => process.stderr.write(text)) : lineReporter(process.stderr);

  const client = createClient(BudgetService, createHttp2Transport(endpoint));
  const requests = new RequestStream();
  const call = new AbortController();
  requests.push({
    kind: {
      case: "start",
      value: {
        need,
        label,
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
        reporter.done();
        if (relay.interrupted !== undefined) {
          reporter.event("interrupted", { signal: relay.interrupted }, `interrupted (${relay.interrupted}) while waiting; the request was withdrawn`);
          return signalExit(relay.interrupted);
        }
        const e = ConnectError.from(error);
        const refused = refusal(e);
        if (refused !== undefined) {
          reporter.event(
            "refused",
            { kind: refused.kind, message: refused.message, retry_after_ms: refused.retryAfterMs, settings: refused.settings, waited_ms: refused.waitedMs },
            `refused: ${refused.message}${refused.retryAfterMs === undefined ? "" : ` (retry in ~${roughly(refused.retryAfterMs)})`}`,
          );
          return refused.exit;
        }
        const failure = describeFailure(e, "budget", endpoint.url);
        reporter.event("error", { code: Code[e.code], message: failure.message }, failure.message);
        return failure.exit;
      }
      if (result.done) {
        reporter.done();
        reporter.event("error", { message: "the budget service ended the stream before admitting" }, "the budget service ended the stream before admitting");
        return EXIT.failed;
      }
      const kind = result.value.kind;
      if (kind.case === "queued") reporter.queued(kind.value, Date.now() - started);
      else if (kind.case === "admitted") {
        admitted = kind;
        break;
      }
    }
    const reservation = admitted.value.reservation;
    const waitedMs = admitted.value.waited === undefined ? 0 : durationMs(admitted.value.waited);
    reporter.done();
    reporter.event("admitted", { reservation_id: reservation?.id, waited_ms: waitedMs }, waitedMs > 0 ? `admitted after ${roughly(waitedMs)}` : undefined);

    // 2. Run CMD; report it started; keep reading the stream (its answers, or its loss).
    const spawned = spawn(command[0]!, command.slice(1), { stdio: "inherit", env: { ...process.env, BERTH_RESERVATION_ID: reservation?.id ?? "" } });
    relay.child = spawned;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: NodeJS.ErrnoException }>((resolve) => {
      spawned.once("error", (error: NodeJS.ErrnoException) => resolve({ code: null, signal: null, error }));
      spawned.once("exit", (code, signal) => resolve({ code, signal }));
    });
    let runningId: string | undefined;
    let lost = false;
    // Resolves once the service answered `started` (or the stream ended): CMD may exit before that.
    let acknowledged: () => void = () => {};
    const startedAck = new Promise<void>((resolve) => (acknowledged = resolve));
    const reading = (async () => {
      try {
        for (;;) {
          const result = await responses.next();
          if (result.done) return acknowledged();
          const kind = result.value.kind;
          if (kind.case === "updated" && kind.value.running !== undefined) {
            runningId = kind.value.running.id;
            reporter.event("started", { pid: kind.value.running.pid, running_id: runningId });
            acknowledged();
          } else if (kind.case === "released") {
            reporter.event("released", { reservation_id: kind.value.reservationId });
            return;
          }
        }
      } catch (error) {
        if (call.signal.aborted) return;
        lost = true;
        acknowledged();
        const message = `lost the budget service (${ConnectError.from(error).rawMessage}); ${name} keeps running`;
        reporter.event("lost", { message }, message);
      }
    })();
    await new Promise<void>((resolve) => {
      spawned.once("spawn", resolve);
      spawned.once("error", () => resolve());
    });
    if (spawned.pid !== undefined) {
      requests.push({ kind: { case: "started", value: { name: name.slice(0, 256), costSource: { case: "spec", value: run }, pid: spawned.pid } } });
    }

    const outcome = await exited;
    if (outcome.error !== undefined) {
      const code = outcome.error.code === "ENOENT" ? 127 : 126;
      process.stderr.write(`berth admit: cannot run ${command[0]}: ${outcome.error.message}\n`);
      await release(client, requests, reading, call, undefined, lost);
      return code;
    }
    const code = outcome.code ?? signalExit(outcome.signal ?? "SIGKILL");
    reporter.event("exited", { code: outcome.code, signal: outcome.signal });

    // 3. Release: the running entry first (CMD is gone), then the reservation.
    if (spawned.pid !== undefined) await Promise.race([startedAck, new Promise((resolve) => setTimeout(resolve, 2000).unref())]);
    await release(client, requests, reading, call, runningId, lost);
    return code;
  } finally {
    relay.dispose();
    reporter.done();
    requests.end();
    call.abort();
  }
}

/** Stops counting CMD and releases the reservation, waiting a little for the service's answer. */
async function release(
  client: ReturnType<typeof createClient<typeof BudgetService>>,
  requests: RequestStream,
  reading: Promise<void>,
  call: AbortController,
  runningId: string | undefined,
  lost: boolean,
): Promise<void> {
  if (lost) return;
  const timeout = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref());
  if (runningId !== undefined) {
    // The tally would drop it at its next sample anyway (the pid is gone); this makes it immediate.
    await Promise.race([client.stopRunning({ id: runningId }, { signal: call.signal }).catch(() => undefined), timeout(2000)]);
  }
  requests.push({ kind: { case: "release", value: {} } });
  requests.end();
  await Promise.race([reading, timeout(3000)]);
}

export const admitCommand: Command = {
  name: "admit",
  usage: USAGE,
  // CMD's own --help must reach CMD: only a --help before `--` is ours.
  handlesHelp: true,
  async run(argv) {
    const separator = argv.indexOf("--");
    const own = separator < 0 ? argv : argv.slice(0, separator);
    if (own.includes("--help") || own.includes("-h")) {
      process.stdout.write(`${USAGE}\n`);
      return EXIT.ok;
    }
    let parsed;
    let endpoint: Endpoint;
    try {
      parsed = parse(argv);
      endpoint = resolveEndpoint({
        url: typeof parsed.values["budget-url"] === "string" ? parsed.values["budget-url"] : undefined,
        urlEnv: "BERTH_BUDGET_URL",
        defaultUrl: "http://127.0.0.1:7302",
        tokenFile: typeof parsed.values["token-file"] === "string" ? parsed.values["token-file"] : undefined,
      });
      // Checks the need flags before any call.
      needFromFlags(parsed.values, "check");
      durationFlag(parsed.values["max-wait"], "--max-wait");
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      process.stderr.write(`berth admit: ${error.message}\n`);
      return EXIT.usage;
    }
    return admit(parsed.values, parsed.command, endpoint);
  },
};
