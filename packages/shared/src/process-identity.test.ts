import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { describe, expect, it } from "vitest";
import { bootId, identityIsLive, isPidAlive, parseStatStartTime, parseStatState, processStartTime, sameProcess, selfIdentity } from "./process-identity.js";

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

  it("is not alive while it is a zombie nobody reaps (a container whose PID 1 does not)", async () => {
    // `sleep 0.1 &` is a child of the shell that then becomes `sleep 30`, which never reaps it.
    const parent = spawn("sh", ["-c", "sleep 0.1 & echo $!; exec sleep 30"], { stdio: ["ignore", "pipe", "ignore"] });
    try {
      const pid = Number(await new Promise<string>((resolve) => parent.stdout!.once("data", (chunk: Buffer) => resolve(chunk.toString()))));
      const startTime = processStartTime(pid);
      const deadline = Date.now() + 10_000;
      let state: string | undefined;
      while ((state = parseStatState(readFileSync(`/proc/${pid}/stat`, "utf8"))) !== "Z" && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      expect(state).toBe("Z");
      expect(isPidAlive(pid)).toBe(false);
      expect(sameProcess(pid, startTime)).toBe(false);
      expect(isPidAlive(parent.pid!)).toBe(true);
    } finally {
      parent.kill("SIGKILL");
    }
  });

  it("reads the state letter past any comm", () => {
    expect(parseStatState(statLine("evil) Z 1 (x", 5))).toBe("S");
    expect(parseStatState("1 (sleep) Z 1 1")).toBe("Z");
    expect(parseStatState("garbage")).toBeUndefined();
  });

  it.each([0, -1, 1.5, NaN])("treats the non-pid %d as dead", (pid) => {
    expect(isPidAlive(pid)).toBe(false);
    expect(processStartTime(pid)).toBeUndefined();
  });
});
