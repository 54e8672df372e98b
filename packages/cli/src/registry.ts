/**
 * Every `berth` command, and the top-level help. A command's module loads only when it runs (or
 * when its help is asked for): `berth --help` or a client command should not pay for loading the
 * services (`up`) or every generated descriptor.
 */
import { EXIT, type Command } from "./command.js";
import { renderHelp, type HelpRow } from "./help.js";

/** A command as `berth --help` lists it, and how to load it. */
export interface CommandEntry {
  readonly name: string;
  /** One line for `berth --help`. */
  readonly summary: string;
  load(): Promise<Command>;
}

/** The commands, in the order `berth --help` lists them. */
export const COMMANDS: readonly CommandEntry[] = [
  {
    name: "up",
    summary: "run the sessions and budget services in the foreground (Ctrl-C stops both)",
    load: async () => (await import("./commands/up.js")).upCommand,
  },
  {
    name: "ui",
    summary: "serve the live page of the running services on loopback (sessions, locks, budget in a browser)",
    load: async () => (await import("./commands/ui.js")).uiCommand,
  },
  {
    name: "sessions",
    summary: "append to, read and watch session journals (append, get, list, watch, journal)",
    load: async () => (await import("./commands/sessions.js")).sessionsCommand,
  },
  {
    name: "lock",
    summary: "run a command while holding a source lock (like flock), inspect a lock, or show the limits (hold, inspect, limits)",
    load: async () => (await import("./commands/lock.js")).lockCommand,
  },
  {
    name: "admit",
    summary: "wait for room in the load budget, run a command, release when it exits",
    load: async () => (await import("./commands/admit.js")).admitCommand,
  },
  {
    name: "budget",
    summary: "look at the load budget: check a need, the state, the machine (check, state, machine, watch, build-done)",
    load: async () => (await import("./commands/budget.js")).budgetCommand,
  },
  {
    name: "mcp",
    summary: "serve berth to a coding agent over stdio (Model Context Protocol): locks, journals, waits, the budget",
    load: async () => (await import("./commands/mcp.js")).mcpCommand,
  },
];

/** The command named `name`, if any. */
export function findCommand(name: string): CommandEntry | undefined {
  return COMMANDS.find((c) => c.name === name);
}

/** The exit codes every command shares, as help rows (docs/cli.md has the same table). */
export const COMMON_EXIT_ROWS: readonly HelpRow[] = [
  [String(EXIT.ok), "done"],
  [String(EXIT.failed), "the service failed otherwise (the message says how)"],
  [String(EXIT.usage), "wrong command, flags or arguments, or an argument the service refused"],
  [String(EXIT.conflict), "conflict: the state moved on (an expected seq, a fence no longer current)"],
  [String(EXIT.notFound), "not found: the session, or the reservation, does not exist"],
  [String(EXIT.unreachable), "the service cannot be reached, is shutting down or did not answer"],
  [String(EXIT.timedOut), "timed out: the wait ran out (lock hold --max-wait, admit --max-wait)"],
  [String(EXIT.denied), "the service wants a bearer token (BERTH_TOKEN, BERTH_TOKEN_FILE, --token-file)"],
  [String(EXIT.impossible), "refused: the need can never fit the budget (admit, budget check)"],
  [String(EXIT.queueFull), "refused: the budget's queue is full; retry later (admit)"],
  [String(EXIT.wouldWait), "the need fits the budget, but not now (budget check)"],
  ["126/127", "CMD cannot be run / was not found (admit, lock hold)"],
  ["128+N", "interrupted by signal N while waiting (130: Ctrl-C); once CMD runs, CMD's own code"],
];

/** `berth --help`. */
export function overview(): string {
  return renderHelp({
    usage: ["berth <command> [arguments] [flags]", "berth help <command> [<subcommand>]"],
    about:
      "berth from a shell: the session journals and source locks of the sessions service, and the load budget " +
      "of the budget service. Human output on a terminal; --json for scripts (JSON lines, no colours, no escapes).",
    commands: COMMANDS.map((c) => [c.name, c.summary]),
    flags: [
      ["--help, -h", "help for berth, a command (berth lock --help) or a subcommand (berth lock hold --help)"],
      ["--version", "the version of berth"],
    ],
    notes:
      "Every client command finds the sessions and the budget service by --sessions-url/--budget-url, else " +
      "BERTH_SESSIONS_URL/BERTH_BUDGET_URL (http://HOST:PORT or unix:/path/to/socket), else the services' own " +
      "BERTH_SESSIONS_SOCKET/BERTH_BUDGET_SOCKET, else BERTH_HOST with BERTH_SESSIONS_PORT/BERTH_BUDGET_PORT, else " +
      "http://127.0.0.1:7301 and :7302; the bearer token from --token-file, else BERTH_TOKEN_FILE, else BERTH_TOKEN " +
      '(the README\'s "Finding the services"). NO_COLOR turns colours off.',
    exitCodes: COMMON_EXIT_ROWS,
    examples: [
      "berth up                                          # both services, state in ./.berth",
      "berth sessions append demo generate --field count=3",
      "berth sessions watch demo",
      "berth lock hold src/app.css -- ./rewrite.sh",
      "berth admit --memory 2G --cpu 2 -- npm run build",
      "berth budget state",
      "berth help lock hold",
    ],
    footer: "Run 'berth <command> --help' (or 'berth help <command>') for a command's flags, exit codes and examples. docs/cli.md has them all.",
  });
}
