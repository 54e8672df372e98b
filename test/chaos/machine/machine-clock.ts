/**
 * Time that cannot jump: the real service processes run under Debian's libfaketime, whose offset
 * is read from a file the suite rewrites while they run (`FAKETIME_TIMESTAMP_FILE`, re-read every
 * second), with the monotonic clock left alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`): the wall clock
 * steps an hour back, then two forward, as NTP or a person setting the date would step it.
 *
 * Sessions: a holder that never renews must lose its lease after its ttl, not an hour later, and
 * its waiter get the lock then; a waiter's wait must run out after its length, neither an hour
 * later nor at once; a holder renewing its lease must keep it through a step forward (never two
 * holders, per the service's log), and its renewals show the expiry in the service's new time.
 * Budget: a reservation whose lease is not renewed ends after its ttl and lets the queue's first waiter in;
 * a queued admission's wait runs out after its length; a renewed reservation lives through a step
 * forward.
 */
import { existsSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { timestampMs } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError } from "@connectrpc/connect";
import { NeedItemKind, type NeedSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { makeTempDir, startService, type ServiceProcess } from "../../harness.js";
import {
  budgetClient,
  type Findings,
  judgeLockEvents,
  lockEvents,
  ms,
  sessionsClient,
  show,
  sleep,
  until,
  within,
  type SessionsClient,
} from "./machine-world.js";

const HOUR = 3_600_000;
/** How late a timed event may come on a loaded 2-core machine and still count as on time. */
const SLACK_MS = 4000;

/** Where Debian puts libfaketime (the thread-safe build: node has threads). */
export function libfaketime(): string | undefined {
  const candidates = ["x86_64-linux-gnu", "aarch64-linux-gnu", "i386-linux-gnu", "arm-linux-gnueabihf"].map(
    (arch) => `/usr/lib/${arch}/faketime/libfaketimeMT.so.1`,
  );
  return [...candidates, "/usr/lib/faketime/libfaketimeMT.so.1"].find((file) => existsSync(file));
}

/** A wall clock the suite steps: the environment that puts a service under it, and the step. */
export interface SteppedClock {
  readonly env: Record<string, string>;
  /** Sets the processes' wall clock to the real one plus `offsetMs` (taking effect within a second or so). */
  set(offsetMs: number): void;
}

export function steppedClock(library: string): SteppedClock {
  const file = path.join(makeTempDir("berth-machine-faketime-"), "offset");
  const set = (offsetMs: number) => writeFileSync(file, `${offsetMs >= 0 ? "+" : "-"}${Math.abs(offsetMs) / 1000}s\n`);
  set(0);
  return {
    env: {
      LD_PRELOAD: library,
      FAKETIME_TIMESTAMP_FILE: file,
      FAKETIME_CACHE_DURATION: "1",
      FAKETIME_DONT_FAKE_MONOTONIC: "1",
    },
    set,
  };
}

/** Waits until `read()` (a wall time the service just stamped) is the real time plus `offsetMs`, give or take a minute. */
async function shows(offsetMs: number, read: () => Promise<number>): Promise<boolean> {
  return until(async () => Math.abs((await read()) - Date.now() - offsetMs) < 60_000, 15_000, 200);
}

/** Real ms since `since` (performance.now()). */
const since = (start: number) => performance.now() - start;

function timed<T>(promise: Promise<T>): Promise<{ ms: number; outcome: { value: T } | { error: unknown } | { timedOut: true } }> {
  const start = performance.now();
  return within(promise, 60_000).then((outcome) => ({ ms: since(start), outcome }));
}

/** Keeps a lock lease renewed every `everyMs` by KeepAlive calls. */
function renewLoop(client: SessionsClient, leaseToken: string, everyMs: number) {
  const state = { renewals: 0, lost: false, lastExpiresAt: NaN, stopped: false };
  const loop = (async () => {
    while (!state.stopped) {
      try {
        const renewal = (await client.locks.keepAlive({ leaseTokens: [leaseToken] })).renewals[0];
        if (!renewal?.alive) state.lost = true;
        else {
          state.renewals++;
          state.lastExpiresAt = renewal.expireTime ? timestampMs(renewal.expireTime) : NaN;
        }
      } catch {
        state.lost = true;
      }
      await sleep(everyMs);
    }
  })();
  return {
    state,
    async stop() {
      state.stopped = true;
      await within(loop, 10_000);
    },
  };
}

/** The sessions service under a stepped wall clock; see the module comment. */
export async function steppedSessions(findings: Findings, clock: SteppedClock): Promise<void> {
  const scenario = "clock steps (sessions)";
  const service = await startService("sessions", { args: ["--log-level", "debug"], env: clock.env });
  const url = service.url("sessions");
  const dir = makeTempDir("berth-machine-clock-");
  const file = (name: string) => `${dir}/${name}`;
  const probe = sessionsClient(url);
  const serviceNow = async () => {
    const lease = (await probe.locks.acquire({ file: file("probe"), owner: "probe", ttl: ms(1000) })).lease!;
    await probe.locks.release({ leaseToken: lease.leaseToken });
    return timestampMs(lease.acquireTime!);
  };

  // A step back of an hour while a dead holder's lease runs and a waiter waits.
  const dead = sessionsClient(url);
  await dead.locks.acquire({ file: file("a"), owner: "dead", ttl: ms(10_000) });
  const waiterA = sessionsClient(url);
  const granted = timed(waiterA.locks.acquire({ file: file("a"), owner: "waiter-a", maxWait: ms(60_000), ttl: ms(60_000) }));
  const held = sessionsClient(url);
  await held.locks.acquire({ file: file("c"), owner: "holder-c", ttl: ms(120_000) });
  const waiterC = sessionsClient(url);
  const refused = timed(waiterC.locks.acquire({ file: file("c"), owner: "waiter-c", maxWait: ms(8000) }));
  clock.set(-HOUR);
  findings.check(await shows(-HOUR, serviceNow), scenario, "the service's wall clock did not step back an hour");
  const grant = await granted;
  // Measured from the waiter's request, made right after the holder's grant.
  const grantMs = grant.ms;
  findings.check("value" in grant.outcome && grant.outcome.value.lease?.owner === "waiter-a", scenario, `waiter-a was not granted a: ${show(grant.outcome)}`);
  findings.check(
    grantMs <= 10_000 + SLACK_MS,
    scenario,
    `the dead holder's 10 s lease ended ${Math.round(grantMs)} ms after it was granted, across a step back of 1 h`,
  );
  const { ms: refusalMs, outcome: refusal } = await refused;
  findings.check(
    "error" in refusal && ConnectError.from(refusal.error).code === Code.ResourceExhausted,
    scenario,
    `waiter-c's 8 s wait did not end as locked: ${show(refusal)}`,
  );
  findings.check(
    refusalMs >= 7500 && refusalMs <= 8000 + SLACK_MS,
    scenario,
    `waiter-c's 8 s wait ran out after ${Math.round(refusalMs)} ms across a step back of 1 h`,
  );
  findings.figures.clockBackLeaseEndedMs = Math.round(grantMs);
  findings.figures.clockBackWaitEndedMs = Math.round(refusalMs);

  // A step forward of two hours while a holder renews its short lease and a waiter waits.
  const renewer = sessionsClient(url);
  const lease = (await renewer.locks.acquire({ file: file("b"), owner: "renewer", ttl: ms(5000) })).lease!;
  const renewals = renewLoop(renewer, lease.leaseToken, 1000);
  const waiterB = sessionsClient(url);
  const stolen = within(waiterB.locks.acquire({ file: file("b"), owner: "waiter-b", maxWait: ms(12_000) }), 60_000);
  const waiterD = timed(waiterA.locks.acquire({ file: file("a"), owner: "waiter-d", maxWait: ms(8000) }));
  clock.set(HOUR);
  findings.check(await shows(HOUR, serviceNow), scenario, "the service's wall clock did not step forward two hours");
  const lost = await until(async () => !(await renewer.locks.checkToken({ file: file("b"), fencingToken: lease.fencingToken })).current, 10_000, 250);
  findings.check(!lost, scenario, "the renewing holder lost its lease after the step forward");
  const { ms: dMs, outcome: d } = await waiterD;
  findings.check(
    "error" in d && dMs >= 7500 && dMs <= 8000 + SLACK_MS,
    scenario,
    `waiter-d's 8 s wait ended after ${Math.round(dMs)} ms across a step forward of 2 h: ${show(d)}`,
  );
  const b = await stolen;
  findings.check("error" in b && ConnectError.from(b.error).code === Code.ResourceExhausted, scenario, `waiter-b got the renewing holder's lock: ${show(b)}`);
  findings.check(!renewals.state.lost && renewals.state.renewals >= 10, scenario, `the renewing holder's renewals: ${show(renewals.state)}`);
  findings.check(
    Math.abs(renewals.state.lastExpiresAt - (Date.now() + HOUR + 5000)) < 60_000,
    scenario,
    `a renewal showed its expiry at ${new Date(renewals.state.lastExpiresAt).toISOString()}, not in the service's stepped time`,
  );
  await renewals.stop();
  clock.set(0);

  for (const problem of judgeLockEvents(lockEvents(service.entries()))) findings.violation(scenario, problem);
  findings.operations += lockEvents(service.entries()).length + renewals.state.renewals;
  findings.rounds++;
  await service.stop();
}

function memoryNeed(megabytes: number): MessageInitShape<typeof NeedSchema> {
  return { items: [{ kind: NeedItemKind.START, name: "work", costSource: { case: "cost", value: { memoryBytes: BigInt(megabytes * 1024 * 1024), cpu: 0 } } }] };
}

/** The budget service under a stepped wall clock; see the module comment. */
export async function steppedBudget(findings: Findings, clock: SteppedClock): Promise<void> {
  const scenario = "clock steps (budget)";
  const service: ServiceProcess = await startService("budget", { args: ["--memory", "100M", "--reserve", "0", "--wait", "10m"], env: clock.env });
  const client = budgetClient(service.url("budget")).budget;
  const serviceNow = async () => timestampMs((await client.getMachine({})).machine!.sampleTime!);
  const reserve = (owner: string, megabytes: number, options: { ttlMs?: number; waitMs?: number } = {}) =>
    client.reserve({
      need: memoryNeed(megabytes),
      owner,
      skipLoadGate: true,
      ttl: ms(options.ttlMs ?? 60_000),
      ...(options.waitMs === undefined ? {} : { maxWait: ms(options.waitMs) }),
    });

  // A live reservation renewed every second, a dead one that never is, and the queue's first waiter behind them.
  const live = (await reserve("live", 40, { ttlMs: 5000 })).reservation!;
  const renewing = { stopped: false, alive: 0, lost: false, lastExpiresAt: NaN };
  const renewer = (async () => {
    while (!renewing.stopped) {
      const answer = (await client.keepAlive({ ids: [live.id] })).renewals[0]!;
      if (answer.alive) {
        renewing.alive++;
        renewing.lastExpiresAt = answer.expireTime ? timestampMs(answer.expireTime) : NaN;
      } else renewing.lost = true;
      await sleep(1000);
    }
  })();
  await reserve("dead", 40, { ttlMs: 10_000 });
  const deadAt = performance.now();
  const firstWaiter = timed(reserve("first-waiter", 50, { waitMs: 60_000 }));
  const short = timed(reserve("short wait", 50, { waitMs: 8000 }));
  clock.set(-HOUR);
  findings.check(await shows(-HOUR, serviceNow), scenario, "the service's wall clock did not step back an hour");
  const admitted = await firstWaiter;
  const admittedMs = since(deadAt);
  findings.check("value" in admitted.outcome, scenario, `the first waiter was not admitted once the dead reservation's lease ended: ${show(admitted.outcome)}`);
  findings.check(
    admittedMs <= 10_000 + SLACK_MS,
    scenario,
    `the dead reservation's 10 s lease ended ${Math.round(admittedMs)} ms after it was made, across a step back of 1 h`,
  );
  if ("value" in admitted.outcome) await client.release({ reservationId: admitted.outcome.value.reservation!.id });
  const { ms: shortMs, outcome: shortOutcome } = await short;
  findings.check(
    "error" in shortOutcome && shortMs >= 7500 && shortMs <= 8000 + SLACK_MS,
    scenario,
    `an 8 s wait in the queue ended after ${Math.round(shortMs)} ms across a step back of 1 h: ${show(shortOutcome)}`,
  );
  findings.figures.clockBackReservationEndedMs = Math.round(admittedMs);
  findings.figures.clockBackQueueWaitEndedMs = Math.round(shortMs);

  // Two hours forward: the renewed reservation lives on, a queued wait runs its length.
  await reserve("blocker", 50, { ttlMs: 60_000 });
  const queued = timed(reserve("after the step", 50, { waitMs: 8000 }));
  clock.set(HOUR);
  findings.check(await shows(HOUR, serviceNow), scenario, "the service's wall clock did not step forward two hours");
  const { ms: queuedMs, outcome: queuedOutcome } = await queued;
  findings.check(
    "error" in queuedOutcome && queuedMs >= 7500 && queuedMs <= 8000 + SLACK_MS,
    scenario,
    `an 8 s wait in the queue ended after ${Math.round(queuedMs)} ms across a step forward of 2 h`,
  );
  await sleep(2000);
  renewing.stopped = true;
  await within(renewer, 10_000);
  findings.check(!renewing.lost && renewing.alive >= 10, scenario, `the renewed reservation: ${show(renewing)}`);
  findings.check(
    Math.abs(renewing.lastExpiresAt - (Date.now() + HOUR + 5000)) < 60_000,
    scenario,
    "a renewal's expiry was not shown in the service's stepped time",
  );
  clock.set(0);
  findings.operations += renewing.alive + 6;
  findings.rounds++;
  await service.stop();
}
