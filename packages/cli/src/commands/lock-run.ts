/**
 * The calls of `berth lock …` (its help and command line are in lock.ts), through
 * `@berth/client`'s locks client: only the lock service's generated code loads.
 */
import { spawn } from "node:child_process";
import * as path from "node:path";
import type { Duration, Timestamp } from "@bufbuild/protobuf/wkt";
import { msOfDuration, msOfTimestamp } from "@berth/client/wire-time";
import { Code } from "@connectrpc/connect";
import {
  GetLimitsResponseSchema,
  HolderKind,
  InspectResponseSchema,
  LockEventKind,
  LockEventSchema,
  type GetLimitsResponse,
  type Holder,
  type InspectResponse,
  type LockHeld,
} from "@berth/api/berth/locks/v1/lock_service_pb";
import { BerthClientError } from "@berth/client/errors";
import { LocksClient, type HeldLock } from "@berth/client/locks";
import { formatDuration } from "@berth/shared/units";
import { describeFailure, failureFields, reportFailure } from "../run/errors.js";
import { findCommand, reportCommandProblem, spawnProblem } from "../run/find-command.js";
import { jsonInteger, messageJson } from "../run/json.js";
import { progressFor, type Progress } from "../run/progress.js";
import { relaySignals, signalExit } from "../run/wrapped-command.js";
import { EXIT } from "../command.js";
import { styleFor } from "../terminal.js";
import type { LimitsInvocation, LockInvocation, WatchInvocation } from "./lock-invocation.js";

type Invocation = LockInvocation;

const iso = (ts: Timestamp | undefined) => (ts === undefined ? undefined : new Date(msOfTimestamp(ts)).toISOString());

function kindName(kind: HolderKind): string {
  switch (kind) {
    case HolderKind.LEASE:
      return "lease";
    case HolderKind.STREAM:
      return "hold";
    case HolderKind.SEED_LOCK_FILE:
      return "seed lock file";
    default:
      return "unknown";
  }
}

/** "alice (lease, fencing token 7) since 2026-… (12s ago)" */
function describeHolder(holder: {
  owner: string;
  kind: HolderKind;
  fencingToken: bigint;
  acquireTime?: Timestamp | undefined;
  pid?: number | undefined;
}): string {
  const who = holder.owner === "" ? "an unknown owner" : holder.owner;
  const facts = [kindName(holder.kind)];
  if (holder.fencingToken > 0n) facts.push(`fencing token ${holder.fencingToken}`);
  if (holder.kind === HolderKind.SEED_LOCK_FILE && holder.pid !== undefined) facts.push(`pid ${holder.pid}`);
  const since =
    holder.acquireTime === undefined
      ? ""
      : ` since ${iso(holder.acquireTime)} (${formatDuration(Math.max(0, Date.now() - msOfTimestamp(holder.acquireTime)))} ago)`;
  return `${who} (${facts.join(", ")})${since}`;
}

function holderJson(holder: Holder | LockHeld | undefined): Record<string, unknown> | undefined {
  if (holder === undefined) return undefined;
  return {
    owner: holder.owner,
    kind: kindName(holder.kind),
    fencing_token: jsonInteger(holder.fencingToken),
    since: iso(holder.acquireTime),
    ...(holder.pid === undefined ? {} : { pid: holder.pid }),
  };
}

