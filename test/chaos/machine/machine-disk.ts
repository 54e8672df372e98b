/**
 * A full disk and a read-only one, for real: both services keep their state on a small tmpfs the
 * suite mounts (and unmounts) itself and fills with a file until writes fail with ENOSPC; then on a
 * small ext4 image (a loop device) mounted `errors=remount-ro`, which the suite makes report an
 * error (`/sys/fs/ext4/<dev>/trigger_fs_error`), so that the kernel remounts it read-only under
 * the running services, as it does when a disk fails (a plain `mount -o remount,ro` is refused
 * while files are open for writing).
 *
 * While it is full: appends from four writers (single events and batches, each attempt with an
 * idempotency key of its own, never retried) are refused with RESOURCE_EXHAUSTED DISK_FULL naming
 * the state directory and what to do, never anything else; reads, watchers and locks (and the
 * lock service's token file, through a restart of the service on the full disk) keep serving; the
 * budget admits, and refuses RegisterRunning (its running tally) with DISK_FULL. Once the file is
 * removed, appends and registrations succeed again, without a restart. Read-only: appends and
 * registrations are UNAVAILABLE STATE_READ_ONLY, reads go on, the services never crash, and stop
 * cleanly when asked. Then the image is checked (e2fsck) and mounted read-write again, as after a
 * reboot, and the sessions service started on it anew.
 *
 * Afterwards: every acknowledged append is in the journal exactly once, at the seqs it was given,
 * and nothing of a refused one; every journal line parses (no torn line; a refused batch left
 * nothing, so no half batch); every snapshot file parses; the services never exited on their own.
 * Two exceptions, both of the write the disk failed under. While the disk is read-only, it may have
 * left part of its line at the journal's end, which berth cannot cut back then (its caller was told
 * the outcome is unknown, and reads skip those bytes); once the disk is writable, berth's next open
 * cuts it back. And an append acknowledged as the disk failed may be gone after the remount, where
 * ext4 reported its sync a success (see onFailingFs); every one acknowledged before must be there.
 */
import { execFileSync } from "node:child_process";
import { closeSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync, writeSync } from "node:fs";
import * as path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { makeTempDir, startService, type ServiceProcess } from "../../harness.js";
import { budgetClient, type Findings, ms, sessionsClient, show, sleep, until, within, type SessionsClient } from "./machine-world.js";

/** A small file system of the suite's own. */
export interface SmallFs {
  readonly dir: string;
  /** Writes a file until the file system is full (ENOSPC). */
  fill(): void;
  /** Removes that file. */
  free(): void;
  unmount(): void;
}

/** A small ext4 image on a loop device, which the suite can have the kernel remount read-only. */
export interface FailingFs {
  readonly dir: string;
  /** Reports an error to ext4: mounted `errors=remount-ro`, it goes read-only at once. */
  failReadOnly(): void;
  /**
   * Unmounts it, has e2fsck replay its journal and repair it, and mounts it read-write again, as a
   * reboot that checks the failed disk does: what was not synced before the error is gone.
   */
  remountWritable(): void;
  unmount(): void;
}

