/**
 * Lock chaos (docs/architecture.md, "Tests and benchmarks"): one holder per lock, whatever happens to the clients.
 *
 * One sessions service (the LockService lives in it) runs as a real process. Eight client
 * processes (`lock-client.ts`) take turns on three files, some with Hold, some with Acquire +
 * KeepAlive + Release on a short lease, and while holding make protected writes: AppendEvents to
 * the file's session fenced with their fencing token, so the journal itself is the resource the
 * lock protects. Meanwhile the suite SIGKILLs clients at random and respawns them, and pauses lease
 * holders with SIGSTOP until their token is no longer current (the lease ran out and, usually,
 * another client took the lock), then resumes them: their writes with the stale fence must be
 * refused and write nothing.
 *
 * Afterwards (`lock-checks.ts`), without looking at any clock: in each file's journal the accepted
 * writes carry non-decreasing tokens and no token writes again after another's run (no two holders
 * overlapped); each token wrote from one process only; every grant's token is unique per file and a
 * process's own tokens rose; every acknowledged write is in the journal at its seq; every write a
 * resumed holder attempted was refused with the fence detail and is not in the journal.
 *
 * Knobs (env `BERTH_CHAOS_<NAME>`): LOCK_GRANTS (1000), LOCK_CLIENTS (8), LOCK_FILES (3),
 * LOCK_PAUSES (12), LOCK_KILL_MS (mean ms between kills, 2000), LOCK_TTL_MS (lease ttl, 1000),
 * LOCK_MAX_SECONDS (give up after, 400).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, statSync } from "node:fs";
import * as path from "node:path";
import { createInterface } from "node:readline";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { continueProcess, stopProcess } from "@berth/shared/testing/process-stop";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { connectClient, makeTempDir, onStopAll, repoPath, startService, stopAll } from "../../harness.js";
import { judgeLockRun, quantile, type JournalWrite, type LockRunEvidence, type PauseRecord } from "./lock-checks.js";
import { parseLog, WRITE_EVENT_TYPE, type LockClientConfig, type LockRecord, type LoggedRecord } from "./lock-records.js";
import { chaosSetting, reportSuite } from "../common/summary.js";

afterAll(stopAll);

const GRANTS = chaosSetting("LOCK_GRANTS", 1000);
const CLIENTS = chaosSetting("LOCK_CLIENTS", 8);
const FILES = chaosSetting("LOCK_FILES", 3);
const PAUSES = chaosSetting("LOCK_PAUSES", 12);
const KILL_MEAN_MS = chaosSetting("LOCK_KILL_MS", 2000);
const LEASE_TTL_MS = chaosSetting("LOCK_TTL_MS", 1000);
const MAX_SECONDS = chaosSetting("LOCK_MAX_SECONDS", 400);
const HOLD_SHARE = 0.5;
/** A run with no new grant for this long is stuck: fail rather than wait for the test timeout. */
const STALL_MS = 60_000;

const CLIENT_SCRIPT = repoPath("test/dist/chaos/lock/lock-client.js");

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `probe` until it answers true; after `timeoutMs`, throws `what` (every wait is bounded). */
async function until(probe: () => boolean | Promise<boolean>, timeoutMs: number, what: string, everyMs = 10): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    if (await probe()) return;
    if (performance.now() > deadline) throw new Error(`gave up after ${timeoutMs} ms waiting for ${what}`);
    await sleep(everyMs);
  }
}

/** A promise settled by whichever comes first: `promise`, or a rejection naming `what` after `ms`. */
function bounded<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`gave up after ${ms} ms waiting for ${what}`)), ms)));
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** One client slot: a process, respawned in place after each kill, appending to the slot's log. */
interface Slot {
  readonly index: number;
  readonly logPath: string;
  child: ChildProcess;
  pid: number;
  exited: Promise<void>;
  /** Being paused (or just resumed and not yet past its stale grant): kills leave it alone. */
  paused: boolean;
  /** Called with each line the current process announces on stdout. */
  watcher: ((record: LockRecord) => void) | undefined;
  stderrTail: string;
}

