#!/usr/bin/env node
/**
 * The `berth` command: `berth <command> [arguments] [flags]`. This file finds the command, answers
 * `--help` (for every command and subcommand) and `--version`, and turns a mistyped command into
 * a usage error; the commands themselves live in commands/ and load only when they run.
 */
import { readFileSync } from "node:fs";
import { closest, usageError, wantsHelp } from "./args.js";
import { EXIT, type Command } from "./command.js";
import { rows } from "./help.js";
import { COMMANDS, findCommand, overview } from "./registry.js";

/** The help text for `topic` (`[]`, `["lock"]`, `["lock", "hold"]`), or a usage error's message. */
async function helpFor(topic: readonly string[]): Promise<{ text: string } | { error: string; where: string }> {
  const [name, sub, ...extra] = topic;
  if (name === undefined) return { text: overview() };
  const entry = findCommand(name);
  if (entry === undefined)
    return {
      error: unknownCommand(
        name,
        COMMANDS.map((c) => c.name),
      ),
      where: "berth",
    };
  const command = await entry.load();
  if (sub === undefined) return { text: command.help };
  const subcommand = command.subcommands?.find((s) => s.name === sub);
  if (subcommand === undefined || extra.length > 0) {
    const names = command.subcommands?.map((s) => s.name) ?? [];
    return {
      error:
        subcommand === undefined
          ? unknownCommand(
              `${name} ${sub}`,
              names.map((n) => `${name} ${n}`),
            )
          : `unexpected '${extra[0]}'`,
      where: `berth ${name}`,
    };
  }
  return { text: subcommand.help };
}

function unknownCommand(name: string, known: readonly string[]): string {
  const near = closest(name, known);
  return `unknown command '${name}'${near === undefined ? "" : ` (did you mean '${near}'?)`}`;
}

function version(): string {
  try {
    return (JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8")) as { version?: string }).version ?? "unknown";
  } catch {
    return "unknown";
  }
}

/**
 * Checks the subcommand of a command that has them (before loading anything more): none, a flag
 * in its place, or an unknown one is a usage error listing the subcommands.
 */
function checkSubcommand(command: Command, argv: readonly string[]): number | undefined {
  const subcommands = command.subcommands;
  if (subcommands === undefined) return undefined;
  const [sub] = argv;
  if (sub !== undefined && subcommands.some((s) => s.name === sub)) return undefined;
  const list = rows(subcommands.map((s) => [s.name, s.summary]));
  const where = `berth ${command.name}`;
  const problem =
    sub === undefined
      ? "which one?"
      : sub.startsWith("-")
        ? `give the command before the flags ('${sub}')`
        : unknownCommand(
            sub,
            subcommands.map((s) => s.name),
          );
  process.stderr.write(`${where}: ${problem}\n${list}\nRun '${where} --help' for usage and examples.\n`);
  return EXIT.usage;
}

async function main(argv: string[]): Promise<number | "serving"> {
  const [name, ...rest] = argv;
  if (name === undefined) {
    process.stderr.write(`${overview()}\n`);
    return EXIT.usage;
  }
  if (name === "--help" || name === "-h" || name === "help") {
    const topic = name === "help" ? rest.filter((a) => a !== "--help" && a !== "-h") : [];
    // A command that answers --help itself (berth up lists the services' flags) answers here too.
    const only = topic.length === 1 ? findCommand(topic[0]!) : undefined;
    if (only !== undefined) {
      const command = await only.load();
      if (command.handlesHelp) return command.run(["--help"]);
    }
    const help = await helpFor(topic);
    if ("error" in help) return usageError(help.where, help.error);
    process.stdout.write(`${help.text}\n`);
    return EXIT.ok;
  }
  if (name === "--version" || name === "-V") {
    process.stdout.write(`berth ${version()}\n`);
    return EXIT.ok;
  }
  if (name.startsWith("-")) return usageError("berth", `unknown flag '${name}' (flags go after the command: berth <command> [flags])`);
  const entry = findCommand(name);
  if (entry === undefined)
    return usageError(
      "berth",
      unknownCommand(
        name,
        COMMANDS.map((c) => c.name),
      ),
    );
  const command = await entry.load();
  if (!command.handlesHelp && wantsHelp(rest)) {
    const sub = command.subcommands?.find((s) => s.name === rest[0]);
    process.stdout.write(`${sub?.help ?? command.help}\n`);
    return EXIT.ok;
  }
  // `berth lock help hold` reads as `berth help lock hold`.
  if (command.subcommands !== undefined && rest[0] === "help") {
    const help = await helpFor([name, ...rest.slice(1)]);
    if ("error" in help) return usageError(help.where, help.error);
    process.stdout.write(`${help.text}\n`);
    return EXIT.ok;
  }
  const wrong = checkSubcommand(command, rest);
  if (wrong !== undefined) return wrong;
  return command.run(rest);
}

// A reader that went away (`berth sessions journal s1 | head -1`) ends the command quietly, as
// for any Unix filter, instead of with a stack trace.
for (const stream of [process.stdout, process.stderr]) {
  stream.on("error", (error: NodeJS.ErrnoException) => {
    if (error.code === "EPIPE") process.exit(process.exitCode ?? EXIT.ok);
    throw error;
  });
}

const outcome = await main(process.argv.slice(2));
if (outcome !== "serving") process.exitCode = outcome;