/** Mounts a 16 MiB ext4 image through a loop device; throws (with the tools' words) where that is not possible. */
export function mountFailingFs(): FailingFs {
  const dir = makeTempDir("berth-machine-ext4-");
  const image = path.join(makeTempDir("berth-machine-image-"), "state.img");
  execFileSync("truncate", ["-s", "16M", image]);
  execFileSync("mkfs.ext4", ["-q", "-F", image], { stdio: ["ignore", "ignore", "pipe"] });
  const device = execFileSync("losetup", ["-f", "--show", image], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] }).trim();
  try {
    // A loop device keeps the read-only flag of an earlier use.
    execFileSync("blockdev", ["--setrw", device]);
    mount(["-o", "errors=remount-ro", device, dir]);
  } catch (error) {
    execFileSync("losetup", ["-d", device], { stdio: "ignore" });
    throw error;
  }
  return {
    dir,
    failReadOnly() {
      writeFileSync(`/sys/fs/ext4/${path.basename(device)}/trigger_fs_error`, "berth machine suite: a read-only remount\n");
    },
    remountWritable() {
      execFileSync("umount", [dir], { stdio: ["ignore", "ignore", "pipe"] });
      try {
        execFileSync("e2fsck", ["-f", "-y", device], { stdio: ["ignore", "ignore", "pipe"] });
      } catch (error) {
        // Exit status 1: errors were found and corrected, as they are after the error the suite reported.
        if ((error as { status?: number }).status !== 1) throw error;
      }
      mount(["-o", "errors=remount-ro", device, dir]);
    },
    unmount() {
      execFileSync("umount", ["-l", dir], { stdio: "ignore" });
      execFileSync("losetup", ["-d", device], { stdio: "ignore" });
    },
  };
}

function mount(args: readonly string[]): void {
  execFileSync("mount", args, { stdio: ["ignore", "ignore", "pipe"] });
}

/** Mounts a tmpfs of `sizeBytes`; throws (with mount's words) where mounting is not allowed. */
export function mountSmallFs(sizeBytes: number): SmallFs {
  const dir = makeTempDir("berth-machine-fs-");
  mount(["-t", "tmpfs", "-o", `size=${sizeBytes},mode=0700`, "berth-machine", dir]);
  const filler = path.join(dir, "filler");
  return {
    dir,
    fill() {
      const fd = openSync(filler, "a");
      const chunk = Buffer.alloc(64 * 1024, 0x61);
      try {
        for (;;) writeSync(fd, chunk);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOSPC") throw error;
      } finally {
        closeSync(fd);
      }
      // The last pages: a smaller chunk may still fit where a 64 KiB one did not.
      const small = openSync(filler, "a");
      try {
        for (;;) writeSync(small, Buffer.alloc(512, 0x61));
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "ENOSPC") throw error;
      } finally {
        closeSync(small);
      }
    },
    free() {
      rmSync(filler, { force: true });
    },
    unmount() {
      // Lazy: a descriptor some process still holds does not keep the suite from going on.
      execFileSync("umount", ["-l", dir], { stdio: "ignore" });
    },
  };
}

/** Why `attempt` (a mount and its unmount) is impossible here, or undefined when it works. */
export function whyNot(attempt: () => void): string | undefined {
  try {
    attempt();
    return undefined;
  } catch (error) {
    return String((error as { stderr?: Buffer }).stderr ?? "").trim() || (error as Error).message;
  }
}

/** The code and ErrorInfo reason of a refusal. */
function refusalOf(error: unknown): { code: Code; reason: string | undefined; message: string } {
  const connect = ConnectError.from(error);
  return { code: connect.code, reason: connect.findDetails(ErrorInfoSchema)[0]?.reason, message: connect.rawMessage };
}

/** The fencing tokens one write of the token file reserves (fencing-file.ts). */
const FENCING_BLOCK = 1000;

const checkpoint = (reason: string) => ({ kind: { case: "checkpoint" as const, value: { reason } } });

/** An append attempt and what became of it. */
interface Attempt {
  readonly session: string;
  readonly key: string;
  readonly events: number;
  outcome?: { firstSeq: number; lastSeq: number } | { refused: ReturnType<typeof refusalOf> };
  /** When the outcome came (performance.now()). */
  answeredAt?: number;
}

