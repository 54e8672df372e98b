// @module-tag python
/**
 * Python as a real polyglot client (python-e2e.ts): stubs generated from proto/ with Debian's
 * protoc and gRPC's Python plugin, and `examples/python/berth_client/` on Debian's grpcio, against a started
 * sessions service (with a bearer token) and a budget service (a fixture machine with a 4G budget,
 * so admission queues deterministically).
 *
 * `examples/python/e2e.py` runs the Python side and reports each step as a JSON line; this side
 * checks each report against what it sees through its own clients, and acts where the scenario
 * needs a second party: a live entry for the watcher, a second waiter for the lock, a reservation
 * that makes the Python admission queue. A watch of sessions runs against a service of its own with
 * a small `--watch-buffer`, so that a Python watcher that stops reading is ended WATCHER_LAGGED and
 * resumes by itself. Locks (however a file is spelled, and their watches) are python-locks.test.ts's;
 * the budget's errors and watches python-budget.test.ts's.
 */
import { mkdirSync, readFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { HolderKind, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import type { Client } from "@connectrpc/connect";
import { G, startBudget, until, type BudgetUnderTest } from "./budget-e2e.js";
import { discoveryCases, expectResolutions, type Resolution } from "./discovery.js";
import { connectClient, makeTempDir, runCommand, startService, stopAll, type CommandResult, type StartedService } from "./harness.js";
import { DEBIAN_PYTHON } from "./harness/system-packages.js";
import { EXAMPLES, generateStubs, PYTHON_TOKEN, runPython, startTokenedSessions } from "./python-e2e.js";

describe("Python client (grpcio 1.51 + stubs from Debian's protoc)", () => {
  const token = PYTHON_TOKEN;
  let sessions: StartedService;
  let budget: BudgetUnderTest;
  let stubs: string;
  let generated: CommandResult;
  let pluginRequests: string;
  let projectRoot: string;
  let sessionClient: Client<typeof SessionService>;
  let lockClient: Client<typeof LockService>;

  beforeAll(async () => {
    let root: string;
    ({ root, stubs, generated, pluginRequests } = await generateStubs());
    projectRoot = path.join(root, "project");
    mkdirSync(projectRoot);
    [sessions, budget] = await Promise.all([startTokenedSessions(root), startBudget()]);
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
});
