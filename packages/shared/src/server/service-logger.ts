/**
 * The log a service process writes (on stdout): JSON lines, pino's own, for whatever reads it (a
 * pipe, a file, a supervisor's journal); readable lines (pino-pretty) for a person watching a
 * terminal. `--log-format` / `BERTH_LOG_FORMAT` chooses either way.
 *
 * pino-pretty is loaded only when the log is pretty: a piped or supervised service never loads it.
 * It runs in this thread on a synchronous stream, not as a pino worker transport: a person at a
 * terminal writes little, and a worker thread would cost memory and lose the last lines of a crash.
 */
import { pino, type Logger } from "pino";
import type { LogFormat } from "../config.js";

/** Where the log goes: a file descriptor, and whether it is a terminal (`process.stdout` is one). */
export interface LogOutput {
  readonly fd: number;
  readonly isTTY?: boolean | undefined;
}

/** What {@link createServiceLogger} needs. */
export interface ServiceLoggerOptions {
  /** The pino level name. */
  readonly level: string;
  /** The format asked for (`--log-format`); unset: pretty on a terminal, JSON anything else. */
  readonly format?: LogFormat | undefined;
  /** Default: stdout. */
  readonly output?: LogOutput;
  /** Default `process.env` (`NO_COLOR` turns the colours of a pretty log off). */
  readonly env?: NodeJS.ProcessEnv;
  /** How pino-pretty is loaded (tests count it). */
  readonly loadPretty?: () => Promise<Pick<typeof import("pino-pretty"), "build">>;
}

/** The format of a log written to `output`: the one asked for, else pretty on a terminal and JSON otherwise. */
export function logFormatFor(asked: LogFormat | undefined, output: Pick<LogOutput, "isTTY">): LogFormat {
  return asked ?? (output.isTTY === true ? "pretty" : "json");
}

/** The service's logger, in the format {@link logFormatFor} picks for its output. */
export async function createServiceLogger(options: ServiceLoggerOptions): Promise<{ logger: Logger; format: LogFormat }> {
  const output = options.output ?? { fd: 1, isTTY: process.stdout.isTTY };
  const format = logFormatFor(options.format, output);
  const settings = { level: options.level, base: { pid: process.pid } };
  if (format === "pretty") {
    const { build: pretty } = await (options.loadPretty ?? (() => import("pino-pretty")))();
    const env = options.env ?? process.env;
    const stream = pretty({
      destination: output.fd,
      sync: true,
      colorize: output.isTTY === true && (env["NO_COLOR"] ?? "") === "",
      translateTime: "SYS:HH:MM:ss.l",
      ignore: "pid,hostname",
      // One line per record, its fields after the message: the log of a busy service stays a list.
      singleLine: true,
    });
    return { logger: pino(settings, stream), format };
  }
  // Asynchronous destination: a log line costs the request path a buffer copy, not a write(2).
  // Shutdown flushes it (pino's final flush on exit).
  const destination = pino.destination({ dest: output.fd, sync: false });
  const logger = pino(settings, destination);
  // A reader that went away (`berth up | head`, a supervisor that closed the pipe) must not wedge
  // the process: the writer would retry EPIPE forever, even through shutdown. Logs stop; serving
  // goes on.
  destination.on("error", (error: NodeJS.ErrnoException) => {
    if (error.code !== "EPIPE") return;
    logger.level = "silent";
    destination.destroy();
  });
  return { logger, format };
}
