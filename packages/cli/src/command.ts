/** The shape of a `berth` command, and the exit codes every command shares. */

/** A subcommand's help, for `berth <command> <sub> --help` and `berth help <command> <sub>`. */
export interface SubcommandHelp {
  readonly name: string;
  /** One line, for the command's list of subcommands. */
  readonly summary: string;
  /** The whole help: usage, what it does, flags, exit codes, examples. */
  readonly help: string;
}

/** A `berth` command. */
export interface Command {
  readonly name: string;
  /** `berth <name> --help`: what it does, its flags, exit codes and examples. */
  readonly help: string;
  /** The subcommands (`berth sessions append`), each with its own help. */
  readonly subcommands?: readonly SubcommandHelp[];
  /**
   * True when `run` answers `--help` itself (`berth up`: its flags come from the settings it
   * loads). Otherwise `berth` answers a `--help` before any `--` (after `--`, it is CMD's).
   */
  readonly handlesHelp?: boolean;
  /**
   * Runs the command with the arguments after its name. Resolves with the exit code, or
   * `"serving"` when the process must stay up (a server) and exits on its own later.
   */
  run(argv: string[]): Promise<number | "serving">;
}

/**
 * Exit codes every command shares. The commands that run CMD (`admit`, `lock hold`) exit with
 * CMD's own code once CMD ran; these are for everything that happens before (or instead of) that.
 * docs/cli.md has the same table.
 */
export const EXIT = {
  ok: 0,
  /** The service answered with an error not covered by a more specific code. */
  failed: 1,
  /** Wrong command, flags or arguments (also when the service refuses an argument: INVALID_ARGUMENT). */
  usage: 2,
  /** The service refused because the state moved on: a stale expected seq, a fence no longer current, an idempotency key used for other events. */
  conflict: 3,
  /** What the command names does not exist (a session without a journal, a reservation). */
  notFound: 4,
  /** The service could not be reached, is shutting down, or did not answer in time (EX_UNAVAILABLE). */
  unreachable: 69,
  /**
   * The wait ran out (EX_TEMPFAIL: retry later): `lock hold` (FILE stayed locked past --max-wait) and
   * `admit` (the need did not fit within --max-wait).
   */
  timedOut: 75,
  /** The service wants a valid bearer token (BERTH_TOKEN or --token-file) (EX_NOPERM). */
  denied: 77,
  /** `admit`, `budget check`: the need is bigger than the whole budget and can never be admitted. */
  impossible: 80,
  /** `admit`: the budget's queue was full (BERTH_BUDGET_MAX_QUEUE); retry later. */
  queueFull: 81,
  /** `budget check`: the need fits the budget, but not now (it would wait). */
  wouldWait: 82,
  /** `admit`, `lock hold`: CMD cannot be run (no execute permission, a directory); told before the service is asked. */
  cannotRun: 126,
  /** `admit`, `lock hold`: CMD was not found (on PATH, or no such file); told before the service is asked. */
  commandNotFound: 127,
} as const;
