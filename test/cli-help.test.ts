/**
 * The `berth` command's help, for every command and subcommand the registry has (not a list kept
 * here): `--help` exits 0 with usage, exit codes and examples, `berth help <topic>` says the same,
 * every example is a command line berth accepts, an unknown command or flag is named with a
 * pointer to `--help` (exit 2), and docs/cli.md carries every help text and every exit code.
 *
 * docs/cli.md's reference blocks are the help texts themselves: after changing a help text, run
 * `BERTH_UPDATE_DOCS=1 npx vitest run test/cli-help.test.ts` to rewrite them.
 */
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EXIT } from "@berth/cli/command";
import { COMMANDS, overview } from "@berth/cli/registry";
import { repoPath, runCommand, type CommandResult } from "./harness.js";
import { BERTH_CLI } from "./pty.js";

/** A help topic (`["lock"]`, `["lock", "hold"]`) and its help text. */
interface Topic {
  readonly words: readonly string[];
  readonly help: string;
  /** True when the binary prints more than `help` (`berth up` adds the services' flags). */
  readonly extended: boolean;
}

const topics: Topic[] = [];
const NOWHERE = "http://127.0.0.1:1";
const tempDirs: string[] = [];

beforeAll(async () => {
  for (const entry of COMMANDS) {
    const command = await entry.load();
    topics.push({ words: [entry.name], help: command.help, extended: command.handlesHelp === true });
    for (const sub of command.subcommands ?? []) topics.push({ words: [entry.name, sub.name], help: sub.help, extended: false });
  }
});
afterAll(() => {
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
});

/** Runs `berth ARGS` with both services pointed at a port where nothing listens. */
function berth(args: readonly string[]): Promise<CommandResult> {
  return runCommand(process.execPath, [BERTH_CLI, ...args], {
    env: { BERTH_SESSIONS_URL: NOWHERE, BERTH_BUDGET_URL: NOWHERE, BERTH_TOKEN: undefined, BERTH_TOKEN_FILE: undefined, NO_COLOR: undefined },
    timeoutMs: 60_000,
  });
}

/** Runs `task` over `items`, `limit` at a time (each spawns a node: the machine has two cores). */
async function eachLimited<T, R>(items: readonly T[], limit: number, task: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(limit, items.length) }, async () => {
      while (next < items.length) {
        const i = next++;
        results[i] = await task(items[i]!);
      }
    }),
  );
  return results;
}

/** The lines of a help text's Examples section. */
function examples(help: string): string[] {
  const section = help.split("\nExamples:\n")[1] ?? "";
  const lines: string[] = [];
  for (const line of section.split("\n")) {
    if (!line.startsWith("  ")) break;
    lines.push(line.slice(2));
  }
  return lines;
}

describe("berth --help", () => {
  it("lists every command of the registry and exits 0; a bare 'berth' prints it as a usage error", async () => {
    const [help, bare, version] = await Promise.all([berth(["--help"]), berth([]), berth(["--version"])]);
    expect(help.code).toBe(0);
    for (const entry of COMMANDS) expect(help.stdout).toMatch(new RegExp(`^ {2}${entry.name} +${entry.summary.slice(0, 30).replace(/[()]/g, "\\$&")}`, "m"));
    expect(help.stdout).toContain("\nExamples:\n");
    expect(help.stdout).toBe(`${overview()}\n`);
    expect(bare).toMatchObject({ code: EXIT.usage, stdout: "" });
    expect(bare.stderr).toBe(help.stdout);
    expect(version).toMatchObject({ code: 0, stdout: expect.stringMatching(/^berth \d+\.\d+\.\d+\n$/) });
  });
});

