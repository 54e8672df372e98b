/**
 * `berth sessions append|get|list|watch|journal|delete`: the session journals from a shell. Human output
 * by default (a table, key/value lines, one line per entry; colours on a terminal), `--json` for
 * scripts (JSON lines); the exit code says what happened (see each subcommand's help).
 */
import { toJson, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { durationFromMs, durationMs, timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client } from "@connectrpc/connect";
import type { Event } from "@berth/api/berth/sessions/v1/events_pb";
import {
  ExpectedState,
  SessionService,
  WatcherLaggedSchema,
  type JournalEntry,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { parseDuration } from "@berth/shared/units";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { eventToJournal, journalToEvent } from "@berth/sessions/server/event-codec";
import { SESSION_ID_RULE, isSessionId } from "@berth/shared/safe-id";
import { parseFlags, stringFlag, usageError, type FlagSpec, type ParsedArgs } from "../args.js";
import { createTransport, resolveEndpoint, UsageError, type Endpoint } from "../client/connect.js";
import { describeFailure, reportFailure } from "../client/errors.js";
import { absoluteLockPath } from "../client/lock-path.js";
import { EXIT, type Command, type SubcommandHelp } from "../command.js";
import { DEFAULT_SESSIONS_URL, SESSIONS_ENDPOINT_FLAGS, callExitRows } from "../common-help.js";
import { renderHelp, type HelpRow } from "../help.js";
import { styleFor, type Style } from "../terminal.js";

export { DEFAULT_SESSIONS_URL };

const COMMON_FLAGS: Readonly<Record<string, FlagSpec>> = {
  json: { type: "boolean" },
  "sessions-url": { type: "string" },
  "token-file": { type: "string" },
  help: { type: "boolean", short: "h" },
};

const EVENTS_NOTE =
  'Events are the seed\'s journal events: a JSON object with a "type" and the event\'s own keys ("pageUrl", "count", …). ' +
  'A --field VALUE is read as JSON when it is JSON (3, true, null, "quoted", {…}, […]) and as a string otherwise.';

const NOT_FOUND_ROW: HelpRow = [String(EXIT.notFound), "not found: SESSION has no journal"];

/** How many times `append` makes an append again that another process's line overtook (nothing of it was kept). */
const OVERTAKEN_ATTEMPTS = 5;

type SessionClient = Client<typeof SessionService>;

/** What a subcommand gets: its parsed flags and positionals, a client, and where to write. */
interface Invocation {
  readonly values: ParsedArgs["values"];
  readonly positionals: string[];
  readonly client: SessionClient;
  readonly endpoint: Endpoint;
  readonly json: boolean;
  /** Styles for stdout (plain unless stdout is a colour terminal). */
  readonly out: Style;
}

interface Subcommand extends SubcommandHelp {
  /** Flags besides the common ones. */
  readonly flags: Readonly<Record<string, FlagSpec>>;
  /** `[min, max]` positionals. */
  readonly arity: readonly [number, number];
  run(invocation: Invocation): Promise<number>;
}

const SUBCOMMANDS: readonly Subcommand[] = [
  {
    name: "append",
    summary: "append one event (TYPE and --field, or --json), or the events on stdin, atomically",
    help: renderHelp({
      usage: [
        "berth sessions append SESSION TYPE [--field KEY=VALUE]... [flags]",
        "berth sessions append SESSION --json '{\"type\":…, …}' [flags]",
        "berth sessions append SESSION [flags] < events.jsonl",
      ],
      about:
        "Appends to SESSION's journal (a new session starts at seq 1) and prints the seq the events got, and the phase. " +
        "The events on stdin (JSON lines, or a JSON array) are appended in one call: all of them or none.\n\n" +
        EVENTS_NOTE,
      flags: [
        ["--field KEY=VALUE", "a key of the event (repeat for more)"],
        ["--json ['{…}']", "with a JSON object: the event to append; alone or with it: print the answer as one JSON line ({seq, duplicate, snapshot})"],
        ["--expected-seq N", "refuse unless the session's last seq is N (0: unless SESSION has no entry yet)"],
        ["--idempotency-key KEY", "a retry with the same key and events writes nothing and answers what the first append did; the key with other events is refused"],
        ["--fence-file FILE", "with --fence-token: refuse unless N is still the fencing token of FILE's lock (FILE resolved against the current directory)"],
        ["--fence-token N", "the fencing token a lock grant gave (BERTH_FENCING_TOKEN under berth lock hold)"],
        ...SESSIONS_ENDPOINT_FLAGS,
      ],
      exitCodes: [
        [String(EXIT.ok), "appended (or already appended with this idempotency key: nothing written)"],
        [String(EXIT.conflict), "conflict: --expected-seq is not the last seq, the fence is no longer current, or --idempotency-key was used for other events"],
        ...callExitRows("sessions"),
      ],
      examples: [
        "berth sessions append s1 generate --field pageUrl=http://localhost:3000/ --field count=3",
        "berth sessions append s1 --json '{\"type\":\"agent_phase\",\"phase\":\"planning\"}' --expected-seq 1",
        "berth sessions append s1 agent_phase --field phase=done --idempotency-key step-7",
        "berth sessions append s1 < events.jsonl",
        "berth sessions append s1 steer --fence-file \"$BERTH_LOCK_FILE\" --fence-token \"$BERTH_FENCING_TOKEN\"",
      ],
    }),
    flags: {
      field: { type: "string", multiple: true },
      event: { type: "string" },
      "expected-seq": { type: "string" },
      "idempotency-key": { type: "string" },
      "fence-file": { type: "string" },
      "fence-token": { type: "string" },
    },
    arity: [1, 2],
    run: append,
  },
  {
    name: "get",
    summary: "the session's snapshot (phase, variants, …) and its last seq",
    help: renderHelp({
      usage: ["berth sessions get SESSION [flags]"],
      about:
        "Prints SESSION's snapshot, the state derived from its journal (phase, page, variants expected and arrived, …), " +
        "one key per line, with its last seq; completed and discarded sessions too (their phase says so).",
      flags: [["--json", "print the answer as one JSON line: {lastSeq, snapshot}"], ...SESSIONS_ENDPOINT_FLAGS],
      exitCodes: [[String(EXIT.ok), "done"], NOT_FOUND_ROW, ...callExitRows("sessions")],
      examples: ["berth sessions get s1", "berth sessions get s1 --json | jq .snapshot.phase"],
    }),
    flags: {},
    arity: [1, 1],
    run: get,
  },
  {
    name: "list",
    summary: "the active sessions as a table (all with --include-completed)",
    help: renderHelp({
      usage: ["berth sessions list [--include-completed] [--page-size N [--page-token TOKEN]] [flags]"],
      about:
        "Prints the active sessions as a table: session, phase, variants arrived of expected, last update. With --include-completed, " +
        "the completed and discarded ones too. Every session is listed (the service's pages are fetched one after another); with " +
        "--page-size, one page only, and the token of the next one (on stderr, or as nextPageToken with --json). Sessions are sorted " +
        "by id and pages follow ids, so paging misses no session and shows none twice, whatever is created meanwhile.",
      flags: [
        ["--include-completed", "list completed and discarded sessions too"],
        ["--page-size N", "one page of at most N sessions (the service's largest page is 1000)"],
        ["--page-token TOKEN", "with --page-size: the page after the one that gave TOKEN"],
        ["--json", 'print one JSON line: {"sessions": [snapshot, …]} (and "nextPageToken" with --page-size)'],
        ...SESSIONS_ENDPOINT_FLAGS,
      ],
      exitCodes: [[String(EXIT.ok), "done (also when there are no sessions)"], ...callExitRows("sessions")],
      examples: [
        "berth sessions list",
        "berth sessions list --include-completed",
        "berth sessions list --json | jq -r '.sessions[].id'",
        "berth sessions list --page-size 50 --json | jq -r .nextPageToken",
      ],
    }),
    flags: { "include-completed": { type: "boolean" }, "page-size": { type: "string" }, "page-token": { type: "string" } },
    arity: [0, 0],
    run: list,
  },
  {
    name: "delete",
    summary: "delete a session: its journal and snapshot files; its watchers are ended",
    help: renderHelp({
      usage: ["berth sessions delete SESSION [--expected-seq N] [flags]"],
      about:
        "Deletes SESSION: its journal and snapshot files (the seed's library no longer sees it either) and its idempotency keys. " +
        "Its watchers are ended (NOT_FOUND, the session was deleted); a later append starts a new session from seq 1. " +
        "Prints the last seq it had.",
      flags: [
        ["--expected-seq N", "refuse unless the session's last seq is still N"],
        ["--json", "print the answer as one JSON line: {lastSeq}"],
        ...SESSIONS_ENDPOINT_FLAGS,
      ],
      exitCodes: [
        [String(EXIT.ok), "deleted"],
        [String(EXIT.conflict), "conflict: --expected-seq is not the last seq"],
        NOT_FOUND_ROW,
        ...callExitRows("sessions"),
      ],
      examples: ["berth sessions delete s1", "berth sessions delete s1 --expected-seq 42"],
    }),
    flags: { "expected-seq": { type: "string" } },
    arity: [1, 1],
    run: deleteSession,
  },
  {
    name: "watch",
    summary: "the journal from a seq, then every new entry as it is appended, until Ctrl-C",
    help: renderHelp({
      usage: ["berth sessions watch SESSION [--from-seq N] [--snapshots] [--progress DURATION] [flags]"],
      about:
        "Prints SESSION's journal from seq N (default: from the start), then a caught-up marker, then every new entry as it " +
        "is appended, until Ctrl-C or SIGTERM. A watcher that falls behind resumes where it stopped: nothing is missed. " +
        "Human output has one line per entry (and the snapshot after it with --snapshots); the caught-up marker goes to stderr. " +
        "A deleted session ends the watch (exit 4).",
      flags: [
        ["--from-seq N", "start at seq N (entries before it are not printed)"],
        ["--snapshots", "print the session's snapshot after each entry"],
        ["--progress DURATION", "ask the service for a progress message whenever DURATION (100ms or more) passes without an entry: a line on stderr, or {\"progress\": {lastSeq, sendTime}} with --json"],
        ["--json", 'one JSON line per entry, in the journal\'s format ({seq, id, type, ts, event}, plus "snapshot"), and {"caughtUp": {lastSeq}} once the backlog is printed'],
        ...SESSIONS_ENDPOINT_FLAGS,
      ],
      exitCodes: [[String(EXIT.ok), "stopped with Ctrl-C or SIGTERM"], [String(EXIT.notFound), "the session was deleted"], ...callExitRows("sessions")],
      examples: [
        "berth sessions watch s1",
        "berth sessions watch s1 --from-seq 10 --snapshots",
        "berth sessions watch s1 --progress 30s --json",
        "berth sessions watch s1 --json | jq -c 'select(.type == \"agent_phase\")'",
      ],
    }),
    flags: { "from-seq": { type: "string" }, snapshots: { type: "boolean" }, progress: { type: "string" } },
    arity: [1, 1],
    run: watch,
  },
  {
    name: "journal",
    summary: "the journal's entries (from a seq, at most a limit)",
    help: renderHelp({
      usage: ["berth sessions journal SESSION [--from-seq N] [--limit N] [flags]"],
      about:
        "Prints SESSION's journal entries from seq N, at most --limit of them: one line per entry (#seq, time, type, the event's keys). " +
        "When --limit stopped the read before the journal's end, a note on stderr says where the rest starts. N may be one past the last " +
        "seq (nothing to print); beyond is an error.",
      flags: [
        ["--from-seq N", "start at seq N"],
        ["--limit N", "print at most N entries (0: all)"],
        ["--json", "one JSON line per entry, in the journal's own format: {seq, id, type, ts, event}"],
        ...SESSIONS_ENDPOINT_FLAGS,
      ],
      exitCodes: [[String(EXIT.ok), "done"], NOT_FOUND_ROW, ...callExitRows("sessions")],
      examples: ["berth sessions journal s1", "berth sessions journal s1 --from-seq 10 --limit 5", "berth sessions journal s1 --json > s1.jsonl"],
    }),
    flags: { "from-seq": { type: "string" }, limit: { type: "string" } },
    arity: [1, 1],
    run: journal,
  },
];

const HELP = renderHelp({
  usage: ["berth sessions <command> [SESSION] [arguments] [flags]"],
  about:
    "Append to, read and follow the session journals of the sessions service. SESSION is an id of 1 to 128 letters, " +
    "digits, '_' or '-'. Human output by default; --json prints JSON lines for scripts.",
  commands: [
    ["append SESSION TYPE [--field KEY=VALUE]...", "append one event of type TYPE"],
    ["append SESSION --json '{…}'", "append one event given as JSON"],
    ["append SESSION < events.jsonl", "append the events on stdin (JSON lines or a JSON array) atomically, in one call"],
    ["get SESSION", "the session's snapshot (phase, variants, …) and its last seq"],
    ["list", "the active sessions (all with --include-completed)"],
    ["delete SESSION", "delete the session (journal and snapshot files); its watchers are ended"],
    ["watch SESSION [--from-seq N]", "the journal from seq N, then every new entry as it is appended, until Ctrl-C"],
    ["journal SESSION [--from-seq N] [--limit N]", "the journal's entries"],
  ],
  flags: [
    ["--json", "JSON lines: one object (append, get, list, delete) or one line per entry (watch, journal)"],
    ["--expected-seq N", "append, delete: refuse unless the session's last seq is N (append 0: unless it has no entry yet)"],
    ["--idempotency-key KEY", "append: a retry with the same key and events writes nothing and answers the first"],
    ["--fence-file FILE --fence-token N", "append: refuse unless N is still the fencing token of FILE's lock"],
    ...SESSIONS_ENDPOINT_FLAGS,
  ],
  notes: EVENTS_NOTE,
  exitCodes: [
    [String(EXIT.ok), "done (watch: stopped with Ctrl-C)"],
    [String(EXIT.conflict), "conflict: --expected-seq is not the last seq, the fence is no longer current, or the idempotency key was used for other events"],
    [String(EXIT.notFound), "not found: the session has no journal (get, journal, delete), or was deleted (watch)"],
    ...callExitRows("sessions"),
  ],
  examples: [
    "berth sessions append s1 generate --field pageUrl=http://localhost:3000/ --field count=3",
    "berth sessions append s1 --json '{\"type\":\"agent_phase\",\"phase\":\"planning\"}' --expected-seq 1",
    "berth sessions get s1",
    "berth sessions list --json | jq -r '.sessions[].id'",
    "berth sessions watch s1 --from-seq 1 --snapshots",
    "berth sessions journal s1 --from-seq 10 --limit 5 --json",
    "berth sessions delete s1",
  ],
  footer: "Run 'berth sessions <command> --help' for a command's own flags, exit codes and examples.",
});

/** `berth sessions …`. */
export const sessionsCommand: Command = {
  name: "sessions",
  help: HELP,
  subcommands: SUBCOMMANDS,
  async run(argv) {
    const [name, ...rest] = argv;
    const subcommand = SUBCOMMANDS.find((s) => s.name === name);
    // main checks the subcommand first; this is for a caller that did not.
    if (subcommand === undefined) return usageError("berth sessions", `unknown command '${name ?? ""}'`);
    const where = `berth sessions ${subcommand.name}`;
    let invocation: Invocation;
    try {
      const parsed = parseFlags(subcommand.name === "append" ? eventJsonAsFlag(rest) : rest, { ...COMMON_FLAGS, ...subcommand.flags }, true);
      const [min, max] = subcommand.arity;
      if (parsed.positionals.length > max) throw new UsageError(`unexpected argument '${parsed.positionals[max]}'`);
      if (parsed.positionals.length < min) throw new UsageError(min === 1 && max <= 2 ? "no SESSION given" : `expected at least ${min} arguments`);
      const values = parsed.values;
      // Checked here too, so a mistyped id is a usage error even when the service is down.
      const sessionId = parsed.positionals[0];
      if (subcommand.name !== "list" && sessionId !== undefined && !isSessionId(sessionId)) {
        throw new UsageError(`SESSION must match ${SESSION_ID_RULE}, got ${JSON.stringify(sessionId)}`);
      }
      const endpoint = resolveEndpoint({
        url: stringFlag(values, "sessions-url"),
        urlEnv: "BERTH_SESSIONS_URL",
        defaultUrl: DEFAULT_SESSIONS_URL,
        tokenFile: stringFlag(values, "token-file"),
      });
      invocation = {
        values,
        positionals: parsed.positionals,
        client: createClient(SessionService, createTransport(endpoint)),
        endpoint,
        json: values.json === true,
        out: styleFor(process.stdout),
      };
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError(where, error.message);
    }
    try {
      return await subcommand.run(invocation);
    } catch (error) {
      if (error instanceof UsageError) return usageError(where, error.message);
      return reportFailure(where, describeFailure(error, "sessions", invocation.endpoint.url), invocation.json);
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

  const expectedSeq = values["expected-seq"] === undefined ? undefined : wholeNumber(values["expected-seq"] as string, "--expected-seq");
  const request = {
    sessionId,
    idempotencyKey: (values["idempotency-key"] as string | undefined) ?? "",
    // The service's expected_seq is a seq; "no entry yet" is an expected state.
    expected:
      expectedSeq === undefined
        ? { case: undefined }
        : expectedSeq === 0n
          ? { case: "expectedState" as const, value: ExpectedState.NO_SESSION }
          : { case: "expectedSeq" as const, value: expectedSeq },
    ...fenceOf(values),
  };
  let firstSeq: bigint;
  let lastSeq: bigint;
  let duplicate: boolean;
  let snapshot: Snapshot | undefined;
  if (typed.length === 1) {
    const res = await retryOvertaken(() => client.appendEvent({ ...request, event: typed[0]! }));
    ({ seq: lastSeq, duplicate, snapshot } = res);
    firstSeq = lastSeq;
    if (json) printJson({ seq: String(res.seq), duplicate, snapshot: snapshot ? snapshotJson(snapshot) : null });
  } else {
    const res = await retryOvertaken(() => client.appendEvents({ ...request, events: typed }));
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

/**
 * `call`, made again when the service refused it as overtaken (UNAVAILABLE APPEND_OVERTAKEN: a seed
 * process's line got in front of it, and nothing of it was kept), after the delay its RetryInfo
 * asks, up to {@link OVERTAKEN_ATTEMPTS} times in all.
 */
async function retryOvertaken<T>(call: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await call();
    } catch (error) {
      const connectError = ConnectError.from(error);
      const overtaken = connectError.code === Code.Unavailable && connectError.findDetails(ErrorInfoSchema)[0]?.reason === "APPEND_OVERTAKEN";
      if (!overtaken || attempt >= OVERTAKEN_ATTEMPTS) throw error;
      const delay = connectError.findDetails(RetryInfoSchema)[0]?.retryDelay;
      await new Promise((resolve) => setTimeout(resolve, Math.min(1000, delay === undefined ? 10 : durationMs(delay))));
    }
  }
}

function fenceOf(values: Invocation["values"]): { fence?: { file: string; fencingToken: bigint } } {
  const file = values["fence-file"] as string | undefined;
  const token = values["fence-token"] as string | undefined;
  if (file === undefined && token === undefined) return {};
  if (file === undefined || token === undefined) throw new UsageError("--fence-file and --fence-token go together");
  return { fence: { file: absoluteLockPath(file), fencingToken: wholeNumber(token, "--fence-token") } };
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

async function get({ positionals, client, json, out }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  const res = await client.getSnapshot({ sessionId });
  if (json) {
    printJson({ lastSeq: String(res.lastSeq), snapshot: res.snapshot ? snapshotJson(res.snapshot) : null });
    return EXIT.ok;
  }
  const view = res.snapshot ? snapshotJson(res.snapshot) : {};
  const rows: Array<[string, string]> = [
    ["session", sessionId],
    ["last seq", String(res.lastSeq)],
  ];
  for (const [key, value] of Object.entries(view)) {
    if (key === "id") continue;
    rows.push([key, human(value)]);
  }
  const width = Math.max(...rows.map(([key]) => key.length));
  process.stdout.write(rows.map(([key, value]) => `${out.bold(key.padEnd(width))}  ${value}`).join("\n") + "\n");
  return EXIT.ok;
}

async function list({ values, client, json, out }: Invocation): Promise<number> {
  const includeCompleted = values["include-completed"] === true;
  const onePage = values["page-size"] !== undefined;
  if (values["page-token"] !== undefined && !onePage) throw new UsageError("--page-token goes with --page-size");
  const pageSize = onePage ? Number(wholeNumber(values["page-size"] as string, "--page-size", 1_000_000n)) : 0;
  if (onePage && pageSize === 0) throw new UsageError("--page-size must be at least 1");
  let pageToken = (values["page-token"] as string | undefined) ?? "";
  const sessions: Snapshot[] = [];
  for (;;) {
    const page = await client.listSessions({ includeCompleted, pageSize, pageToken });
    sessions.push(...page.sessions);
    pageToken = page.nextPageToken;
    if (onePage || pageToken === "") break;
  }
  if (json) {
    printJson({ sessions: sessions.map(snapshotJson), ...(onePage ? { nextPageToken: pageToken } : {}) });
    return EXIT.ok;
  }
  if (onePage && pageToken !== "") process.stderr.write(`${styleFor(process.stderr).dim(`-- more: --page-token ${pageToken}`)}\n`);
  if (sessions.length === 0) {
    process.stdout.write(includeCompleted ? "no sessions\n" : "no active sessions\n");
    return EXIT.ok;
  }
  const rows = [["SESSION", "PHASE", "VARIANTS", "UPDATED"]];
  for (const s of sessions) {
    rows.push([s.id, s.phase, `${s.arrivedVariants}/${s.expectedVariants}`, s.updatedAt ? timestampDate(s.updatedAt).toISOString() : "-"]);
  }
  const widths = rows[0]!.map((_, col) => Math.max(...rows.map((row) => row[col]!.length)));
  const lines = rows.map((row) => row.map((cell, col) => (col === row.length - 1 ? cell : cell.padEnd(widths[col]!))).join("  "));
  process.stdout.write([out.bold(lines[0]!), ...lines.slice(1)].join("\n") + "\n");
  return EXIT.ok;
}

async function journal({ values, positionals, client, json, out }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  const fromSeq = values["from-seq"] === undefined ? 0n : wholeNumber(values["from-seq"] as string, "--from-seq");
  const limit = values.limit === undefined ? 0 : Number(wholeNumber(values.limit as string, "--limit", 0x7fffffffn));
  for await (const batch of client.readJournal({ sessionId, fromSeq, limit })) {
    for (const entry of batch.entries) printEntry(entry, json, out);
    if (batch.end?.more && !json) process.stderr.write(`${styleFor(process.stderr).dim(`-- more from seq ${batch.end.nextSeq} (last seq ${batch.end.lastSeq}): --from-seq ${batch.end.nextSeq}`)}\n`);
  }
  return EXIT.ok;
}

async function deleteSession({ values, positionals, client, json }: Invocation): Promise<number> {
  const sessionId = positionals[0]!;
  const expectedSeq = values["expected-seq"] === undefined ? undefined : wholeNumber(values["expected-seq"] as string, "--expected-seq");
  const res = await client.deleteSession({ sessionId, ...(expectedSeq !== undefined ? { expectedSeq } : {}) });
  if (json) printJson({ lastSeq: String(res.lastSeq) });
  else process.stdout.write(`${sessionId}: deleted (its last seq was ${res.lastSeq})\n`);
  return EXIT.ok;
}

/**
 * Follows the session until Ctrl-C (exit 0). A watcher the service ended for falling behind
 * resumes where it stopped (the service says where), so nothing is missed.
 */
async function watch({ values, positionals, client, json, out }: Invocation): Promise<number> {
  const err = styleFor(process.stderr);
  const sessionId = positionals[0]!;
  let fromSeq = values["from-seq"] === undefined ? 0n : wholeNumber(values["from-seq"] as string, "--from-seq");
  const includeSnapshot = values.snapshots === true;
  const progressMs = values.progress === undefined ? undefined : durationOf(values.progress as string, "--progress");
  if (progressMs !== undefined && progressMs < 100) throw new UsageError("--progress must be at least 100ms");
  const progressInterval = progressMs === undefined ? undefined : durationFromMs(progressMs);
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    for (;;) {
      try {
        for await (const message of client.watchSession({ sessionId, fromSeq, includeSnapshot, progressInterval }, { signal: stop.signal })) {
          if (message.kind.case === "entries") {
            for (const { entry, snapshot } of message.kind.value.entries) {
              if (entry === undefined) continue;
              printEntry(entry, json, out, snapshot);
              fromSeq = entry.seq + 1n;
            }
          } else if (message.kind.case === "progress") {
            const { lastSeq, sendTime } = message.kind.value;
            if (json) printJson({ progress: { lastSeq: String(lastSeq), ...(sendTime ? { sendTime: timestampIso(sendTime) } : {}) } });
            else process.stderr.write(`${err.dim(`-- still following at seq ${lastSeq}`)}\n`);
          } else if (message.kind.case === "caughtUp") {
            const { lastSeq, snapshot } = message.kind.value;
            if (json) printJson({ caughtUp: { lastSeq: String(lastSeq), ...(snapshot ? { snapshot: snapshotJson(snapshot) } : {}) } });
            else {
              process.stderr.write(`${err.dim(`-- caught up at seq ${lastSeq}; following new entries (Ctrl-C to stop)`)}\n`);
              // The backlog's entries come without snapshots: the one as of the marker stands for them.
              if (snapshot) printSnapshotSummary(snapshot, out);
            }
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
        if (json) process.stderr.write(`${JSON.stringify({ event: "resumed", from_seq: Number(fromSeq), reason: "fell behind the service" })}\n`);
        else process.stderr.write(`${err.yellow(`-- fell behind the service; resuming from seq ${fromSeq}`)}\n`);
      }
    }
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

// --------------------------------------------------------------------------- output

/**
 * An entry as the journal holds it (`{seq, id, type, ts, event}`): a JSON line, or a human line
 * (`#seq  time  type  {keys}`; on a colour terminal the seq bold, the time dim, the type cyan).
 */
function printEntry(entry: JournalEntry, json: boolean, out: Style, snapshot?: Snapshot): void {
  const event = entry.event ? eventToJournal(entry.event) : {};
  const ts = entry.appendTime ? timestampIso(entry.appendTime) : undefined;
  if (json) {
    const line: Record<string, unknown> = { seq: Number(entry.seq), id: entry.sessionId, type: entry.type, ts, event: { ...event, id: entry.sessionId } };
    if (snapshot) line.snapshot = snapshotJson(snapshot);
    process.stdout.write(`${JSON.stringify(line)}\n`);
    return;
  }
  const { type: _type, ...rest } = event;
  const body = Object.keys(rest).length > 0 ? ` ${truncate(JSON.stringify(rest), 160)}` : "";
  process.stdout.write(`${out.bold(`#${entry.seq}`)}  ${out.dim(ts ?? "-")}  ${out.cyan(entry.type)}${body}\n`);
  if (snapshot) printSnapshotSummary(snapshot, out);
}

/** The snapshot's main keys on one indented line, under the entry that made it. */
function printSnapshotSummary(snapshot: Snapshot, out: Style): void {
  const s = snapshotJson(snapshot);
  const summary = ["phase", "generationPhase", "expectedVariants", "arrivedVariants", "visibleVariant"]
    .filter((key) => s[key] !== undefined)
    .map((key) => `${key}=${human(s[key]!)}`)
    .join(" ");
  process.stdout.write(`    ${out.dim("snapshot:")} ${summary}\n`);
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

function durationOf(raw: string, flag: string): number {
  try {
    return parseDuration(raw, flag);
  } catch {
    throw new UsageError(`${flag}: ${JSON.stringify(raw)} is not a duration like 500ms, 30s or 5m`);
  }
}

function wholeNumber(raw: string, flag: string, max = BigInt(Number.MAX_SAFE_INTEGER)): bigint {
  if (!/^\d+$/.test(raw.trim())) throw new UsageError(`${flag} must be a whole number ≥ 0, got ${JSON.stringify(raw)}`);
  const value = BigInt(raw.trim());
  if (value > max) throw new UsageError(`${flag} must be at most ${max}`);
  return value;
}
