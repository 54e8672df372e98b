/**
 * The admission of `berth admit` (its help and command line are in admit.ts), through
 * `@berth/client`'s budget client: only the budget service's generated code loads.
 */
import { spawn } from "node:child_process";
import * as path from "node:path";
import { msOfDuration, msOfTimestamp } from "@berth/client/wire-time";
import { RefusalKind, type RunningEntry } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetClient, type Admission } from "@berth/client/budget";
import { BerthClientError } from "@berth/client/errors";
import { EXIT } from "../command.js";
import { formatQueued, gateName, roughly } from "../run/budget-format.js";
import { describeFailure, failureFields } from "../run/errors.js";
import { findCommand, reportCommandProblem, spawnProblem } from "../run/find-command.js";
import { needItems } from "../run/need-items.js";
import { progressFor } from "../run/progress.js";
import { relaySignals, signalExit } from "../run/wrapped-command.js";
import type { AdmitInvocation } from "./admit-invocation.js";

/** The exit code for a refused admission, and the facts to report. */
function refusal(error: BerthClientError) {
  const detail = error.refusal;
  if (detail === undefined) return undefined;
  const exit = detail.kind === RefusalKind.IMPOSSIBLE ? EXIT.impossible : detail.kind === RefusalKind.QUEUE_FULL ? EXIT.queueFull : EXIT.timedOut;
  const kind = detail.kind === RefusalKind.IMPOSSIBLE ? "impossible" : detail.kind === RefusalKind.QUEUE_FULL ? "queue_full" : "wait_exhausted";
  const retryAfterMs = msOfDuration(detail.retryAfter);
  return {
    exit,
    kind,
    message: detail.message || error.rawMessage,
    retryAfterMs,
    settings: detail.settings,
    waitedMs: msOfDuration(detail.waited) ?? 0,
  };
}

/** How CMD ended. */
interface Outcome {
  readonly code: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly error?: NodeJS.ErrnoException;
}

