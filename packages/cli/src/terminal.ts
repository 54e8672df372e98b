/**
 * What `berth` does differently on a terminal: colours (never in a pipe or a file, nor with
 * NO_COLOR or TERM=dumb) and a status line rewritten in place. Whatever goes to a pipe stays plain
 * text without a single escape sequence.
 */

/** A stream as far as the terminal checks go (process.stdout/stderr, or a test's stand-in). */
export interface OutputStream {
  readonly isTTY?: boolean;
  readonly columns?: number;
  write(text: string): unknown;
}

/** True when `stream` is a terminal that understands escape sequences. */
export function isTerminal(stream: OutputStream, env: NodeJS.ProcessEnv = process.env): boolean {
  return stream.isTTY === true && env.TERM !== "dumb";
}

/** Text styles: SGR escapes on a colour terminal, the text unchanged anywhere else. */
export interface Style {
  readonly enabled: boolean;
  bold(text: string): string;
  dim(text: string): string;
  red(text: string): string;
  yellow(text: string): string;
  green(text: string): string;
  cyan(text: string): string;
}

const sgr = (open: number, close: number) => (text: string) => (text === "" ? text : `\x1b[${open}m${text}\x1b[${close}m`);
const plain = (text: string) => text;

/** The styles for `stream`: colours only on a terminal, and never with NO_COLOR set (no-color.org). */
export function styleFor(stream: OutputStream, env: NodeJS.ProcessEnv = process.env): Style {
  const enabled = isTerminal(stream, env) && (env.NO_COLOR === undefined || env.NO_COLOR === "");
  if (!enabled) return { enabled, bold: plain, dim: plain, red: plain, yellow: plain, green: plain, cyan: plain };
  return { enabled, bold: sgr(1, 22), dim: sgr(2, 22), red: sgr(31, 39), yellow: sgr(33, 39), green: sgr(32, 39), cyan: sgr(36, 39) };
}

/**
 * One line at the bottom of a terminal, rewritten in place (`\r`, erase line) and cut to the
 * terminal's width so it never wraps (a wrapped line could not be rewritten).
 */
export class LiveLine {
  private shown = false;

  constructor(private readonly stream: OutputStream) {}

  /** Replaces the line with `text`. */
  show(text: string): void {
    // A terminal whose size is unknown (0 columns, as under script(1)) gets a generous line.
    const columns = this.stream.columns !== undefined && this.stream.columns > 0 ? this.stream.columns : 160;
    const width = Math.max(20, columns - 1);
    this.stream.write(`\r\x1b[K${text.length > width ? `${text.slice(0, width - 1)}…` : text}`);
    this.shown = true;
  }

  /** Erases the line (before other output, or before exiting), leaving the cursor at its start. */
  clear(): void {
    if (this.shown) this.stream.write("\r\x1b[K");
    this.shown = false;
  }
}

/**
 * A {@link LiveLine} that redraws itself every second (elapsed times keep counting between
 * updates): `update` gives the function that renders the text; `stop` clears the line.
 */
export class TickingLine {
  private readonly line: LiveLine;
  private render: (() => string) | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(stream: OutputStream) {
    this.line = new LiveLine(stream);
  }

  update(render: () => string): void {
    this.render = render;
    this.line.show(render());
    this.timer ??= setInterval(() => {
      if (this.render !== undefined) this.line.show(this.render());
    }, 1000);
    // The line alone must not keep the process alive.
    this.timer.unref();
  }

  stop(): void {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    this.render = undefined;
    this.line.clear();
  }
}
