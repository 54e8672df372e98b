/**
 * `@berth/client` against the real services, as processes: it finds them by the shared table (the
 * services' own variables, a token file), appends and watches (a watcher the service ends for
 * falling behind resumes without a gap or a repeat), holds locks with `await using` (relative
 * paths are the caller's), admits through the budget, and every refusal is a BerthClientError
 * with its typed details; deadlines and cancellation go through each call's options.
 */
import { writeFileSync } from "node:fs";
import * as path from "node:path";
import { Code } from "@connectrpc/connect";
import { RefusalKind } from "@berth/api/berth/budget/v1/budget_pb";
import { Berth, BerthClientError, start, type MachineWatchEvent } from "@berth/client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startBudget, type BudgetUnderTest } from "./budget-e2e.js";
import { appendThenWatch, resumeAfterLag, typedRefusals, watchEverySession } from "./client-scenarios.js";
import { makeTempDir, startService, stopAll, type StartedService } from "./harness.js";

const TOKEN = "client-test-token";
let sessions: StartedService;
let budget: BudgetUnderTest;
let berth: Berth;
let tokenFile: string;

beforeAll(async () => {
  tokenFile = path.join(makeTempDir("berth-client-token-"), "token");
  writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
  [sessions, budget] = await Promise.all([startService("sessions", { env: { BERTH_TOKEN: TOKEN } }), startBudget()]);
  berth = new Berth({ sessionsUrl: sessions.url("sessions"), budgetUrl: budget.url, token: TOKEN });
}, 60_000);
afterAll(stopAll);

describe("finding the services", () => {
  it("by the services' own port variable and a token file, as the table says; without the token, UNAUTHENTICATED", async () => {
    const port = new URL(sessions.url("sessions")).port;
    const found = new Berth({ env: { BERTH_HOST: "0.0.0.0", BERTH_SESSIONS_PORT: port, BERTH_TOKEN_FILE: tokenFile } });
    expect(found.sessions.endpoint).toMatchObject({ url: `http://127.0.0.1:${port}`, urlSource: "BERTH_HOST and BERTH_SESSIONS_PORT", token: TOKEN });
    expect((await found.append("found-by-port", { type: "steer" })).seq).toBe(1n);
    const anonymous = new Berth({ env: { BERTH_SESSIONS_PORT: port } });
    await expect(anonymous.sessions.snapshot("found-by-port")).rejects.toMatchObject({ code: Code.Unauthenticated, reason: "TOKEN_MISSING" });
  });
});

describe("sessions", () => {
  it("appends, then watches: the backlog, caught-up, a live entry with its snapshot", () => appendThenWatch(berth, "client-watch"));

  it("resumes a watch the service ended for falling behind, missing and repeating no entry", { timeout: 60_000 }, async () => {
    const slow = await startService("sessions", { args: ["--watch-buffer", "4"] });
    await resumeAfterLag(new Berth({ sessionsUrl: slow.url("sessions") }), "client-lag");
    await slow.stop();
  });

  it("watches every session: the current state, caught up, a live change with its snapshot, a deletion; a resume by revision", () =>
    watchEverySession(berth, "client-every-session"));

  it("refuses with typed details: SeqConflict, IdempotencyKeyReused", () => typedRefusals(berth, "client-refusals"));
});

describe("locks", () => {
  it("holds a lock for a block with await using (the path the caller's), fences writes with it, refuses a stale fence after", async () => {
    const project = makeTempDir("berth-client-project-");
    const other = new Berth({ sessionsUrl: sessions.url("sessions"), token: TOKEN });
    let token: bigint;
    {
      await using lease = await berth.lock("src/app.css", { cwd: project, owner: "client test" });
      token = lease.fencingToken;
      expect(lease.file).toBe(path.join(project, "src/app.css"));
      expect((await berth.locks.inspect(lease.file)).holder).toMatchObject({ owner: "client test", fencingToken: token });
      // Held: another caller trying once is refused, the holder named.
      const busy = await other.lock(path.join(project, "src/app.css"), { maxWaitMs: 0, owner: "other" }).catch((e: unknown) => e);
      expect(busy).toMatchObject({ code: Code.ResourceExhausted, reason: "WAIT_EXHAUSTED", lockHeld: { owner: "client test", fencingToken: token } });
      expect((await berth.append("client-fenced", { type: "steer" }, { fence: { file: "src/app.css", fencingToken: token }, cwd: project })).seq).toBe(1n);
    }
    expect((await berth.locks.inspect("src/app.css", { cwd: project })).holder).toBeUndefined();
    await using again = await other.lock("src/app.css", { cwd: project, owner: "other" });
    expect(again.fencingToken).toBeGreaterThan(token);
    const stale = await berth
      .append("client-fenced", { type: "steer" }, { fence: { file: "src/app.css", fencingToken: token }, cwd: project })
      .catch((e: unknown) => e);
    expect(stale).toMatchObject({
      code: Code.FailedPrecondition,
      reason: "FENCE_REJECTED",
      fenceRejected: { fencingToken: token, currentToken: again.fencingToken },
    });
  });

  it("a wait ends at its deadline (DEADLINE_EXCEEDED) or its signal (CANCELED), and leaves no waiter behind", async () => {
    const file = path.join(makeTempDir("berth-client-wait-"), "busy.css");
    await using _held = await berth.lock(file, { owner: "holder" });
    await expect(berth.lock(file, { timeoutMs: 300 })).rejects.toMatchObject({ code: Code.DeadlineExceeded });
    const stop = new AbortController();
    const waiting = berth.lock(file, { signal: stop.signal, onWaiting: () => stop.abort() });
    await expect(waiting).rejects.toMatchObject({ code: Code.Canceled });
    for (let i = 0; i < 100 && (await berth.locks.inspect(file)).waiters.length > 0; i++) await new Promise((resolve) => setTimeout(resolve, 20));
    expect((await berth.locks.inspect(file)).waiters).toEqual([]);
  });
});

