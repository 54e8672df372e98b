import { afterAll, describe, expect, it } from "vitest";
import { stopAll } from "../harness.js";
import { Findings } from "./machine-world.js";
import { pausedBudget, pausedSessions } from "./machine-wake.js";
import { chaosSetting, reportSuite } from "./summary.js";

afterAll(stopAll);
const findings = new Findings();
const PAUSE_MS = chaosSetting("MACHINE_PAUSE_MS", 30_000);

describe("sleep and wake", () => {
  it("sessions", async () => {
    await pausedSessions(findings, PAUSE_MS);
    expect(findings.violations).toEqual([]);
  });
  it("budget", async () => {
    await pausedBudget(findings, PAUSE_MS);
    expect(findings.violations).toEqual([]);
  });
});

afterAll(() => reportSuite({ suite: "machine", rounds: findings.rounds, operations: findings.operations, violations: findings.violations.length, ...findings.figures }));
