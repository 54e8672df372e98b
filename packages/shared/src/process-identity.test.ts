import { spawn } from "node:child_process";
import { hostname } from "node:os";
import { describe, expect, it } from "vitest";
import {
  bootId,
  identityIsLive,
  isPidAlive,
  parseStatStartTime,
  processStartTime,
  sameProcess,
  selfIdentity,
} from "./process-identity.js";

function statLine(comm: string, startTime: number): string {
  // pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
  // cutime cstime priority nice num_threads itrealvalue starttime vsize ...
  const after = ["S", "1", "1", "1", "0", "-1", "4194560", "0", "0", "0", "0", "0", "0", "0", "0", "20", "0", "1", "0", String(startTime), "1000", "1"];
  return `1234 (${comm}) ${after.join(" ")}\n`;
}

describe("parseStatStartTime", () => {
  it.each(["node", "a b", "evil) 1 2 3 (x", ") )", "(((", ""])("reads field 22 past a comm of %j", (comm) => {
    expect(parseStatStartTime(statLine(comm, 987654))).toBe(987654);
  });

  it("gives undefined for garbage", () => {
    expect(parseStatStartTime("nonsense")).toBeUndefined();
    expect(parseStatStartTime("1 (x) S 1")).toBeUndefined();
  });
});

describe("the current process", () => {
  it("has a start time, a boot id and is alive", () => {
    const self = selfIdentity();
    expect(self.pid).toBe(process.pid);
    expect(self.startTime).toBeTypeOf("number");
    expect(self.bootId).toMatch(/^[0-9a-f-]{36}$/);
    expect(self.hostname).toBe(hostname());
    expect(isPidAlive(process.pid)).toBe(true);
    expect(sameProcess(process.pid, self.startTime)).toBe(true);
    expect(identityIsLive(self)).toBe(true);
  });

  it("is not live under another start time, boot or host", () => {
    const self = selfIdentity();
    expect(sameProcess(process.pid, self.startTime! + 1)).toBe(false);
    expect(identityIsLive({ ...self, startTime: self.startTime! + 1 })).toBe(false);
    expect(identityIsLive({ ...self, bootId: "00000000-0000-0000-0000-000000000000" })).toBe(false);
    expect(identityIsLive({ ...self, hostname: `${hostname()}-elsewhere` })).toBe(false);
  });

  it("counts pid 1 (not ours to signal, EPERM or not) as alive", () => {
    expect(isPidAlive(1)).toBe(true);
  });
});

describe("a process that exited", () => {
  it("is no longer alive and has no start time", async () => {
    const child = spawn(process.execPath, ["-e", "0"], { stdio: "ignore" });
    const pid = child.pid!;
    await new Promise((resolve) => child.on("exit", resolve));
    expect(isPidAlive(pid)).toBe(false);
    expect(processStartTime(pid)).toBeUndefined();
    expect(sameProcess(pid, undefined)).toBe(false);
    expect(identityIsLive({ pid, startTime: 1, bootId: bootId(), hostname: hostname() })).toBe(false);
  });

  it.each([0, -1, 1.5, NaN])("treats the non-pid %d as dead", (pid) => {
    expect(isPidAlive(pid)).toBe(false);
    expect(processStartTime(pid)).toBeUndefined();
  });
});
