// @module-tag python
/**
 * Python as a real polyglot client: stubs generated from proto/ with Debian's protoc and gRPC's
 * Python plugin, and `examples/python/berth_client.py` on Debian's grpcio, against a started
 * sessions service (with a bearer token) and a budget service (a fixture machine with a 4G budget,
 * so admission queues deterministically).
 *
 * `examples/python/e2e.py` runs the Python side and reports each step as a JSON line; this side
 * checks each report against what it sees through its own clients, and acts where the scenario
 * needs a second party: a live entry for the watcher, a second waiter for the lock, a reservation
 * that makes the Python admission queue. The watches of locks (on each store) and of the budget
 * run against services of their own with a small `--watch-buffer`, so that a Python watcher that
 * stops reading is ended WATCHER_LAGGED and resumes by itself.
 */
import { spawn } from "node:child_process";
import { mkdirSync, readFileSync, realpathSync, symlinkSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { HolderKind, LockHeldSchema, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { Code, type Client } from "@connectrpc/connect";
import { CLI, G, startBudget, until, type BudgetUnderTest } from "./budget-e2e.js";
import { discoveryCases, expectResolutions, type Resolution } from "./discovery.js";
import {
  connectClient,
  makeTempDir,
  onStore,
  repoPath,
  runCommand,
  runSteps,
  startService,
  stopAll,
  STORES,
  storeTags,
  type CommandResult,
  type StartedService,
  type StepRun,
  callFailure,
} from "./harness.js";
import { DEBIAN_PYTHON } from "./harness/system-packages.js";

const EXAMPLES = repoPath("examples/python");

function runPython(args: readonly string[], env: Record<string, string>, cwd: string = EXAMPLES): StepRun {
  // Only what the script needs: no BERTH_* of the developer, and no PYTHONHOME/PYTHONPATH of
  // another interpreter (pyenv) that would break /usr/bin/python3's own modules.
  const base: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!/^(BERTH_|BACKLOT_|PYTHON)/.test(name)) base[name] = value;
  }
  return runSteps(DEBIAN_PYTHON, [path.join(EXAMPLES, "e2e.py"), ...args], {
    cwd,
    env: { ...base, PYTHONUNBUFFERED: "1", PYTHONDONTWRITEBYTECODE: "1", ...env },
    label: "e2e.py",
  });
}