describe("help on every command and subcommand", () => {
  it("--help exits 0 with the usage, the exit codes and examples of that very command; 'berth help <topic>' and -h say the same", async () => {
    expect(topics.length).toBeGreaterThan(COMMANDS.length);
    const runs = await eachLimited(topics, 4, async (topic) => {
      const [flag, help] = await Promise.all([berth([...topic.words, "--help"]), berth(["help", ...topic.words])]);
      return { topic, flag, help };
    });
    for (const { topic, flag, help } of runs) {
      const name = `berth ${topic.words.join(" ")}`;
      expect(flag.code, `${name} --help: ${flag.stderr}`).toBe(0);
      expect(flag.stdout, name).toMatch(new RegExp(`^usage: ${name}\\b`));
      expect(flag.stdout, name).toContain("\nExit codes:\n");
      expect(flag.stdout, name).toMatch(new RegExp(`\\nExamples:\\n  ${name}\\b`));
      if (topic.extended) expect(flag.stdout.startsWith(topic.help), name).toBe(true);
      else expect(flag.stdout, name).toBe(`${topic.help}\n`);
      expect(help, `berth help ${topic.words.join(" ")}`).toMatchObject({ code: 0, stdout: flag.stdout });
    }
    // -h, and help asked for after other arguments.
    const [short, late, afterSeparator] = await Promise.all([
      berth(["lock", "hold", "-h"]),
      berth(["sessions", "get", "s1", "--json", "--help"]),
      berth(["lock", "help", "hold"]),
    ]);
    expect(short.stdout).toBe(runs.find((r) => r.topic.words.join(" ") === "lock hold")!.flag.stdout);
    expect(late.stdout).toMatch(/^usage: berth sessions get SESSION/);
    expect(afterSeparator.stdout).toBe(short.stdout);
  }, 180_000);

  it("every example is a command line berth accepts (run against services that are not there: 0 or 69, never a usage error)", async () => {
    const lines = new Set<string>(examples(overview()));
    for (const topic of topics) for (const line of examples(topic.help)) lines.add(line);
    // `berth up` would start the services and `berth ui` serve the page, both until stopped: their
    // flags are checked by their own tests (the services', ui-command.test.ts).
    const runnable = [...lines].filter((line) => !/^(\S+=\S+ )*berth (up|ui)\b/.test(line) || line.includes("--help"));
    expect(runnable.length).toBeGreaterThan(20);
    const results = await eachLimited(runnable, 4, async (line) => {
      const cwd = mkdtempSync(path.join(tmpdir(), "berth-example-"));
      tempDirs.push(cwd);
      writeFileSync(path.join(cwd, "events.jsonl"), '{"type":"agent_phase","phase":"a"}\n{"type":"agent_phase","phase":"b"}\n');
      // CMD is looked up before a service is asked (127 when it is not there): a stub of each one
      // an example runs, in the directory for a path, else on PATH behind the machine's own tools.
      const stubs = path.join(cwd, "stub-bin");
      for (const [, name] of line.matchAll(/\s--\s+([^\s'"|;&]+)/g)) {
        const stub = name!.includes("/") ? path.join(cwd, name!) : path.join(stubs, name!);
        mkdirSync(path.dirname(stub), { recursive: true });
        writeFileSync(stub, "#!/bin/sh\n", { mode: 0o755 });
      }
      // The example as a person would paste it into bash: `berth` is the built CLI, jq reads and
      // drops its input (it may not be installed), the variables berth sets for CMD are set.
      const prelude = `set -o pipefail; berth() { "${process.execPath}" "${BERTH_CLI}" "$@"; }; jq() { cat > /dev/null; }; `;
      const result = await runCommand("bash", ["-c", prelude + line.replace(/\s+#\s.*$/, "")], {
        cwd,
        timeoutMs: 60_000,
        env: {
          PATH: `${process.env.PATH}${path.delimiter}${stubs}`,
          BERTH_SESSIONS_URL: NOWHERE,
          BERTH_BUDGET_URL: NOWHERE,
          BERTH_TOKEN: undefined,
          BERTH_TOKEN_FILE: undefined,
          BERTH_RESERVATION_ID: "0b6f2c1e-8d3a-4c55-9f0e-5a7d2b1c9e44",
          BERTH_LOCK_FILE: path.join(cwd, "src/app.ts"),
          BERTH_FENCING_TOKEN: "7",
        },
      });
      return { line, result };
    });
    for (const { line, result } of results) {
      expect([0, EXIT.unreachable], `${line}\nexit ${result.code}\n${result.stderr}`).toContain(result.code);
    }
  }, 180_000);
});

describe("mistakes", () => {
  it("an unknown command, subcommand or flag is named, with a pointer to --help, and exits 2", async () => {
    const cases: Array<{ args: string[]; names: string; help: string }> = [
      { args: ["frobnicate"], names: "unknown command 'frobnicate'", help: "Run 'berth --help'" },
    ];
    for (const entry of COMMANDS) {
      const command = await entry.load();
      if (command.subcommands !== undefined)
        cases.push({ args: [entry.name, "frobnicate"], names: "unknown command 'frobnicate'", help: `Run 'berth ${entry.name} --help'` });
    }
    for (const topic of topics) {
      if (topic.words.length === 1 && topics.some((t) => t.words.length === 2 && t.words[0] === topic.words[0])) continue;
      cases.push({ args: [...topic.words, "--no-such-flag"], names: "--no-such-flag", help: `Run 'berth ${topic.words.join(" ")} --help'` });
    }
    const results = await eachLimited(cases, 4, (c) => berth(c.args));
    cases.forEach((c, i) => {
      const result = results[i]!;
      const name = `berth ${c.args.join(" ")}`;
      expect(result.code, `${name}: ${result.stderr}`).toBe(EXIT.usage);
      expect(result.stdout, name).toBe("");
      expect(result.stderr, name).toContain(c.names);
      expect(result.stderr, name).toContain(c.help);
    });
  }, 180_000);

  it("a command's help lists every flag of its subcommands, each on its own row", async () => {
    /** The flags a help's "Flags:" section names, and its rows' name columns. */
    const flagsOf = (help: string) => {
      const section = help.split("\n\n").find((block) => block.startsWith("Flags:")) ?? "";
      const names = section
        .split("\n")
        .slice(1)
        .map((line) => /^ {2}(-\S.*?)(?: {2,}|$)/.exec(line)?.[1])
        .filter((n): n is string => n !== undefined);
      return { names, flags: new Set(names.flatMap((n) => n.match(/--[a-z][\w-]*/g) ?? [])) };
    };
    for (const entry of COMMANDS) {
      const command = await entry.load();
      if (command.subcommands === undefined) continue;
      const listed = flagsOf(command.help);
      for (const row of listed.names)
        expect(row.match(/--[a-z][\w-]*/g)?.length ?? 0, `berth ${command.name} --help: '${row}' is two flags in one row`).toBeLessThanOrEqual(1);
      for (const sub of command.subcommands) {
        for (const flag of flagsOf(sub.help).flags)
          expect(listed.flags.has(flag), `berth ${command.name} --help does not list ${flag} (of ${sub.name})`).toBe(true);
      }
    }
  });

  it("a near miss gets a suggestion", async () => {
    const [command, sub, flag, up] = await Promise.all([
      berth(["sesions", "list"]),
      berth(["budget", "stat"]),
      berth(["sessions", "get", "s1", "--jsn"]),
      // up's flags are the services' settings: the same suggestion, before anything starts.
      berth(["up", "--sessions-prot", "0"]),
    ]);
    expect(command.stderr).toContain("berth: unknown command 'sesions' (did you mean 'sessions'?)");
    expect(sub.stderr).toContain("berth budget: unknown command 'stat' (did you mean 'state'?)");
    expect(flag.stderr).toContain("berth sessions get: unknown flag '--jsn' (did you mean --json?)");
    expect(up.stderr).toContain("berth up: --sessions-prot: unknown flag (did you mean --sessions-port?)");
    for (const result of [command, sub, flag, up]) expect(result.code).toBe(EXIT.usage);
  });
});

describe("docs/cli.md", () => {
  const DOCS = repoPath("docs/cli.md");
  const BLOCK = /<!-- help: (berth[^>]*?) -->\n```text\n([\s\S]*?)\n```\n<!-- end help -->/g;

  it("carries every command's and subcommand's help text, as the command prints it", () => {
    let docs = readFileSync(DOCS, "utf8");
    const expected = new Map<string, string>([["berth", overview()], ...topics.map((t): [string, string] => [`berth ${t.words.join(" ")}`, t.help])]);
    if (process.env.BERTH_UPDATE_DOCS === "1") {
      docs = docs.replace(BLOCK, (block, name: string) => {
        const help = expected.get(name);
        return help === undefined ? block : `<!-- help: ${name} -->\n\`\`\`text\n${help}\n\`\`\`\n<!-- end help -->`;
      });
      writeFileSync(DOCS, docs);
    }
    const found = new Map([...docs.matchAll(BLOCK)].map((m) => [m[1]!, m[2]!]));
    for (const [name, help] of expected) {
      expect(found.has(name), `docs/cli.md has no block for '${name}'`).toBe(true);
      expect(found.get(name), `docs/cli.md's help of '${name}' is out of date: BERTH_UPDATE_DOCS=1 npx vitest run test/cli-help.test.ts`).toBe(help);
    }
  });

  it("lists every exit code", () => {
    const docs = readFileSync(DOCS, "utf8");
    for (const [name, code] of Object.entries(EXIT)) expect(docs, `EXIT.${name}`).toMatch(new RegExp(`^\\| ${code} \\|`, "m"));
  });
});
