/** The shape of a `berth` subcommand. */
export interface Command {
  readonly name: string;
  /** `berth <name> --help`: what it does, its flags and examples. */
  readonly usage: string;
  /** True when `run` answers `--help` itself (with the flags of the settings it loads). */
  readonly handlesHelp?: boolean;
  /**
   * Runs the command with the arguments after its name. Resolves with the exit code, or
   * `"serving"` when the process must stay up (a server, a held lock) and exits on its own later.
   */
  run(argv: string[]): Promise<number | "serving">;
}

/** Exit codes every command shares; commands document their own on top of these. */
export const EXIT = {
  ok: 0,
  /** The service answered with an error not covered by a more specific code. */
  failed: 1,
  /** Wrong flags or arguments (also when the service refuses an argument: INVALID_ARGUMENT). */
  usage: 2,
  /** The service refused because the state moved on: a stale expected seq, a fence no longer current. */
  conflict: 3,
  /** What the command names does not exist (a session without a journal). */
  notFound: 4,
  /** The service wants a valid bearer token (BERTH_TOKEN or --token-file). */
  denied: 77,
  /** The service could not be reached. */
  unreachable: 69,
  /** `berth admit`, `berth budget check`: the need is bigger than the whole budget and can never be admitted. */
  impossible: 80,
  /** `berth admit`: the budget's queue was full (BERTH_BUDGET_MAX_QUEUE); retry later. */
  queueFull: 81,
  /** `berth admit`: the wait ran out (--max-wait, BERTH_BUDGET_WAIT) before the need fit. */
  waitExhausted: 82,
  /** `berth budget check`: the need fits the budget, but not now (it would wait). */
  wouldWait: 83,
  /** `berth lock hold`: the wait ran out while the file stayed locked (EX_TEMPFAIL: retry later). */
  lockTimedOut: 75,
} as const;
