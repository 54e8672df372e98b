/**
 * CMD looked up as a shell looks it up, for the commands that wait and then run it (`berth admit`,
 * `berth lock hold`): they look before asking anything of a service, so a command that cannot run
 * does not queue for minutes or take a lock to find out, and again right before running it.
 *
 * A name with a slash is a path (from the current directory); any other name is searched on PATH,
 * an empty entry meaning the current directory. The first regular file there that this process may
 * execute is CMD; directories are passed over, and a file without the execute permission too, but
 * it is named when nothing else is found (exit 126, as a shell's "Permission denied").
 */
import { accessSync, constants, statSync } from "node:fs";
import * as path from "node:path";
import { getSystemErrorMap } from "node:util";
import { EXIT } from "../command.js";
import type { Progress } from "./progress.js";

/** Why CMD cannot be run: what to print, the exit code and the JSON event's code. */
export interface CommandProblem {
  readonly exit: typeof EXIT.commandNotFound | typeof EXIT.cannotRun;
  readonly code: "command_not_found" | "cannot_run";
  /** In words: "command not found: X", "cannot run X: it is a directory". */
  readonly message: string;
}

/** CMD found (the file to run: absolute), or why not. */
export type CommandLookup = { readonly file: string; readonly problem?: undefined } | { readonly file?: undefined; readonly problem: CommandProblem };

/** Where to look: PATH and the current directory. */
export interface LookupPlaces {
  /** PATH's value; undefined (PATH unset): the default search path, which spawn would search too. */
  readonly path: string | undefined;
  readonly cwd: string;
}

/** The search path when PATH is unset: libuv's (the C library's `_PATH_DEFPATH`), which spawn would search. */
const DEFAULT_SEARCH_PATH = "/usr/bin:/bin";

/** Looks `name` up: the file to run, or why it cannot be run. */
export function findCommand(name: string, { path: searchPath, cwd }: LookupPlaces = { path: process.env.PATH, cwd: process.cwd() }): CommandLookup {
  if (name.includes("/")) {
    const file = path.resolve(cwd, name);
    const found = inspectFile(file);
    if (found === "runnable") return { file };
    if (found === "missing") return { problem: notFound(name, " (no such file)") };
    return { problem: cannotRun(name, found === "not executable" ? "it is not executable (no execute permission)" : found) };
  }
  let notExecutable: string | undefined;
  for (const entry of (searchPath ?? DEFAULT_SEARCH_PATH).split(path.delimiter)) {
    const file = path.resolve(cwd, entry, name);
    const found = inspectFile(file);
    if (found === "runnable") return { file };
    if (found === "not executable") notExecutable ??= file;
  }
  return { problem: notExecutable === undefined ? notFound(name) : cannotRun(name, `${notExecutable} is not executable (no execute permission)`) };
}

/** Why spawning `name` failed, in words (not "spawn X ENOENT"): a lookup right before can still lose a race. */
export function spawnProblem(name: string, error: NodeJS.ErrnoException): CommandProblem {
  return error.code === "ENOENT" ? notFound(name, ` (${systemWords(error)})`) : cannotRun(name, systemWords(error));
}

/** Tells `problem` as an "error" event (a JSON line, or the message in words) and returns its exit code. */
export function reportCommandProblem(progress: Progress, problem: CommandProblem): number {
  progress.event("error", { code: problem.code, exit: problem.exit, message: problem.message }, problem.message, "error");
  return problem.exit;
}

function notFound(name: string, detail = ""): CommandProblem {
  return { exit: EXIT.commandNotFound, code: "command_not_found", message: `command not found: ${name}${detail}` };
}

function cannotRun(name: string, why: string): CommandProblem {
  return { exit: EXIT.cannotRun, code: "cannot_run", message: `cannot run ${name}: ${why}` };
}

/** Whether `file` can be executed: "runnable", "missing", "not executable", or why not in words. */
function inspectFile(file: string): string {
  let stats;
  try {
    stats = statSync(file);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    return code === "ENOENT" || code === "ENOTDIR" ? "missing" : systemWords(error as NodeJS.ErrnoException);
  }
  if (stats.isDirectory()) return "it is a directory";
  if (!stats.isFile()) return "it is not a regular file";
  try {
    accessSync(file, constants.X_OK);
    return "runnable";
  } catch {
    return "not executable";
  }
}

/** An errno's words, as the C library's strerror says them ("no such file or directory"). */
function systemWords(error: NodeJS.ErrnoException): string {
  return (error.errno === undefined ? undefined : getSystemErrorMap().get(error.errno)?.[1]) ?? error.code ?? error.message;
}