describe("the lock chaos checks", () => {
  // A run the checks must pass: client 0 (pid 100) holds token 1 and writes twice, releases; client
  // 1 (pid 200) holds token 2 and writes once.
  const file = "f";
  const base = { client: 0, pid: 100, file, t: 0 };
  const other = { client: 1, pid: 200, file, t: 0 };
  function evidence(changes: { journal?: JournalWrite[]; extra0?: LockRecord[]; pauses?: PauseRecord[] } = {}): LockRunEvidence {
    const log0: LockRecord[] = [
      { ...base, event: "asked", mode: "lease" },
      { ...base, event: "granted", mode: "lease", fencingToken: 1, ttlMs: 1000 },
      { ...base, event: "write-attempt", fencingToken: 1, n: 1 },
      { ...base, event: "write-ok", fencingToken: 1, n: 1, seq: 1 },
      { ...base, event: "write-attempt", fencingToken: 1, n: 2 },
      { ...base, event: "write-ok", fencingToken: 1, n: 2, seq: 2 },
      ...(changes.extra0 ?? []),
    ];
    const log1: LockRecord[] = [
      { ...other, event: "asked", mode: "hold" },
      { ...other, event: "granted", mode: "hold", fencingToken: 2, ttlMs: null },
      { ...other, event: "write-attempt", fencingToken: 2, n: 1 },
      { ...other, event: "write-ok", fencingToken: 2, n: 1, seq: 3 },
    ];
    const journal = changes.journal ?? [
      { seq: 1, file, fencingToken: 1, client: 0, pid: 100, n: 1 },
      { seq: 2, file, fencingToken: 1, client: 0, pid: 100, n: 2 },
      { seq: 3, file, fencingToken: 2, client: 1, pid: 200, n: 1 },
    ];
    const withOffsets = (records: LockRecord[]) => records.map((record, offset) => ({ ...record, offset }));
    return {
      files: [file],
      journals: new Map([[file, journal]]),
      logs: new Map([
        [0, withOffsets(log0)],
        [1, withOffsets(log1)],
      ]),
      badLogLines: 0,
      pauses: changes.pauses ?? [],
      lastTokens: new Map([[file, 2]]),
    };
  }

  it("pass a clean run", () => {
    expect(judgeLockRun(evidence()).violations).toEqual([]);
  });

  it("catch two holders' writes interleaved, a token going down and two writers with one token", () => {
    const interleaved = judgeLockRun(
      evidence({
        journal: [
          { seq: 1, file, fencingToken: 1, client: 0, pid: 100, n: 1 },
          { seq: 2, file, fencingToken: 2, client: 1, pid: 200, n: 1 },
          { seq: 3, file, fencingToken: 1, client: 0, pid: 100, n: 2 },
        ],
      }),
    );
    expect(interleaved.violations.join("\n")).toMatch(/token went down/);
    expect(interleaved.violations.join("\n")).toMatch(/two holders overlapped/);
    const shared = judgeLockRun(
      evidence({
        journal: [
          { seq: 1, file, fencingToken: 1, client: 0, pid: 100, n: 1 },
          { seq: 2, file, fencingToken: 1, client: 1, pid: 200, n: 2 },
        ],
      }),
    );
    expect(shared.violations.join("\n")).toMatch(/two holders with one token/);
  });

  it("catch a token granted twice, an acknowledged write missing and a stale write accepted", () => {
    const twice = judgeLockRun(evidence({ extra0: [{ ...base, event: "granted", mode: "hold", fencingToken: 2, ttlMs: null }] }));
    expect(twice.violations.join("\n")).toMatch(/granted twice/);
    const lost = judgeLockRun(evidence({ journal: [{ seq: 1, file, fencingToken: 1, client: 0, pid: 100, n: 1 }] }));
    expect(lost.violations.join("\n")).toMatch(/acknowledged write .* is not in the journal/);
    const stale = judgeLockRun(
      evidence({
        extra0: [
          { ...base, event: "write-attempt", fencingToken: 1, n: 3 },
          { ...base, event: "write-ok", fencingToken: 1, n: 3, seq: 4 },
        ],
        pauses: [{ client: 0, pid: 100, file, fencingToken: 1, logOffset: 6 }],
      }),
    );
    expect(stale.staleAttempts).toBe(1);
    expect(stale.staleFencesRefused).toBe(0);
    expect(stale.violations.join("\n")).toMatch(/accepted with a stale fence/);
    const refused = judgeLockRun(
      evidence({
        extra0: [
          { ...base, event: "write-attempt", fencingToken: 1, n: 3 },
          { ...base, event: "write-refused", fencingToken: 1, n: 3, code: "FailedPrecondition", detail: { file: "/p/f", fencingToken: 1, currentToken: 2 } },
        ],
        pauses: [{ client: 0, pid: 100, file, fencingToken: 1, logOffset: 6 }],
      }),
    );
    expect(refused.violations).toEqual([]);
    expect(refused.staleFencesRefused).toBe(1);
  });
});

