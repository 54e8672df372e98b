/**
 * `berth sessions append|get|list|watch|journal|delete`: the session journals from a shell. Human output
 * by default (a table, key/value lines, one line per entry; colours on a terminal), `--json` for
 * scripts (JSON lines); the exit code says what happened (see each subcommand's help).
 *
 * This module is the command's help and command line; the calls are in sessions-run.ts, loaded
 * once the command line is known to be right.
 */
import { SESSION_ID_RULE, isSessionId } from "@berth/shared/safe-id";
import { parseFlags, usageError, UsageError, type FlagSpec } from "../args.js";
import { endpointFromFlags } from "../run/endpoint-flags.js";
import { EXIT, type Command, type SubcommandHelp } from "../command.js";
import { DEFAULT_SESSIONS_URL, SESSIONS_ENDPOINT_FLAGS, callExitRows } from "../common-help.js";
import { renderHelp, type HelpRow } from "../help.js";
import type { SessionsInvocation, SubcommandName } from "./sessions-invocation.js";

export { DEFAULT_SESSIONS_URL };

const COMMON_FLAGS: Readonly<Record<string, FlagSpec>> = {
  json: { type: "boolean" },
  "sessions-url": { type: "string" },
  "token-file": { type: "string" },
  help: { type: "boolean", short: "h" },
};

const EVENTS_NOTE =
  'Events are the seed\'s journal events: a JSON object with a "type" and the event\'s own keys ("pageUrl", "count", …). ' +
  'A --field VALUE is read as JSON when it is JSON (3, true, null, "quoted", {…}, […]) and as a string otherwise. ' +
  'A key the event type has a typed field for (a generate event\'s "count", "pageUrl", …) must hold that field\'s type, ' +
  "as the API checks it (--field count=abc is refused, exit 2); other keys are kept as given.";

const NOT_FOUND_ROW: HelpRow = [String(EXIT.notFound), "not found: SESSION has no journal"];

interface Subcommand extends SubcommandHelp {
  readonly name: SubcommandName;
  /** Flags besides the common ones. */
  readonly flags: Readonly<Record<string, FlagSpec>>;
  /** `[min, max]` positionals. */
  readonly arity: readonly [number, number];
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
        [
          "--idempotency-key KEY",
          "a retry with the same key and events writes nothing and answers what the first append did; the key with other events is refused",
        ],
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
        'berth sessions append s1 --json \'{"type":"agent_phase","phase":"planning"}\' --expected-seq 1',
        "berth sessions append s1 agent_phase --field phase=done --idempotency-key step-7",
        "berth sessions append s1 < events.jsonl",
        'berth sessions append s1 steer --fence-file "$BERTH_LOCK_FILE" --fence-token "$BERTH_FENCING_TOKEN"',
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
  },
  {
    name: "delete",
    summary: "delete a session: its journal and snapshot files; its watchers are ended",
    help: renderHelp({
      usage: ["berth sessions delete SESSION [--expected-seq N] [flags]"],
      about:
        "Deletes SESSION: its journal and snapshot files (the seed's library no longer sees it either). " +
        "Its watchers are ended (NOT_FOUND, the session was deleted); a later append starts a new session that continues from its last seq + 1, " +
        "so nothing written for the old one applies to the new one. Retried with the same idempotency key when the connection fails, so it is never done twice. " +
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
  },
  {
    name: "watch",
    summary: "the journal from a seq, then every new entry as it is appended, until Ctrl-C",
    help: renderHelp({
      usage: ["berth sessions watch SESSION [--from-seq N] [--snapshots] [--progress DURATION] [--wait-for-session] [flags]"],
      about:
        "Prints SESSION's journal from seq N (default: from the start), then a caught-up marker, then every new entry as it " +
        "is appended, until Ctrl-C or SIGTERM. A watcher that falls behind resumes where it stopped: nothing is missed. " +
        "Human output has one line per entry (and the snapshot after it with --snapshots); the caught-up marker goes to stderr. " +
        "A session that does not exist (no journal: a mistyped id, or deleted) is an error (exit 4) unless --wait-for-session " +
        "asks to wait for its first entry; a deleted session ends the watch (exit 4).",
      flags: [
        ["--from-seq N", "start at seq N (entries before it are not printed)"],
        ["--snapshots", "print the session's snapshot after each entry"],
        [
          "--progress DURATION",
          'ask the service for a progress message whenever DURATION (100ms or more) passes without an entry: a line on stderr, or {"progress": {lastSeq, sendTime}} with --json',
        ],
        ["--wait-for-session", "SESSION need not exist yet: follow it from its first entry"],
        [
          "--json",
          'one JSON line per entry, in the journal\'s format ({seq, id, type, ts, event}, plus "snapshot"), and {"caughtUp": {lastSeq}} once the backlog is printed',
        ],
        ...SESSIONS_ENDPOINT_FLAGS,
      ],
      exitCodes: [
        [String(EXIT.ok), "stopped with Ctrl-C or SIGTERM"],
        [String(EXIT.notFound), "SESSION does not exist (without --wait-for-session), or was deleted"],
        ...callExitRows("sessions"),
      ],
      examples: [
        "berth sessions watch s1",
        "berth sessions watch s1 --from-seq 10 --snapshots",
        "berth sessions watch s1 --progress 30s --json",
        "berth sessions watch next-run --wait-for-session   # before anything appends to it",
        "berth sessions watch s1 --json | jq -c 'select(.type == \"agent_phase\")'",
      ],
    }),
    flags: { "from-seq": { type: "string" }, snapshots: { type: "boolean" }, progress: { type: "string" }, "wait-for-session": { type: "boolean" } },
    arity: [1, 1],
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
    ["--field KEY=VALUE", "append: a key of the event (repeat for more)"],
    ["--json", "JSON lines: one object (append, get, list, delete) or one line per entry (watch, journal); append: with '{…}', the event"],
    ["--expected-seq N", "append, delete: refuse unless the session's last seq is N (append 0: unless it has no entry yet)"],
    ["--idempotency-key KEY", "append: a retry with the same key and events writes nothing and answers the first"],
    ["--fence-file FILE", "append, with --fence-token: refuse unless N is still the fencing token of FILE's lock"],
    ["--fence-token N", "append: the fencing token a lock grant gave (BERTH_FENCING_TOKEN under berth lock hold)"],
    ["--include-completed", "list: completed and discarded sessions too"],
    ["--page-size N", "list: one page of at most N sessions"],
    ["--page-token TOKEN", "list, with --page-size: the page after the one that gave TOKEN"],
    ["--from-seq N", "watch, journal: start at seq N"],
    ["--limit N", "journal: at most N entries (0: all)"],
    ["--snapshots", "watch: the session's snapshot after each entry"],
    ["--progress DURATION", "watch: a progress line whenever DURATION passes without an entry"],
    ["--wait-for-session", "watch: SESSION need not exist yet: follow it from its first entry"],
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
    'berth sessions append s1 --json \'{"type":"agent_phase","phase":"planning"}\' --expected-seq 1',
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
    let invocation: SessionsInvocation;
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
      invocation = {
        subcommand: subcommand.name,
        values,
        positionals: parsed.positionals,
        endpoint: endpointFromFlags("sessions", values),
        json: values.json === true,
      };
    } catch (error) {
      if (!(error instanceof UsageError)) throw error;
      return usageError(where, error.message);
    }
    // The calls, and the generated code they need, load only now: help and usage errors are quick.
    const { runSessions } = await import("./sessions-run.js");
    return runSessions(invocation, where);
  },
};

// --------------------------------------------------------------------------- command line

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
