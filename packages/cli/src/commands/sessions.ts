/**
 * `berth sessions append|get|list|watch|journal`: the session journals from a shell. Human output
 * by default, `--json` for scripts; the exit code says what happened (see USAGE).
 */
import { parseArgs } from "node:util";
import { toJson, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import type { Event } from "@berth/api/berth/sessions/v1/events_pb";
import {
  GetSnapshotResponseSchema,
  SessionService,
  WatcherLaggedSchema,
  type JournalEntry,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { eventToJournal, journalToEvent } from "@berth/sessions/server/event-codec";
import { SESSION_ID_RULE, isSessionId } from "@berth/shared/safe-id";
import { createTransport, resolveEndpoint, UsageError, type Endpoint } from "../client/connect.js";
import { describeFailure } from "../client/errors.js";
import { EXIT, type Command } from "../command.js";

/** Where the sessions service is when neither `--sessions-url` nor `BERTH_SESSIONS_URL` says. */
export const DEFAULT_SESSIONS_URL = "http://127.0.0.1:7301";

const USAGE = `berth sessions <append|get|list|watch|journal> [arguments] [flags]

Append to, read and follow the session journals of the sessions service.

  append SESSION TYPE [--field KEY=VALUE]...   append one event of type TYPE
  append SESSION --json '{"type":…, …}'        append one event given as JSON (output is JSON)
  append SESSION < events.jsonl                append the events on stdin (one JSON object per
                                               line, or a JSON array) atomically, in one call
  get SESSION [--include-completed]            the session's snapshot
  list [--include-completed]                   the active sessions (all with --include-completed)
  watch SESSION [--from-seq N] [--snapshots]   the journal from seq N, then every new entry as it
                                               is appended, until Ctrl-C
  journal SESSION [--from-seq N] [--limit N]   the journal's entries

Events are the seed's journal events: a JSON object with a "type" and the event's own keys
("pageUrl", "count", …). A --field VALUE is read as JSON when it is JSON (3, true, null,
"quoted", {…}, […]) and as a string otherwise.

Flags:
  --json                    machine-readable output: one JSON object (get, list, append) or one
                            JSON line per entry (watch, journal; entries in the journal's format)
  --expected-seq N          append: refuse unless the session's last seq is N (0: a new session)
  --idempotency-key KEY     append: a retry with the same key writes nothing and answers the first
  --fence-file FILE --fence-token N
                            append: refuse unless N is still the fencing token of FILE's lock
  --sessions-url URL        the service (BERTH_SESSIONS_URL; default ${DEFAULT_SESSIONS_URL};
                            unix:/path for a socket)
  --token-file FILE         the bearer token (else BERTH_TOKEN_FILE or BERTH_TOKEN)

Exit codes:
  0   done (watch: stopped with Ctrl-C)
  1   the service failed otherwise
  2   wrong arguments (including those the service refused)
  3   conflict: --expected-seq is not the last seq, or the fence is no longer current
  4   not found: the session has no journal (get, journal)
  69  the service cannot be reached or is shutting down
  77  the service wants a bearer token

Examples:
  berth sessions append s1 generate --field pageUrl=http://localhost:3000/ --field count=3
  berth sessions append s1 --json '{"type":"agent_phase","phase":"planning"}' --expected-seq 1
  berth sessions get s1
  berth sessions list --json | jq '.sessions[].id'
  berth sessions watch s1 --from-seq 1 --snapshots
  berth sessions journal s1 --from-seq 10 --limit 5 --json`;

const COMMON_OPTIONS = {
  json: { type: "boolean" },
  "sessions-url": { type: "string" },
  "token-file": { type: "string" },
  help: { type: "boolean", short: "h" },
} as const;

type SessionClient = Client<typeof SessionService>;

/** What a subcommand gets: its parsed flags and positionals, a client, and where to write. */
interface Invocation {
  readonly values: Record<string, string | boolean | string[] | undefined>;
  readonly positionals: string[];
  readonly client: SessionClient;
  readonly endpoint: Endpoint;
  readonly json: boolean;
}

interface Subcommand {
  /** Flags besides the common ones. */
  readonly options: Record<string, { type: "string" | "boolean"; multiple?: boolean }>;
  /** `[min, max]` positionals. */
  readonly arity: readonly [number, number];
  readonly usage: string;
  run(invocation: Invocation): Promise<number>;
}

const SUBCOMMANDS: Record<string, Subcommand> = {
  append: {
    options: {
      field: { type: "string", multiple: true },
      event: { type: "string" },
      "expected-seq": { type: "string" },
      "idempotency-key": { type: "string" },
      "fence-file": { type: "string" },
      "fence-token": { type: "string" },
    },
    arity: [1, 2],
    usage: "berth sessions append SESSION TYPE [--field KEY=VALUE]... | --json '{…}' | < events.jsonl",
    run: append,
  },
  get: { options: { "include-completed": { type: "boolean" } }, arity: [1, 1], usage: "berth sessions get SESSION [--include-completed] [--json]", run: get },
  list: { options: { "include-completed": { type: "boolean" } }, arity: [0, 0], usage: "berth sessions list [--include-completed] [--json]", run: list },
  watch: {
    options: { "from-seq": { type: "string" }, snapshots: { type: "boolean" } },
    arity: [1, 1],
    usage: "berth sessions watch SESSION [--from-seq N] [--snapshots] [--json]",
    run: watch,
  },
  journal: {
    options: { "from-seq": { type: "string" }, limit: { type: "string" } },
    arity: [1, 1],
    usage: "berth sessions journal SESSION [--from-seq N] [--limit N] [--json]",
    run: journal,
  },
};

/** `berth sessions …`. */
export const sessionsCommand: Command = {
  name: "sessions",
  usage: USAGE,
  handlesHelp: true,
  async run(argv) {
    const [name, ...rest] = argv;
    if (name === undefined || name === "--help" || name === "-h" || name === "help") {
      process.stdout.write(`${USAGE}\n`);
      return name === undefined ? EXIT.usage : EXIT.ok;
    }
    const subcommand = SUBCOMMANDS[name];
    if (subcommand === undefined) {
      process.stderr.write(`berth sessions: unknown command '${name}'; commands: ${Object.keys(SUBCOMMANDS).join(", ")}\n`);
      return EXIT.usage;
    }
    let invocation: Invocation;
    try {
      const parsed = parseArgs({
        args: name === "append" ? eventJsonAsFlag(rest) : rest,
        options: { ...COMMON_OPTIONS, ...subcommand.options },
        allowPositionals: true,
        strict: true,
      });
      if (parsed.values.help) {
        process.stdout.write(`usage: ${subcommand.usage}\n\nRun 'berth sessions --help' for every flag, exit code and example.\n`);
        return EXIT.ok;
      }
      const [min, max] = subcommand.arity;
      if (parsed.positionals.length < min || parsed.positionals.length > max) {
        throw new UsageError(`expected ${min === max ? min : `${min} to ${max}`} argument${max === 1 ? "" : "s"}, got ${parsed.positionals.length}`);
      }
      const values = parsed.values as Invocation["values"];
      // Checked here too, so a mistyped id is a usage error even when the service is down.
      const sessionId = parsed.positionals[0];
      if (name !== "list" && sessionId !== undefined && !isSessionId(sessionId)) {
        throw new UsageError(`SESSION must match ${SESSION_ID_RULE}, got ${JSON.stringify(sessionId)}`);
      }
      const endpoint = resolveEndpoint({
        url: values["sessions-url"] as string | undefined,
        urlEnv: "BERTH_SESSIONS_URL",
        defaultUrl: DEFAULT_SESSIONS_URL,
        tokenFile: values["token-file"] as string | undefined,
      });
      invocation = {
        values,
        positionals: parsed.positionals,
        client: createClient(SessionService, createTransport(endpoint)),
        endpoint,
        json: values.json === true,
      };
    } catch (error) {
      process.stderr.write(`berth sessions ${name}: ${(error as Error).message}\nusage: ${subcommand.usage}\n`);
      return EXIT.usage;
    }
    try {
      return await subcommand.run(invocation);
    } catch (error) {
      if (error instanceof UsageError) {
        process.stderr.write(`berth sessions ${name}: ${error.message}\nusage: ${subcommand.usage}\n`);
        return EXIT.usage;
      }
      const failure = describeFailure(error, "sessions", invocation.endpoint.url);
      process.stderr.write(`berth sessions ${name}: ${failure.message}\n`);
      return failure.exit;
    }
  },
};

// --------------------------------------------------------------------------- append

/**
 * `--json '{…}'` (or `--json=…`) on append gives the event and asks for JSON output; a bare
 * `--json` only asks for JSON output. parseArgs cannot have one flag be both, so the event form
 * becomes `--event … --json` first.
 */
function eventJsonAsFlag(argv: string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === "--") {
      out.push(...argv.slice(i));
      break;
    }
    const next = argv[i + 1];
    if (arg === "--json" && next !== undefined && /^\s*[[{]/.test(next)) {
      out.push("--event", next, "--json");
      i++;
    } else if (arg.startsWith("--json=")) {
      out.push("--event", arg.slice("--json=".length), "--json");
    } else out.push(arg);
  }
  return out;
}

async function append({ values, positionals, client, json }: Invocation): Promise<number> {
  const [sessionId, type] = positionals as [string, string | undefined];
  const fields = (values.field as string[] | undefined) ?? [];
  const eventJson = values.event as string | undefined;
  let events: Record<string, unknown>[];
  if (eventJson !== undefined) {
    if (fields.length > 0) throw new UsageError("give the event either as --json or as TYPE with --field, not both");
    events = parseEvents(eventJson, "--json");
  } else if (type !== undefined) {
    events = [{ type, ...parseFields(fields) }];
  } else {
    if (fields.length > 0) throw new UsageError("--field needs the event TYPE");
    if (process.stdin.isTTY) throw new UsageError("give the event: TYPE [--field KEY=VALUE]..., --json '{…}', or JSON on stdin");
    events = parseEvents(await readStdin(), "stdin");
  }
  if (events.length === 0) throw new UsageError("no event given");
  const typed: Event[] = events.map((event, i) => {
    const where = events.length > 1 ? `event ${i + 1}` : "the event";
    if (type !== undefined && eventJson !== undefined) {
      if (event.type === undefined) event = { ...event, type };
      else if (event.type !== type) throw new UsageError(`${where} has type ${JSON.stringify(event.type)} but TYPE is ${type}`);
    }
    if (typeof event.type !== "string" || event.type === "") throw new UsageError(`${where} needs a "type" (a non-empty string)`);
    if (event.id !== undefined && event.id !== sessionId) throw new UsageError(`${where} names session ${JSON.stringify(event.id)}, not ${sessionId}`);
    return journalToEvent(event);
  });

  const request = {
    sessionId,
    idempotencyKey: (values["idempotency-key"] as string | undefined) ?? "",
    ...(values["expected-seq"] !== undefined ? { expectedSeq: wholeNumber(values["expected-seq"] as string, "--expected-seq") } : {}),
    ...fenceOf(values),
  };
  let firstSeq: bigint;
  let lastSeq: bigint;
  let duplicate: boolean;
  let snapshot: Snapshot | undefined;
  if (typed.length === 1) {
    const res = await client.appendEvent({ ...request, event: typed[0]! });
    ({ seq: lastSeq, duplicate, snapshot } = res);
    firstSeq = lastSeq;
    if (json) printJson({ seq: String(res.seq), duplicate, snapshot: snapshot ? snapshotJson(snapshot) : null });
  } else {
    const res = await client.appendEvents({ ...request, events: typed });
    ({ firstSeq, lastSeq, duplicate, snapshot } = res);
    if (json) printJson({ firstSeq: String(firstSeq), lastSeq: String(lastSeq), duplicate, snapshot: snapshot ? snapshotJson(snapshot) : null });
  }
  if (!json) {
    const seqs = firstSeq === lastSeq ? `seq ${lastSeq}` : `seqs ${firstSeq}-${lastSeq}`;
    const phase = snapshot?.phase ? ` (phase ${snapshot.phase})` : "";
    process.stdout.write(duplicate ? `${sessionId}: already appended with this idempotency key: ${seqs}; nothing written\n` : `${sessionId}: appended ${seqs}${phase}\n`);
  }
  return EXIT.ok;
}

function fenceOf(values: Invocation["values"]): { fence?: { file: string; fencingToken: bigint } } {
  const file = values["fence-file"] as string | undefined;
  const token = values["fence-token"] as string | undefined;
  if (file === undefined && token === undefined) return {};
  if (file === undefined || token === undefined) throw new UsageError("--fence-file and --fence-token go together");
  return { fence: { file, fencingToken: wholeNumber(token, "--fence-token") } };
}

/** One event (a JSON object), several (a JSON array), or JSON lines. */
function parseEvents(text: string, where: string): Record<string, unknown>[] {
  const trimmed = text.trim();
  if (trimmed === "") return [];
  let parsed: unknown;
  try {
    parsed = JSON.parse(trimmed);
  } catch {
    parsed = trimmed.split("\n").filter((line) => line.trim() !== "").map((line, i) => {
      try {
        return JSON.parse(line) as unknown;
      } catch (error) {
        throw new UsageError(`${where}: line ${i + 1} is not JSON (${(error as Error).message})`);
      }
    });
  }
  const list = Array.isArray(parsed) ? parsed : [parsed];
  return list.map((item, i) => {
    if (item === null || typeof item !== "object" || Array.isArray(item)) throw new UsageError(`${where}: event ${i + 1} must be a JSON object`);
    return item as Record<string, unknown>;
  });
}

/** `KEY=VALUE` pairs; a VALUE that parses as JSON is taken as JSON, anything else as a string. */
function parseFields(fields: string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const field of fields) {
    const eq = field.indexOf("=");
    if (eq <= 0) throw new UsageError(`--field ${JSON.stringify(field)}: expected KEY=VALUE`);
    const key = field.slice(0, eq);
    if (key === "type") throw new UsageError("--field type=…: the type is the TYPE argument");
    const raw = field.slice(eq + 1);
    let value: unknown = raw;
    try {
      value = JSON.parse(raw);
    } catch {
      // Not JSON: a plain string.
    }
    Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

// --------------------------------------------------------------------------- reads

async function get({ values, positionals, client, json }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  const res = await client.getSnapshot({ sessionId, includeCompleted: values["include-completed"] === true });
  if (json) printJson(toJson(GetSnapshotResponseSchema, res) as JsonObject);
  if (!res.exists) {
    if (!json) process.stderr.write(`berth sessions get: session ${sessionId} has no journal\n`);
    return EXIT.notFound;
  }
  if (json) return EXIT.ok;
  if (res.snapshot === undefined) {
    process.stdout.write(`${sessionId}: completed or discarded at seq ${res.lastSeq} (add --include-completed to see it)\n`);
    return EXIT.ok;
  }
  const view = snapshotJson(res.snapshot);
  const rows: Array<[string, string]> = [
    ["session", sessionId],
    ["last seq", String(res.lastSeq)],
  ];
  for (const [key, value] of Object.entries(view)) {
    if (key === "id") continue;
    rows.push([key, human(value)]);
  }
  const width = Math.max(...rows.map(([key]) => key.length));
  process.stdout.write(rows.map(([key, value]) => `${key.padEnd(width)}  ${value}`).join("\n") + "\n");
  return EXIT.ok;
}

async function list({ values, client, json }: Invocation): Promise<number> {
  const res = await client.listSessions({ includeCompleted: values["include-completed"] === true });
  if (json) {
    printJson({ sessions: res.sessions.map(snapshotJson) });
    return EXIT.ok;
  }
  if (res.sessions.length === 0) {
    process.stdout.write(values["include-completed"] ? "no sessions\n" : "no active sessions\n");
    return EXIT.ok;
  }
  const rows = [["SESSION", "PHASE", "VARIANTS", "UPDATED"]];
  for (const s of res.sessions) {
    rows.push([s.id, s.phase, `${s.arrivedVariants}/${s.expectedVariants}`, s.updatedAt ? timestampDate(s.updatedAt).toISOString() : "-"]);
  }
  const widths = rows[0]!.map((_, col) => Math.max(...rows.map((row) => row[col]!.length)));
  process.stdout.write(rows.map((row) => row.map((cell, col) => (col === row.length - 1 ? cell : cell.padEnd(widths[col]!))).join("  ")).join("\n") + "\n");
  return EXIT.ok;
}

async function journal({ values, positionals, client, json }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  const fromSeq = values["from-seq"] === undefined ? 0n : wholeNumber(values["from-seq"] as string, "--from-seq");
  const limit = values.limit === undefined ? 0 : Number(wholeNumber(values.limit as string, "--limit", 0xffffffffn));
  for await (const batch of client.readJournal({ sessionId, fromSeq, limit })) {
    for (const entry of batch.entries) printEntry(entry, json);
  }
  return EXIT.ok;
}

/**
 * Follows the session until Ctrl-C (exit 0). A watcher the service ended for falling behind
 * resumes where it stopped (the service says where), so nothing is missed.
 */
async function watch({ values, positionals, client, json }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  let fromSeq = values["from-seq"] === undefined ? 0n : wholeNumber(values["from-seq"] as string, "--from-seq");
  const includeSnapshot = values.snapshots === true;
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    for (;;) {
      try {
        for await (const message of client.watchSession({ sessionId, fromSeq, includeSnapshot }, { signal: stop.signal })) {
          if (message.kind.case === "entry") {
            printEntry(message.kind.value, json, message.snapshot);
            fromSeq = message.kind.value.seq + 1n;
          } else if (message.kind.case === "caughtUp") {
            const { lastSeq, snapshot } = message.kind.value;
            if (json) printJson({ caughtUp: { lastSeq: String(lastSeq), ...(snapshot ? { snapshot: snapshotJson(snapshot) } : {}) } });
            else process.stderr.write(`-- caught up at seq ${lastSeq}; following new entries (Ctrl-C to stop)\n`);
            if (lastSeq + 1n > fromSeq) fromSeq = lastSeq + 1n;
          }
        }
        return EXIT.ok;
      } catch (error) {
        if (stop.signal.aborted) return EXIT.ok;
        const connectError = ConnectError.from(error);
        const lag = connectError.code === Code.ResourceExhausted ? connectError.findDetails(WatcherLaggedSchema)[0] : undefined;
        if (lag === undefined) throw error;
        fromSeq = lag.resumeFromSeq;
        process.stderr.write(`-- fell behind the service; resuming from seq ${fromSeq}\n`);
      }
    }
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

// --------------------------------------------------------------------------- output

/** An entry as the journal holds it (`{seq, id, type, ts, event}`): a JSON line, or a human line. */
function printEntry(entry: JournalEntry, json: boolean, snapshot?: Snapshot): void {
  const event = entry.event ? eventToJournal(entry.event) : {};
  const ts = entry.ts ? timestampIso(entry.ts) : undefined;
  if (json) {
    const line: Record<string, unknown> = { seq: Number(entry.seq), id: entry.sessionId, type: entry.type, ts, event: { ...event, id: entry.sessionId } };
    if (snapshot) line.snapshot = snapshotJson(snapshot);
    process.stdout.write(`${JSON.stringify(line)}\n`);
    return;
  }
  const { type: _type, ...rest } = event;
  const body = Object.keys(rest).length > 0 ? ` ${truncate(JSON.stringify(rest), 160)}` : "";
  process.stdout.write(`#${entry.seq}  ${ts ?? "-"}  ${entry.type}${body}\n`);
  if (snapshot) {
    const s = snapshotJson(snapshot);
    const summary = ["phase", "generationPhase", "expectedVariants", "arrivedVariants", "visibleVariant"]
      .filter((key) => s[key] !== undefined)
      .map((key) => `${key}=${human(s[key]!)}`)
      .join(" ");
    process.stdout.write(`    snapshot: ${summary}\n`);
  }
}

/** The snapshot in its proto JSON form, whose keys are the seed's snapshot keys. */
function snapshotJson(snapshot: Snapshot): JsonObject {
  return toJson(SnapshotSchema, snapshot) as JsonObject;
}

function printJson(value: JsonValue | Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

function human(value: JsonValue): string {
  return typeof value === "string" ? value : truncate(JSON.stringify(value), 200);
}

function truncate(text: string, max: number): string {
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

function timestampIso(ts: Timestamp): string | undefined {
  const date = timestampDate(ts);
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString();
}

function wholeNumber(raw: string, flag: string, max = BigInt(Number.MAX_SAFE_INTEGER)): bigint {
  if (!/^\d+$/.test(raw.trim())) throw new UsageError(`${flag} must be a whole number ≥ 0, got ${JSON.stringify(raw)}`);
  const value = BigInt(raw.trim());
  if (value > max) throw new UsageError(`${flag} must be at most ${max}`);
  return value;
}
