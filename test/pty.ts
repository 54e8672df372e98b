/**
 * The `berth` CLI as a person at a terminal sees it: the built binary run in a pseudo-terminal
 * made by util-linux `script` (no native pty module needed), its stdin, stdout and stderr all on
 * that terminal. `runInTerminal` runs a command to completion; `startInTerminal` keeps it running
 * and lets the test type (`"\x03"` is Ctrl-C: the terminal turns it into SIGINT for the
 * foreground process group, as for a person). `screen(output)` replays the output the way a
 * terminal draws it (carriage returns, erased lines, colours dropped), to assert on what is left
 * on the screen rather than on the bytes.
 *
 * The output is the terminal's: newlines arrive as "\r\n", typed characters are echoed ("^C").
 */
import { spawn } from "node:child_process";
import { onStopAll, repoPath } from "./harness.js";

/** The built CLI. */
export const BERTH_CLI = repoPath("packages/cli/bin/berth.js");

/** Options of {@link runInTerminal} and {@link startInTerminal}. */
export interface TerminalOptions {
  /** Environment additions (`undefined` removes a variable). `BERTH_*` from the test's own environment never leak in. */
  readonly env?: Readonly<Record<string, string | undefined>>;
  readonly cwd?: string;
  /** The terminal's width (default 120): under `script` it would otherwise be 0, "unknown". */
  readonly columns?: number;
  /** Default 20 s; the terminal is then killed and the promise rejects with what it showed. */
  readonly timeoutMs?: number;
}

/** How a command in a terminal ended, and everything the terminal got. */
export interface TerminalResult {
  readonly code: number | null;
  readonly output: string;
}

/** A command running in a terminal. */
export interface TerminalSession {
  /** Types `text` on the terminal (`"\x03"`: Ctrl-C). */
  type(text: string): void;
  /** Everything the terminal got so far. */
  output(): string;
  /** Resolves once the output matches `pattern`; rejects after `timeoutMs` (default 10 s) with the output. */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<void>;
  /** Resolves when the command (and with it the terminal) ends. */
  readonly exited: Promise<TerminalResult>;
}

const quote = (arg: string) => `'${arg.replace(/'/g, `'\\''`)}'`;

/**
 * Starts `berth ARGS…` in a fresh pseudo-terminal. The command is `exec`ed by the terminal's
 * shell, so it is the terminal's foreground process, as when a person types it.
 */
export function startInTerminal(args: readonly string[], options: TerminalOptions = {}): TerminalSession {
  const env: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) if (!name.startsWith("BERTH_") && !name.startsWith("BACKLOT_")) env[name] = value;
  // A colour terminal unless the test says otherwise.
  env.TERM = "xterm-256color";
  delete env.NO_COLOR;
  for (const [name, value] of Object.entries(options.env ?? {})) {
    if (value === undefined) delete env[name];
    else env[name] = value;
  }
  const command = [process.execPath, BERTH_CLI, ...args].map(quote).join(" ");
  const script = `stty cols ${options.columns ?? 120} rows 40 2>/dev/null; exec ${command}`;
  // -q: no "Script started" lines; -f: flush at once; -e: exit with the command's code; -c: run this.
  const child = spawn("script", ["-qfec", script, "/dev/null"], { cwd: options.cwd ?? repoPath(), env, stdio: ["pipe", "pipe", "pipe"] });
  let output = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => (output += chunk));
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (output += chunk));
  child.stdin.on("error", () => {});
  let done = false;
  const timeoutMs = options.timeoutMs ?? 20_000;
  const exited = new Promise<TerminalResult>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`berth ${args.join(" ")} still ran in its terminal after ${timeoutMs} ms; it showed:\n${output}`));
    }, timeoutMs);
    child.once("error", (error) => {
      clearTimeout(timer);
      reject(new Error(`cannot run script(1) for a pseudo-terminal: ${error.message}`));
    });
    child.once("close", (code) => {
      done = true;
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
  // A rejection nobody awaits yet must not fail the run; the test sees it when it awaits.
  exited.catch(() => {});
  onStopAll(() => {
    if (!done) child.kill("SIGKILL");
  });
  return {
    type(text) {
      child.stdin.write(text);
    },
    output: () => output,
    async waitFor(pattern, waitMs = 10_000) {
      const deadline = Date.now() + waitMs;
      while (!pattern.test(output)) {
        if (done || Date.now() > deadline) {
          throw new Error(
            `berth ${args.join(" ")}: ${done ? "ended" : `nothing like ${pattern} within ${waitMs} ms`}; the terminal showed:\n${JSON.stringify(output)}`,
          );
        }
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    },
    exited,
  };
}

/** Runs `berth ARGS…` in a fresh pseudo-terminal to completion (stdin: the terminal, nothing typed). */
export function runInTerminal(args: readonly string[], options: TerminalOptions = {}): Promise<TerminalResult> {
  const session = startInTerminal(args, options);
  return session.exited;
}

// An SGR (colour) sequence, or any other CSI sequence but "erase line".
const CSI = /^\x1b\[[0-9;?]*[A-Za-z]/;

/**
 * What is left on the screen after `output`: "\r" returns to the line's start, "\x1b[K" erases to
 * its end, later text overwrites earlier; colours and other escape sequences are dropped. Lines
 * are joined with "\n", without trailing blanks.
 */
export function screen(output: string): string {
  const lines: string[][] = [[]];
  let row = 0;
  let col = 0;
  for (let i = 0; i < output.length; i++) {
    const ch = output[i]!;
    if (ch === "\x1b") {
      const match = CSI.exec(output.slice(i));
      if (match !== null) {
        if (match[0].endsWith("K")) lines[row]!.length = col;
        i += match[0].length - 1;
      }
      continue;
    }
    if (ch === "\r") col = 0;
    else if (ch === "\n") {
      row++;
      col = 0;
      lines[row] ??= [];
    } else {
      lines[row]![col] = ch;
      col++;
    }
  }
  return lines
    .map((line) =>
      Array.from(line, (c) => c ?? " ")
        .join("")
        .trimEnd(),
    )
    .join("\n")
    .replace(/\n+$/, "");
}

/** True when `text` holds an SGR (colour or bold) sequence. */
export function hasColour(text: string): boolean {
  return /\x1b\[[0-9;]*m/.test(text);
}

/** True when `text` holds any terminal escape sequence at all. */
export function hasEscapes(text: string): boolean {
  return text.includes("\x1b");
}
