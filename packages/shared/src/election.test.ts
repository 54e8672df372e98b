import { spawn, type ChildProcessByStdio } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { createInterface } from "node:readline";
import type { Readable, Writable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { acquireElection, electionLockPath, readClaim } from "./election.js";
import { claimIsLive, ElectionHeldError, type ElectionClaim } from "./elector.js";
import { selfIdentity } from "./process-identity.js";
import { transpileForChild, type ChildModules } from "./testing/child-modules.js";

/**
 * A child node process that runs election commands sent as JSON lines on stdin and answers each with
 * one JSON line. It keeps whatever it acquired until told to release or exit, so one process serves
 * many rounds and every round is still a race between separate processes.
 */
const WORKER = (electionUrl: string) => `
import * as fs from "node:fs";
import { createInterface } from "node:readline";
import fsExt from "fs-ext";
import { acquireElection } from ${JSON.stringify(electionUrl)};
let lock;
const reply = (value) => process.stdout.write(JSON.stringify(value) + "\\n");
createInterface({ input: process.stdin }).on("line", (line) => {
  const command = JSON.parse(line);
  if (command.op === "acquire") {
    // Everyone waits for the same instant so the attempts overlap.
    setTimeout(() => {
      try {
        lock = acquireElection(command.stateDir, command.name);
        reply({ result: "WIN" });
      } catch (error) {
        reply({ result: "LOSE", name: error.name, message: error.message });
      }
    }, Math.max(0, command.at - Date.now()));
  } else if (command.op === "release") {
    lock?.release();
    lock = undefined;
    reply({ result: "released" });
  } else if (command.op === "flock-only") {
    // A winner caught between taking the lock and writing its claim.
    const fd = fs.openSync(command.path, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
    fsExt.flockSync(fd, "exnb");
    reply({ result: "locked" });
  } else if (command.op === "exit") {
    process.exit(0);
  }
});
reply({ result: "ready" });
`;

interface Reply {
  result: string;
  name?: string;
  message?: string;
}

class Worker {
  readonly process: ChildProcessByStdio<Writable, Readable, null>;
  private readonly waiting: Array<{ resolve: (reply: Reply) => void; reject: (error: Error) => void }> = [];
  private gone = false;
  readonly ready: Promise<Reply>;
  readonly exited: Promise<unknown>;

  constructor(script: string) {
    this.process = spawn(process.execPath, [script], { stdio: ["pipe", "pipe", "inherit"] });
    this.exited = new Promise((resolve) => this.process.on("exit", resolve));
    createInterface({ input: this.process.stdout }).on("line", (line) => this.waiting.shift()?.resolve(JSON.parse(line) as Reply));
    // A worker that dies (a syntax error, a crash) fails what waits on it instead of hanging the test.
    this.process.on("exit", (code, signal) => {
      this.gone = true;
      for (const waiter of this.waiting.splice(0)) waiter.reject(new Error(`worker ${this.pid} exited (${signal ?? code})`));
    });
    this.ready = this.next();
  }

  get pid(): number {
    return this.process.pid!;
  }

  private next(): Promise<Reply> {
    if (this.gone) return Promise.reject(new Error(`worker ${this.pid} has exited`));
    return new Promise((resolve, reject) => this.waiting.push({ resolve, reject }));
  }

  send(command: Record<string, unknown>): Promise<Reply> {
    const reply = this.next();
    this.process.stdin.write(`${JSON.stringify(command)}\n`);
    return reply;
  }

  async kill(): Promise<void> {
    this.process.kill("SIGKILL");
    await this.exited;
  }
}

const RACERS = 8;
const ROUNDS = 100;
const HELD = /is already served by (pid \d+ \(|a process that is still starting)/;

let child: ChildModules;
let script: string;
let base: string;
let racers: Worker[];

beforeAll(async () => {
  child = transpileForChild(["errors", "files", "process-identity", "elector", "election"]);
  script = child.script("elector.mjs", WORKER(child.url("election")));
  base = mkdtempSync(path.join(tmpdir(), "berth-election-"));
  racers = Array.from({ length: RACERS }, () => new Worker(script));
  await Promise.all(racers.map((racer) => racer.ready));
});

afterAll(async () => {
  await Promise.all(racers.map((racer) => racer.kill()));
  rmSync(base, { recursive: true, force: true });
  child.remove();
});

/** One race of all racers on `stateDir`; returns the winners and the losers' messages. */
async function race(stateDir: string): Promise<{ winners: Worker[]; messages: string[] }> {
  const at = Date.now() + 15;
  const replies = await Promise.all(racers.map((racer) => racer.send({ op: "acquire", stateDir, name: "sessions", at })));
  const winners = racers.filter((_, i) => replies[i]!.result === "WIN");
  const messages = replies.filter((reply) => reply.result === "LOSE").map((reply) => `${reply.name}: ${reply.message}`);
  return { winners, messages };
}

async function releaseAll(): Promise<void> {
  await Promise.all(racers.map((racer) => racer.send({ op: "release" })));
}

describe("racing processes", () => {
  it(`elect exactly one of ${RACERS} when there is no lock file, ${ROUNDS} rounds`, async () => {
    for (let round = 0; round < ROUNDS; round++) {
      const stateDir = path.join(base, `fresh-${round}`, "state");
      const { winners, messages } = await race(stateDir);
      expect(winners.length, `round ${round}`).toBe(1);
      for (const message of messages) expect(message).toMatch(/^ElectionHeldError: /);
      for (const message of messages) expect(message).toMatch(HELD);
      expect(readClaim(electionLockPath(stateDir, "sessions"))?.pid).toBe(winners[0]!.pid);
      await releaseAll();
    }
  }, 90_000);

  it(`elect exactly one of ${RACERS} over a claim left by a SIGKILLed holder, ${ROUNDS} rounds`, async () => {
    const stateDir = path.join(base, "dead-holder");
    const lockPath = electionLockPath(stateDir, "sessions");
    // Holders for the next rounds start while this one runs: node start-up is the slow part.
    const upcoming = Array.from({ length: 3 }, () => new Worker(script));
    for (let round = 0; round < ROUNDS; round++) {
      const holder = upcoming.shift()!;
      if (round + upcoming.length + 1 < ROUNDS) upcoming.push(new Worker(script));
      await holder.ready;
      expect((await holder.send({ op: "acquire", stateDir, name: "sessions", at: 0 })).result).toBe("WIN");
      await holder.kill();
      const left = readClaim(lockPath);
      expect(left?.pid).toBe(holder.pid);
      expect(claimIsLive(left!)).toBe(false);

      const { winners, messages } = await race(stateDir);
      expect(winners.length, `round ${round}`).toBe(1);
      for (const message of messages) expect(message).toMatch(HELD);
      expect(readClaim(lockPath)?.pid).toBe(winners[0]!.pid);
      await releaseAll();
    }
  }, 90_000);
});

describe("a live holder", () => {
  it("is never broken, and losers name it", async () => {
    const stateDir = path.join(base, "live");
    const holder = new Worker(script);
    try {
      await holder.ready;
      expect((await holder.send({ op: "acquire", stateDir, name: "sessions", at: 0 })).result).toBe("WIN");
      const before = readFileSync(electionLockPath(stateDir, "sessions"), "utf8");
      for (let round = 0; round < 5; round++) {
        const { winners, messages } = await race(stateDir);
        expect(winners).toEqual([]);
        for (const message of messages) {
          expect(message).toContain(`${stateDir} is already served by pid ${holder.pid} (sessions, started `);
          expect(message).toContain("stop it first or choose another --state-dir");
        }
      }
      expect(() => acquireElection(stateDir, "sessions")).toThrow(ElectionHeldError);
      expect(readFileSync(electionLockPath(stateDir, "sessions"), "utf8")).toBe(before);
      expect(claimIsLive(readClaim(electionLockPath(stateDir, "sessions"))!)).toBe(true);
    } finally {
      await holder.kill();
    }
  });

  it("in this process survives a failed second attempt closing its own descriptor", async () => {
    const stateDir = path.join(base, "same-process");
    const lock = acquireElection(stateDir, "budget");
    try {
      const error = (() => {
        try {
          acquireElection(stateDir, "budget");
        } catch (e) {
          return e as ElectionHeldError;
        }
        return undefined;
      })();
      expect(error).toBeInstanceOf(ElectionHeldError);
      expect(error!.code).toBe("unavailable");
      expect(error!.holder?.pid).toBe(process.pid);
      expect(error!.details).toMatchObject({ stateDir, holder: { pid: process.pid } });
      // fcntl locks would have been dropped by that close; flock is per open file, so we still hold it.
      const [racer] = racers;
      const reply = await racer!.send({ op: "acquire", stateDir, name: "budget", at: 0 });
      expect(reply.result).toBe("LOSE");
      expect(reply.message).toContain(`pid ${process.pid} `);
    } finally {
      lock.release();
    }
  });
});

describe("claims on disk", () => {
  const self = selfIdentity();
  const claim = (overrides: Partial<ElectionClaim>): ElectionClaim => ({ ...self, at: new Date().toISOString(), service: "sessions", ...overrides });

  it("one whose pid is alive but whose start time differs is dead, and is taken", () => {
    const stateDir = path.join(base, "reused-pid");
    const lockPath = electionLockPath(stateDir, "sessions");
    acquireElection(stateDir, "sessions").release();
    const stale = claim({ startTime: self.startTime! + 1 });
    writeFileSync(lockPath, JSON.stringify(stale));
    expect(claimIsLive(readClaim(lockPath)!)).toBe(false);
    const lock = acquireElection(stateDir, "sessions");
    try {
      expect(readClaim(lockPath)).toEqual(lock.claim);
      expect(lock.claim.startTime).toBe(self.startTime);
    } finally {
      lock.release();
    }
  });

  it("one from another boot or another host is dead; our own is live", () => {
    expect(claimIsLive(claim({}))).toBe(true);
    expect(claimIsLive(claim({ bootId: "00000000-0000-4000-8000-000000000000" }))).toBe(false);
    expect(claimIsLive(claim({ hostname: `${self.hostname}.elsewhere` }))).toBe(false);
  });

  it.each([
    ["empty", ""],
    ["half-written", '{"pid": 12'],
    ["naming a dead pid", JSON.stringify({ pid: 999_999_999, startTime: 1, hostname: "vm", at: "then", service: "sessions" })],
  ])("one caught %s while a live process holds the lock is not taken", async (_, content) => {
    const stateDir = path.join(base, `starting-${content.length}`);
    const lockPath = electionLockPath(stateDir, "sessions");
    acquireElection(stateDir, "sessions").release();
    writeFileSync(lockPath, content);
    const starter = new Worker(script);
    try {
      await starter.ready;
      expect((await starter.send({ op: "flock-only", path: lockPath })).result).toBe("locked");
      expect(() => acquireElection(stateDir, "sessions")).toThrow(
        `${stateDir} is already served by a process that is still starting; stop it first or choose another --state-dir`,
      );
      expect(readFileSync(lockPath, "utf8")).toBe(content);
      const { winners } = await race(stateDir);
      expect(winners).toEqual([]);
    } finally {
      await starter.kill();
    }
  });

  it("readClaim gives undefined for what is not a claim", () => {
    const file = path.join(base, "not-a-claim");
    for (const content of ["", "null", "[]", '"x"', '{"pid":"1","hostname":"h"}', '{"pid":1.5,"hostname":"h"}', '{"pid":1}']) {
      writeFileSync(file, content);
      expect(readClaim(file), content).toBeUndefined();
    }
    expect(readClaim(path.join(base, "missing"))).toBeUndefined();
  });
});

describe("release", () => {
  it("releases only once, clears the claim and keeps the file", async () => {
    const stateDir = path.join(base, "release");
    const lock = acquireElection(stateDir, "sessions");
    expect(statSync(stateDir).mode & 0o777).toBe(0o700);
    expect(statSync(lock.path).mode & 0o777).toBe(0o600);
    lock.release();
    lock.release();
    expect(statSync(lock.path).size).toBe(0);
    const { winners } = await race(stateDir);
    expect(winners.length).toBe(1);
    // A stale release object must not touch the new holder's lock.
    lock.release();
    expect(readClaim(lock.path)?.pid).toBe(winners[0]!.pid);
    await releaseAll();
  });

  it("refuses an election name that is not a plain word", () => {
    expect(() => acquireElection(base, "../x")).toThrow(/^election name: /);
    expect(() => acquireElection(base, "")).toThrow(/^election name: /);
  });
});
