/**
 * The election lock of a state directory, against real processes: one live service per state
 * directory; a second one refuses at once and names the holder; a SIGKILLed holder leaves nothing
 * that blocks its successor; and two instances started together never both serve.
 */
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { grpcJsHealthClient, launchService, makeTempDir, SERVERS_OF, startService, stopAll, type ServiceKind, type ServiceProcess } from "./harness.js";

afterEach(stopAll);
afterAll(stopAll);

const KINDS: readonly ServiceKind[] = ["sessions", "budget", "up"];

/** Generous for a loaded 2-core machine: node's own start-up is most of it. "At once" means no waiting on the holder. */
const REFUSAL_WITHIN_MS = 10_000;

/** The lock file the refusal is decided on (the first one `kind` takes). */
function firstLockFile(kind: ServiceKind, stateDir: string): string {
  return path.join(stateDir, `${SERVERS_OF[kind][0]}.lock`);
}

async function expectServing(service: ServiceProcess): Promise<void> {
  for (const server of SERVERS_OF[service.kind]) {
    const health = grpcJsHealthClient(service.url(server));
    try {
      expect(await health.check(), `${service.kind} pid ${service.pid}: ${server}`).toEqual({ status: "SERVING" });
    } finally {
      health.close();
    }
  }
}

/** Launches an instance expected to refuse, and checks it refused at once, naming `holder`. */
async function expectRefused(kind: ServiceKind, stateDir: string, holder: ServiceProcess): Promise<void> {
  const started = performance.now();
  const second = launchService(kind, { stateDir });
  const outcome = await second.outcome;
  const elapsedMs = performance.now() - started;
  expect(outcome.state, second.output()).toBe("exited");
  const status = second.exitStatus()!;
  expect(status.signal, second.output()).toBeNull();
  expect(status.code, second.output()).not.toBe(0);
  expect(second.stderr()).toContain(`already served by pid ${holder.pid}`);
  expect(second.stderr()).toContain(stateDir);
  expect(elapsedMs).toBeLessThan(REFUSAL_WITHIN_MS);
}

describe.each(KINDS)("%s", (kind) => {
  it("a second instance on the same state directory exits non-zero at once, naming the holder's pid on stderr", async () => {
    const holder = await startService(kind);
    await expectRefused(kind, holder.stateDir, holder);
    // The refusal took nothing from the holder.
    await expectServing(holder);
    for (const server of SERVERS_OF[kind]) {
      expect(JSON.parse(readFileSync(path.join(holder.stateDir, `${server}.lock`), "utf8"))).toMatchObject({ pid: holder.pid });
    }
  });

  it("after SIGKILL of the holder, a new instance takes over at once", async () => {
    const holder = await startService(kind);
    expect(await holder.kill()).toEqual({ code: null, signal: "SIGKILL" });
    // The dead holder's claim is still in the file: only the kernel lock, gone with the process, decides.
    expect(JSON.parse(readFileSync(firstLockFile(kind, holder.stateDir), "utf8"))).toMatchObject({ pid: holder.pid });

    const successor = await startService(kind, { stateDir: holder.stateDir });
    await expectServing(successor);
    // The successor's claim replaced the dead one: the next refusal names the live process.
    await expectRefused(kind, holder.stateDir, successor);
  });
});

it("two instances started at the same moment on one state directory: exactly one serves, the other exits naming it (10 rounds)", async () => {
  const stateDir = path.join(makeTempDir(), "state");
  for (let round = 0; round < 10; round++) {
    // Rotate the kinds, and end each round alternately with SIGTERM (the lock released, the claim
    // cleared) and SIGKILL (a dead holder's claim left in the file), so each round races over both.
    const kind = KINDS[round % KINDS.length]!;
    const contenders = [launchService(kind, { stateDir }), launchService(kind, { stateDir })];
    const outcomes = await Promise.all(contenders.map((c) => c.outcome));
    const context = `round ${round} (${kind}):\n${contenders.map((c) => c.output()).join("\n")}`;

    const winners = contenders.filter((_, i) => outcomes[i]!.state === "listening");
    expect(winners.length, context).toBe(1);
    const winner = winners[0]!;
    const loser = contenders.find((c) => c !== winner)!;
    const status = loser.exitStatus()!;
    expect(status.signal, context).toBeNull();
    expect(status.code, context).not.toBe(0);
    expect(loser.stderr(), context).toContain(`${stateDir} is already served by`);
    // The loser waits briefly for the winner's claim, so it names the winner even when it lost
    // the race in the instant between the winner's lock and its claim.
    expect(loser.stderr(), context).toContain(`already served by pid ${winner.pid}`);

    await expectServing(winner);
    if (round % 2 === 0) expect(await winner.stop(), context).toEqual({ code: 0, signal: null });
    else await winner.kill();
  }
}, 60_000);
