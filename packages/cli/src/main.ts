#!/usr/bin/env node
/** The `berth` command: `berth <command> [flags]`; `berth --help` lists the commands. */
import { EXIT, type Command } from "./command.js";

/**
 * Every command, loaded only when it runs: a client command should not pay for loading the
 * services (`up`) or every generated descriptor.
 */
const commands: ReadonlyArray<{ name: string; summary: string; load(): Promise<Command> }> = [
  { name: "up", summary: "run the sessions and budget services in the foreground (Ctrl-C stops both)", load: async () => (await import("./commands/up.js")).upCommand },
  { name: "sessions", summary: "append to, read and watch session journals (append, get, list, watch, journal)", load: async () => (await import("./commands/sessions.js")).sessionsCommand },
  { name: "admit", summary: "wait for room in the load budget, run a command, release when it exits", load: async () => (await import("./commands/admit.js")).admitCommand },
  { name: "budget", summary: "look at the load budget: check a need, the state, the machine", load: async () => (await import("./commands/budget.js")).budgetCommand },
  { name: "lock", summary: "run a command while holding a source lock (like flock), or inspect a lock", load: async () => (await import("./commands/lock.js")).lockCommand },
];

function overview(): string {
  const width = Math.max(...commands.map((c) => c.name.length));
  return [
    "usage: berth <command> [flags]",
    "",
    "commands:",
    ...commands.map((c) => `  ${c.name.padEnd(width)}  ${c.summary}`),
    "",
    "Run 'berth <command> --help' for a command's flags and examples.",
  ].join("\n");
}

async function main(argv: string[]): Promise<number | "serving"> {
  const [name, ...rest] = argv;
  if (name === undefined || name === "--help" || name === "-h" || name === "help") {
    process.stdout.write(`${overview()}\n`);
    return name === undefined ? EXIT.usage : EXIT.ok;
  }
  const entry = commands.find((c) => c.name === name);
  if (!entry) {
    process.stderr.write(`berth: unknown command '${name}'\n\n${overview()}\n`);
    return EXIT.usage;
  }
  const command = await entry.load();
  if (!command.handlesHelp && (rest.includes("--help") || rest.includes("-h"))) {
    process.stdout.write(`${command.usage}\n`);
    return EXIT.ok;
  }
  return command.run(rest);
}

const outcome = await main(process.argv.slice(2));
if (outcome !== "serving") process.exitCode = outcome;