describe("Python client (grpcio 1.51 + stubs from Debian's protoc)", () => {
  const token = "python-e2e-token";
  let sessions: StartedService;
  let budget: BudgetUnderTest;
  let stubs: string;
  let generated: CommandResult;
  let pluginRequests: string;
  let projectRoot: string;
  let sessionClient: Client<typeof SessionService>;
  let lockClient: Client<typeof LockService>;

  beforeAll(async () => {
    const root = makeTempDir("berth-python-e2e-");
    const tokenFile = path.join(root, "token");
    writeFileSync(tokenFile, `${token}\n`, { mode: 0o600 });
    projectRoot = path.join(root, "project");
    mkdirSync(projectRoot);
    stubs = path.join(root, "stubs");
    // As a user would: the stubs are generated from proto/ for this run, never taken from git. The
    // plugin is Debian's, through a wrapper that keeps the requests protoc hands it.
    pluginRequests = path.join(root, "plugin-requests");
    const plugin = path.join(root, "grpc_python_plugin");
    writeFileSync(plugin, `#!/bin/sh\ntee -a "${pluginRequests}" | exec grpc_python_plugin "$@"\n`, { mode: 0o755 });
    generated = await runCommand("bash", [path.join(EXAMPLES, "generate.sh"), stubs], { timeoutMs: 60_000, env: { GRPC_PYTHON_PLUGIN: plugin } });
    [sessions, budget] = await Promise.all([
      // Room for one waiter per lock: the Python side meets TOO_MANY_WAITERS once this side queues one.
      startService("sessions", { args: ["--token-file", tokenFile, "--lock-max-waiters", "1"] }),
      startBudget(),
    ]);
    const url = sessions.url("sessions");
    sessionClient = connectClient(SessionService, url, { protocol: "grpc", token });
    lockClient = connectClient(LockService, url, { protocol: "grpc", token, defaultTimeoutMs: 30_000 });
    // Generating and two service starts, on a CI machine busy with every other test file.
  }, 90_000);
  afterAll(stopAll);

  it("generates the stubs from proto/ with protoc and grpc_python_plugin", async () => {
    expect(generated.code, `${generated.stdout}\n${generated.stderr}`).toBe(0);
    const imports = await runCommand(
      DEBIAN_PYTHON,
      [
        "-c",
        "import grpc, health_pb2_grpc; from berth.sessions.v1 import session_service_pb2_grpc, events_pb2; from berth.locks.v1 import lock_service_pb2_grpc; from berth.budget.v1 import budget_service_pb2_grpc; print(grpc.__file__, events_pb2.GenerateEvent().HasField('page_url'))",
      ],
      { cwd: stubs, env: { PYTHONPATH: stubs, PYTHONHOME: undefined, PYTHONDONTWRITEBYTECODE: "1" } },
    );
    expect(imports.code, imports.stderr).toBe(0);
    // grpcio is still the real module (nothing generated shadows it), and `optional` has presence.
    expect(imports.stdout).toMatch(/^\/usr\/lib\/python3\/dist-packages\/grpc\/__init__\.py False$/m);
    // The service stubs come from gRPC's plugin run by protoc on the real protos (proto3 `optional`
    // included), not from another compiler or an edited copy.
    const requests = readFileSync(pluginRequests, "latin1");
    for (const file of [
      "berth/sessions/v1/session_service.proto",
      "berth/locks/v1/lock_service.proto",
      "berth/budget/v1/budget_service.proto",
      "health.proto",
    ]) {
      expect(requests).toContain(file);
    }
    // proto3 `optional` page_url's synthetic oneof: the descriptors handed to the plugin kept it.
    expect(requests).toContain("_page_url");
  });

  it("finds the services and its token as the berth command does (every row of the discovery table)", async () => {
    expect(generated.code, generated.stderr).toBe(0);
    const cases = discoveryCases(makeTempDir("berth-python-discovery-"));
    const run = await runCommand(DEBIAN_PYTHON, [path.join(EXAMPLES, "e2e.py"), "resolve"], {
      cwd: EXAMPLES,
      input: JSON.stringify(cases.map(({ expected: _, ...c }) => c)),
      env: { BERTH_PYTHON_STUBS: stubs, PYTHONHOME: undefined, PYTHONPATH: undefined, PYTHONDONTWRITEBYTECODE: "1" },
    });
    expect(run.code, run.stderr).toBe(0);
    expectResolutions(
      cases,
      run.stdout
        .trim()
        .split("\n")
        .map((line) => JSON.parse(line) as Resolution),
    );
  });

  it("drives sessions, locks and the budget from Python, checked from TypeScript", { timeout: 120_000 }, async () => {
    expect(generated.code, generated.stderr).toBe(0);
    // Run in the project: the client resolves the relative lock path against its own directory.
    const python = runPython(
      [],
      {
        BERTH_SESSIONS_URL: sessions.url("sessions"),
        BERTH_BUDGET_URL: budget.url,
        BERTH_TOKEN: token,
        BERTH_PYTHON_STUBS: stubs,
        BERTH_E2E_LOCK_FILE: "src/app.css",
      },
      projectRoot,
    );
    try {
      // The token: refused without it (or with a wrong one), health open, raw stubs carry it too.
      const tokenStep = await python.step("token");
      expect(tokenStep).toMatchObject({
        without: "UNAUTHENTICATED",
        without_reason: "TOKEN_MISSING",
        health_without: "SERVING",
        with_token: "SERVING",
        raw_stub_max_page_size: 1000,
      });
      expect(tokenStep.message).toMatch(/bearer token/i);

      // Append and read back: typed events with extra keys, an idempotent retry, the key reused
      // with another event refused, a seq conflict.
      const appended = await python.step("appended");
      expect(appended).toMatchObject({
        seqs: [1, 2],
        duplicate: true,
        duplicate_seq: 1,
        reused_reason: "IDEMPOTENCY_KEY_REUSED",
        reused_seqs: [1, 1],
        conflict_current_seq: 2,
        conflict_reason: "SEQ_CONFLICT",
        conflict_facts: { reason: "SEQ_CONFLICT", sessionId: "py-e2e", expectedSeq: 1, currentSeq: 2 },
        phase: "generate_requested",
        page_url: "/pricing",
        expected_variants: 3,
        generation_phase: "planning",
        pending_event: { id: "py-e2e", type: "generate", pageUrl: "/pricing", count: 3, prompt: "make it pop" },
      });
      expect(appended.journal).toEqual([
        {
          seq: 1,
          type: "generate",
          idempotency_key: "gen-1",
          integrity: "ENTRY_INTEGRITY_VERIFIED",
          event: { generate: { pageUrl: "/pricing", count: 3, extra: { prompt: "make it pop" } } },
        },
        {
          seq: 2,
          type: "agent_phase",
          idempotency_key: "",
          integrity: "ENTRY_INTEGRITY_VERIFIED",
          event: { agentPhase: { phase: "planning", at: 1700000000000 } },
        },
      ]);
      // What Python wrote is what TypeScript reads.
      const fromTs = await sessionClient.getSnapshot({ sessionId: "py-e2e" });
      expect(fromTs.snapshot).toMatchObject({ phase: "generate_requested", pageUrl: "/pricing", expectedVariants: 3 });

      // Watch: the backlog, the caught-up marker, progress while idle, then a live entry appended from this side.
      expect(await python.step("watch_caught_up")).toMatchObject({ backlog: [1, 2], last_seq: 2, snapshot_phase: "generate_requested" });
      expect(await python.step("watch_progress")).toMatchObject({ last_seq: 2 });
      const live = await sessionClient.appendEvent({
        sessionId: "py-e2e",
        event: { kind: { case: "variantsReady", value: { sourceFile: "src/app.css", arrivedVariants: 3 } } },
      });
      expect(live.seq).toBe(3n);
      expect(await python.step("watch_live")).toMatchObject({
        seq: 3,
        type: "variants_ready",
        live: true,
        snapshot_phase: "variants_ready",
        event: { variantsReady: { sourceFile: "src/app.css", arrivedVariants: 3 } },
      });

      // Every page of the list, a read that says where it ended, a deletion.
      expect(await python.step("sessions")).toMatchObject({
        read: [1],
        read_end: { last_seq: 3, next_seq: 2, more: true },
        empty_read: { entries: 0, next_seq: 4, more: false },
        deleted_at: 1,
        repeated_delete: 1,
        after_delete: ["py-page-1", "py-page-2", "py-page-3", "py-page-4"],
        snapshot_after_delete: true,
        reborn_seq: 2,
        limits: { max_page_size: 1000, max_events_per_append: 10000 },
      });
      const listedIds = (await python.step("sessions")).listed as string[];
      expect(listedIds).toEqual([...listedIds].sort());
      expect(listedIds).toEqual(expect.arrayContaining(["py-e2e", "py-page-0", "py-page-4"]));
      expect(new Set(listedIds).size).toBe(listedIds.length);

      // A watch of every session started again from the revision of a change it received: the
      // changes after it, in order, then caught_up at the last one (no reset).
      const everySession = await python.step("sessions_watch");
      const changes = everySession.changes as Array<[number, number, number]>;
      expect(changes.map(([session, lastSeq]) => [session, lastSeq])).toEqual([
        [0, 1],
        [1, 1],
        [0, 2],
      ]);
      expect(changes[1]![2]).toBeGreaterThan(changes[0]![2]);
      expect(changes[2]![2]).toBeGreaterThan(changes[1]![2]);
      expect(everySession.watch_revision).toBe(changes[2]![2]);
      expect(everySession.replayed).toEqual(changes.slice(1));
      expect(everySession.caught_up).toEqual([changes[2]![2], false]);
      expect(everySession.again_revision).toBe(changes[2]![2]);

      // Each SessionService refusal as Python sees it: the code and the ErrorInfo reason.
      expect((await python.step("session_refusals")).seen).toEqual({
        "append bad id": ["INVALID_ARGUMENT", "INVALID_FIELD"],
        "append too large": ["INVALID_ARGUMENT", "EVENT_TOO_LARGE"],
        "append stale seq": ["ABORTED", "SEQ_CONFLICT"],
        "append exists": ["ABORTED", "SEQ_CONFLICT"],
        "append missing": ["ABORTED", "SEQ_CONFLICT"],
        "append key reused": ["ALREADY_EXISTS", "IDEMPOTENCY_KEY_REUSED"],
        "append fence": ["FAILED_PRECONDITION", "FENCE_REJECTED"],
        "appends too many": ["INVALID_ARGUMENT", "TOO_MANY_EVENTS"],
        "get missing": ["NOT_FOUND", "SESSION_NOT_FOUND"],
        "list bad token": ["INVALID_ARGUMENT", "INVALID_FIELD"],
        "flush missing": ["NOT_FOUND", "SESSION_NOT_FOUND"],
        "delete missing": ["NOT_FOUND", "SESSION_NOT_FOUND"],
        "delete stale seq": ["ABORTED", "SEQ_CONFLICT"],
        "read missing": ["NOT_FOUND", "SESSION_NOT_FOUND"],
        "read past the end": ["OUT_OF_RANGE", "SEQ_OUT_OF_RANGE"],
        "watch progress too often": ["INVALID_ARGUMENT", "INVALID_FIELD"],
        "watch all bad resume": ["INVALID_ARGUMENT", "INVALID_FIELD"],
        "watch deleted": ["NOT_FOUND", "SESSION_DELETED"],
      });

      // The locks' limits, as GetLimits answers them to Python.
      expect(await python.step("lock_limits")).toMatchObject({
        default_ttl_ms: 30_000,
        max_ttl_ms: 3_600_000,
        max_wait_ms: 600_000,
        heartbeat_ms: 5_000,
        max_waiters_per_file: 1,
        max_owner_length: 256,
      });

      // A lock held in a `with` block: held as Inspect sees it, WAIT_EXHAUSTED with a typed
      // LockHeld and a retry delay for a second taker, TOO_MANY_WAITERS once a waiter from this
      // side fills the file's queue, and that waiter granted once the block exits.
      const held = await python.step("lock_held");
      const file = path.join(projectRoot, "src/app.css");
      expect(held).toMatchObject({
        file,
        owner: "python",
        busy_reason: "WAIT_EXHAUSTED",
        busy_retry_after: 1,
        busy_owner: "python",
        busy_kind: "HOLDER_KIND_STREAM",
        busy_waited_ms: 200,
      });
      expect(held.busy_fencing_token).toBe(held.fencing_token);
      const inspected = await lockClient.inspect({ file });
      expect(inspected.holder).toMatchObject({ owner: "python", kind: HolderKind.STREAM, fencingToken: BigInt(held.fencing_token as number) });
      const waiter = lockClient.acquire({ file, owner: "ts-waiter", maxWait: { seconds: 20n } });
      expect(await until(async () => (await lockClient.inspect({ file })).waiters.some((w) => w.owner === "ts-waiter"))).toBe(true);
      python.go("release_lock");
      expect(await python.step("lock_crowded")).toMatchObject({
        reason: "TOO_MANY_WAITERS",
        retry_after: 1,
        lock_held: false,
        message: expect.stringMatching(/1 requests already wait for .*app\.css/),
      });
      const granted = await waiter;
      await python.step("lock_released");
      expect(granted.lease).toMatchObject({ owner: "ts-waiter", file });
      expect(granted.lease!.fencingToken).toBeGreaterThan(BigInt(held.fencing_token as number));
      expect((await lockClient.inspect({ file })).holder?.owner).toBe("ts-waiter");
      await lockClient.release({ leaseToken: granted.lease!.leaseToken });

      // A lease: one request_id twice is one lease; renewed by unary KeepAlive (several tokens in a
      // call too), released; a malformed request_id is refused naming the field; and a Hold whose
      // lease its owner releases through Release ends OK (lost to the hold object, with no error).
      expect(await python.step("lease")).toEqual({
        step: "lease",
        file: path.join(projectRoot, "src/lease.css"),
        same_lease: true,
        alive: true,
        renewed_later: true,
        several: [true, false],
        bad_code: "INVALID_ARGUMENT",
        bad_reason: "INVALID_FIELD",
        bad_field: "request_id",
        bad_violations: ["request_id"],
        released: true,
        alive_after_release: false,
      });
      expect(await python.step("hold_released")).toEqual({ step: "hold_released", released: true, lost: true, code: null, reason: null, message: null });

      // An impossible need: FAILED_PRECONDITION with a typed Refusal naming the setting.
      expect(await python.step("refused")).toMatchObject({
        kind: "REFUSAL_KIND_IMPOSSIBLE",
        settings: ["BERTH_BUDGET_MEMORY"],
        gates: ["GATE_MEMORY_BUDGET"],
        facts: { kind: "impossible", reason: "IMPOSSIBLE" },
        reason: "IMPOSSIBLE",
      });

      // Admit: queued behind a 3G reservation of this side (the budget is 4G, Python needs 2G),
      // admitted once it is released; started moves the cost to the running tally; release.
      await python.step("ready_to_admit");
      const blocker = await budget.client.reserve({
        owner: "ts blocker",
        need: { items: [{ kind: NeedItemKind.START, name: "blocker", costSource: { case: "spec", value: { memory: "3G", cpu: 1 } } }] },
        ttl: { seconds: 60n },
      });
      python.go("budget_held");
      const queued = await python.step("admit_queued");
      expect(queued).toMatchObject({ position: 1 });
      expect(queued.gates).toContain("GATE_MEMORY_BUDGET");
      expect(String(queued.wait_for_text)).toMatch(/memory/);
      expect(queued.wait_expire_ms).toBeGreaterThan(Date.now());
      const state = await budget.client.getState({});
      expect(state.queue.map((q) => q.owner)).toEqual(["python admit"]);
      await budget.client.release({ reservationId: blocker.reservation!.id });
      const admitted = await python.step("admitted");
      expect(admitted).toMatchObject({ owner: "python admit", start_memory: 2 * G });
      expect(admitted.queued_updates).toBeGreaterThanOrEqual(1);
      const started = await python.step("admit_started");
      expect(started).toMatchObject({ running_name: "web", running_memory: G, start_memory_left: G });
      const running = (await budget.client.getState({})).running.find((r) => r.id === started.running_id);
      expect(running).toMatchObject({ name: "web", pid: started.running_pid, reservationId: admitted.id });
      python.go("running_seen");
      expect(await python.step("admit_released")).toMatchObject({ released: true, id: admitted.id });
      expect((await budget.client.getState({})).reservations.some((r) => r.id === admitted.id)).toBe(false);

      // Reserve with a lease: seen from here, renewed, released once (a second release is a no-op).
      const reserved = await python.step("reserved");
      expect(reserved).toMatchObject({ owner: "python reserve", memory: G });
      const withLease = (await budget.client.getState({})).reservations.find((r) => r.id === reserved.id);
      expect(withLease?.expireTime).toBeDefined();
      python.go("reservation_seen");
      expect(await python.step("reserve_done")).toEqual({
        step: "reserve_done",
        alive: true,
        renewed_later: true,
        released: true,
        released_again: false,
        alive_after_release: false,
      });

      // INVALID_ARGUMENT names the field, in the Struct detail and the berth-error-details trailer.
      const invalid = await python.step("invalid_argument");
      expect(invalid).toMatchObject({
        code: "INVALID_ARGUMENT",
        field: "session_id",
        reason: "INVALID_FIELD",
        violations: ["session_id"],
        budget_field: "need.items[0].spec.memory",
        event_field: "event.generate.extra.pageUrl",
      });
      expect(invalid.struct_detail).toMatchObject({ field: "session_id", rule: invalid.rule });
      expect(String(invalid.message)).toMatch(/^session_id: /);

      await python.step("done");
      expect(await python.exited, python.output()).toEqual({ code: 0, signal: null });
    } catch (error) {
      throw new Error(`${error instanceof Error ? error.message : String(error)}\n${python.output()}`, { cause: error });
    }
  });

  it("the budget from Python: each error code with its ErrorInfo reason, request ids, pages and limits", { timeout: 60_000 }, async () => {
    expect(generated.code, generated.stderr).toBe(0);
    const full = await startBudget({ args: ["--max-queue=0"] });
    const python = runPython(["budget"], { BERTH_BUDGET_URL: full.url, BERTH_PYTHON_STUBS: stubs });
    try {
      expect(await python.step("limits")).toMatchObject({ default_ttl_s: 30, max_ttl_s: 3600, max_wait_s: 600, max_queue: 0, max_owner_length: 256 });
      expect(await python.step("request_ids")).toMatchObject({
        same_reservation: true,
        same_entry: true,
        running_count: 1,
        start_left: 3 * G - 256 * 1024 ** 2,
      });
      expect(await python.step("pages")).toMatchObject({
        running: ["py-svc"],
        reservations: ["py holder"],
        queue: [],
        reservation_count: 1,
        all_reservations: 1,
      });
      const errors = await python.step("budget_errors");
      const refused = (reason: string, refusal: string | null, retry: boolean, code = "RESOURCE_EXHAUSTED") => ({
        code,
        reason,
        domain: "berth.budget",
        retry,
        refusal,
      });
      expect(errors).toMatchObject({
        impossible: refused("IMPOSSIBLE", "REFUSAL_KIND_IMPOSSIBLE", false, "FAILED_PRECONDITION"),
        queue_full: refused("QUEUE_FULL", "REFUSAL_KIND_QUEUE_FULL", true),
        wait_exhausted: refused("WAIT_EXHAUSTED", "REFUSAL_KIND_WAIT_EXHAUSTED", true),
        invalid_field: { code: "INVALID_ARGUMENT", reason: "INVALID_FIELD", domain: "berth.budget", field: "ttl" },
        bad_request_id: { code: "INVALID_ARGUMENT", reason: "INVALID_FIELD", field: "request_id" },
        request_id_reused: { code: "ALREADY_EXISTS", reason: "IDEMPOTENCY_KEY_REUSED", domain: "berth.budget" },
        reservation_not_found: { code: "NOT_FOUND", reason: "RESERVATION_NOT_FOUND", domain: "berth.budget", retry: false },
        release_build_gone: { code: "NOT_FOUND", reason: "RESERVATION_NOT_FOUND" },
        out_of_turn: { code: "INVALID_ARGUMENT", reason: "OUT_OF_TURN", domain: "berth.budget" },
      });
      await python.step("done");
      expect(await python.exited, python.output()).toEqual({ code: 0, signal: null });
      // Nothing left behind.
      const state = await full.client.getState({});
      expect([state.reservationCount, state.runningCount, state.queueSize]).toEqual([0, 0, 0]);
    } catch (error) {
      throw new Error(`${error instanceof Error ? error.message : String(error)}\n${python.output()}`, { cause: error });
    } finally {
      await full.service.stop();
    }
  });

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

  it("resumes a watch the service ended for falling behind (WatcherLagged), missing no entry; a watch of every session describes only what moved", {
    timeout: 90_000,
  }, async () => {
    expect(generated.code, generated.stderr).toBe(0);
    const slow = await startService("sessions", { args: ["--watch-buffer", "4"] });
    const python = runPython(["lag"], { BERTH_SESSIONS_URL: slow.url("sessions"), BERTH_PYTHON_STUBS: stubs });
    try {
      const lag = await python.step("lag", 40_000);
      expect(lag).toMatchObject({ contiguous: true, total: 801, received: 801 });
      // 800 entries against a buffer of 4 with nobody reading: the service must have ended it.
      expect(lag.resumed).toBeGreaterThanOrEqual(1);
      const all = await python.step("lag_all", 60_000);
      expect(all.resumes).toBeGreaterThanOrEqual(1);
      expect(all.knew_idle).toBe(1);
      expect(all.last_seqs).toEqual(all.expected);
      // Resumed from the seqs it had seen: the idle session was not described again.
      expect((all.described_again as string[]).some((id) => id.includes("-idle-"))).toBe(false);
      expect((all.described_again as string[]).some((id) => id.includes("-busy-"))).toBe(true);
      await python.step("done");
      expect(await python.exited).toEqual({ code: 0, signal: null });
    } catch (error) {
      throw new Error(`${error instanceof Error ? error.message : String(error)}\n${python.output()}`, { cause: error });
    }
    await slow.stop();
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

  it("watches the budget from Python through a queued admission, with progress, a replay and WatchMachine; resumes a lag without a gap", {
    timeout: 90_000,
  }, async () => {
    expect(generated.code, generated.stderr).toBe(0);
    const watched = await startBudget({ args: ["--watch-buffer", "4"] });
    const python = runPython(["budget_watch"], { BERTH_BUDGET_URL: watched.url, BERTH_PYTHON_STUBS: stubs });
    try {
      const step = await python.step("budget_watch");
      const at = step.start_revision as number;
      expect(step.described).toEqual([["POLICY_CHANGED", "", at]]);
      // Queued behind a 3G reservation (the budget is 4G), admitted once it is released: one revision per change.
      expect(step.events).toEqual([
        ["RESERVATION_MADE", "py-blocker", at + 1],
        ["REQUEST_QUEUED", "py-admit", at + 2],
        ["RESERVATION_RELEASED", "py-blocker", at + 3],
        ["RESERVATION_MADE", "py-admit", at + 4],
        ["REQUEST_ADMITTED", "py-admit", at + 5],
        ["RESERVATION_RELEASED", "py-admit", at + 6],
      ]);
      expect(step).toMatchObject({
        replayed_same: true,
        replay_caught_up: ["caught_up", at + 6, false],
        progress_revision: at + 6,
        watch_revision: at + 6,
        machine_memory: 16 * G,
      });
      // Two samples in a row; resumed after the first, the next is the second, not a reset.
      const [first, second, resumed, reset, machineRevision] = step.machine as [number, number, number, boolean, number];
      expect([second, resumed, reset, machineRevision]).toEqual([first + 1, first + 1, false, first + 1]);

      // 300 changes unread with --watch-buffer 4: ended once, resumed from the revision named, and
      // the service's history (10,000 changes) replays every one it missed.
      const lag = await python.step("budget_lag", 60_000);
      expect(lag).toEqual({ step: "budget_lag", resumes: 1, reset: false, received: 300, exact: true, revisions_consecutive: true });
      await python.step("done");
      expect(await python.exited, python.output()).toEqual({ code: 0, signal: null });
    } catch (error) {
      throw new Error(`${error instanceof Error ? error.message : String(error)}\n${python.output()}`, { cause: error });
    } finally {
      await watched.service.stop();
    }
  });
});
