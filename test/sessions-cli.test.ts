/**
 * `berth sessions append|get|list|watch|journal|delete` as a user runs them: the built binary
 * (`node packages/cli/bin/berth.js`) against a started sessions service — output, `--json`, stdin,
 * exit codes, Ctrl-C on watch, the bearer token — in a pipe (plain text or JSON lines, never an
 * escape sequence) and in a pseudo-terminal (tables and entries in colour, Ctrl-C from the keyboard).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { closeClient, connectClient, makeTempDir, repoPath, runCommand, startService, stopAll, type CommandResult, type ServiceProcess } from "./harness.js";
import { hasColour, hasEscapes, runInTerminal, screen, startInTerminal } from "./pty.js";

const BERTH = repoPath("packages/cli/bin/berth.js");

let service: ServiceProcess;
let url: string;
const spawned: ChildProcess[] = [];

beforeAll(async () => {
  service = await startService("sessions");
  url = service.url("sessions");
});
afterEach(() => {
  for (const child of spawned) child.kill("SIGKILL");
  spawned.length = 0;
});
afterAll(stopAll);

/** Runs `berth sessions ARGS` to completion. */
function sessions(args: string[], options: { env?: Record<string, string | undefined>; input?: string } = {}): Promise<CommandResult> {
  return runCommand(process.execPath, [BERTH, "sessions", ...args], {
    env: { BERTH_SESSIONS_URL: url, BERTH_TOKEN: undefined, BERTH_TOKEN_FILE: undefined, ...options.env },
    timeoutMs: 30_000,
    ...(options.input === undefined ? {} : { input: options.input }),
  });
}

function jsonLines(text: string): Array<Record<string, unknown>> {
  return text
    .trim()
    .split("\n")
    .filter((line) => line !== "")
    .map((line) => JSON.parse(line) as Record<string, unknown>);
}

