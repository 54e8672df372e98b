/**
 * Command-line parsing for every `berth` command: `node:util` parseArgs, with its errors rewritten
 * as one short sentence naming the flag or argument (and the nearest known name, for a typo), and
 * the usage error every command prints the same way.
 */
import { parseArgs, type ParseArgsConfig } from "node:util";
import { closest } from "@berth/shared/closest";
import { EXIT } from "./command.js";

export { closest };

/** A command-line mistake: the command prints the message and exits with the usage code. */
export class UsageError extends Error {
  override name = "UsageError";
}

/** A flag's declaration (parseArgs's option config). */
export interface FlagSpec {
  readonly type: "string" | "boolean";
  readonly multiple?: boolean;
  readonly short?: string;
}

/** Parsed flags by name, and the positional arguments. */
export interface ParsedArgs {
  readonly values: Readonly<Record<string, string | boolean | string[] | undefined>>;
  readonly positionals: string[];
}

/**
 * Parses `args` against `flags` (strict: an unknown flag is an error). Throws UsageError with a
 * message like `unknown flag '--jsn' (did you mean --json?)`.
 */
export function parseFlags(args: readonly string[], flags: Readonly<Record<string, FlagSpec>>, allowPositionals: boolean): ParsedArgs {
  try {
    const parsed = parseArgs({ args: [...args], options: flags as ParseArgsConfig["options"], strict: true, allowPositionals });
    return { values: parsed.values as ParsedArgs["values"], positionals: parsed.positionals };
  } catch (error) {
    throw new UsageError(explainParseError(error, flags));
  }
}

/** parseArgs's error as one sentence. */
export function explainParseError(error: unknown, flags: Readonly<Record<string, FlagSpec>>): string {
  const code = (error as NodeJS.ErrnoException).code;
  const message = (error as Error).message;
  const quoted = /'([^']+)'/.exec(message)?.[1] ?? "";
  switch (code) {
    // "Unknown option '--bogus'…": name it and suggest the nearest flag.
    case "ERR_PARSE_ARGS_UNKNOWN_OPTION": {
      const known = Object.entries(flags).flatMap(([name, spec]) => [`--${name}`, ...(spec.short === undefined ? [] : [`-${spec.short}`])]);
      const near = closest(quoted.replace(/=.*/, ""), known);
      return `unknown flag '${quoted}'${near === undefined ? "" : ` (did you mean ${near}?)`}`;
    }
    // "Option '--from-seq <value>' argument missing" / "Option '--json' does not take an argument" /
    // "…argument is ambiguous" (a value that starts with '-').
    case "ERR_PARSE_ARGS_INVALID_OPTION_VALUE": {
      const flag = quoted.replace(/ <value>$/, "");
      if (/argument missing/.test(message)) return `${flag} needs a value`;
      if (/does not take an argument/.test(message)) return `${flag} takes no value`;
      if (/ambiguous/.test(message)) return `${flag}: a value that starts with '-' must be given as ${flag}=VALUE`;
      return message;
    }
    // "Unexpected argument 'x'. This command does not take positional arguments".
    case "ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL":
      return `unexpected argument '${quoted}'`;
    default:
      return message;
  }
}

/** True when `--help`/`-h` is among a command's own arguments (before any `--`: after it, they are CMD's). */
export function wantsHelp(argv: readonly string[]): boolean {
  const separator = argv.indexOf("--");
  const own = separator < 0 ? argv : argv.slice(0, separator);
  return own.includes("--help") || own.includes("-h");
}

/**
 * Prints a usage error the way every command does (`berth lock hold: no FILE`, then where the help
 * is) and returns the usage exit code. Usage errors are plain text even under `--json`: they are
 * a mistake in the command line, for the person who wrote it.
 */
export function usageError(command: string, message: string): number {
  process.stderr.write(`${command}: ${message}\nRun '${command} --help' for usage and examples.\n`);
  return EXIT.usage;
}

/** `--name`'s string value, or undefined. */
export function stringFlag(values: ParsedArgs["values"], name: string): string | undefined {
  const value = values[name];
  return typeof value === "string" ? value : undefined;
}
