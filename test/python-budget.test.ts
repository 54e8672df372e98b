// @module-tag python
/**
 * The budget from Python (python-e2e.ts), against budget services of their own on a fixture
 * machine with a 4G budget (so admission queues deterministically): each error code with its
 * ErrorInfo reason, request ids, pages and limits; and its watches, with a small `--watch-buffer`,
 * so that a Python watcher that stops reading is ended WATCHER_LAGGED and resumes by itself.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { G, startBudget } from "./budget-e2e.js";
import { stopAll, type CommandResult } from "./harness.js";
import { generateStubs, runPython } from "./python-e2e.js";

describe("Python client (grpcio 1.51 + stubs from Debian's protoc)", () => {
  let stubs: string;
  let generated: CommandResult;

  beforeAll(async () => {
    ({ stubs, generated } = await generateStubs());
  }, 90_000);
  afterAll(stopAll);

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