/** Runs `berth lock hold`; resolves with the exit code. */
export async function hold(invocation: Invocation): Promise<number> {
  const { file, owner, maxWaitMs, command, endpoint } = invocation;
  const progress = progressFor("berth lock hold", invocation.json);
  const client = new LocksClient({ endpoint });
  const call = new AbortController();
  const relay = relaySignals(() => call.abort());
  const started = Date.now();

  try {
    // 1. Wait for the grant.
    let waited = false;
    let held: HeldLock;
    try {
      held = await client.lock(file, {
        owner,
        maxWaitMs,
        signal: call.signal,
        onWaiting({ position, holder }) {
          waited = true;
          progress.waiting("waiting", { file, position, holder: holderJson(holder) }, () => {
            const by = holder === undefined ? "" : `, held by ${describeHolderBriefly(holder)}`;
            return `waiting for ${shortPath(file)}${by}; #${position} in line, waited ${formatDuration(roundSeconds(Date.now() - started))}`;
          });
        },
      });
    } catch (error) {
      progress.done();
      return refused(error, invocation, progress, relay.interrupted);
    }
    const lease = held.lease;
    const waitedMs = Date.now() - started;
    progress.event(
      "acquired",
      { file: lease.file, fencing_token: jsonInteger(lease.fencingToken), owner: lease.owner, waited_ms: waitedMs },
      waited ? `acquired ${lease.file} after ${formatDuration(roundSeconds(waitedMs))} (fencing token ${lease.fencingToken})` : undefined,
    );
    progress.done();

    // 2. Run CMD, looked up again (the wait may have been long: what runs is what is there now).
    const { file: executable, problem } = findCommand(command[0]!);
    const code = problem === undefined ? await run(executable, held) : reportCommandProblem(progress, problem);

    // 3. Release before exiting, so the next holder never races this process's exit; ending the
    // stream (which the release does too) would free it a moment later.
    if (held.lost === undefined) {
      const released = await held.release();
      progress.event("released", { file: lease.file, fencing_token: jsonInteger(lease.fencingToken), by: released ? "release" : "stream end" });
    }
    return code;
  } finally {
    progress.done();
    relay.dispose();
    call.abort();
  }

  /** Runs CMD while `held`, hearing at once if the lock is lost meanwhile (CMD keeps running without it); resolves with the exit code. */
  async function run(executable: string, held: HeldLock): Promise<number> {
    const lease = held.lease;
    const spawned = spawn(executable, command.slice(1), {
      argv0: command[0],
      stdio: "inherit",
      env: { ...process.env, BERTH_FENCING_TOKEN: String(lease.fencingToken), BERTH_LOCK_FILE: lease.file },
    });
    relay.child = spawned;
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; error?: NodeJS.ErrnoException }>((resolve) => {
      spawned.once("error", (error: NodeJS.ErrnoException) => resolve({ code: null, signal: null, error }));
      spawned.once("exit", (code, signal) => resolve({ code, signal }));
    });
    // Once CMD has exited the hold is ours to end (our release ends the stream at once): not a loss.
    let commandDone = false;
    held.signal.addEventListener("abort", () => {
      const lost = held.lost;
      if (commandDone || lost === undefined) return;
      const message = `lost the lock on ${file} (${lost.rawMessage}); ${command[0]} keeps running without it`;
      progress.event("lost", { message }, message, "warn");
    });

    const outcome = await exited;
    commandDone = true;
    if (outcome.error !== undefined) return reportCommandProblem(progress, spawnProblem(command[0]!, outcome.error));
    progress.event("exited", { code: outcome.code, signal: outcome.signal });
    return outcome.code ?? signalExit(outcome.signal ?? "SIGKILL");
  }
}

/** "alice (lease, fencing token 7) for 12s": the live line's short form of {@link describeHolder}. */
function describeHolderBriefly(holder: Holder | LockHeld): string {
  const who = holder.owner === "" ? "an unknown owner" : holder.owner;
  const facts = [kindName(holder.kind)];
  if (holder.fencingToken > 0n) facts.push(`fencing token ${holder.fencingToken}`);
  const since = holder.acquireTime === undefined ? "" : ` for ${formatDuration(roundSeconds(Date.now() - msOfTimestamp(holder.acquireTime)))}`;
  return `${who} (${facts.join(", ")})${since}`;
}