/** Four writers appending until stopped: single events and batches, each attempt with a key of its own. */
function writers(client: SessionsClient, attempts: Attempt[]) {
  let stopped = false;
  let serial = 0;
  const loops = Array.from({ length: 4 }, async (_, w) => {
    while (!stopped) {
      const session = `disk-${w % 3}`;
      const events = 1 + (serial % 4);
      // Keys are unique across every writers() of a scenario (they share `attempts`): a key used
      // again after a refusal would be written anew, and read back as the refused attempt's.
      const attempt: Attempt = { session, key: `w${w}-${attempts.length}`, events };
      serial++;
      attempts.push(attempt);
      // Payloads of 1-3 KiB: the journals grow quickly, and a batch spans pages.
      const pad = "x".repeat(1024 * (1 + (serial % 3)));
      try {
        const answer = await client.sessions.appendEvents({
          sessionId: session,
          idempotencyKey: attempt.key,
          events: Array.from({ length: events }, (_, i) => checkpoint(`${attempt.key}/${i} ${pad}`)),
        });
        attempt.outcome = { firstSeq: Number(answer.firstSeq), lastSeq: Number(answer.lastSeq) };
        attempt.answeredAt = performance.now();
      } catch (error) {
        attempt.outcome = { refused: refusalOf(error) };
        attempt.answeredAt = performance.now();
        await sleep(20);
      }
    }
  });
  return {
    async stop() {
      stopped = true;
      await within(Promise.all(loops), 30_000);
    },
  };
}

/** The refusals among `attempts` since index `from` that are not `code`/`reason` naming `dir`. */
function unexpectedRefusals(attempts: readonly Attempt[], from: number, code: Code, reason: string, dir: string): string[] {
  const wrong: string[] = [];
  for (const attempt of attempts.slice(from)) {
    const outcome = attempt.outcome;
    if (outcome === undefined || !("refused" in outcome)) continue;
    const r = outcome.refused;
    if (r.code !== code || r.reason !== reason || !r.message.includes(dir)) wrong.push(`${attempt.key}: ${Code[r.code]} ${r.reason}: ${r.message}`);
  }
  return wrong;
}

/** Attempts since `from` that were refused / acknowledged. */
function tally(attempts: readonly Attempt[], from: number) {
  const since = attempts.slice(from).filter((a) => a.outcome !== undefined);
  return { refused: since.filter((a) => "refused" in a.outcome!).length, acknowledged: since.filter((a) => "lastSeq" in a.outcome!).length };
}

function memoryNeed(megabytes: number) {
  return {
    items: [{ kind: NeedItemKind.START, name: "work", costSource: { case: "cost" as const, value: { memoryBytes: BigInt(megabytes * 1024 * 1024), cpu: 0 } } }],
  };
}

/** Both services on a full, then freed, small file system; see the module comment. */
export async function fullDisk(findings: Findings): Promise<void> {
  const fs = mountSmallFs(8 * 1024 * 1024);
  try {
    await onSmallFs(findings, "full disk", fs);
  } finally {
    fs.unmount();
  }
}

