/**
 * `berth lock hold|inspect|limits` as a user runs them: the built command (`node packages/cli/bin/berth.js`, the bundle the build makes)
 * against a started sessions service, in a pipe (JSON-line progress, plain output, no escapes) and
 * in a pseudo-terminal (the live status line, colours, Ctrl-C from the keyboard).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, readFileSync, realpathSync, symlinkSync, unlinkSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { connectClient, curl, makeTempDir, repoPath, runCommand, startService, stopAll, type CommandResult, type ServiceProcess } from "./harness.js";
import { hasColour, hasEscapes, runInTerminal, screen, startInTerminal } from "./pty.js";

const BERTH = repoPath("packages/cli/bin/berth.js");

let service: ServiceProcess;
let url: string;
let project: string;
let locks: ReturnType<typeof connectClient<typeof LockService>>;
const spawned: ChildProcess[] = [];
const strayPids: number[] = [];

beforeAll(async () => {
  project = path.join(realpathSync(makeTempDir("berth-lock-cli-")), "project");
  mkdirSync(project, { recursive: true });
  service = await startService("sessions");
  url = service.url("sessions");
  locks = connectClient(LockService, url, { protocol: "grpc", defaultTimeoutMs: 30_000 });
});
afterEach(() => {
  for (const child of spawned) child.kill("SIGKILL");
  spawned.length = 0;
  for (const pid of strayPids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // already gone
    }
  }
  strayPids.length = 0;
});
afterAll(stopAll);

/** Runs `berth ARGS` to completion in the project directory (or `cwd`). */
function berth(args: string[], env: Record<string, string | undefined> = {}, cwd = project): Promise<CommandResult> {
  return runCommand(process.execPath, [BERTH, ...args], { cwd, env: { BERTH_SESSIONS_URL: url, ...env }, timeoutMs: 30_000 });
}

