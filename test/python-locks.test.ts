// @module-tag python
/**
 * Locks from Python (python-e2e.ts): one file is one lock from Python, the CLI and a Connect client,
 * however each spells it (against a sessions service with a bearer token); and the watches of
 * locks, on each store, against services of their own with a small `--watch-buffer`, so that a
 * Python watcher that stops reading is ended WATCHER_LAGGED and resumes by itself.
 */
import { spawn } from "node:child_process";
import { mkdirSync, realpathSync, symlinkSync } from "node:fs";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LockHeldSchema, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { Code } from "@connectrpc/connect";
import { CLI } from "./budget-e2e.js";
import {
  callFailure,
  connectClient,
  makeTempDir,
  onStore,
  runCommand,
  startService,
  stopAll,
  STORES,
  storeTags,
  type CommandResult,
  type StartedService,
} from "./harness.js";
import { generateStubs, PYTHON_TOKEN, runPython, startTokenedSessions } from "./python-e2e.js";

describe("Python client (grpcio 1.51 + stubs from Debian's protoc)", () => {
  const token = PYTHON_TOKEN;
  let sessions: StartedService;
  let stubs: string;
  let generated: CommandResult;

  beforeAll(async () => {
    let root: string;
    ({ root, stubs, generated } = await generateStubs());
    sessions = await startTokenedSessions(root);
  }, 90_000);
  afterAll(stopAll);

  it("one file is one lock from Python, the CLI and a Connect client, however each spells it", { timeout: 90_000 }, async () => {
    expect(generated.code, generated.stderr).toBe(0);
    // proj/src/x/ (for a '..' spelling), a directory beside it, and a symlink to the project.
    const root = realpathSync(makeTempDir("berth-python-spellings-"));
    const project = path.join(root, "proj");
    mkdirSync(path.join(project, "src", "x"), { recursive: true });
    const elsewhere = path.join(root, "elsewhere");
    mkdirSync(elsewhere);
    const link = path.join(root, "link");
    symlinkSync(project, link);
    const canonical = path.join(project, "src", "app.css");
    const url = sessions.url("sessions");
    // A Connect client speaking JSON, spelling the file through the symlinked directory.
    const connect = connectClient(LockService, url, { protocol: "connect", useBinaryFormat: false, token, defaultTimeoutMs: 30_000 });
    const connectSessions = connectClient(SessionService, url, { protocol: "connect", useBinaryFormat: false, token });
    const viaLink = `${link}/src/app.css`;
    const cliEnv = { BERTH_SESSIONS_URL: url, BERTH_TOKEN: token, BERTH_TOKEN_FILE: undefined };
    /** `berth lock hold src/app.css --max-wait 0 -- true` from the project: its exit code and last progress event. */
    const cliTry = async () => {
      const run = await runCommand(process.execPath, [CLI, "lock", "hold", "src/app.css", "--max-wait", "0", "--owner", "cli-try", "--", "true"], {
        cwd: project,
        env: cliEnv,
        timeoutMs: 30_000,
      });
      return { code: run.code, last: JSON.parse(run.stderr.trim().split("\n").at(-1)!) as Record<string, unknown> };
    };

    // Python runs beside the project and spells the file with a '..' past a real directory.
    const python = runPython(
      ["spellings"],
      { BERTH_SESSIONS_URL: url, BERTH_TOKEN: token, BERTH_PYTHON_STUBS: stubs, BERTH_E2E_LOCK_FILE: "../proj/src/x/../app.css" },
      elsewhere,
    );
    try {
      expect(await python.step("spellings_ready")).toMatchObject({ cwd: elsewhere, sent: `${elsewhere}/../proj/src/x/../app.css` });

      // 1. The CLI holds it, run in the project with `src/app.css`: Python and Connect are refused.
      const holder = spawn(process.execPath, [CLI, "lock", "hold", "src/app.css", "--owner", "cli", "--", "sh", "-c", 'echo "held $BERTH_LOCK_FILE"; read _'], {
        cwd: project,
        env: { ...process.env, ...cliEnv, BERTH_TOKEN_FILE: "" },
        stdio: ["pipe", "pipe", "pipe"],
      });
      const holderExit = new Promise<number | null>((resolve) => holder.once("exit", resolve));
      const held = await new Promise<string>((resolve, reject) => {
        let out = "";
        holder.stdout.setEncoding("utf8").on("data", (chunk: string) => {
          out += chunk;
          if (out.includes("\n")) resolve(out.trim());
        });
        void holderExit.then((code) => reject(new Error(`berth lock hold exited (${code}) before holding`)));
      });
      expect(held).toBe(`held ${canonical}`);
      python.go("try cli");
      expect(await python.step("tried cli")).toEqual({ step: "tried cli", acquired: false, code: "RESOURCE_EXHAUSTED", file: canonical, holder: "cli" });
      const refusedByCli = await callFailure(connect.acquire({ file: viaLink, owner: "connect-try", maxWait: { seconds: 0n } }));
      expect(refusedByCli.code).toBe(Code.ResourceExhausted);
      expect(refusedByCli.findDetails(LockHeldSchema)[0]).toMatchObject({ file: canonical, owner: "cli" });
      holder.stdin.end("\n");
      expect(await holderExit).toBe(0);

      // 2. Python holds it: the CLI and Connect are refused; a fence spelled through the symlink
      //    and '..' with Python's token matches its lock.
      python.go("hold");
      const pythonHeld = await python.step("held");
      expect(pythonHeld.file).toBe(canonical);
      expect(await cliTry()).toMatchObject({ code: 75, last: { event: "timeout", file: canonical, holder: { owner: "python" } } });
      const refusedByPython = await callFailure(connect.acquire({ file: viaLink, owner: "connect-try", maxWait: { seconds: 0n } }));
      expect(refusedByPython.findDetails(LockHeldSchema)[0]).toMatchObject({ file: canonical, owner: "python" });
      const fence = { file: `${link}/src/x/../app.css`, fencingToken: BigInt(pythonHeld.fencing_token as number) };
      const fenced = await connectSessions.appendEvent({
        sessionId: "py-spellings",
        event: { kind: { case: "agentPhase", value: { phase: "fenced" } } },
        fence,
      });
      expect(fenced.seq).toBe(1n);
      python.go("release");
      await python.step("released");

      // 3. Connect holds it through the symlink (waiting for Python's stream end to reach the
      //    service): Python and the CLI are refused.
      const { lease } = await connect.acquire({ file: viaLink, owner: "connect", maxWait: { seconds: 10n } });
      expect(lease!.file).toBe(canonical);
      python.go("try connect");
      expect(await python.step("tried connect")).toEqual({
        step: "tried connect",
        acquired: false,
        code: "RESOURCE_EXHAUSTED",
        file: canonical,
        holder: "connect",
      });
      expect(await cliTry()).toMatchObject({ code: 75, last: { event: "timeout", file: canonical, holder: { owner: "connect" } } });
      await connect.release({ leaseToken: lease!.leaseToken });
      python.go("try free");
      expect(await python.step("tried free")).toEqual({ step: "tried free", acquired: true, file: canonical });

      // A relative path over Connect JSON is refused, naming the field and what to send.
      const relative = await callFailure(connect.acquire({ file: "src/app.css", owner: "connect" }));
      expect(relative.code).toBe(Code.InvalidArgument);
      expect(relative.rawMessage).toBe('file: must be an absolute path; resolve it against your working directory before sending, got "src/app.css"');
      python.go("done");
      await python.step("done");
      expect(await python.exited, python.output()).toEqual({ code: 0, signal: null });
    } catch (error) {
      throw new Error(`${error instanceof Error ? error.message : String(error)}\n${python.output()}`, { cause: error });
    }
  });

  for (const store of STORES) {
    describe(`watches of locks from Python (${store} store)`, storeTags(store), () => {
      it("sees one file's grants, waiter and releases, every file's, progress and a replay from a revision; resumes a lag without a gap", {
        timeout: 120_000,
      }, async () => {
        expect(generated.code, generated.stderr).toBe(0);
        // --watch-buffer 64: 200 changes unread end a watcher (with what the narrow window holds in
        // flight), and the file store's history of four times the buffer still replays every
        // change after the revision the lag names.
        const service = await startService("sessions", await onStore(store, { args: ["--watch-buffer", "64"] }));
        const lockDir = realpathSync(makeTempDir("berth-python-lock-watch-"));
        const python = runPython(["lock_watch"], { BERTH_SESSIONS_URL: service.url("sessions"), BERTH_PYTHON_STUBS: stubs, BERTH_E2E_LOCK_DIR: lockDir });
        try {
          const watched = await python.step("lock_watch");
          const [holderToken, waiterToken] = watched.tokens as number[];
          const at = watched.start_revision as number;
          // The watch of every file described the lock held before it started, at its start revision.
          expect(watched.described).toEqual([["CURRENT_HOLDER", "py-held", "held.css", 0, expect.any(Number), at]]);
          // The watch of one file, without include_current, still said where it started.
          expect(watched).toMatchObject({ opened_revision: at, opened_reset: false, every_same: true, replayed_same: true });
          const events = watched.events as Array<[string, string, string, number, number, number]>;
          expect(events.map((event) => event.slice(0, 5))).toEqual([
            ["GRANTED", "py-holder", "watched.css", 0, holderToken],
            ["WAITER_JOINED", "py-waiter", "watched.css", 1, 0],
            ["RELEASED", "py-holder", "watched.css", 0, holderToken],
            ["GRANTED", "py-waiter", "watched.css", 0, waiterToken],
            ["RELEASED", "py-waiter", "watched.css", 0, waiterToken],
          ]);
          // Revisions grow after the start; a release and the grant it hands on may share one (etcd).
          const revisions = events.map((event) => event[5]);
          expect(revisions[0]).toBeGreaterThan(at);
          for (let i = 1; i < revisions.length; i++) expect(revisions[i]).toBeGreaterThanOrEqual(revisions[i - 1]!);
          expect(revisions.at(-1)).toBeGreaterThan(revisions[0]!);
          expect(watched.progress_revision).toBeGreaterThanOrEqual(revisions.at(-1)!);
          expect(watched.watch_revision).toBe(watched.progress_revision);

          // 200 changes unread: the service ended the watcher once, and it resumed by itself from the
          // revision named, which both stores still replay (etcd its own history, the file store
          // its four buffers' worth): each change comes once, in order, no reset.
          const lag = await python.step("lock_lag", 60_000);
          expect(lag).toMatchObject({ resumes: 1, in_order: true, revisions_growing: true, reset: false, complete: true, received: 200, view_held: [] });
          await python.step("done");
          expect(await python.exited, python.output()).toEqual({ code: 0, signal: null });
        } catch (error) {
          throw new Error(`${error instanceof Error ? error.message : String(error)}\n${python.output()}`, { cause: error });
        } finally {
          await service.stop();
        }
      });
    });
  }
});