async function onSmallFs(findings: Findings, scenario: string, fs: SmallFs): Promise<void> {
  const stateDir = path.join(fs.dir, "state");
  const sessionsDir = path.join(stateDir, "sessions");
  const sessions: ServiceProcess = await startService("sessions", { stateDir });
  const budget = await startService("budget", { stateDir, args: ["--memory", "100M", "--reserve", "0"] });
  const gone = (service: ServiceProcess) => service.exitStatus() !== undefined;
  const client = sessionsClient(sessions.url("sessions"));
  const budgets = budgetClient(budget.url("budget")).budget;
  const lockDir = makeTempDir("berth-machine-disk-locks-");
  const lockFile = (name: string) => `${lockDir}/${name}`;

  // Before: journals, snapshot files, a lock held, a watcher, a running entry.
  const attempts: Attempt[] = [];
  for (let i = 0; i < 3; i++) await client.sessions.appendEvent({ sessionId: `disk-${i}`, event: checkpoint("before") });
  for (let i = 0; i < 3; i++) await client.sessions.flushSnapshot({ sessionId: `disk-${i}` });
  const held = (await client.locks.acquire({ file: lockFile("held"), owner: "holder", ttl: ms(600_000) })).lease!;
  const cycled = (await client.locks.acquire({ file: lockFile("cycled"), owner: "cycler" })).lease!;
  await client.locks.release({ leaseToken: cycled.leaseToken });
  const watched: number[] = [];
  const watchController = new AbortController();
  const watching = (async () => {
    try {
      for await (const message of client.sessions.watchSession({ sessionId: "disk-0" }, { signal: watchController.signal })) {
        if (message.kind.case === "entries") for (const item of message.kind.value.entries) watched.push(Number(item.entry!.seq));
      }
      return "ended";
    } catch (error) {
      return watchController.signal.aborted ? "stopped" : `failed: ${refusalOf(error).message}`;
    }
  })();
  await budgets.registerRunning({ name: "before", costSource: { case: "cost", value: { memoryBytes: 1n, cpu: 0 } } });

  const writing = writers(client, attempts);
  await until(() => tally(attempts, 0).acknowledged >= 20, 20_000);

  // Full.
  fs.fill();
  const fullFrom = attempts.length;
  const sawFull = await until(() => tally(attempts, fullFrom).refused >= 20, 30_000);
  findings.check(sawFull, scenario, `appends on the full disk were not refused: ${show(tally(attempts, fullFrom))}`);
  for (const wrong of unexpectedRefusals(attempts, fullFrom, Code.ResourceExhausted, "DISK_FULL", sessionsDir))
    findings.violation(scenario, `a refused append was not DISK_FULL naming ${sessionsDir}: ${wrong}`);
  const fullRefusals = tally(attempts, fullFrom).refused;
  // Reads, watchers, locks and the budget serve on.
  const snapshot = await within(client.sessions.getSnapshot({ sessionId: "disk-1" }), 10_000);
  findings.check("value" in snapshot, scenario, `GetSnapshot failed on the full disk: ${show(snapshot)}`);
  const listed = await within(client.sessions.listSessions({}), 10_000);
  findings.check("value" in listed && listed.value.sessions.length === 3, scenario, `ListSessions on the full disk: ${show(listed)}`);
  // Enough grants to use up a block of fencing tokens: the token file's ceiling is written again, on the full disk.
  let grants = 0;
  let lastToken = held.fencingToken;
  for (; grants < FENCING_BLOCK + 50; grants++) {
    const lease = await within(client.locks.acquire({ file: lockFile("cycled"), owner: `full-${grants}` }), 10_000);
    if (!("value" in lease)) {
      findings.violation(scenario, `grant ${grants} on the full disk: ${show(lease)}`);
      break;
    }
    findings.check(lease.value.lease!.fencingToken > lastToken, scenario, `fencing token ${lease.value.lease!.fencingToken} after ${lastToken}`);
    lastToken = lease.value.lease!.fencingToken;
    await client.locks.release({ leaseToken: lease.value.lease!.leaseToken });
  }
  findings.figures.diskFullGrants = grants;
  const reserved = await within(budgets.reserve({ need: memoryNeed(10), owner: "on a full disk", skipLoadGate: true }), 10_000);
  findings.check("value" in reserved, scenario, `Reserve on the full disk: ${show(reserved)}`);
  if ("value" in reserved) await budgets.release({ reservationId: reserved.value.reservation!.id });
  const register = await within(budgets.registerRunning({ name: "on a full disk", costSource: { case: "cost", value: { memoryBytes: 1n, cpu: 0 } } }), 10_000);
  const registerRefusal = "error" in register ? refusalOf(register.error) : undefined;
  findings.check(
    registerRefusal?.code === Code.ResourceExhausted && registerRefusal.reason === "DISK_FULL" && registerRefusal.message.includes(stateDir),
    scenario,
    `RegisterRunning on the full disk: ${show(register)}`,
  );
  const running = (await budgets.getState({})).running.map((r) => r.name);
  findings.check(JSON.stringify(running) === JSON.stringify(["before"]), scenario, `a refused RegisterRunning was counted: ${show(running)}`);
  await writing.stop();
  watchController.abort();
  const watchEnd = await within(watching, 10_000);
  findings.check("value" in watchEnd && watchEnd.value === "stopped", scenario, `the watcher ended on the full disk: ${show(watchEnd)}`);
  findings.check(watched.length >= 1 && watched.every((seq, i) => seq === i + 1), scenario, `the watcher saw ${show(watched)}`);

  // Freed: appends succeed again, without a restart of the budget either.
  fs.free();
  const freedFrom = attempts.length;
  const writingAgain = writers(client, attempts);
  const recovered = await until(() => tally(attempts, freedFrom).acknowledged >= 20, 30_000);
  findings.check(recovered, scenario, `appends did not succeed again once space was freed: ${show(tally(attempts, freedFrom))}`);
  await writingAgain.stop();
  const registered = await within(budgets.registerRunning({ name: "after", costSource: { case: "cost", value: { memoryBytes: 1n, cpu: 0 } } }), 10_000);
  findings.check("value" in registered, scenario, `RegisterRunning once space was freed: ${show(registered)}`);

  findings.check(!gone(sessions) && !gone(budget), scenario, "a service exited");

  const { acknowledged } = await checkJournals(findings, scenario, client, sessionsDir, attempts);
  findings.figures.diskFullRefusals = fullRefusals;
  findings.figures.diskAppendsAcknowledged = acknowledged;
  findings.operations += attempts.length;
  findings.rounds++;
  await sessions.stop();
  await budget.stop();
}

