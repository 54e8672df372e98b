/**
 * One shape for data: every `berth` command that takes `--json`, enumerated from the command
 * registry, run against live services, prints integers as JSON numbers (seqs, fencing tokens, byte
 * counts: the 64-bit fields proto3's JSON mapping would quote), on stdout and in its stderr events.
 * A command that gains `--json` without a case here fails the test until it has one.
 */
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { COMMANDS } from "@berth/cli/registry";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CLI, startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import { makeTempDir, runCommand, startService, stopAll, type StartedService } from "./harness.js";

let sessions: StartedService;
let budget: BudgetUnderTest;
let cwd: string;
let etcd: EtcdCluster | undefined;

beforeAll(async () => {
  cwd = makeTempDir("berth-cli-json-");
  [sessions, budget] = await Promise.all([startService("sessions"), startBudget()]);
}, 60_000);
afterAll(async () => {
  await stopAll();
  await etcd?.stop();
});

function env(budgetUrl: string): Record<string, string | undefined> {
  return { BERTH_SESSIONS_URL: sessions.url("sessions"), BERTH_BUDGET_URL: budgetUrl, BERTH_TOKEN: undefined, BERTH_TOKEN_FILE: undefined };
}

/** How a case runs: to completion (with stdin), or until its output says enough and then Ctrl-C. */
interface Case {
  readonly args: readonly string[];
  readonly input?: string;
  /** For a command that follows until stopped: SIGINT once the JSON lines so far satisfy this. */
  readonly until?: (lines: readonly unknown[]) => boolean;
}

const SESSION = "json-s";
// `admit` runs `berth budget build-done --json` as its command: one run covers both.
const BUILD_DONE: Case = {
  args: ["admit", "--memory", "64M", "--build-memory", "64M", "--json", "--", process.execPath, CLI, "budget", "build-done", "--json"],
};

/** Every `--json` command, with the invocations that exercise it. */
const CASES: Readonly<Record<string, readonly Case[]>> = {
  "sessions append": [
    { args: ["sessions", "append", SESSION, "generate", "--field", "count=3", "--field", "pageUrl=/p", "--json"] },
    { args: ["sessions", "append", SESSION, "--json"], input: '{"type":"agent_phase","phase":"a"}\n{"type":"steer"}\n' },
  ],
  "sessions get": [{ args: ["sessions", "get", SESSION, "--json"] }],
  "sessions list": [{ args: ["sessions", "list", "--json"] }, { args: ["sessions", "list", "--page-size", "1", "--json"] }],
  "sessions journal": [{ args: ["sessions", "journal", SESSION, "--json"] }],
  "sessions watch": [{ args: ["sessions", "watch", SESSION, "--snapshots", "--json"], until: (lines) => lines.some((l) => has(l, "caughtUp")) }],
  "sessions delete": [{ args: ["sessions", "append", "json-gone", "steer", "--json"] }, { args: ["sessions", "delete", "json-gone", "--json"] }],
  "lock hold": [{ args: ["lock", "hold", "json.lock", "--json", "--", "true"] }],
  "lock inspect": [{ args: ["lock", "inspect", "json.lock", "--json"] }],
  "lock limits": [{ args: ["lock", "limits", "--json"] }],
  "lock watch": [{ args: ["lock", "watch", "json.lock", "--current", "--json"], until: (lines) => lines.some((l) => has(l, "caughtUp")) }],
  admit: [BUILD_DONE],
  "budget check": [{ args: ["budget", "check", "--memory", "1G", "--json"] }],
  "budget state": [{ args: ["budget", "state", "--json"] }, { args: ["budget", "state", "--all", "--json"] }],
  "budget limits": [{ args: ["budget", "limits", "--json"] }],
  "budget machine": [{ args: ["budget", "machine", "--json"] }],
  "budget watch": [{ args: ["budget", "watch", "--json"], until: (lines) => lines.length >= 1 }],
  "budget events": [{ args: ["budget", "events", "--json"], until: (lines) => lines.some((l) => has(l, "caughtUp")) }],
  // Run against a budget on etcd (the file store has no fleet), by the suite tagged etcd.
  "budget fleet": [{ args: ["budget", "fleet", "--json"] }],
  "budget build-done": [BUILD_DONE],
};

function has(line: unknown, key: string): boolean {
  return line !== null && typeof line === "object" && key in line;
}

/** The names (`sessions append`, `admit`) of the commands whose help offers --json. */
async function jsonCommands(): Promise<string[]> {
  const names: string[] = [];
  for (const entry of COMMANDS) {
    const command = await entry.load();
    if (command.subcommands === undefined) {
      if (/--json\b/.test(command.help)) names.push(command.name);
      continue;
    }
    for (const sub of command.subcommands) if (/--json\b/.test(sub.help)) names.push(`${command.name} ${sub.name}`);
  }
  return names;
}

/** The commands that need the budget on etcd; every other command is the same on either store. */
const ON_ETCD: ReadonlySet<string> = new Set(["budget fleet"]);

