#!/usr/bin/env node
/** The `berth` command: `berth <command> [flags]`; `berth --help` lists the commands. */
import { EXIT, type Command } from "./command.js";
import { upCommand } from "./commands/up.js";
import { admitCommand } from "./commands/admit.js";
import { budgetCommand } from "./commands/budget.js";
import { sessionsCommand } from "./commands/sessions.js";
import { lockCommand } from "./commands/lock.js";

const commands: readonly Command[] = [upCommand, sessionsCommand, admitCommand, budgetCommand, lockCommand];

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
  const command = commands.find((c) => c.name === name);
  if (!command) {
    process.stderr.write(`berth: unknown command '${name}'\n\n${overview()}\n`);
    return EXIT.usage;
  }
  if (!command.handlesHelp && (rest.includes("--help") || rest.includes("-h"))) {
    process.stdout.write(`${command.usage}\n`);
    return EXIT.ok;
  }
  return command.run(rest);
}

const outcome = await main(process.argv.slice(2));
if (outcome !== "serving") process.exitCode = outcome;