/** Runs the admission; resolves with the exit code. */
export async function admit({ values, command, need, maxWaitMs, endpoint }: AdmitInvocation): Promise<number> {
  // The service refuses control characters in owners and names: a command line may hold newlines.
  const printable = (text: string) =>
    text
      .replace(/[\u0000-\u001f\u007f\s]+/g, " ")
      .trim()
      .slice(0, 256);
  const name = typeof values["name"] === "string" ? values["name"] : printable(path.basename(command[0]!)) || "command";
  const given = values["owner"] ?? values["label"];
  const owner = typeof given === "string" ? given : printable(command.join(" ")) || name;
  const progress = progressFor("berth admit", values["json"] === true);
  const client = new BudgetClient({ endpoint });
  const call = new AbortController();
  const relay = relaySignals(() => call.abort());
  const started = Date.now();
  let held: Admission | undefined;

  try {
    return await client.admit(needItems(need, name.slice(0, 256)), (admission) => run(admission), {
      owner,
      maxWaitMs,
      skipLoadGate: values["skip-load-gate"] === true,
      signal: call.signal,
      onQueued(queued) {
        const at = Date.now();
        progress.waiting(
          "queued",
          {
            position: queued.position,
            eta_ms: msOfDuration(queued.eta),
            eta_basis: queued.etaBasis,
            waited_ms: at - started,
            wait_for: queued.waitForText,
            gates: queued.waitFor.map((r) => gateName(r.gate)),
            ahead: queued.ahead.map((a) => ({ owner: a.owner, position: a.position })),
            wait_expire_time: queued.waitExpireTime === undefined ? undefined : new Date(msOfTimestamp(queued.waitExpireTime)).toISOString(),
          },
          // Rendered again every second: the wait counts up, the service's ETA counts down until its next update.
          () => formatQueued(queued, Date.now() - started, Date.now() - at),
        );
      },
    });
  } catch (error) {
    // Only the wait throws: what happens once admitted is reported by `run`.
    progress.done();
    if (relay.interrupted !== undefined) {
      const exit = signalExit(relay.interrupted);
      progress.event("interrupted", { signal: relay.interrupted, exit }, `interrupted (${relay.interrupted}) while waiting; the request was withdrawn`, "warn");
      return exit;
    }
    const e = BerthClientError.from(error);
    const refused = refusal(e);
    if (refused !== undefined) {
      progress.event(
        "refused",
        {
          kind: refused.kind,
          exit: refused.exit,
          message: refused.message,
          retry_after_ms: refused.retryAfterMs,
          settings: refused.settings,
          waited_ms: refused.waitedMs,
        },
        `${refused.kind === "wait_exhausted" ? "timed out" : "refused"}: ${refused.message}${refused.retryAfterMs === undefined ? "" : ` (retry in ~${roughly(refused.retryAfterMs)})`}`,
        "error",
      );
      return refused.exit;
    }
    const failure = describeFailure(e, "budget", endpoint.url);
    progress.event("error", failureFields(failure), failure.message, "error");
    return failure.exit;
  } finally {
    if (held !== undefined && held.lost === undefined && held.releasedId !== undefined) progress.event("released", { reservation_id: held.releasedId });
    relay.dispose();
    progress.done();
    call.abort();
  }

  /** Once admitted: runs CMD, reports it started, and resolves with its exit code (the client releases after). */
  async function run(admission: Admission): Promise<number> {
    held = admission;
    const reservation = admission.reservation;
    const waitedMs = admission.waitedMs;
    progress.event("admitted", { reservation_id: reservation.id, waited_ms: waitedMs }, waitedMs > 0 ? `admitted after ${roughly(waitedMs)}` : undefined);

    // Looked up again: the wait may have been long, and what runs is what is there now.
    const { file, problem } = findCommand(command[0]!);
    if (problem !== undefined) return reportCommandProblem(progress, problem);
    const spawned = spawn(file, command.slice(1), { argv0: command[0], stdio: "inherit", env: { ...process.env, BERTH_RESERVATION_ID: reservation.id } });
    relay.child = spawned;
    const exited = new Promise<Outcome>((resolve) => {
      spawned.once("error", (error: NodeJS.ErrnoException) => resolve({ code: null, signal: null, error }));
      spawned.once("exit", (code, signal) => resolve({ code, signal }));
    });
    await new Promise<void>((resolve) => {
      spawned.once("spawn", resolve);
      spawned.once("error", () => resolve());
    });
    const lost = new Promise<string>((resolve) =>
      admission.signal.addEventListener("abort", () => {
        if (admission.lost !== undefined) resolve(admission.lost.rawMessage);
      }),
    );

    let running: RunningEntry | undefined;
    if (spawned.pid !== undefined) {
      const answer = admission.started(name.slice(0, 256), { spec: need.run, pid: spawned.pid }).then(
        (updated) => updated.running,
        () => undefined,
      );
      // `started` once the service counts CMD (or cannot: the stream is gone). CMD may exit first:
      // the answer is still awaited (a little), and `exited` comes after it whatever the timing.
      running = await Promise.race([answer, exited.then(() => Promise.race([answer, delay(STARTED_ANSWER_MS)]))]);
      progress.event("started", { pid: spawned.pid, running_id: running?.id });
    }

    // Wait for CMD; say so at once if the service goes away meanwhile (CMD keeps running).
    const first = await Promise.race([exited.then((outcome) => ({ outcome })), lost.then((message) => ({ message }))]);
    if ("message" in first) {
      const message = `lost the budget service (${first.message}); ${name} keeps running`;
      progress.event("lost", { message }, message, "warn");
    }
    const outcome = "outcome" in first ? first.outcome : await exited;
    let code: number;
    if (outcome.error !== undefined) {
      code = reportCommandProblem(progress, spawnProblem(command[0]!, outcome.error));
    } else {
      code = outcome.code ?? signalExit(outcome.signal ?? "SIGKILL");
      progress.event("exited", { code: outcome.code, signal: outcome.signal });
    }
    // The running entry first (CMD is gone); the client then releases the reservation. The tally
    // would drop the entry at its next sample anyway (the pid is gone); this makes it immediate.
    if (admission.lost === undefined && running !== undefined) {
      await Promise.race([client.stopRunning(running.id, { signal: admission.signal }).catch(() => undefined), delay(2000)]);
    }
    return code;
  }
}

/** How long, once CMD has exited, the service's answer to `started` is still awaited. */
const STARTED_ANSWER_MS = 2000;

/** Resolves with undefined after `ms` (without keeping the process alive). */
function delay(ms: number): Promise<undefined> {
  return new Promise((resolve) => setTimeout(() => resolve(undefined), ms).unref());
}