/** Runs a case; its stdout and stderr as parsed JSON lines (every non-empty line must be JSON). */
async function run(c: Case, budgetUrl: string = budget.url): Promise<{ code: number | null; lines: unknown[]; text: string }> {
  if (c.until === undefined) {
    const result = await runCommand(process.execPath, [CLI, ...c.args], {
      env: env(budgetUrl),
      cwd,
      timeoutMs: 30_000,
      ...(c.input === undefined ? {} : { input: c.input }),
    });
    const text = `${result.stdout}${result.stderr}`;
    return {
      code: result.code,
      lines: text
        .split("\n")
        .filter((l) => l.trim() !== "")
        .map((l) => parse(l, c)),
      text,
    };
  }
  const until = c.until;
  const child = spawn(process.execPath, [CLI, ...c.args], { cwd, env: { ...process.env, ...defined(env(budgetUrl)) }, stdio: ["ignore", "pipe", "pipe"] });
  const lines: unknown[] = [];
  let text = "";
  let interrupted = false;
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  for (const stream of [child.stdout, child.stderr]) {
    createInterface({ input: stream }).on("line", (line) => {
      text += `${line}\n`;
      lines.push(parse(line, c));
      // Once: a second SIGINT while the command winds down is a user's "stop now", and the command
      // rightly dies of it (a sample printed between the two made this flaky).
      if (!interrupted && until(lines)) {
        interrupted = true;
        child.kill("SIGINT");
      }
    });
  }
  const code = await new Promise<number | null>((resolve) => child.once("close", (exit) => resolve(exit)));
  clearTimeout(timer);
  return { code, lines, text };
}

function parse(line: string, c: Case): unknown {
  try {
    return JSON.parse(line) as unknown;
  } catch {
    throw new Error(`berth ${c.args.join(" ")}: a line that is not JSON: ${line}`);
  }
}

function defined(vars: Record<string, string | undefined>): Record<string, string> {
  return Object.fromEntries(Object.entries(vars).filter((e): e is [string, string] => e[1] !== undefined));
}

/** The paths of the strings that hold an integer (`"5"`), anywhere in `value`. */
function quotedIntegers(value: unknown, path = "$"): string[] {
  if (typeof value === "string") return /^-?\d+$/.test(value) ? [`${path} = ${JSON.stringify(value)}`] : [];
  if (Array.isArray(value)) return value.flatMap((v, i) => quotedIntegers(v, `${path}[${i}]`));
  if (value !== null && typeof value === "object") return Object.entries(value).flatMap(([k, v]) => quotedIntegers(v, `${path}.${k}`));
  return [];
}

describe("berth … --json", () => {
  it("has a case for every command that offers --json, and none for one that does not", async () => {
    expect(Object.keys(CASES).sort()).toEqual((await jsonCommands()).sort());
  });

  it("prints every integer as a JSON number, in every command", async () => {
    const ran = new Set<Case>();
    for (const [name, cases] of Object.entries(CASES)) {
      if (ON_ETCD.has(name)) continue;
      for (const c of cases) {
        if (ran.has(c)) continue;
        ran.add(c);
        await expectIntegersAsNumbers(name, c, budget.url);
      }
    }
    // The fields proto3 JSON quotes, as numbers.
    const appended = (await run({ args: ["sessions", "append", SESSION, "steer", "--json"] })).lines[0];
    expect(appended).toMatchObject({ seq: 4, snapshot: { pendingEventSeq: 4 } });
    expect((await run({ args: ["sessions", "get", SESSION, "--json"] })).lines[0]).toMatchObject({ lastSeq: 4 });
    expect((await run({ args: ["lock", "inspect", "json.lock", "--json"] })).lines[0]).toMatchObject({ lastFencingToken: 1 });
    expect((await run({ args: ["budget", "limits", "--json"] })).lines[0]).toMatchObject({ maxQueue: expect.any(Number) });
    expect((await run({ args: ["budget", "state", "--json"] })).lines[0]).toMatchObject({ policy: { memoryBytes: expect.any(Number) } });
  }, 120_000);

  describe("with the budget on etcd", { tags: ["etcd"] }, () => {
    let fleetBudget: BudgetUnderTest;
    beforeAll(async () => {
      const started = await startEtcd();
      etcd = started;
      fleetBudget = await startBudget({ args: ["--store", "etcd", "--etcd-endpoints", started.clientUrls.join(","), "--machine-name", "json-box"] });
    }, 60_000);

    it("prints every integer as a JSON number in the commands that need it", async () => {
      for (const name of ON_ETCD) for (const c of CASES[name] ?? []) await expectIntegersAsNumbers(name, c, fleetBudget.url);
      expect((await run({ args: ["budget", "fleet", "--json"] }, fleetBudget.url)).lines[0]).toMatchObject({
        machines: [{ machine: "json-box", budget: { memoryBytes: expect.any(Number) } }],
      });
    });
  });
});

/** Runs a case: it exits 0, prints JSON lines, and no integer in them is quoted. */
async function expectIntegersAsNumbers(name: string, c: Case, budgetUrl: string): Promise<void> {
  const { code, lines, text } = await run(c, budgetUrl);
  const what = `${name}: berth ${c.args.join(" ")}`;
  expect(code, `${what} exited ${code}:\n${text}`).toBe(0);
  expect(lines.length, what).toBeGreaterThan(0);
  expect(
    lines.flatMap((line) => quotedIntegers(line)),
    what,
  ).toEqual([]);
}
