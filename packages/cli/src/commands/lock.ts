/**
 * `berth lock hold FILE -- CMD` and `berth lock inspect FILE`: source locks from a shell.
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
import { parseArgs } from "node:util";
import { toJson } from "@bufbuild/protobuf";
import { durationFromMs, timestampMs, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import {
  HolderKind,
  InspectResponseSchema,
  LockHeldSchema,
  LockService,
  type Holder,
  type HoldResponse,
  type InspectResponse,
  type Lease,
  type LockHeld,
} from "@berth/api/berth/sessions/v1/lock_service_pb";
import { formatDuration, parseDuration } from "@berth/shared/units";
import { createTransport, resolveEndpoint, UsageError, type Endpoint } from "../client/connect.js";
import { relaySignals, signalExit } from "../client/wrapped-command.js";
import { describeFailure } from "../client/errors.js";
import { createHttp2Transport } from "../client/http2-transport.js";
import { EXIT, type Command } from "../command.js";

const DEFAULT_SESSIONS_URL = "http://127.0.0.1:7301";
const DEFAULT_WAIT = "30s";

const USAGE = `berth lock <hold|inspect> FILE [flags] [-- CMD [ARGS…]]

Source locks of the sessions service: the same locks as every berth client and every process
still using the seed's source-lock library on the same project.

  hold FILE [flags] -- CMD [ARGS…]
      Like flock(1): waits for FILE's lock, runs CMD while holding it (stdin, stdout and stderr
      inherited), and releases it when CMD exits, whatever ends this command (exit, Ctrl-C, kill -9:
      the service frees the lock the moment the connection goes). While queued it shows who holds
      the file and since when. CMD gets BERTH_FENCING_TOKEN (the grant's fencing token) and
      BERTH_LOCK_FILE (the locked path) in its environment, for fenced writes:
      berth sessions append … --fence-file "$BERTH_LOCK_FILE" --fence-token "$BERTH_FENCING_TOKEN".
  inspect FILE
      Who holds FILE's lock (owner, kind, fencing token, since, expiry), who waits, in order, and the
      last fencing token granted.

FILE is resolved against the current directory, as flock(1) and the seed do.

Flags:
  --owner TEXT          who holds the lock, shown to everyone who waits (default: user@host pid N)
  --wait DURATION       hold: how long to wait for the lock: 0 tries once; 30s, 5m, at most 10m
                        (default ${DEFAULT_WAIT})
  --json                machine-readable: inspect prints one JSON object; hold writes JSON lines to
                        stderr (events: waiting, acquired, exited, released, lost, timeout, error)
  --sessions-url URL    the service (BERTH_SESSIONS_URL; default ${DEFAULT_SESSIONS_URL}; unix:/path)
  --token-file FILE     the bearer token (else BERTH_TOKEN_FILE or BERTH_TOKEN)

While CMD runs, SIGTERM and SIGHUP are passed on to it, and so is SIGINT unless stdin is a terminal
(there Ctrl-C reaches CMD already); while waiting they withdraw the request. If the service goes
away while CMD runs, the lock is gone: a warning says so and CMD keeps running (fenced writes with
its token are then refused).

Exit codes (hold): CMD's own (128+N when signal N killed it); otherwise
  ${EXIT.lockTimedOut}  the wait ran out: FILE stayed locked (the message names the holder)
  ${EXIT.unreachable}  the sessions service could not be reached or is shutting down
  ${EXIT.usage}   wrong flags, or a FILE the service refuses (NUL, '..', too long)
  ${EXIT.denied}  the service wants a bearer token
  127/126  CMD not found / not executable;  130/143  interrupted (SIGINT/SIGTERM) while waiting
Exit codes (inspect): 0, or ${EXIT.unreachable}, ${EXIT.usage}, ${EXIT.denied} as above.

Examples:
  berth lock hold src/app.ts -- npm run codegen
  berth lock hold src/app.ts --wait 5m --owner "codegen bot" -- ./regen.sh
  berth lock hold src/app.ts --wait 0 -- true || echo "busy"
  berth lock inspect src/app.ts
  berth lock inspect src/app.ts --json | jq .holder`;

const OPTIONS = {
  owner: { type: "string" },
  wait: { type: "string" },
  json: { type: "boolean" },
  "sessions-url": { type: "string" },
  "token-file": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

interface Invocation {
  readonly action: "hold" | "inspect";
  readonly file: string;
  readonly owner: string;
  readonly waitMs: number;
  readonly json: boolean;
  readonly command: string[];
  readonly endpoint: Endpoint;
}

/** Splits `hold|inspect FILE [flags] [-- CMD ARGS…]`. */
function parse(argv: string[]): Invocation {
  const separator = argv.indexOf("--");
  const own = separator < 0 ? argv : argv.slice(0, separator);
  let parsed;
  try {
    parsed = parseArgs({ args: own, options: OPTIONS, strict: true, allowPositionals: true });
  } catch (error) {
    throw new UsageError((error as Error).message);
  }
  const [action, file, ...extra] = parsed.positionals;
  if (action !== "hold" && action !== "inspect") {
    throw new UsageError(action === undefined ? "say what to do: berth lock hold FILE -- CMD, or berth lock inspect FILE" : `unknown action '${action}': hold or inspect`);
  }
  if (file === undefined || file === "") throw new UsageError(`no FILE: berth lock ${action} FILE${action === "hold" ? " -- CMD" : ""}`);
  const command = separator < 0 ? [] : argv.slice(separator + 1);
  if (action === "hold") {
    if (extra.length > 0) throw new UsageError(`unexpected '${extra[0]}': put -- before the command (berth lock hold FILE -- CMD)`);
    if (command.length === 0 || command[0] === "") throw new UsageError("no command to run: berth lock hold FILE [flags] -- CMD [ARGS…]");
  } else if (extra.length > 0 || separator >= 0) {
    throw new UsageError("inspect takes one FILE and no command");
  }
  const values = parsed.values;
  let waitMs: number;
  try {
    waitMs = parseDuration(values.wait ?? DEFAULT_WAIT, "--wait");
  } catch {
    throw new UsageError(`--wait: ${JSON.stringify(values.wait)} is not a duration like 0, 30s, 5m`);
  }
  const endpoint = resolveEndpoint({ url: values["sessions-url"], urlEnv: "BERTH_SESSIONS_URL", defaultUrl: DEFAULT_SESSIONS_URL, tokenFile: values["token-file"] });
  return {
    action,
    // The lock's key is the absolute path: resolve here, where "the current directory" means the user's.
    file: path.resolve(file),
    owner: values.owner ?? defaultOwner(),
    waitMs,
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

/** Where hold's progress goes: human lines, or JSON lines (stderr either way: stdout is CMD's). */
interface Reporter {
  event(name: string, fields: Record<string, unknown>, line?: string): void;
}

function reporter(json: boolean): Reporter {
  return {
    event(name, fields, line) {
      if (json) process.stderr.write(`${JSON.stringify({ event: name, ...fields })}\n`);
      else if (line !== undefined) process.stderr.write(`berth lock: ${line}\n`);
    },
  };
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
function describeHolder(holder: { owner: string; kind: HolderKind; fencingToken: bigint; since?: Timestamp | undefined; pid?: number | undefined }): string {
  const who = holder.owner === "" ? "an unknown owner" : holder.owner;
  const facts = [kindName(holder.kind)];
  if (holder.fencingToken > 0n) facts.push(`fencing token ${holder.fencingToken}`);
  if (holder.kind === HolderKind.SEED_LOCK_FILE && holder.pid !== undefined) facts.push(`pid ${holder.pid}`);
  const since = holder.since === undefined ? "" : ` since ${iso(holder.since)} (${formatDuration(Math.max(0, Date.now() - timestampMs(holder.since)))} ago)`;
  return `${who} (${facts.join(", ")})${since}`;
}

function holderJson(holder: Holder | LockHeld | undefined): Record<string, unknown> | undefined {
  if (holder === undefined) return undefined;
  return {
    owner: holder.owner,
    kind: kindName(holder.kind),
    fencing_token: Number(holder.fencingToken),
    since: iso(holder.since),
    ...(holder.pid === undefined ? {} : { pid: holder.pid }),
  };
}


/** Runs `berth lock hold`; resolves with the exit code. */
async function hold(invocation: Invocation): Promise<number> {
  const { file, owner, waitMs, command, endpoint } = invocation;
  const report = reporter(invocation.json);
  const client = createClient(LockService, createHttp2Transport(endpoint));
  const call = new AbortController();
  const responses = client.hold({ file, owner, wait: durationFromMs(waitMs) }, { signal: call.signal })[Symbol.asyncIterator]();

  const relay = relaySignals(() => call.abort());

  try {
    // 1. Wait for the grant.
    let lease: Lease;
    for (;;) {
      let result: IteratorResult<HoldResponse>;
      try {
        result = await responses.next();
      } catch (error) {
        return refused(error, invocation, report, relay.interrupted);
      }
      if (result.done) {
        report.event("error", { message: "the service ended the stream before granting the lock" }, "the service ended the stream before granting the lock");
        return EXIT.failed;
      }
      const kind = result.value.kind;
      if (kind.case === "waiting") {
        const { position, holder } = kind.value;
        report.event(
          "waiting",
          { file, position, holder: holderJson(holder) },
          holder === undefined ? `waiting for ${file} (position ${position})` : `waiting for ${file} held by ${describeHolder(holder)}; position ${position}`,
        );
      } else if (kind.case === "acquired") {
        lease = kind.value;
        break;
      }
    }
    report.event("acquired", { file: lease.file, fencing_token: Number(lease.fencingToken), owner: lease.owner });

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
    void (async () => {
      try {
        for (;;) {
          const result = await responses.next();
          if (result.done) break;
        }
        if (call.signal.aborted) return;
        lost = true;
        const message = `lost the lock on ${file}: the service ended the hold; ${command[0]} keeps running without it`;
        report.event("lost", { message }, message);
      } catch (error) {
        if (call.signal.aborted) return;
        lost = true;
        const message = `lost the lock on ${file} (${ConnectError.from(error).rawMessage}); ${command[0]} keeps running without it`;
        report.event("lost", { message }, message);
      }
    })();

    const outcome = await exited;
    let code: number;
    if (outcome.error !== undefined) {
      code = outcome.error.code === "ENOENT" ? 127 : 126;
      process.stderr.write(`berth lock: cannot run ${command[0]}: ${outcome.error.message}\n`);
    } else {
      code = outcome.code ?? signalExit(outcome.signal ?? "SIGKILL");
      report.event("exited", { code: outcome.code, signal: outcome.signal });
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
      report.event("released", { file: lease.file, fencing_token: Number(lease.fencingToken), by: released ? "release" : "stream end" });
    }
    return code;
  } finally {
    relay.dispose();
    call.abort();
  }
}

/** The exit code and message for a Hold that ended before the grant. */
function refused(error: unknown, invocation: Invocation, report: Reporter, interrupted: NodeJS.Signals | undefined): number {
  if (interrupted !== undefined) {
    report.event("interrupted", { signal: interrupted }, `interrupted (${interrupted}) while waiting; the request was withdrawn`);
    return signalExit(interrupted);
  }
  const e = ConnectError.from(error);
  const [held] = e.code === Code.Aborted ? e.findDetails(LockHeldSchema) : [];
  if (held !== undefined) {
    const waited = invocation.waitMs === 0 ? "it was not free (--wait 0)" : `it stayed locked for ${formatDuration(invocation.waitMs)}`;
    const holder = held.owner === "" && held.kind === HolderKind.UNSPECIFIED ? "others queued ahead" : describeHolder(held);
    report.event("timeout", { file: held.file, waited_ms: invocation.waitMs, holder: holderJson(held), message: e.rawMessage }, `timed out: ${held.file} is held by ${holder}; ${waited}`);
    return EXIT.lockTimedOut;
  }
  const failure = describeFailure(e, "sessions", invocation.endpoint.url);
  report.event("error", { code: Code[e.code], message: failure.message }, failure.message);
  return failure.exit;
}

/** Runs `berth lock inspect`; resolves with the exit code. */
async function inspect(invocation: Invocation): Promise<number> {
  const client = createClient(LockService, createTransport(invocation.endpoint));
  let response: InspectResponse;
  try {
    response = await client.inspect({ file: invocation.file }, { timeoutMs: 10_000 });
  } catch (error) {
    const failure = describeFailure(error, "sessions", invocation.endpoint.url);
    process.stderr.write(`berth lock: ${failure.message}\n`);
    return failure.exit;
  }
  if (invocation.json) {
    process.stdout.write(`${JSON.stringify(toJson(InspectResponseSchema, response, { alwaysEmitImplicit: true }))}\n`);
    return EXIT.ok;
  }
  const lines = [response.file];
  const holder = response.holder;
  if (holder === undefined) lines.push("  free");
  else {
    const expiry = holder.expiresAt === undefined ? "" : `; expires ${iso(holder.expiresAt)} unless renewed`;
    lines.push(`  held by ${describeHolder(holder)}${expiry}`);
  }
  if (response.waiters.length > 0) {
    lines.push(`  ${response.waiters.length} waiting:`);
    response.waiters.forEach((w, i) => {
      lines.push(`    ${i + 1}. ${w.owner} (${kindName(w.kind)}) since ${iso(w.since)}, gives up at ${iso(w.deadline)}`);
    });
  }
  lines.push(`  last fencing token: ${response.lastFencingToken === 0n ? "none granted by this service run" : String(response.lastFencingToken)}`);
  if (response.lockPath !== "") lines.push(`  lock file: ${response.lockPath}`);
  process.stdout.write(`${lines.join("\n")}\n`);
  return EXIT.ok;
}

export const lockCommand: Command = {
  name: "lock",
  usage: USAGE,
  // CMD's own --help must reach CMD: only a --help before `--` is ours.
  handlesHelp: true,
  async run(argv) {
    const separator = argv.indexOf("--");
    const own = separator < 0 ? argv : argv.slice(0, separator);
    if (own.includes("--help") || own.includes("-h") || own[0] === "help") {
      process.stdout.write(`${USAGE}\n`);
      return EXIT.ok;
    }
    let invocation: Invocation;
    try {
      invocation = parse(argv);
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      process.stderr.write(`berth lock: ${error.message}\n`);
      return EXIT.usage;
    }
    return invocation.action === "hold" ? hold(invocation) : inspect(invocation);
  },
};