/** True when the append was told it may have been written (the disk went read-only under its write, and its bytes could not be cut back). */
function toldUnknown(attempt: Attempt): boolean {
  const outcome = attempt.outcome;
  return outcome !== undefined && "refused" in outcome && outcome.refused.message.includes("may have been written");
}

/** What {@link checkJournals} allows of a disk that failed. */
interface FailedDisk {
  /**
   * The disk is still read-only: a journal with an append told its outcome is unknown may end in
   * that append's torn bytes, which berth cannot cut back then (reads skip them).
   */
  readonly tornTailsMayStay?: boolean;
  /**
   * When the disk failed (performance.now()): an append acknowledged after that may be gone once
   * the disk is mounted again (see onFailingFs). One acknowledged before must be there.
   */
  readonly failedAt?: number;
}

/**
 * The journals against the attempts: every acknowledged append once, at its seqs; nothing of a
 * refused one; every line whole; every snapshot file whole. Returns how many were acknowledged,
 * and how many of them a failed disk lost as `failed` allows.
 */
async function checkJournals(
  findings: Findings,
  scenario: string,
  client: SessionsClient,
  sessionsDir: string,
  attempts: readonly Attempt[],
  failed: FailedDisk = {},
): Promise<{ acknowledged: number; lostAtTheFailure: number }> {
  const byKey = new Map<string, number[]>();
  for (const id of ["disk-0", "disk-1", "disk-2"]) {
    for await (const message of client.sessions.readJournal({ sessionId: id })) {
      for (const entry of message.entries) {
        if (!entry.idempotencyKey) continue;
        byKey.set(`${id}/${entry.idempotencyKey}`, [...(byKey.get(`${id}/${entry.idempotencyKey}`) ?? []), Number(entry.seq)]);
      }
    }
  }
  let acknowledged = 0;
  let lostAtTheFailure = 0;
  for (const attempt of attempts) {
    const found = byKey.get(`${attempt.session}/${attempt.key}`);
    const outcome = attempt.outcome;
    if (outcome !== undefined && "lastSeq" in outcome) {
      acknowledged++;
      if (found === undefined && failed.failedAt !== undefined && attempt.answeredAt! > failed.failedAt) {
        lostAtTheFailure++;
        continue;
      }
      const expected = Array.from({ length: attempt.events }, (_, i) => outcome.firstSeq + i);
      if (show(found) !== show(expected))
        findings.violation(scenario, `acknowledged ${attempt.key} is at ${show(found)} in the journal, not ${show(expected)}`);
    } else if (found !== undefined) {
      // Only an append told its outcome is unknown (the disk went read-only under its write) may
      // have stayed, and then whole.
      const unknown = toldUnknown(attempt);
      const whole = found.length === attempt.events && found.every((seq, i) => seq === found[0]! + i);
      if (!unknown) findings.violation(scenario, `refused (or unanswered) ${attempt.key} is in the journal at ${show(found)}; it was told ${show(outcome)}`);
      else if (!whole) findings.violation(scenario, `${attempt.key}, of ${attempt.events} events, is in the journal in part: ${show(found)}`);
    }
  }
  const withUnknownAppend = new Set(attempts.filter(toldUnknown).map((attempt) => `${attempt.session}.jsonl`));
  for (const name of readdirSync(sessionsDir)) {
    const text = readFileSync(path.join(sessionsDir, name), "utf8");
    if (name.endsWith(".jsonl")) {
      const lines = text.split("\n");
      const tail = lines.length - 1;
      const tornTailMayStay = failed.tornTailsMayStay === true && withUnknownAppend.has(name);
      findings.check(lines[tail] === "" || tornTailMayStay, scenario, `${name} does not end with a whole line`);
      lines.forEach((line, i) => {
        if (line.trim() === "" || (tornTailMayStay && i === tail)) return;
        try {
          JSON.parse(line);
        } catch {
          findings.violation(scenario, `${name} line ${i + 1} is torn: ${line.slice(0, 80)}`);
        }
      });
    } else if (name.endsWith(".json")) {
      try {
        JSON.parse(text);
      } catch {
        findings.violation(scenario, `${name} is not whole`);
      }
    }
  }
  return { acknowledged, lostAtTheFailure };
}

