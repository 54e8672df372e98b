/**
 * How the commands that wait and then run CMD (`berth admit`, `berth lock hold`) tell their
 * progress, on stderr (stdout is CMD's): on a terminal, a status line rewritten in place while
 * waiting and a line per event after; anywhere else (or with --json), one JSON line per event.
 */
import { TickingLine, isTerminal, styleFor } from "../terminal.js";

/** What the user is told while waiting and after. */
export interface Progress {
  /** True when events are JSON lines. */
  readonly json: boolean;
  /**
   * Still waiting: a JSON line `{"event": name, ...fields}`, or the live line from `render`
   * (called again every second, so elapsed times keep counting).
   */
  waiting(name: string, fields: Record<string, unknown>, render: () => string): void;
  /**
   * Something happened: a JSON line `{"event": name, ...fields}`, or on a terminal `line` (when
   * given; some events are only for scripts) in the colour of its `tone`.
   */
  event(name: string, fields: Record<string, unknown>, line?: string, tone?: "info" | "warn" | "error"): void;
  /** Clears the live line (before CMD takes the terminal, or before exiting). */
  done(): void;
}

/**
 * JSON lines with `json` or when stderr is not a terminal; else the live line, prefixed with
 * `prefix` ("berth admit"); on a terminal that cannot rewrite a line (TERM=dumb), a line per update.
 */
export function progressFor(prefix: string, json: boolean): Progress {
  if (json || !process.stderr.isTTY) return jsonProgress((text) => process.stderr.write(text));
  if (!isTerminal(process.stderr)) return lineProgress(prefix, (text) => process.stderr.write(text));
  return terminalProgress(prefix, process.stderr);
}

/** A plain line per update and per event, for a terminal without escape sequences. */
export function lineProgress(prefix: string, write: (text: string) => void): Progress {
  return {
    json: false,
    waiting(_name, _fields, render) {
      write(`${prefix}: ${render()}\n`);
    },
    event(_name, _fields, line) {
      if (line !== undefined) write(`${prefix}: ${line}\n`);
    },
    done() {},
  };
}

/** One JSON line per event (undefined fields left out). */
export function jsonProgress(write: (text: string) => void): Progress {
  const line = (name: string, fields: Record<string, unknown>) => write(`${JSON.stringify({ event: name, ...fields })}\n`);
  return { json: true, waiting: line, event: line, done() {} };
}

/** The live line on `stream`, and event lines for people. */
export function terminalProgress(prefix: string, stream: NodeJS.WriteStream): Progress {
  const live = new TickingLine(stream);
  const style = styleFor(stream);
  return {
    json: false,
    waiting(_name, _fields, render) {
      live.update(() => `${prefix}: ${render()}`);
    },
    event(_name, _fields, line, tone = "info") {
      live.stop();
      if (line === undefined) return;
      const text = tone === "error" ? style.red(line) : tone === "warn" ? style.yellow(line) : line;
      stream.write(`${prefix}: ${text}\n`);
    },
    done() {
      live.stop();
    },
  };
}
