/**
 * Help texts in one layout: usage, what it does, subcommands, flags, exit codes, examples. Every
 * command and subcommand writes its help as a {@link HelpSpec}, so `--help` reads the same
 * everywhere and every help has its exit codes and examples.
 */

/** A two-column row: a flag, subcommand or exit code, and what it means. */
export type HelpRow = readonly [string, string];

/** What a help text says. */
export interface HelpSpec {
  /** Usage lines, without the leading "usage: " (`berth sessions get SESSION [flags]`). */
  readonly usage: readonly string[];
  /** What the command does: paragraphs separated by blank lines, wrapped here. */
  readonly about: string;
  /** Subcommands and what they do. */
  readonly commands?: readonly HelpRow[];
  readonly flags?: readonly HelpRow[];
  /** Exit codes (`"0"`, `"126/127"`) and when. */
  readonly exitCodes: readonly HelpRow[];
  /** Paragraphs after the flags (environment, signals, output format). */
  readonly notes?: string;
  /** Command lines a user can copy, each optionally followed by `  # comment`. */
  readonly examples: readonly string[];
  /** The closing hint (`Run 'berth sessions <command> --help' for …`). */
  readonly footer?: string;
}

const WIDTH = 100;
/** First columns wider than this put their description on the next line. */
const MAX_KEY = 28;

/** Wraps `text` at {@link WIDTH} columns, every line indented by `indent`; keeps existing line breaks. */
export function wrap(text: string, indent = "", firstIndent = indent): string {
  const out: string[] = [];
  for (const [i, paragraphLine] of text.split("\n").entries()) {
    let line = i === 0 ? firstIndent : indent;
    let empty = true;
    for (const word of paragraphLine.split(/ +/)) {
      if (word === "") continue;
      if (!empty && line.length + 1 + word.length > WIDTH) {
        out.push(line);
        line = indent;
        empty = true;
      }
      line += empty ? word : ` ${word}`;
      empty = false;
    }
    out.push(line.trimEnd());
  }
  return out.join("\n");
}

/** Rows laid out in two columns, the second wrapped with a hanging indent. */
export function rows(items: readonly HelpRow[], indent = "  "): string {
  // Keys too wide for the column go on a line of their own and do not widen it.
  const keyWidth = Math.max(0, ...items.map(([key]) => key.length).filter((length) => length <= MAX_KEY));
  const hang = `${indent}${" ".repeat(keyWidth + 2)}`;
  return items
    .map(([key, text]) => (key.length > keyWidth ? `${indent}${key}\n${wrap(text, hang)}` : wrap(text, hang, `${indent}${key.padEnd(keyWidth)}  `)))
    .join("\n");
}

/** Exit-code rows in numeric order ("126/127" sorts as 126); "CMD's" (not a number) first. */
function byCode(items: readonly HelpRow[]): HelpRow[] {
  const order = ([key]: HelpRow) => {
    const n = Number.parseInt(key, 10);
    return Number.isNaN(n) ? -1 : n;
  };
  return [...items].sort((a, b) => order(a) - order(b));
}

/** The help text of `spec`. */
export function renderHelp(spec: HelpSpec): string {
  const [first, ...more] = spec.usage;
  const sections = [[`usage: ${first ?? ""}`, ...more.map((line) => `       ${line}`)].join("\n")];
  sections.push(
    spec.about
      .split("\n\n")
      .map((p) => wrap(p.replace(/\n/g, " ")))
      .join("\n\n"),
  );
  if (spec.commands !== undefined && spec.commands.length > 0) sections.push(`Commands:\n${rows(spec.commands)}`);
  if (spec.flags !== undefined && spec.flags.length > 0) sections.push(`Flags:\n${rows(spec.flags)}`);
  if (spec.notes !== undefined)
    sections.push(
      spec.notes
        .split("\n\n")
        .map((p) => wrap(p.replace(/\n/g, " ")))
        .join("\n\n"),
    );
  sections.push(`Exit codes:\n${rows(byCode(spec.exitCodes))}`);
  sections.push(`Examples:\n${spec.examples.map((line) => `  ${line}`).join("\n")}`);
  if (spec.footer !== undefined) sections.push(wrap(spec.footer));
  return sections.join("\n\n");
}