/** Both services on a file system the kernel remounts read-only under them; see the module comment. */
export async function readOnlyDisk(findings: Findings): Promise<void> {
  const fs = mountFailingFs();
  try {
    await onFailingFs(findings, "read-only disk", fs);
  } finally {
    fs.unmount();
  }
}

async function onFailingFs(findings: Findings, scenario: string, fs: FailingFs): Promise<void> {
  const stateDir = path.join(fs.dir, "state");
  const sessionsDir = path.join(stateDir, "sessions");
  const sessions = await startService("sessions", { stateDir });
  const budget = await startService("budget", { stateDir, args: ["--memory", "100M", "--reserve", "0"] });
  const client = sessionsClient(sessions.url("sessions"));
  const budgets = budgetClient(budget.url("budget")).budget;
  const lockDir = makeTempDir("berth-machine-ro-locks-");
  const attempts: Attempt[] = [];
  for (let i = 0; i < 3; i++) await client.sessions.appendEvent({ sessionId: `disk-${i}`, event: checkpoint("before") });
  await client.sessions.flushSnapshot({ sessionId: "disk-0" });
  const held = (await client.locks.acquire({ file: `${lockDir}/held`, owner: "holder", ttl: ms(600_000) })).lease!;
  const writing = writers(client, attempts);
  await until(() => tally(attempts, 0).acknowledged >= 20, 20_000);

  const failedAt = performance.now();
  fs.failReadOnly();
  const from = attempts.length;
  const sawRefusals = await until(() => tally(attempts, from).refused >= 20, 30_000);
  await writing.stop();
  findings.check(sawRefusals, scenario, `appends on the read-only disk were not refused: ${show(tally(attempts, from))}`);
  // The append in flight when the disk went read-only may fail otherwise (its sync met the error); every later one is STATE_READ_ONLY.
  const later = attempts.slice(from).findIndex((a) => a.outcome !== undefined && "refused" in a.outcome && a.outcome.refused.reason === "STATE_READ_ONLY");
  for (const wrong of unexpectedRefusals(attempts, from + Math.max(0, later), Code.Unavailable, "STATE_READ_ONLY", sessionsDir))
    findings.violation(scenario, `a refused append was not STATE_READ_ONLY naming ${sessionsDir}: ${wrong}`);
  findings.check(tally(attempts, from + Math.max(0, later)).acknowledged === 0, scenario, "an append was acknowledged on the read-only disk");
  const read = await within(client.sessions.getSnapshot({ sessionId: "disk-1" }), 10_000);
  findings.check("value" in read, scenario, `GetSnapshot on the read-only disk: ${show(read)}`);
  const check = await within(client.locks.checkToken({ file: `${lockDir}/held`, fencingToken: held.fencingToken }), 10_000);
  findings.check("value" in check && check.value.current, scenario, `CheckToken on the read-only disk: ${show(check)}`);
  const lock = await within(client.locks.acquire({ file: `${lockDir}/new`, owner: "on a read-only disk" }), 10_000);
  const lockRefusal = "error" in lock ? refusalOf(lock.error) : undefined;
  findings.check(
    lockRefusal?.code === Code.Unavailable && lockRefusal.reason === "STATE_READ_ONLY",
    scenario,
    `Acquire of a new lock file on the read-only disk: ${show(lock)}`,
  );
  const reserved = await within(budgets.reserve({ need: memoryNeed(10), owner: "on a read-only disk", skipLoadGate: true }), 10_000);
  findings.check("value" in reserved, scenario, `Reserve on the read-only disk: ${show(reserved)}`);
  const register = await within(
    budgets.registerRunning({ name: "on a read-only disk", costSource: { case: "cost", value: { memoryBytes: 1n, cpu: 0 } } }),
    10_000,
  );
  const registerRefusal = "error" in register ? refusalOf(register.error) : undefined;
  findings.check(
    registerRefusal?.code === Code.Unavailable && registerRefusal.reason === "STATE_READ_ONLY",
    scenario,
    `RegisterRunning on the read-only disk: ${show(register)}`,
  );
  findings.check(sessions.exitStatus() === undefined && budget.exitStatus() === undefined, scenario, "a service exited on the read-only disk");
  await checkJournals(findings, scenario, client, sessionsDir, attempts, { tornTailsMayStay: true });
  for (const [name, service] of [
    ["sessions", sessions],
    ["budget", budget],
  ] as const) {
    const stopped = await service.stop();
    findings.check(
      stopped.code === 0,
      scenario,
      `the ${name} service did not stop cleanly on the read-only disk: ${show(stopped)}\n${service.output().slice(-2000)}`,
    );
  }

  // Writable again: the next open cuts a torn tail back, every append acknowledged before the disk
  // failed survived, and appends succeed again. ext4 can answer a sync that raced its error with
  // success and lose those bytes; berth trusts a sync only if the file system still takes writes
  // after it (confirmStillWritable), which catches that unless the sync returned in the instant
  // between ext4 aborting its journal and refusing writes. So an append acknowledged after the
  // failure began may be gone (counted in the figures), never one acknowledged before it.
  fs.remountWritable();
  const reopened = await startService("sessions", { stateDir });
  const reopenedClient = sessionsClient(reopened.url("sessions"));
  const { lostAtTheFailure } = await checkJournals(findings, `${scenario}, remounted read-write`, reopenedClient, sessionsDir, attempts, { failedAt });
  const after = await within(reopenedClient.sessions.appendEvent({ sessionId: "disk-0", event: checkpoint("after") }), 10_000);
  findings.check("value" in after, scenario, `an append once the disk was read-write again: ${show(after)}`);
  findings.check((await reopened.stop()).code === 0, scenario, "the sessions service did not stop cleanly on the remounted disk");
  findings.figures.readOnlyAcknowledgedLostAtTheFailure = lostAtTheFailure;
  findings.figures.readOnlyRefusals = tally(attempts, from).refused;
  findings.figures.readOnlyUnknownOutcomes = attempts.filter(toldUnknown).length;
  findings.operations += attempts.length;
  findings.rounds++;
}
