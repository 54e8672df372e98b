/**
 * The machine suite: berth's promises through what a developer's machine does on its own, on the
 * real service processes and real file systems.
 *
 * - The wall clock steps an hour back and two forward under libfaketime (machine-clock.ts).
 * - Each service is stopped with SIGSTOP past every lease, under load, and resumed (machine-wake.ts).
 * - Its state sits on a full tmpfs, then on an ext4 image the kernel remounts read-only
 *   (machine-disk.ts); skipped, saying why, only where the suite cannot mount them (not root).
 * - 1,000 clients connect at once to a service started with `ulimit -n 256` (machine-fds.ts).
 *
 * Each scenario adds what it finds to one tally; the suite ends with one summary line and fails on
 * any violation. Knob (env `BERTH_CHAOS_<NAME>`): MACHINE_PAUSE_MS (how long a service is stopped, 30000).
 */
import { afterAll, describe, expect, it } from "vitest";
import { stopAll } from "../../harness.js";
import { libfaketime, steppedBudget, steppedClock, steppedSessions } from "./machine-clock.js";
import { floodedBudget, floodedSessions, FD_LIMIT, FLOOD_CLIENTS } from "./machine-fds.js";
import { fullDisk, mountFailingFs, mountSmallFs, readOnlyDisk, whyNot } from "./machine-disk.js";
import { Findings } from "./machine-world.js";
import { pausedBudget, pausedSessions } from "./machine-wake.js";
import { chaosSetting, reportSuite } from "../common/summary.js";

afterAll(stopAll);
const findings = new Findings();
const PAUSE_MS = chaosSetting("MACHINE_PAUSE_MS", 30_000);

/**
 * Runs a scenario on a tally of its own (the clock and the pause scenarios of the two services run
 * side by side: each mostly waits, on a stepped clock or a stopped process) and fails the test on
 * its violations; the suite's summary counts them all.
 */
async function scenario(run: (own: Findings) => Promise<void>): Promise<void> {
  const own = new Findings();
  try {
    await run(own);
  } finally {
    findings.absorb(own);
  }
  expect(own.violations).toEqual([]);
}

describe.concurrent("the wall clock steps an hour back and two forward (libfaketime)", () => {
  const library = libfaketime();
  it("libfaketime is installed (Debian's faketime)", () => {
    expect(library, "install Debian's faketime package (libfaketime)").toBeDefined();
  });
  it("sessions", () => scenario((own) => steppedSessions(own, steppedClock(library!))));
  it("budget", () => scenario((own) => steppedBudget(own, steppedClock(library!))));
});

describe.concurrent("sleep and wake: SIGSTOP past every lease, then SIGCONT", () => {
  it("sessions", () => scenario((own) => pausedSessions(own, PAUSE_MS)));
  it("budget", () => scenario((own) => pausedBudget(own, PAUSE_MS)));
});

describe("a full disk (a small tmpfs), then a read-only one (an ext4 image the kernel remounts read-only)", () => {
  const noTmpfs = whyNot(() => mountSmallFs(1024 * 1024).unmount());
  if (noTmpfs !== undefined) process.stdout.write(`machine: skipped the full-disk case: cannot mount a tmpfs here (${noTmpfs}); it needs root\n`);
  it.skipIf(noTmpfs !== undefined)("full: both services", () => scenario((own) => fullDisk(own)));
  const noLoop = whyNot(() => mountFailingFs().unmount());
  if (noLoop !== undefined)
    process.stdout.write(
      `machine: skipped the read-only case: cannot mount an ext4 image on a loop device here (${noLoop}); it needs root, losetup and mkfs.ext4\n`,
    );
  it.skipIf(noLoop !== undefined)("read-only: both services", () => scenario((own) => readOnlyDisk(own)));
});

describe(`too many clients: ${FLOOD_CLIENTS} at once against ulimit -n ${FD_LIMIT}`, () => {
  it("sessions", () => scenario((own) => floodedSessions(own)));
  it("budget", () => scenario((own) => floodedBudget(own)));
});

afterAll(() =>
  reportSuite({ suite: "machine", rounds: findings.rounds, operations: findings.operations, violations: findings.violations.length, ...findings.figures }),
);