describe("budget", () => {
  it("admits for as long as the work runs, and releases when it settles", async () => {
    const during = await berth.admit(
      [start("client-web", { memory: "1G", cpu: 1 })],
      async (admission) => {
        const state = await berth.budget.state();
        expect(state.reservations.map((r) => r.id)).toContain(admission.reservation.id);
        const { running } = await admission.started("client-web", { pid: process.pid });
        expect(running?.name).toBe("client-web");
        await berth.budget.rpc.stopRunning({ id: running!.id });
        return admission.reservation.id;
      },
      { owner: "client test web" },
    );
    expect((await berth.budget.state()).reservations.map((r) => r.id)).not.toContain(during);
  });

  it("a need bigger than the whole budget is refused with its Refusal, before any work", async () => {
    let ran = false;
    const refused = await berth.admit([start("huge", { memory: "64G" })], () => (ran = true), { owner: "client test huge" }).catch((e: unknown) => e);
    expect(ran).toBe(false);
    expect(refused).toBeInstanceOf(BerthClientError);
    expect(refused).toMatchObject({ code: Code.FailedPrecondition, reason: "IMPOSSIBLE", refusal: { kind: RefusalKind.IMPOSSIBLE } });
  });

  it("watches the machine from a sample's revision: the samples after it, with progress while none comes", { timeout: 30_000 }, async () => {
    const [first, second] = await (async () => {
      const samples: bigint[] = [];
      for await (const item of berth.budget.watchMachine({ timeoutMs: 20_000 })) {
        if (item.kind === "sample") samples.push(item.revision);
        if (samples.length === 2) return samples;
      }
      throw new Error("the watch ended");
    })();
    expect(second).toBe(first! + 1n);
    const seen: MachineWatchEvent[] = [];
    // Samples every 200 ms on the fixture machine: a progress every 100 ms of quiet comes between them.
    for await (const item of berth.budget.watchMachine({ startRevision: first!, progressIntervalMs: 100, timeoutMs: 20_000 })) {
      seen.push(item);
      if (item.kind === "progress") break;
    }
    // The sample after the one given comes first, not the latest again: nothing repeated, none missed.
    expect(seen[0]).toMatchObject({ kind: "sample", revision: first! + 1n, reset: false });
    // A progress names the revision of the last sample sent.
    expect(seen.at(-1)!.revision).toBe(seen.at(-2)!.revision);
    const error = await (async () => {
      for await (const _ of berth.budget.watchMachine({ progressIntervalMs: 10 })) return undefined;
    })().catch((e: unknown) => e);
    expect(error).toMatchObject({ code: Code.InvalidArgument });
  });
});

describe("finding the services: the berth command, through the same table", () => {
  it("by the services' own host and port variables and a token file; a malformed URL variable is a usage error naming it", async () => {
    const { runCommand, repoPath } = await import("./harness.js");
    const port = new URL(sessions.url("sessions")).port;
    const cli = (env: Record<string, string | undefined>) =>
      runCommand(process.execPath, [repoPath("packages/cli/bin/berth.js"), "sessions", "get", "found-by-port"], {
        env: {
          BERTH_SESSIONS_URL: undefined,
          BERTH_SESSIONS_SOCKET: undefined,
          BERTH_HOST: undefined,
          BERTH_SESSIONS_PORT: undefined,
          BERTH_TOKEN: undefined,
          BERTH_TOKEN_FILE: undefined,
          ...env,
        },
      });
    const found = await cli({ BERTH_HOST: "::", BERTH_SESSIONS_PORT: port, BERTH_TOKEN_FILE: tokenFile });
    expect(found.code, found.stderr).toBe(0);
    expect(found.stdout).toMatch(/^session\s+found-by-port$/m);
    expect((await cli({ BERTH_SESSIONS_PORT: port })).code).toBe(77);
    const malformed = await cli({ BERTH_SESSIONS_URL: "127.0.0.1:7301" });
    expect(malformed.code).toBe(2);
    expect(malformed.stderr).toMatch(/BERTH_SESSIONS_URL must look like http:\/\/127\.0\.0\.1:7301 or unix:/);
  });
});