describe("lock chaos", () => {
  it(`${GRANTS} grants with clients killed and paused: one holder at a time, stale fences refused`, async () => {
    if (!existsSync(CLIENT_SCRIPT)) throw new Error(`${CLIENT_SCRIPT} is missing: run npx tsc -b first`);
    const started = performance.now();
    const root = makeTempDir("berth-lock-chaos-");
    const projectRoot = path.join(root, "project");
    const logDir = path.join(root, "logs");
    mkdirSync(projectRoot, { recursive: true });
    mkdirSync(logDir, { recursive: true });
    const service = await startService("sessions");
    const url = service.url("sessions");
    const locks: Client<typeof LockService> = connectClient(LockService, url, { protocol: "grpc", defaultTimeoutMs: 10_000 });
    const sessions: Client<typeof SessionService> = connectClient(SessionService, url, { protocol: "grpc", defaultTimeoutMs: 30_000 });

    const files = Array.from({ length: FILES }, (_, i) => path.join(projectRoot, `src/chaos-${String.fromCharCode(97 + i)}.ts`));
    const sessionIds = files.map((_, i) => `lock-chaos-${i}`);
    const configOf = (client: number): LockClientConfig => ({
      url,
      logPath: path.join(logDir, `client-${client}.log`),
      client,
      files,
      sessions: sessionIds,
      holdShare: HOLD_SHARE,
      leaseTtlMs: LEASE_TTL_MS,
      hold: { writesMin: 1, writesMax: 3, pauseMaxMs: 10 },
      // Lease holders write more and linger between writes, so that a pause usually lands mid-hold.
      lease: { writesMin: 2, writesMax: 4, pauseMaxMs: 40 },
    });

    let grantsSeen = 0;
    let lastProgress = performance.now();
    let kills = 0;
    let pausesStarted = 0;
    let pausesOvertaken = 0;
    let pausing: Promise<void> | undefined;
    let fatal: Error | undefined;
    let finishing = false;
    /** Set once enough grants were seen: no new pause starts. */
    let runOver = false;
    const pauses: PauseRecord[] = [];
    const unexpectedExits: string[] = [];
    const killedPids = new Set<number>();
    const fail = (error: unknown) => {
      fatal ??= error instanceof Error ? error : new Error(String(error));
    };

    const launch = (slot: Pick<Slot, "index" | "logPath"> & Partial<Slot>): Slot => {
      const child = spawn(process.execPath, [CLIENT_SCRIPT, JSON.stringify(configOf(slot.index))], { stdio: ["pipe", "pipe", "pipe"] });
      if (child.pid === undefined) throw new Error(`could not spawn client ${slot.index}`);
      const pid = child.pid;
      const full = slot as Slot;
      full.child = child;
      full.pid = pid;
      full.paused = false;
      full.watcher = undefined;
      full.stderrTail = "";
      full.exited = new Promise<void>((resolve) => {
        child.once("exit", (code, signal) => {
          if (!killedPids.has(pid) && !finishing) {
            unexpectedExits.push(`client ${slot.index} (pid ${pid}) exited by itself (code ${code}, signal ${signal}): ${full.stderrTail}`);
          }
          resolve();
        });
      });
      child.stderr!.on("data", (chunk: Buffer) => {
        full.stderrTail = (full.stderrTail + chunk.toString()).slice(-4000);
      });
      createInterface({ input: child.stdout! }).on("line", (line) => {
        let record: LockRecord;
        try {
          record = JSON.parse(line) as LockRecord;
        } catch {
          return fail(new Error(`client ${slot.index} printed a line that is not a record: ${line}`));
        }
        if (record.pid !== pid) return;
        // Late lines of a killed process count as grants but drive no pause of its successor.
        if (full.pid === pid) full.watcher?.(record);
        if (record.event === "granted") onGrant(full, record);
      });
      return full;
    };

    const slots: Slot[] = Array.from({ length: CLIENTS }, (_, index) => launch({ index, logPath: path.join(logDir, `client-${index}.log`) }));
    // Whatever ends the test, no client outlives it (SIGKILL ends a stopped process too).
    onStopAll(() => {
      finishing = true;
      for (const slot of slots) slot.child.kill("SIGKILL");
    });

    function onGrant(slot: Slot, grant: LockRecord & { event: "granted" }): void {
      grantsSeen++;
      lastProgress = performance.now();
      if (
        grant.mode !== "lease" ||
        pausing !== undefined ||
        runOver ||
        slot.paused ||
        slot.pid !== grant.pid ||
        killedPids.has(grant.pid) ||
        pausesStarted >= PAUSES
      )
        return;
      // Spread the pauses over the run: about 2.5 times as likely as needed to use them all up.
      const leaseGrantsLeft = Math.max(1, (GRANTS - grantsSeen) * (1 - HOLD_SHARE));
      if (Math.random() >= Math.min(1, (2.5 * (PAUSES - pausesStarted)) / leaseGrantsLeft)) return;
      pausesStarted++;
      pausing = pauseHolder(slot, grant)
        .catch(fail)
        .finally(() => {
          slot.paused = false;
          pausing = undefined;
        });
    }

    /**
     * SIGSTOP the holder; note how much of its log was written before it stopped; wait until its
     * token is no longer current (its lease ran out) and, for a bounded time, until another client
     * took the lock; SIGCONT; then wait until it has finished that grant (announced its release or
     * its next turn), so the attempts of the resumed holder all have an outcome in its log.
     */
    async function pauseHolder(slot: Slot, grant: LockRecord & { event: "granted" }): Promise<void> {
      slot.paused = true;
      const { pid } = slot;
      const { file, fencingToken } = grant;
      const grantDone = new Promise<void>((resolve) => {
        slot.watcher = (record) => {
          if ((record.event === "released" && record.fencingToken === fencingToken) || record.event === "asked" || record.event === "turn-error") resolve();
        };
      });
      stopProcess(pid);
      const logOffset = statSync(slot.logPath).size;
      await until(
        async () => !(await locks.checkToken({ file, fencingToken: BigInt(fencingToken) })).current,
        30_000,
        `token ${fencingToken} of ${file} to lapse while its holder is stopped`,
        50,
      );
      const overtaken = await until(async () => (await locks.inspect({ file })).lastFencingToken > BigInt(fencingToken), 10_000, "another holder", 20).then(
        () => true,
        () => false,
      );
      if (overtaken) pausesOvertaken++;
      pauses.push({ client: slot.index, pid, file, fencingToken, logOffset });
      continueProcess(pid);
      await bounded(grantDone, 30_000, `resumed client ${slot.index} (pid ${pid}) to finish its grant of ${file} token ${fencingToken}`);
    }

    async function killOne(): Promise<void> {
      const candidates = slots.filter((slot) => !slot.paused);
      const slot = candidates[Math.floor(Math.random() * candidates.length)];
      if (slot === undefined) return;
      killedPids.add(slot.pid);
      slot.child.kill("SIGKILL");
      kills++;
      await bounded(slot.exited, 10_000, `client ${slot.index} (pid ${slot.pid}) to exit after SIGKILL`);
      if (!finishing) launch(slot);
    }

    // ---- the run: kill at random until enough grants were seen (or something went wrong).
    const deadline = started + MAX_SECONDS * 1000;
    let nextKill = performance.now() + KILL_MEAN_MS * (0.5 + Math.random());
    while (grantsSeen < GRANTS && fatal === undefined && unexpectedExits.length === 0) {
      await sleep(20);
      const now = performance.now();
      if (now > deadline) fail(new Error(`only ${grantsSeen} of ${GRANTS} grants in ${MAX_SECONDS} s`));
      else if (now - lastProgress > STALL_MS)
        fail(new Error(`no grant for ${STALL_MS} ms (after ${grantsSeen}); client stderr: ${slots.map((s) => s.stderrTail).join(" | ")}`));
      else if (now >= nextKill) {
        await killOne().catch(fail);
        nextKill = performance.now() + KILL_MEAN_MS * (0.5 + Math.random());
      }
    }
    runOver = true;
    // A pause in progress finishes first, so that its resumed holder's attempts all have outcomes.
    if (pausing !== undefined) await bounded(pausing, 60_000, "the last pause to finish").catch(fail);
    finishing = true;
    for (const slot of slots) slot.child.kill("SIGKILL");
    await bounded(Promise.all(slots.map((slot) => slot.exited)), 10_000, "every client to exit");
    const runSeconds = (performance.now() - started) / 1000;
    if (fatal !== undefined) throw fatal;
    expect(unexpectedExits).toEqual([]);

    // ---- the evidence: journals, logs, the service's last tokens.
    const journals = new Map<string, JournalWrite[]>();
    for (const [i, file] of files.entries()) {
      const writes: JournalWrite[] = [];
      try {
        for await (const chunk of sessions.readJournal({ sessionId: sessionIds[i]! })) {
          for (const entry of chunk.entries) {
            const event = entry.event?.kind;
            if (event?.case !== "other" || event.value.type !== WRITE_EVENT_TYPE)
              throw new Error(`${sessionIds[i]} seq ${entry.seq} is not a protected write: ${entry.type}`);
            const fields = event.value.fields ?? {};
            writes.push({
              seq: Number(entry.seq),
              file: String(fields.file),
              fencingToken: Number(fields.fencingToken),
              client: Number(fields.client),
              pid: Number(fields.pid),
              n: Number(fields.n),
            });
          }
        }
      } catch (error) {
        // A file nobody ever wrote to has no session.
        if (ConnectError.from(error).code !== Code.NotFound) throw error;
      }
      journals.set(file, writes);
    }
    const logs = new Map<number, LoggedRecord[]>();
    let badLogLines = 0;
    for (const slot of slots) {
      const { records, bad } = parseLog(existsSync(slot.logPath) ? readFileSync(slot.logPath, "utf8") : "");
      logs.set(slot.index, records);
      badLogLines += bad.length;
    }
    // With every client gone, each lock frees itself (Holds at once, leases within their ttl), no
    // dead waiter is left queued, and the seed's lock file is cleared.
    const lastTokens = new Map<string, number>();
    const endStates: string[] = [];
    for (const file of files) {
      let state = await locks.inspect({ file });
      await until(
        async () => {
          state = await locks.inspect({ file });
          return state.holder === undefined && state.waiters.length === 0 && !existsSync(state.lockPath);
        },
        10 * LEASE_TTL_MS + 5_000,
        `${file} to be free`,
        50,
      ).catch(() =>
        endStates.push(
          `${file}: still ${JSON.stringify({ holder: state.holder?.owner, waiters: state.waiters.map((w) => w.owner), lockFile: existsSync(state.lockPath) })} after every client was killed`,
        ),
      );
      lastTokens.set(file, Number(state.lastFencingToken));
    }

    const verdict = judgeLockRun({ files, journals, logs, badLogLines, pauses, lastTokens });
    const violations = [...verdict.violations, ...endStates];
    if (verdict.staleAttempts === 0) violations.push(`none of the ${pauses.length} pauses landed before its holder's last write: no stale fence was tried`);
    if (pauses.length > 0 && pausesOvertaken === 0) violations.push(`no paused holder's lock was taken by another client while it was stopped`);
    if (verdict.staleFencesRefused !== verdict.staleAttempts)
      violations.push(`stale fences refused ${verdict.staleFencesRefused} != attempts ${verdict.staleAttempts}`);
    const round = (ms: number) => Math.round(ms * 10) / 10;
    reportSuite({
      suite: "lock-chaos",
      rounds: verdict.grants,
      operations: verdict.requests,
      violations: violations.length,
      clients: CLIENTS,
      files: FILES,
      grantsByMode: verdict.grantsByMode,
      writesAttempted: verdict.writesAttempted,
      writesAccepted: verdict.writesAccepted,
      kills,
      stops: pauses.length,
      stopsOvertaken: pausesOvertaken,
      stopsMidHold: verdict.pausesMidHold,
      staleFencesRefused: verdict.staleFencesRefused,
      staleAttempts: verdict.staleAttempts,
      inFlightAtStop: verdict.inFlightAtPause,
      otherFenceRefusals: verdict.otherRefusals,
      lastTokens: Object.fromEntries(lastTokens),
      handoffSamples: verdict.handoffsMs.length,
      handoffP50Ms: round(quantile(verdict.handoffsMs, 0.5)),
      handoffP99Ms: round(quantile(verdict.handoffsMs, 0.99)),
      seconds: Math.round(runSeconds),
    });
    if (violations.length > 0) process.stdout.write(`lock-chaos violations (first 50):\n${violations.slice(0, 50).join("\n")}\n`);
    expect(violations.slice(0, 20)).toEqual([]);
    expect(verdict.grants).toBeGreaterThanOrEqual(GRANTS);
    await service.stop();
  });
});