/** FILE relative to the current directory when it is inside it (as the user typed it, most often). */
function shortPath(file: string): string {
  const relative = path.relative(process.cwd(), file);
  return relative !== "" && !relative.startsWith("..") && !path.isAbsolute(relative) ? relative : file;
}

/** Whole seconds above one second, so a live line does not flicker through milliseconds. */
function roundSeconds(ms: number): number {
  return ms < 1000 ? Math.max(0, Math.round(ms)) : Math.floor(ms / 1000) * 1000;
}

/** The exit code and message for a Hold that ended before the grant. */
function refused(error: unknown, invocation: Invocation, progress: Progress, interrupted: NodeJS.Signals | undefined): number {
  if (interrupted !== undefined) {
    progress.event(
      "interrupted",
      { signal: interrupted, exit: signalExit(interrupted) },
      `interrupted (${interrupted}) while waiting; the request was withdrawn`,
      "warn",
    );
    return signalExit(interrupted);
  }
  const e = BerthClientError.from(error);
  const reason = e.code === Code.ResourceExhausted ? e.reason : undefined;
  const held = reason === "WAIT_EXHAUSTED" ? e.lockHeld : undefined;
  if (held !== undefined) {
    const waitedMs = msOfDuration(held.waited) ?? 0;
    const waited = waitedMs === 0 ? "it was not free (--max-wait 0)" : `it stayed locked for ${formatDuration(waitedMs)}`;
    const holder = held.owner === "" && held.kind === HolderKind.UNSPECIFIED ? "others queued ahead" : describeHolder(held);
    progress.event(
      "timeout",
      { file: held.file, waited_ms: waitedMs, holder: holderJson(held), exit: EXIT.timedOut, message: e.rawMessage },
      `timed out: ${held.file} is held by ${holder}; ${waited}`,
      "error",
    );
    return EXIT.timedOut;
  }
  if (reason === "TOO_MANY_WAITERS") {
    progress.event("timeout", { file: invocation.file, waited_ms: 0, exit: EXIT.timedOut, message: e.rawMessage }, `too many wait: ${e.rawMessage}`, "error");
    return EXIT.timedOut;
  }
  const failure = describeFailure(e, "sessions", invocation.endpoint.url);
  progress.event("error", failureFields(failure), failure.message, "error");
  return failure.exit;
}

/** Runs `berth lock inspect`; resolves with the exit code. */
export async function inspect(invocation: Invocation): Promise<number> {
  const client = new LocksClient({ endpoint: invocation.endpoint });
  let response: InspectResponse;
  try {
    response = await client.inspect(invocation.file, { timeoutMs: 10_000 });
  } catch (error) {
    return reportFailure("berth lock inspect", describeFailure(error, "sessions", invocation.endpoint.url), invocation.json);
  }
  if (invocation.json) {
    process.stdout.write(`${JSON.stringify(messageJson(InspectResponseSchema, response, { alwaysEmitImplicit: true }))}\n`);
    return EXIT.ok;
  }
  const out = styleFor(process.stdout);
  const lines = [out.bold(response.file)];
  const holder = response.holder;
  if (holder === undefined) lines.push(`  ${out.green("free")}`);
  else {
    const expiry = holder.expireTime === undefined ? "" : `; expires ${iso(holder.expireTime)} unless renewed`;
    lines.push(`  ${out.yellow("held")} by ${describeHolder(holder)}${expiry}`);
  }
  if (response.waiters.length > 0) {
    lines.push(`  ${response.waiters.length} waiting:`);
    response.waiters.forEach((w, i) => {
      lines.push(`    ${i + 1}. ${w.owner} (${kindName(w.kind)}) since ${iso(w.waitStartTime)}, gives up at ${iso(w.waitExpireTime)}`);
    });
  }
  lines.push(`  last fencing token: ${response.lastFencingToken === 0n ? "none granted by this service run" : String(response.lastFencingToken)}`);
  if (response.lockPath !== "") lines.push(`  lock file: ${out.dim(response.lockPath)}`);
  process.stdout.write(`${lines.join("\n")}\n`);
  return EXIT.ok;
}