/** Starts `berth ARGS` and collects its output as it comes. */
function startBerth(args: string[]) {
  const child = spawn(process.execPath, [BERTH, ...args], {
    cwd: project,
    env: { ...process.env, BERTH_SESSIONS_URL: url },
    stdio: ["ignore", "pipe", "pipe"],
  });
  spawned.push(child);
  let stdout = "";
  let stderr = "";
  child.stdout!.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal })),
  );
  const waitFor = async (pattern: RegExp, where: "stdout" | "stderr", timeoutMs = 10_000) => {
    const deadline = Date.now() + timeoutMs;
    while (!pattern.test(where === "stdout" ? stdout : stderr)) {
      if (Date.now() > deadline)
        throw new Error(`berth ${args.join(" ")}: no ${pattern} on ${where} within ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  };
  return { child, exited, waitFor, out: () => stdout, err: () => stderr };
}

async function waiters(file: string): Promise<number> {
  return (await locks.inspect({ file: path.join(project, file) })).waiters.length;
}

async function untilWaiting(file: string, count: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  while ((await waiters(file)) < count) {
    if (Date.now() > deadline) throw new Error(`${count} waiters for ${file} never showed up`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("berth lock", () => {
  it("documents itself: --help with examples and exit codes; listed by berth --help", async () => {
    const help = await berth(["lock", "hold", "--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/berth lock hold src\/app\.ts -- npm run codegen/);
    expect(help.stdout).toMatch(/^ {2}75 +timed out: FILE stayed locked/m);
    expect(help.stdout).toMatch(/BERTH_FENCING_TOKEN/);
    expect((await berth(["--help"])).stdout).toMatch(/^ {2}lock +run a command while holding a source lock/m);
  });

  it("a hold released when its command exits ends OK: /metrics counts it ok, not a failure", async () => {
    // A service of its own, so that its counters hold this test's holds alone.
    const own = await startService("sessions");
    const ownUrl = own.url("sessions");
    for (let i = 0; i < 3; i++) expect((await berth(["lock", "hold", "metrics.ts", "--", "true"], { BERTH_SESSIONS_URL: ownUrl })).code).toBe(0);
    // Counted as each stream's end is written, which may be a moment after the command exits.
    const holds = async () =>
      (await curl(ownUrl, "/metrics")).body.split("\n").filter((line) => line.startsWith('berth_rpc_requests_total{method="/berth.locks.v1.LockService/Hold"'));
    await vi.waitFor(async () => expect(await holds()).toEqual(['berth_rpc_requests_total{method="/berth.locks.v1.LockService/Hold",code="ok"} 3']));
    await own.stop();
  });

  it("refuses wrong usage with exit 2", async () => {
    for (const args of [
      ["lock"],
      ["lock", "grab", "a.ts"],
      ["lock", "hold", "a.ts"],
      ["lock", "hold", "a.ts", "--max-wait", "soon", "--", "true"],
      ["lock", "inspect"],
      ["lock", "limits", "a.ts"],
    ]) {
      const result = await berth(args);
      expect(result.code, args.join(" ")).toBe(2);
      expect(result.stderr).toMatch(/^berth lock( hold| inspect| limits)?: /);
      expect(result.stderr).toMatch(/^Run 'berth lock( hold| inspect| limits)? --help' for usage and examples\.$/m);
    }
    // A path the service refuses is a usage error too, with the service's reason.
    const long = await berth(["lock", "inspect", "x".repeat(5000)]);
    expect(long.code).toBe(2);
    expect(long.stderr).toMatch(/file: must be at most 4096 bytes/);
  });

  it("runs CMD with the fencing token, exits with CMD's code and releases the lock", async () => {
    const result = await berth([
      "lock",
      "hold",
      "src/a.ts",
      "--owner",
      "cli-test",
      "--",
      "sh",
      "-c",
      'echo "token=$BERTH_FENCING_TOKEN file=$BERTH_LOCK_FILE"; exit 7',
    ]);
    expect(result.code).toBe(7);
    const match = /token=(\d+) file=(.*)/.exec(result.stdout);
    expect(match?.[2]).toBe(path.join(project, "src/a.ts"));
    const state = await locks.inspect({ file: path.join(project, "src/a.ts") });
    expect(state.holder).toBeUndefined();
    expect(state.lastFencingToken).toBe(BigInt(match![1]!));
  });

  it("in a pipe: JSON-line progress on stderr (who holds the file while it waits), CMD's output alone on stdout", async () => {
    const file = "src/queued.ts";
    const { lease } = await locks.acquire({ file: path.join(project, file), owner: "alice" });
    const run = startBerth(["lock", "hold", file, "--max-wait", "20s", "--", "sh", "-c", "echo got $BERTH_FENCING_TOKEN"]);
    await run.waitFor(/"event":"waiting"/, "stderr");
    expect(run.out()).toBe("");
    await locks.release({ leaseToken: lease!.leaseToken });
    expect((await run.exited).code).toBe(0);
    expect(BigInt(/got (\d+)/.exec(run.out())![1]!)).toBeGreaterThan(lease!.fencingToken);
    expect(hasEscapes(run.err()) || hasEscapes(run.out())).toBe(false);
    const events = run
      .err()
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(events.map((e) => e.event)).toEqual(["waiting", "acquired", "exited", "released"]);
    expect(events[0]).toMatchObject({
      file: path.join(project, file),
      position: 1,
      holder: { owner: "alice", kind: "lease", fencing_token: Number(lease!.fencingToken) },
    });
    expect(events[1]).toMatchObject({ file: path.join(project, file), fencing_token: Number(/got (\d+)/.exec(run.out())![1]) });
    expect(events[2]).toMatchObject({ code: 0, signal: null });
  });

  it("on a terminal: a live status line naming the holder, rewritten in place and gone once granted; CMD gets the terminal", async () => {
    const file = "src/tty.ts";
    const { lease } = await locks.acquire({ file: path.join(project, file), owner: "alice" });
    const run = startInTerminal(["lock", "hold", file, "--max-wait", "20s", "--", "sh", "-c", '[ -t 0 ] && [ -t 1 ] && echo "CMD on a terminal"; exit 3'], {
      cwd: project,
      env: { BERTH_SESSIONS_URL: url },
    });
    await run.waitFor(/\r\x1b\[Kberth lock hold: waiting for src\/tty\.ts, held by alice \(lease, fencing token \d+\) for \d+(ms|s); #1 in line, waited \d/);
    // Redrawn every second while nothing else happens: the wait keeps counting in place.
    await run.waitFor(/(\r\x1b\[Kberth lock hold: waiting for [^\r]*){2}/, 5_000);
    await locks.release({ leaseToken: lease!.leaseToken });
    const { code, output } = await run.exited;
    expect(code).toBe(3);
    expect(output).not.toContain('"event"');
    const seen = screen(output);
    expect(seen).toMatch(/^berth lock hold: acquired .*src\/tty\.ts after \d+(ms|s) \(fencing token \d+\)$/m);
    expect(seen).toMatch(/^CMD on a terminal$/m);
    expect(seen).not.toContain("waiting for");
  });

  it("exits 75 naming the holder when the wait runs out (a JSON line in a pipe, a red sentence on a terminal)", async () => {
    const file = "src/busy.ts";
    const { lease } = await locks.acquire({ file: path.join(project, file), owner: "bob" });
    const json = await berth(["lock", "hold", file, "--max-wait", "300ms", "--", "true"]);
    expect(json.code).toBe(75);
    const events = json.stderr
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(events.at(0)).toMatchObject({ event: "waiting", position: 1, holder: { owner: "bob", kind: "lease" } });
    expect(events.at(-1)).toMatchObject({
      event: "timeout",
      waited_ms: 300,
      exit: 75,
      holder: { owner: "bob", kind: "lease", fencing_token: Number(lease!.fencingToken) },
    });
    const tty = await runInTerminal(["lock", "hold", file, "--max-wait", "0", "--", "true"], { cwd: project, env: { BERTH_SESSIONS_URL: url } });
    expect(tty.code).toBe(75);
    expect(tty.output).toMatch(
      /berth lock hold: \x1b\[31mtimed out: .*busy\.ts is held by bob \(lease, fencing token \d+\) since .*; it was not free \(--max-wait 0\)\x1b\[39m/,
    );
    // --json asks for the JSON lines on a terminal too.
    const forced = await runInTerminal(["lock", "hold", file, "--max-wait", "0", "--json", "--", "true"], { cwd: project, env: { BERTH_SESSIONS_URL: url } });
    expect(forced.code).toBe(75);
    expect(JSON.parse(forced.output.trim().split("\r\n").at(-1)!)).toMatchObject({ event: "timeout", exit: 75, holder: { owner: "bob" } });
    expect(hasEscapes(forced.output)).toBe(false);
    await locks.release({ leaseToken: lease!.leaseToken });
  });

  it("one file is one lock however the path is spelled: from the project, from elsewhere with '..', through a symlinked directory, over Connect", async () => {
    mkdirSync(path.join(project, "spelled", "x"), { recursive: true });
    const beside = path.join(path.dirname(project), "beside");
    mkdirSync(beside, { recursive: true });
    const link = path.join(path.dirname(project), "project-link");
    symlinkSync(project, link);
    const canonical = path.join(project, "spelled", "app.css");
    // While holding it, CMD tries the other spellings with --wait 0 and a fenced append, then exits.
    const cli = `"${process.execPath}" "${BERTH}"`;
    const script = [
      'echo "file=$BERTH_LOCK_FILE"',
      `cd "${beside}"`,
      `${cli} lock hold ../project/spelled/x/../app.css --max-wait 0 -- true 2>/dev/null; echo "dotdot=$?"`,
      `${cli} lock hold ../project-link/spelled/app.css --max-wait 0 -- true 2>/dev/null; echo "symlink=$?"`,
      `${cli} sessions append lock-spellings steer --field pageUrl=/ --fence-file ../project-link/spelled/x/../app.css --fence-token "$BERTH_FENCING_TOKEN" >/dev/null; echo "fenced=$?"`,
    ].join("\n");
    const held = await berth(["lock", "hold", "spelled/app.css", "--owner", "from-project", "--", "sh", "-c", script]);
    expect(held.code, held.stderr).toBe(0);
    expect(held.stdout).toBe(`file=${canonical}\ndotdot=75\nsymlink=75\nfenced=0\n`);

    // A Connect client through the symlink: the same lock, named by its canonical path; the CLI
    // is refused while it holds.
    const { lease } = await locks.acquire({ file: `${link}/spelled/app.css`, owner: "connect" });
    expect(lease!.file).toBe(canonical);
    const refused = await berth(["lock", "hold", "spelled/app.css", "--max-wait", "0", "--", "true"]);
    expect(refused.code).toBe(75);
    expect(JSON.parse(refused.stderr.trim().split("\n").at(-1)!)).toMatchObject({ event: "timeout", file: canonical, holder: { owner: "connect" } });
    const inspected = await berth(["lock", "inspect", "../project-link/spelled/app.css", "--json"], {}, beside);
    expect(JSON.parse(inspected.stdout)).toMatchObject({ file: canonical, holder: { owner: "connect" } });
    await locks.release({ leaseToken: lease!.leaseToken });
  });

  it("looks CMD up before asking for the lock: a missing one exits 127, one that cannot run 126, in words, and no lock is taken", async () => {
    // A service of its own, so that its counters show whether the lock was asked for.
    const own = await startService("sessions");
    const ownUrl = own.url("sessions");
    const ownLocks = connectClient(LockService, ownUrl, { protocol: "grpc", defaultTimeoutMs: 30_000 });
    const file = "src/never.ts";
    writeFileSync(path.join(project, "not-executable.sh"), "#!/bin/sh\n", { mode: 0o644 });
    mkdirSync(path.join(project, "a-directory"), { recursive: true });
    const cases = [
      { cmd: "no-such-cmd", exit: 127, code: "command_not_found", message: "command not found: no-such-cmd" },
      { cmd: "./no-such-script.sh", exit: 127, code: "command_not_found", message: "command not found: ./no-such-script.sh (no such file)" },
      { cmd: "./not-executable.sh", exit: 126, code: "cannot_run", message: "cannot run ./not-executable.sh: it is not executable (no execute permission)" },
      { cmd: "./a-directory", exit: 126, code: "cannot_run", message: "cannot run ./a-directory: it is a directory" },
    ];
    for (const { cmd, exit, code, message } of cases) {
      const result = await berth(["lock", "hold", file, "--", cmd, "--flag"], { BERTH_SESSIONS_URL: ownUrl });
      expect(result.code, cmd).toBe(exit);
      expect(
        result.stderr
          .trim()
          .split("\n")
          .map((line) => JSON.parse(line)),
      ).toEqual([{ event: "error", code, exit, message }]);
    }
    // On a terminal: the words, named by the command.
    const tty = await runInTerminal(["lock", "hold", file, "--", "no-such-cmd"], { cwd: project, env: { BERTH_SESSIONS_URL: ownUrl } });
    expect(tty.code).toBe(127);
    expect(screen(tty.output)).toMatch(/^berth lock hold: command not found: no-such-cmd$/m);

    // Never held (no fencing token drawn), nobody waits, and no Hold stream came to the service at all.
    const inspected = await ownLocks.inspect({ file: path.join(project, file) });
    expect(inspected.holder).toBeUndefined();
    expect(inspected.waiters).toEqual([]);
    expect(inspected.lastFencingToken).toBe(0n);
    // Counted as each call's answer is written, which may be a moment after the client has it.
    const metrics = await vi.waitFor(async () => {
      const body = (await curl(ownUrl, "/metrics")).body;
      expect(body).toContain(`berth_rpc_requests_total{method="/berth.locks.v1.LockService/Inspect"`);
      return body;
    });
    expect(metrics).not.toContain(`berth_rpc_requests_total{method="/berth.locks.v1.LockService/Hold"`);
    await own.stop();
  });

  it("looks CMD up again once granted: one gone meanwhile is told in words (127) and the lock released", async () => {
    const file = "src/vanishing.ts";
    const script = path.join(project, "vanishing.sh");
    writeFileSync(script, "#!/bin/sh\n", { mode: 0o755 });
    const { lease } = await locks.acquire({ file: path.join(project, file), owner: "erin" });
    const run = startBerth(["lock", "hold", file, "--", "./vanishing.sh"]);
    await run.waitFor(/"event":"waiting"/, "stderr");
    unlinkSync(script);
    await locks.release({ leaseToken: lease!.leaseToken });
    expect((await run.exited).code).toBe(127);
    const events = run
      .err()
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(events.map((e) => e["event"]).filter((name) => name !== "waiting")).toEqual(["acquired", "error", "released"]);
    expect(events.find((e) => e["event"] === "error")).toEqual({
      event: "error",
      code: "command_not_found",
      exit: 127,
      message: "command not found: ./vanishing.sh (no such file)",
    });
    expect((await locks.inspect({ file: path.join(project, file) })).holder).toBeUndefined();
  });

  it("exits 69 when the service cannot be reached", async () => {
    const result = await berth(["lock", "hold", "src/a.ts", "--", "true"], { BERTH_SESSIONS_URL: "http://127.0.0.1:1" });
    expect(result.code).toBe(69);
    expect(result.stderr).toMatch(/cannot reach the sessions service at http:\/\/127\.0\.0\.1:1/);
    expect((await berth(["lock", "inspect", "src/a.ts", "--sessions-url", "http://127.0.0.1:1"])).code).toBe(69);
  });

  it("frees the lock when berth itself is SIGKILLed while CMD runs", async () => {
    const file = "src/killed.ts";
    const pidFile = path.join(project, "cmd.pid");
    const run = startBerth(["lock", "hold", file, "--owner", "doomed", "--", "sh", "-c", `echo $$ > ${pidFile}; echo running; exec sleep 30`]);
    await run.waitFor(/running/, "stdout");
    strayPids.push(Number(readFileSync(pidFile, "utf8")));
    let grantedAt = 0;
    const next = locks.acquire({ file: path.join(project, file), owner: "next", maxWait: { seconds: 20n } }).then((r) => ((grantedAt = Date.now()), r.lease!));
    await untilWaiting(file, 1);
    const killedAt = Date.now();
    run.child.kill("SIGKILL");
    const lease = await next;
    expect(lease.owner).toBe("next");
    // The connection's end frees it, well before the Hold's 5 s heartbeat could have noticed.
    expect(grantedAt - killedAt).toBeLessThan(4_000);
    await locks.release({ leaseToken: lease.leaseToken });
  });

  it("passes SIGTERM on to CMD and exits with CMD's code, releasing the lock", async () => {
    const file = "src/term.ts";
    const run = startBerth(["lock", "hold", file, "--", "sh", "-c", 'trap "echo got-term; exit 42" TERM; echo ready; while :; do sleep 0.05; done']);
    await run.waitFor(/ready/, "stdout");
    run.child.kill("SIGTERM");
    expect((await run.exited).code).toBe(42);
    expect(run.out()).toMatch(/got-term/);
    expect((await locks.inspect({ file: path.join(project, file) })).holder).toBeUndefined();
  });

  it("withdraws a waiting request on SIGINT and exits 130", async () => {
    const file = "src/interrupted.ts";
    const { lease } = await locks.acquire({ file: path.join(project, file), owner: "carol" });
    const run = startBerth(["lock", "hold", file, "--max-wait", "20s", "--", "true"]);
    await run.waitFor(/"event":"waiting"/, "stderr");
    run.child.kill("SIGINT");
    expect((await run.exited).code).toBe(130);
    expect(await waiters(file)).toBe(0);
    expect(JSON.parse(run.err().trim().split("\n").at(-1)!)).toMatchObject({ event: "interrupted", signal: "SIGINT", exit: 130 });

    // The same from the keyboard: Ctrl-C on the terminal.
    const tty = startInTerminal(["lock", "hold", file, "--max-wait", "20s", "--", "true"], { cwd: project, env: { BERTH_SESSIONS_URL: url } });
    await tty.waitFor(/waiting for src\/interrupted\.ts/);
    tty.type("\x03");
    const { code, output } = await tty.exited;
    expect(code).toBe(130);
    expect(screen(output)).toMatch(/^(\^C)?berth lock hold: interrupted \(SIGINT\) while waiting; the request was withdrawn$/m);
    expect(await waiters(file)).toBe(0);
    await locks.release({ leaseToken: lease!.leaseToken });
  });

  it("on a terminal, Ctrl-C while CMD runs goes to CMD, whose handler decides the exit code; the lock is released", async () => {
    const script = "n=0; trap 'n=$((n+1))' INT; echo ready; while [ $n -lt 1 ]; do sleep 0.05; done; sleep 0.5; echo interrupts=$n; exit 5";
    const tty = startInTerminal(["lock", "hold", "src/ctrl-c.ts", "--", "sh", "-c", script], { cwd: project, env: { BERTH_SESSIONS_URL: url } });
    await tty.waitFor(/ready/);
    tty.type("\x03");
    const { code, output } = await tty.exited;
    expect(code).toBe(5);
    expect(screen(output)).toMatch(/^(\^C)?interrupts=1$/m);
    expect((await locks.inspect({ file: path.join(project, "src/ctrl-c.ts") })).holder).toBeUndefined();
  });

  it("inspects a lock: holder, waiters in order, last token (human and --json)", async () => {
    const file = "src/inspected.ts";
    const free = await berth(["lock", "inspect", file]);
    expect(free.code).toBe(0);
    expect(free.stdout).toMatch(/inspected\.ts\n {2}free\n/);
    expect(hasEscapes(free.stdout)).toBe(false);
    const freeTty = await runInTerminal(["lock", "inspect", file], { cwd: project, env: { BERTH_SESSIONS_URL: url } });
    expect(freeTty.code).toBe(0);
    expect(freeTty.output).toMatch(/\x1b\[1m.*inspected\.ts\x1b\[22m\r\n {2}\x1b\[32mfree\x1b\[39m/);
    const plainTty = await runInTerminal(["lock", "inspect", file], { cwd: project, env: { BERTH_SESSIONS_URL: url, NO_COLOR: "1" } });
    expect(hasColour(plainTty.output)).toBe(false);
    expect(screen(plainTty.output)).toMatch(/inspected\.ts\n {2}free\n/);
    const { lease } = await locks.acquire({ file: path.join(project, file), owner: "dave", ttl: { seconds: 60n } });
    const waiting = locks.acquire({ file: path.join(project, file), owner: "erin", maxWait: { seconds: 20n } });
    try {
      await untilWaiting(file, 1);
      const human = await berth(["lock", "inspect", file]);
      expect(human.stdout).toMatch(/held by dave \(lease, fencing token \d+\) since .*; expires .* unless renewed/);
      expect(human.stdout).toMatch(/1 waiting:\n {4}1\. erin \(lease\) since /);
      expect(human.stdout).toMatch(new RegExp(`last fencing token: ${lease!.fencingToken}`));
      const json = await berth(["lock", "inspect", file, "--json"]);
      const inspected = JSON.parse(json.stdout) as { waiters: Array<Record<string, string>> };
      expect(inspected).toMatchObject({ file: path.join(project, file), holder: { owner: "dave", kind: "HOLDER_KIND_LEASE" }, waiters: [{ owner: "erin" }] });
      expect(Date.parse(inspected.waiters[0]!["waitExpireTime"]!) - Date.parse(inspected.waiters[0]!["waitStartTime"]!)).toBe(20_000);
    } finally {
      // Whatever failed above, the waiter is answered and its lease given back: nothing is left pending.
      await locks.release({ leaseToken: lease!.leaseToken });
      const next = await waiting.catch(() => undefined);
      if (next?.lease) await locks.release({ leaseToken: next.lease.leaseToken });
    }
    expect((await waiting).lease?.owner).toBe("erin");
  });

  it("shows the limits the service enforces (human and --json)", async () => {
    const human = await berth(["lock", "limits"]);
    expect(human.code, human.stderr).toBe(0);
    expect(human.stdout).toBe(
      [
        "lease ttl         30s unless Acquire asks another, at most 1h",
        "longest wait      10m (an unset --max-wait; longer ones are capped to it)",
        "hold heartbeat    every 5s",
        "waiters per file  10000",
        "owner             at most 256 characters",
        "request ids       remembered 1h after what their call made ended",
        "",
      ].join("\n"),
    );
    const json = await berth(["lock", "limits", "--json"]);
    expect(JSON.parse(json.stdout)).toEqual({
      defaultTtl: "30s",
      maxTtl: "3600s",
      maxWait: "600s",
      heartbeatInterval: "5s",
      maxWaitersPerFile: 10000,
      maxOwnerLength: 256,
      idempotencyWindow: "3600s",
      watchHistory: 4000,
    });
  });

  it("exits 75 when too many wait for the file (TOO_MANY_WAITERS), and waits the service's longest wait without --max-wait", async () => {
    // Two services: the first waiter must still wait when the CLI's call arrives, however long a
    // loaded machine takes to start the CLI, so the crowded service's longest wait is long; the
    // other's is 1 s, for the wait without --max-wait.
    const [crowdedService, quick] = await Promise.all([
      startService("sessions", { args: ["--lock-max-waiters", "1", "--lock-max-wait", "60s"] }),
      startService("sessions", { args: ["--lock-max-wait", "1s"] }),
    ]);
    const client = connectClient(LockService, crowdedService.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 30_000 });
    const file = path.join(project, "src/crowded.ts");
    const { lease } = await client.acquire({ file, owner: "holder" });
    const queued = client.acquire({ file, owner: "first-waiter", maxWait: { seconds: 60n } });
    const deadline = Date.now() + 10_000;
    while ((await client.inspect({ file })).waiters.length === 0) {
      if (Date.now() > deadline) throw new Error("the first waiter never queued");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const crowded = await berth(["lock", "hold", "src/crowded.ts", "--", "true"], { BERTH_SESSIONS_URL: crowdedService.url("sessions") });
    expect(crowded.code).toBe(75);
    expect(JSON.parse(crowded.stderr.trim().split("\n").at(-1)!)).toMatchObject({
      event: "timeout",
      exit: 75,
      message: expect.stringMatching(/1 requests already wait for .*crowded\.ts/),
    });
    await client.release({ leaseToken: lease!.leaseToken });
    await client.release({ leaseToken: (await queued).lease!.leaseToken });

    // No --max-wait: the service's longest wait (1s here), then 75 naming the holder.
    const other = connectClient(LockService, quick.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 30_000 });
    const held = (await other.acquire({ file, owner: "first-waiter" })).lease!;
    const started = Date.now();
    const waited = await berth(["lock", "hold", "src/crowded.ts", "--", "true"], { BERTH_SESSIONS_URL: quick.url("sessions") });
    expect(waited.code).toBe(75);
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_000);
    expect(JSON.parse(waited.stderr.trim().split("\n").at(-1)!)).toMatchObject({ event: "timeout", waited_ms: 1_000, holder: { owner: "first-waiter" } });
    await other.release({ leaseToken: held.leaseToken });
    await Promise.all([crowdedService.stop(), quick.stop()]);
  });
});
