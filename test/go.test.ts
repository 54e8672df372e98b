// @module-tag go
/**
 * Go as a third independent gRPC implementation (beside grpc-js and Python's C core): the example
 * in examples/go, built offline by its build.sh (stubs from proto/ with Debian's protoc-gen-go and
 * protoc-gen-go-grpc, grpc-go from Debian's Go sources) into a temporary folder, then run against a
 * sessions service with a bearer token and a budget service on a unix socket, which it finds from
 * the environment alone (a port, a socket, a token file), as the berth command would.
 *
 * `berth-go-demo -e2e` reports each step as a JSON line; this side checks each report through its
 * own clients and acts where a second party is needed (a live entry for the watcher, a reservation
 * that makes the admission queue).
 */
import { mkdirSync, realpathSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { HolderKind, LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import type { Client } from "@connectrpc/connect";
import { G, startBudget, until, type BudgetUnderTest } from "./budget-e2e.js";
import { discoveryCases, expectResolutions, type Resolution } from "./discovery.js";
import {
  connectClient,
  makeTempDir,
  repoPath,
  runCommand,
  runSteps,
  startService,
  stopAll,
  type CommandResult,
  type StartedService,
  type StepRun,
} from "./harness.js";

const EXAMPLE = repoPath("examples/go");

/** The environment of a Go process: this one's without BERTH_*, BACKLOT_* or GO* settings, plus `env`. */
function goEnv(env: Record<string, string>): NodeJS.ProcessEnv {
  const base: NodeJS.ProcessEnv = {};
  for (const [name, value] of Object.entries(process.env)) {
    if (!/^(BERTH_|BACKLOT_|GO)/.test(name)) base[name] = value;
  }
  return { ...base, ...env };
}

describe("Go client (grpc-go and stubs from Debian's packages, built offline)", () => {
  const token = "go-e2e-token";
  let built: CommandResult;
  let binary: string;
  let sessions: StartedService;
  let budget: BudgetUnderTest;
  let tokenFile: string;
  let socket: string;
  let projectRoot: string;
  let sessionClient: Client<typeof SessionService>;
  let lockClient: Client<typeof LockService>;

  beforeAll(async () => {
    const root = makeTempDir("berth-go-e2e-");
    tokenFile = path.join(root, "token");
    writeFileSync(tokenFile, `${token}\n`, { mode: 0o600 });
    projectRoot = realpathSync(root);
    mkdirSync(path.join(projectRoot, "src"));
    socket = path.join(root, "budget.sock");
    // No network: build.sh vendors Debian's sources and turns the module proxy off; HOME's build
    // cache is shared (a warm build only links).
    const started = Date.now();
    [built, sessions, budget] = await Promise.all([
      runCommand("bash", [path.join(EXAMPLE, "build.sh"), path.join(root, "build")], { timeoutMs: 280_000, env: goEnv({}) }),
      startService("sessions", { args: ["--token-file", tokenFile] }),
      startBudget({ args: [`--budget-socket=${socket}`] }),
    ]);
    console.info(`go.test.ts: the Go example built in ${((Date.now() - started) / 1000).toFixed(1)} s`);
    binary = path.join(root, "build", "berth-go-demo");
    sessionClient = connectClient(SessionService, sessions.url("sessions"), { protocol: "grpc", token });
    lockClient = connectClient(LockService, sessions.url("sessions"), { protocol: "grpc", token });
    // A cold build compiles grpc-go and protobuf (tens of seconds on a busy 2-core machine).
  }, 300_000);
  afterAll(stopAll);

  it("builds from proto/ and Debian's Go sources, offline", () => {
    expect(built.code, `${built.stdout}\n${built.stderr}`).toBe(0);
    expect(built.stdout).toContain("built ");
  });

  it("finds the services and its token as the berth command does (every row of the discovery table)", async () => {
    expect(built.code, built.stderr).toBe(0);
    const cases = discoveryCases(makeTempDir("berth-go-discovery-"));
    const run = await runCommand(binary, ["resolve"], { input: JSON.stringify(cases.map(({ expected: _, ...c }) => c)), env: goEnv({}) });
    expect(run.code, run.stderr).toBe(0);
    expectResolutions(
      cases,
      run.stdout
        .trim()
        .split("\n")
        .map((line) => JSON.parse(line) as Resolution),
    );
  });

  it("appends, watches, holds a lock and admits from Go, checked from TypeScript", { timeout: 120_000 }, async () => {
    expect(built.code, built.stderr).toBe(0);
    const sessionsPort = new URL(sessions.url("sessions")).port;
    expect(budget.url).toBe(`unix:${socket}`);
    const go: StepRun = runSteps(binary, ["-e2e", "-session", "go-e2e", "-lock-file", "src/app.css", "-admit-memory", "2G"], {
      cwd: projectRoot,
      // Found from the environment alone, as `berth up` was configured: a port, a socket, a token file.
      env: goEnv({ BERTH_SESSIONS_PORT: sessionsPort, BERTH_BUDGET_SOCKET: socket, BERTH_TOKEN_FILE: tokenFile }),
      label: "berth-go-demo",
    });
    try {
      expect(await go.step("connected")).toMatchObject({
        sessions_url: `http://127.0.0.1:${sessionsPort}`,
        budget_url: `unix:${socket}`,
        sessions_health: "SERVING",
        budget_health: "SERVING",
      });

      // Appends on top of each other, then a stale expected seq: ABORTED SEQ_CONFLICT, typed.
      expect(await go.step("appended")).toMatchObject({
        seqs: [1, 2],
        phase: "generate_requested",
        conflict_code: "Aborted",
        conflict_reason: "SEQ_CONFLICT",
        conflict_expected_seq: 1,
        conflict_current_seq: 2,
        conflict_facts: { sessionId: "go-e2e", expectedSeq: 1, currentSeq: 2 },
      });
      expect((await sessionClient.getSnapshot({ sessionId: "go-e2e" })).snapshot).toMatchObject({ pageUrl: "/pricing", expectedVariants: 3 });

      // Watch: the backlog, the caught-up marker, then a live entry appended from this side.
      expect(await go.step("watch_caught_up")).toMatchObject({ backlog: [1, 2], last_seq: 2, snapshot_phase: "generate_requested" });
      const live = await sessionClient.appendEvent({
        sessionId: "go-e2e",
        event: { kind: { case: "variantsReady", value: { sourceFile: "src/app.css", arrivedVariants: 3 } } },
      });
      expect(await go.step("watch_live")).toMatchObject({
        seq: Number(live.seq),
        type: "variants_ready",
        snapshot_phase: "variants_ready",
        event: { variantsReady: { sourceFile: "src/app.css", arrivedVariants: 3 } },
      });

      // A lock on a Hold stream: held as Inspect sees it; a second taker refused with a typed LockHeld.
      const file = path.join(projectRoot, "src/app.css");
      const held = await go.step("lock_held");
      expect(held).toMatchObject({
        file,
        owner: "go-demo",
        busy_code: "ResourceExhausted",
        busy_reason: "WAIT_EXHAUSTED",
        busy_owner: "go-demo",
        busy_kind: "HOLDER_KIND_STREAM",
      });
      expect(held.busy_fencing_token).toBe(held.fencing_token);
      expect(held.busy_retry_after_ms).toBeGreaterThan(0);
      const inspected = await lockClient.inspect({ file });
      expect(inspected.holder).toMatchObject({ owner: "go-demo", kind: HolderKind.STREAM, fencingToken: BigInt(held.fencing_token as number) });
      go.go("release_lock");
      expect(await go.step("lock_released")).toMatchObject({ file });
      // Ending the stream is what frees it.
      expect(await until(async () => (await lockClient.inspect({ file })).holder === undefined)).toBe(true);

      // Admit: queued behind a 3G reservation of this side (the budget is 4G, Go needs 2G),
      // admitted once it is released, then released on the stream.
      const blocker = await budget.client.reserve({
        owner: "ts blocker",
        need: { items: [{ kind: NeedItemKind.START, name: "blocker", costSource: { case: "spec", value: { memory: "3G", cpu: 1 } } }] },
        ttl: { seconds: 60n },
      });
      go.go("budget_held");
      const queued = await go.step("admit_queued");
      expect(queued.position).toBe(1);
      expect(String(queued.wait_for_text)).toMatch(/memory/);
      // An ETA with what it rests on, or none and why: never empty.
      expect(String(queued.eta_basis)).toMatch(/\S/);
      expect((await budget.client.getState({})).queue.map((q) => q.owner)).toEqual(["go-demo admit"]);
      await budget.client.release({ reservationId: blocker.reservation!.id });
      const admitted = await go.step("admitted");
      expect(admitted).toMatchObject({ owner: "go-demo admit", start_memory: 2 * G });
      expect(admitted.queued_updates).toBeGreaterThanOrEqual(1);
      expect((await budget.client.getState({})).reservations.map((r) => r.id)).toContain(admitted.id);
      go.go("admitted_seen");
      expect(await go.step("admit_released")).toMatchObject({ id: admitted.id });
      expect((await budget.client.getState({})).reservations.some((r) => r.id === admitted.id)).toBe(false);

      // A malformed request: the code, the ErrorInfo reason, the field in the facts and a BadRequest.
      expect(await go.step("invalid_argument")).toMatchObject({
        code: "InvalidArgument",
        reason: "INVALID_FIELD",
        field: "session_id",
        violations: ["session_id"],
      });

      await go.step("done");
      expect(await go.exited).toEqual({ code: 0, signal: null });
    } catch (error) {
      throw new Error(`${(error as Error).message}\n${go.output()}`, { cause: error });
    }
  });
});