describe("berth sessions", () => {
  it("appends from --field, --json and stdin, and reads back with get, list and journal", async () => {
    const fields = await sessions(["append", "cli1", "generate", "--field", "pageUrl=http://localhost:3000/", "--field", "count=3", "--field", 'token="007"']);
    expect(fields).toMatchObject({ code: 0, stdout: "cli1: appended seq 1 (phase generate_requested)\n" });

    const json = await sessions(["append", "cli1", "--json", '{"type":"agent_phase","phase":"planning","durationMs":12}', "--expected-seq", "1"]);
    expect(json.code).toBe(0);
    const appended = JSON.parse(json.stdout) as { seq: number; duplicate: boolean; snapshot: Record<string, unknown> };
    expect(appended).toMatchObject({ seq: 2, duplicate: false, snapshot: { id: "cli1", generationPhase: "planning", expectedVariants: 3 } });

    const stdin = await sessions(["append", "cli1"], { input: '{"type":"agent_phase","phase":"a"}\n{"type":"agent_phase","phase":"b"}\n' });
    expect(stdin).toMatchObject({ code: 0, stdout: "cli1: appended seqs 3-4 (phase generate_requested)\n" });

    const get = await sessions(["get", "cli1"]);
    expect(get.code).toBe(0);
    expect(get.stdout).toMatch(/^session\s+cli1$/m);
    expect(get.stdout).toMatch(/^last seq\s+4$/m);
    expect(get.stdout).toMatch(/^generationPhase\s+b$/m);
    const getJson = JSON.parse((await sessions(["get", "cli1", "--json"])).stdout) as Record<string, unknown>;
    expect(getJson).toMatchObject({ lastSeq: 4, snapshot: { id: "cli1", pageUrl: "http://localhost:3000/" } });

    const list = await sessions(["list"]);
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(/^SESSION\s+PHASE\s+VARIANTS\s+UPDATED$/m);
    expect(list.stdout).toMatch(/^cli1\s+generate_requested\s+0\/3\s+\d{4}-/m);

    const journal = await sessions(["journal", "cli1", "--json"]);
    const entries = jsonLines(journal.stdout);
    expect(entries.map((e) => e.seq)).toEqual([1, 2, 3, 4]);
    // The journal's own format: the token the field gave as a JSON string stays a string.
    expect(entries[0]).toMatchObject({
      id: "cli1",
      type: "generate",
      event: { type: "generate", id: "cli1", pageUrl: "http://localhost:3000/", count: 3, token: "007" },
    });
    const part = await sessions(["journal", "cli1", "--from-seq", "2", "--limit", "2"]);
    expect(
      part.stdout
        .trim()
        .split("\n")
        .map((line) => line.split(" ")[0]),
    ).toEqual(["#2", "#3"]);
    expect(part.stderr).toBe("-- more from seq 4 (last seq 4): --from-seq 4\n");
    expect((await sessions(["journal", "cli1", "--from-seq", "3", "--limit", "2"])).stderr).toBe("");
  });

  it("lists every page by default, one page with --page-size, and deletes a session", async () => {
    // More sessions than the service's default page (100): the list needs several pages.
    const ids = Array.from({ length: 150 }, (_, i) => `pg-${String(i).padStart(3, "0")}`);
    const client = connectClient(SessionService, url, { protocol: "grpc" });
    await Promise.all(ids.map((sessionId) => client.appendEvent({ sessionId, event: { kind: { case: "generate", value: {} } } })));
    closeClient(client);
    const all = JSON.parse((await sessions(["list", "--json"])).stdout) as { sessions: Array<{ id: string }>; nextPageToken?: string };
    expect(all.sessions.map((snapshot) => snapshot.id).filter((id) => id.startsWith("pg-"))).toEqual(ids);
    expect(all).not.toHaveProperty("nextPageToken");
    const first = JSON.parse((await sessions(["list", "--page-size", "2", "--json"])).stdout) as { sessions: unknown[]; nextPageToken: string };
    expect(first.sessions).toHaveLength(2);
    expect(first.nextPageToken).not.toBe("");
    const next = await sessions(["list", "--page-size", "2", "--page-token", first.nextPageToken]);
    expect(next.code).toBe(0);
    expect(next.stderr).toMatch(/^-- more: --page-token [A-Za-z0-9_-]+\n$/);
    expect((await sessions(["list", "--page-token", first.nextPageToken])).code).toBe(2);

    expect(await sessions(["delete", "pg-000", "--expected-seq", "1"])).toMatchObject({ code: 0, stdout: "pg-000: deleted (its last seq was 1)\n" });
    expect(JSON.parse((await sessions(["delete", "pg-001", "--json"])).stdout)).toEqual({ lastSeq: 1 });
    const stale = await sessions(["delete", "pg-002", "--expected-seq", "5"]);
    expect(stale.code).toBe(3);
    expect(stale.stderr).toMatch(/expected seq 5 but the session is at seq 1/);
    expect((await sessions(["delete", "pg-000"])).code).toBe(4);
    expect((await sessions(["get", "pg-000"])).code).toBe(4);
    const after = JSON.parse((await sessions(["list", "--json"])).stdout) as { sessions: Array<{ id: string }> };
    expect(after.sessions.map((snapshot) => snapshot.id).filter((id) => id.startsWith("pg-"))).toEqual(ids.slice(2));
  });

  it("exits 3 on a conflict, 4 for a session without a journal, 2 for bad arguments", async () => {
    await sessions(["append", "cli2", "generate"]);
    const conflict = await sessions(["append", "cli2", "agent_phase", "--field", "phase=x", "--expected-seq", "0"]);
    expect(conflict.code).toBe(3);
    expect(conflict.stderr).toMatch(/expected no session yet but the session is at seq 1/);
    expect((await sessions(["append", "cli2", "agent_phase", "--field", "phase=x", "--expected-seq", "3"])).code).toBe(3);
    expect((await sessions(["append", "cli2", "steer", "--idempotency-key", "k"])).code).toBe(0);
    expect(await sessions(["append", "cli2", "steer", "--idempotency-key", "k"])).toMatchObject({
      code: 0,
      stdout: "cli2: already appended with this idempotency key: seq 2; nothing written\n",
    });
    const reused = await sessions(["append", "cli2", "steer", "--field", "pageUrl=/other", "--idempotency-key", "k"]);
    expect(reused.code).toBe(3);
    expect(reused.stderr).toMatch(/idempotency key "k" was used for a different append/);

    const missing = await sessions(["get", "nobody"]);
    expect(missing).toMatchObject({ code: 4, stdout: "" });
    expect(missing.stderr).toMatch(/nobody has no journal/);
    expect((await sessions(["journal", "nobody"])).code).toBe(4);
    // Past the journal's end: the service refuses the argument.
    const past = await sessions(["journal", "cli2", "--from-seq", "9"]);
    expect(past.code).toBe(2);
    expect(past.stderr).toMatch(/from_seq: 9 is past the end of session cli2/);

    for (const args of [
      ["append", "bad/id", "generate"],
      ["append", "cli2"],
      ["get"],
      ["get", "cli2", "--include-completed"],
      ["watch", "cli2", "--from-seq", "-1"],
      ["watch", "cli2", "--progress", "50ms"],
      ["watch", "cli2", "--progress", "soon"],
      ["list", "--page-size", "0"],
      ["delete"],
      ["frobnicate"],
      ["get", "cli2", "--bogus"],
    ]) {
      const result = await sessions(args, { input: "" });
      expect(result.code, args.join(" ")).toBe(2);
    }
    // The service refuses what only it can check (an event of a typed type sent as "other" is fine
    // from the CLI, but an empty type is not).
    const refused = await sessions(["append", "cli2", "--json", '{"type":""}']);
    expect(refused.code).toBe(2);
    // A typed key of another type is refused as the API refuses its curl, and nothing is appended.
    const typed = await sessions(["append", "cli2", "generate", "--field", "count=abc"]);
    expect(typed).toMatchObject({ code: 2, stdout: "" });
    expect(typed.stderr).toMatch(
      /^berth sessions append: event\.generate\.count: the event's "count" must be a whole number from 0 to 4294967295, got "abc"$/m,
    );
    const batch = await sessions(["append", "cli2"], { input: '{"type":"steer"}\n{"type":"generate","pageUrl":5}\n' });
    expect(batch.code).toBe(2);
    expect(batch.stderr).toMatch(/events\[1\]\.generate\.page_url: the event's "pageUrl" must be a string, got 5/);
    expect(JSON.parse((await sessions(["get", "cli2", "--json"])).stdout)).toMatchObject({ lastSeq: 2 });
  });

  it("watch prints the backlog, the caught-up marker, then live entries, and exits 0 on Ctrl-C", async () => {
    await sessions(["append", "cli3", "generate"]);
    const child = spawn(process.execPath, [BERTH, "sessions", "watch", "cli3", "--json", "--snapshots"], {
      env: { ...process.env, BERTH_SESSIONS_URL: url },
      stdio: ["ignore", "pipe", "pipe"],
    });
    spawned.push(child);
    let stdout = "";
    child.stdout!.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const waitFor = async (count: number) => {
      const deadline = Date.now() + 15_000;
      while (jsonLines(stdout).length < count) {
        if (Date.now() > deadline) throw new Error(`watch printed only: ${stdout}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    };
    await waitFor(2);
    await sessions(["append", "cli3", "agent_phase", "--field", "phase=live"]);
    await waitFor(3);
    child.kill("SIGINT");
    expect(await exited).toBe(0);
    const lines = jsonLines(stdout);
    expect(lines[0]).toMatchObject({ seq: 1, type: "generate" });
    expect(lines[1]).toMatchObject({ caughtUp: { lastSeq: 1, snapshot: { phase: "generate_requested" } } });
    expect(lines[2]).toMatchObject({ seq: 2, type: "agent_phase", event: { phase: "live" }, snapshot: { generationPhase: "live" } });
  });

  it("watch of a session that does not exist exits 4 saying so, unless --wait-for-session, which follows it from its first entry", async () => {
    const missing = await sessions(["watch", "cli-nobody"]);
    expect(missing).toMatchObject({ code: 4, stdout: "" });
    expect(missing.stderr).toContain(
      "berth sessions watch: session cli-nobody does not exist (nothing was ever appended to it, or it was deleted); --wait-for-session waits for its first entry",
    );
    const json = await sessions(["watch", "cli-nobody", "--json"]);
    expect(json.code).toBe(4);
    // The command's own refusal (the service would wait for the session): no service reason.
    expect(jsonLines(json.stderr)).toEqual([{ event: "error", code: "not_found", exit: 4, message: expect.any(String) }]);

    const child = spawn(process.execPath, [BERTH, "sessions", "watch", "cli-later", "--json", "--wait-for-session"], {
      env: { ...process.env, BERTH_SESSIONS_URL: url },
      stdio: ["ignore", "pipe", "pipe"],
    });
    spawned.push(child);
    let stdout = "";
    child.stdout!.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const waitFor = async (count: number) => {
      const deadline = Date.now() + 15_000;
      while (jsonLines(stdout).length < count) {
        if (Date.now() > deadline) throw new Error(`watch printed only: ${stdout}`);
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    };
    await waitFor(1);
    await sessions(["append", "cli-later", "steer"]);
    await waitFor(2);
    child.kill("SIGINT");
    expect(await exited).toBe(0);
    expect(jsonLines(stdout)).toMatchObject([{ caughtUp: { lastSeq: 0 } }, { seq: 1, type: "steer" }]);
  });

  it("watch --progress prints the service's progress while idle, and a deletion ends the watch with 4", async () => {
    await sessions(["append", "cli4", "generate"]);
    const child = spawn(process.execPath, [BERTH, "sessions", "watch", "cli4", "--json", "--progress", "100ms"], {
      env: { ...process.env, BERTH_SESSIONS_URL: url },
      stdio: ["ignore", "pipe", "pipe"],
    });
    spawned.push(child);
    let stdout = "";
    let stderr = "";
    child.stdout!.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const deadline = Date.now() + 15_000;
    while (!jsonLines(stdout).some((line) => "progress" in line)) {
      if (Date.now() > deadline) throw new Error(`watch printed no progress: ${stdout}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(jsonLines(stdout).find((line) => "progress" in line)).toMatchObject({ progress: { lastSeq: 1, sendTime: expect.stringMatching(/Z$/) } });
    expect((await sessions(["delete", "cli4"])).code).toBe(0);
    expect(await exited).toBe(4);
    expect(JSON.parse(stderr.trim().split("\n").at(-1)!)).toMatchObject({
      event: "error",
      code: "not_found",
      reason: "SESSION_DELETED",
      exit: 4,
      message: expect.stringContaining("cli4 was deleted"),
    });
  });

  it("exits 69 when the service cannot be reached (with a JSON error line under --json)", async () => {
    const result = await sessions(["list"], { env: { BERTH_SESSIONS_URL: "http://127.0.0.1:1" } });
    expect(result.code).toBe(69);
    expect(result.stderr).toMatch(/cannot reach the sessions service at http:\/\/127\.0\.0\.1:1/);
    const json = await sessions(["list", "--json"], { env: { BERTH_SESSIONS_URL: "http://127.0.0.1:1" } });
    expect(json).toMatchObject({ code: 69, stdout: "" });
    expect(JSON.parse(json.stderr)).toMatchObject({ event: "error", code: "unavailable", exit: 69, message: expect.stringContaining("cannot reach") });
  });

  it("in a pipe: plain text and JSON lines without a single escape sequence; a reader that stops early ends it quietly", async () => {
    const events = Array.from({ length: 2000 }, (_, i) => JSON.stringify({ type: "agent_phase", phase: `p${i}` })).join("\n");
    expect((await sessions(["append", "pipe1"], { input: events })).code).toBe(0);
    const outputs = await Promise.all(
      [["get", "pipe1"], ["list"], ["journal", "pipe1", "--limit", "3"], ["journal", "pipe1", "--limit", "3", "--json"], ["get", "nobody"]].map((args) =>
        sessions(args),
      ),
    );
    for (const result of outputs) expect(hasEscapes(result.stdout + result.stderr)).toBe(false);
    const [get, list, journal, journalJson, missing] = outputs;
    expect(get!.stdout).toMatch(/^generationPhase\s+p1999$/m);
    expect(list!.stdout).toMatch(/^SESSION\s+PHASE\s+VARIANTS\s+UPDATED$/m);
    expect(journal!.stdout).toMatch(/^#1 {2}\d{4}-\d\d-\d\dT[\d:.]+Z {2}agent_phase \{"phase":"p0"\}$/m);
    expect(jsonLines(journalJson!.stdout).map((e) => e.seq)).toEqual([1, 2, 3]);
    expect(missing).toMatchObject({ code: 4, stdout: "" });

    // `| head -1`: the journal's 2000 lines (over 200 kB, more than a pipe holds) meet a closed pipe; berth stops without a stack trace.
    const head = await runCommand("bash", ["-c", 'set -o pipefail; "$0" "$1" sessions journal pipe1 --json | head -n 1', process.execPath, BERTH], {
      env: { BERTH_SESSIONS_URL: url },
      timeoutMs: 30_000,
    });
    expect(head).toMatchObject({ code: 0, stderr: "" });
    expect(jsonLines(head.stdout)).toEqual([expect.objectContaining({ seq: 1, type: "agent_phase" })]);
  });

  it("on a terminal: the snapshot, the table and the entries for people, in colour (none with NO_COLOR)", async () => {
    const env = { BERTH_SESSIONS_URL: url };
    const append = await runInTerminal(["sessions", "append", "tty1", "generate", "--field", "count=2"], { env });
    expect(append.code).toBe(0);
    expect(screen(append.output)).toBe("tty1: appended seq 1 (phase generate_requested)");
    const [get, list, journal, plain] = await Promise.all([
      runInTerminal(["sessions", "get", "tty1"], { env }),
      runInTerminal(["sessions", "list"], { env }),
      runInTerminal(["sessions", "journal", "tty1"], { env }),
      runInTerminal(["sessions", "journal", "tty1"], { env: { ...env, NO_COLOR: "1" } }),
    ]);
    for (const result of [get, list, journal, plain]) expect(result.code).toBe(0);
    expect(get.output).toMatch(/\x1b\[1msession +\x1b\[22m {2}tty1\r\n/);
    expect(screen(get.output)).toMatch(/^expectedVariants\s+2$/m);
    expect(list.output).toMatch(/^\x1b\[1mSESSION +PHASE +VARIANTS +UPDATED\x1b\[22m\r$/m);
    expect(screen(list.output)).toMatch(/^tty1\s+generate_requested\s+0\/2\s+\d{4}-/m);
    expect(journal.output).toMatch(/\x1b\[1m#1\x1b\[22m {2}\x1b\[2m\d{4}-[^\x1b]+Z\x1b\[22m {2}\x1b\[36mgenerate\x1b\[39m \{"count":2\}/);
    expect(hasColour(plain.output)).toBe(false);
    expect(screen(plain.output)).toBe(screen(journal.output));
  });

  it("on a terminal: watch shows the backlog, the caught-up marker and live entries, and Ctrl-C ends it with 0", async () => {
    await sessions(["append", "tty2", "generate"]);
    const watch = startInTerminal(["sessions", "watch", "tty2", "--snapshots"], { env: { BERTH_SESSIONS_URL: url } });
    await watch.waitFor(/caught up at seq 1/);
    await sessions(["append", "tty2", "agent_phase", "--field", "phase=live"]);
    await watch.waitFor(/agent_phase/);
    watch.type("\x03");
    const { code, output } = await watch.exited;
    expect(code).toBe(0);
    const lines = screen(output).split("\n");
    expect(lines[0]).toMatch(/^#1 {2}\S+Z {2}generate$/);
    expect(lines[1]).toBe("-- caught up at seq 1; following new entries (Ctrl-C to stop)");
    // The backlog's snapshot as of the marker, then each live entry's own.
    expect(lines[2]).toMatch(/^ {4}snapshot: phase=generate_requested/);
    expect(lines[3]).toMatch(/^#2 {2}\S+Z {2}agent_phase \{"phase":"live"\}$/);
    expect(lines[4]).toMatch(/^ {4}snapshot: .*generationPhase=live/);
    expect(output).toContain("\x1b[2m-- caught up at seq 1");
  });

  it("sends the bearer token from BERTH_TOKEN or --token-file, and exits 77 without it", async () => {
    const token = "s3cret-token";
    const guarded = await startService("sessions", { env: { BERTH_TOKEN: token } });
    const env = { BERTH_SESSIONS_URL: guarded.url("sessions") };
    expect((await sessions(["list"], { env })).code).toBe(77);
    expect((await sessions(["list"], { env: { ...env, BERTH_TOKEN: token } })).code).toBe(0);
    const file = path.join(makeTempDir("berth-cli-token-"), "token");
    writeFileSync(file, `${token}\n`, { mode: 0o600 });
    expect((await sessions(["append", "t1", "generate", "--token-file", file], { env })).code).toBe(0);
    await guarded.stop();
  });

  it("documents its subcommands, flags, exit codes and examples", async () => {
    const help = await sessions(["--help"]);
    expect(help.code).toBe(0);
    for (const text of ["append SESSION TYPE", "watch SESSION", "journal SESSION", "delete SESSION", "Exit codes:", "Examples:", "--sessions-url"])
      expect(help.stdout).toContain(text);
    const sub = await sessions(["watch", "--help"]);
    expect(sub).toMatchObject({ code: 0 });
    expect(sub.stdout).toMatch(/^usage: berth sessions watch SESSION/);
    expect(sub.stdout).toContain("Examples:\n  berth sessions watch s1\n");
  });
});