/** Runs `berth lock watch` until Ctrl-C or SIGTERM (exit 0); a watcher that fell behind resumes where the service says. */
export async function watch(invocation: WatchInvocation): Promise<number> {
  const client = new LocksClient({ endpoint: invocation.endpoint });
  const err = styleFor(process.stderr);
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  const line = (value: unknown) => process.stdout.write(`${JSON.stringify(value)}\n`);
  try {
    const options = {
      includeCurrent: invocation.includeCurrent,
      startRevision: invocation.startRevision,
      progressIntervalMs: invocation.progressIntervalMs,
      signal: stop.signal,
    };
    for await (const item of client.watch(invocation.file, options)) {
      if (item.kind === "event") {
        const e = item.event;
        if (invocation.json) line({ event: messageJson(LockEventSchema, e, { alwaysEmitImplicit: true }) });
        else {
          const kind = LockEventKind[e.kind].toLowerCase();
          const token = e.fencingToken === 0n ? "" : ` token ${e.fencingToken}`;
          const place = e.position === 0 ? "" : ` position ${e.position}`;
          process.stdout.write(`${e.revision} ${kind} ${e.file} ${e.owner}${token}${place}\n`);
        }
      } else if (item.kind === "caughtUp") {
        if (invocation.json) line({ caughtUp: { revision: jsonInteger(item.revision), reset: item.reset } });
        else
          process.stderr.write(
            `${err.dim(`-- caught up at revision ${item.revision}${item.reset ? " (reset: the current state above replaces what you had)" : ""}; following (Ctrl-C to stop)`)}\n`,
          );
      } else if (item.kind === "progress") {
        if (invocation.json) line({ progress: { revision: jsonInteger(item.revision) } });
        else process.stderr.write(`${err.dim(`-- still following at revision ${item.revision}`)}\n`);
      } else {
        process.stderr.write(`${err.yellow(`-- fell behind the service; resuming after revision ${item.revision}`)}\n`);
      }
    }
    return EXIT.ok;
  } catch (error) {
    if (stop.signal.aborted) return EXIT.ok;
    return reportFailure("berth lock watch", describeFailure(error, "sessions", invocation.endpoint.url), invocation.json);
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
  }
}

/** Runs `berth lock limits [flags]`; resolves with the exit code. */
export async function limits({ endpoint, json }: LimitsInvocation): Promise<number> {
  const client = new LocksClient({ endpoint });
  let response: GetLimitsResponse;
  try {
    response = await client.limits({ timeoutMs: 10_000 });
  } catch (error) {
    return reportFailure("berth lock limits", describeFailure(error, "sessions", endpoint.url), json);
  }
  if (json) {
    process.stdout.write(`${JSON.stringify(messageJson(GetLimitsResponseSchema, response, { alwaysEmitImplicit: true }))}\n`);
    return EXIT.ok;
  }
  const take = (d: Duration | undefined) => formatDuration(msOfDuration(d) ?? 0);
  const rows: Array<[string, string]> = [
    ["lease ttl", `${take(response.defaultTtl)} unless Acquire asks another, at most ${take(response.maxTtl)}`],
    ["longest wait", `${take(response.maxWait)} (an unset --max-wait; longer ones are capped to it)`],
    ["hold heartbeat", `every ${take(response.heartbeatInterval)}`],
    ["waiters per file", String(response.maxWaitersPerFile)],
    ["owner", `at most ${response.maxOwnerLength} characters`],
    ["request ids", `remembered ${take(response.idempotencyWindow)} after what their call made ended`],
  ];
  const width = Math.max(...rows.map(([name]) => name.length));
  process.stdout.write(rows.map(([name, value]) => `${name.padEnd(width)}  ${value}\n`).join(""));
  return EXIT.ok;
}

/** `berth lock …`. */
