/**
 * Election suite (docs/architecture.md, "Tests and benchmarks"): "one daemon per state directory", proved against real
 * processes. Each round launches two instances of one kind at the same moment on that kind's state
 * directory: exactly one must serve (listening, health SERVING, its pid in every lock file it
 * takes) and the other must exit non-zero with a message naming the winner's pid. The winner then
 * stays the holder until that kind's next round, which starts by SIGKILLing it: the two instances
 * launched the moment it is gone race over the dead holder's claim, and one of them must take over
 * at once — on the first try, with no lease to wait out. The takeover time (holder gone → successor
 * SERVING) is reported beside the start time on a fresh directory, which is what it should match.
 *
 * The kinds rotate: `sessions`, `budget` and `up` (both services in one process, two locks), each
 * on its own state directory, `ELECTION_ROUNDS` rounds in all (default 50).
 */
import { readFileSync } from "node:fs";
import * as path from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { launchService, makeTempDir, SERVERS_OF, stopAll, type ServiceKind, type ServiceProcess } from "../../harness.js";
import { chaosSetting, reportSuite } from "../common/summary.js";

afterAll(stopAll);

const ROUNDS = chaosSetting("ELECTION_ROUNDS", 50);
const KINDS: readonly ServiceKind[] = ["sessions", "budget", "up"];
/** Two node processes starting at once on a loaded 2-core machine: generous, and still a bound. */
const READY_TIMEOUT_MS = 60_000;

function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return Math.round(sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!);
}

describe("election (two instances at once; SIGKILL of the holder; takeover)", () => {
  it(`${ROUNDS} rounds: exactly one serves, the other names it; a killed holder is replaced at once`, async () => {
    const began = performance.now();
    let violations = 0;
    const messages: string[] = [];
    const violation = (message: string) => {
      violations++;
      if (messages.length < 30) messages.push(message);
    };
    const figures = {
      races: 0,
      takeovers: 0,
      refusals: 0,
      takeoverMs: [] as number[],
      freshStartMs: [] as number[],
      refusalMs: [] as number[],
      byKind: Object.fromEntries(KINDS.map((kind) => [kind, 0])) as Record<string, number>,
    };

    const stateDirs = new Map(KINDS.map((kind) => [kind, path.join(makeTempDir(`berth-chaos-election-${kind}-`), "state")]));
    const holders = new Map<ServiceKind, ServiceProcess>();

    for (let round = 1; round <= ROUNDS; round++) {
      const kind = KINDS[(round - 1) % KINDS.length]!;
      const stateDir = stateDirs.get(kind)!;
      figures.byKind[kind]!++;
      const at = `round ${round} (${kind})`;

      // The holder of this kind's directory since its last round: still serving, then killed.
      let goneAt: number | undefined;
      const holder = holders.get(kind);
      if (holder) {
        if (holder.exitStatus() !== undefined)
          violation(`${at}: the holder (pid ${holder.pid}) had exited by itself: ${JSON.stringify(holder.exitStatus())}\n${holder.output()}`);
        const status = await holder.kill();
        goneAt = performance.now();
        if (status.signal !== "SIGKILL") violation(`${at}: the holder ended with ${JSON.stringify(status)}, not by the SIGKILL`);
        holders.delete(kind);
      }

      // Two instances launched the same moment (over the dead holder's claim, after the first round).
      const launchedAt = performance.now();
      const contenders = [0, 1].map(() => launchService(kind, { stateDir, readyTimeoutMs: READY_TIMEOUT_MS }));
      const exitedAt = contenders.map((c) => c.exited.then(() => performance.now()));
      figures.races++;
      const outcomes = await Promise.all(contenders.map((c) => c.outcome));
      const context = () => contenders.map((c) => c.output()).join("\n");
      const winners = contenders.filter((_, i) => outcomes[i]!.state === "listening");
      if (winners.length !== 1) {
        violation(`${at}: ${winners.length} of the two instances listened\n${context()}`);
        await Promise.all(contenders.map((c) => c.kill()));
        continue;
      }
      const winner = winners[0]!;
      const loser = contenders.find((c) => c !== winner)!;

      // The winner serves every server of its kind, and every lock file it takes names it.
      try {
        await winner.ready;
      } catch (error) {
        violation(`${at}: the winner (pid ${winner.pid}) did not answer health with SERVING: ${(error as Error).message}`);
        await winner.kill();
        continue;
      }
      const servingAt = performance.now();
      if (goneAt === undefined) figures.freshStartMs.push(servingAt - launchedAt);
      else {
        figures.takeovers++;
        figures.takeoverMs.push(servingAt - goneAt);
      }
      for (const server of SERVERS_OF[kind]) {
        let claimPid: unknown;
        try {
          claimPid = (JSON.parse(readFileSync(path.join(stateDir, `${server}.lock`), "utf8")) as { pid?: unknown }).pid;
        } catch (error) {
          claimPid = `unreadable: ${(error as Error).message}`;
        }
        if (claimPid !== winner.pid) violation(`${at}: ${server}.lock names ${String(claimPid)}, the winner is pid ${winner.pid}`);
      }

      // The loser exits by itself, non-zero, naming the winner — never having listened.
      const status = await loser.exited;
      figures.refusals++;
      figures.refusalMs.push((await exitedAt[contenders.indexOf(loser)]!) - launchedAt);
      if (status.signal !== null || status.code === 0) violation(`${at}: the loser (pid ${loser.pid}) ended with ${JSON.stringify(status)}\n${loser.output()}`);
      if (!loser.stderr().includes(`${stateDir} is already served by pid ${winner.pid}`)) {
        violation(`${at}: the loser's message does not name the winner (pid ${winner.pid}):\n${loser.stderr()}`);
      }
      if (loser.entries().some((entry) => entry.msg === "listening")) violation(`${at}: the loser listened before exiting\n${loser.output()}`);

      holders.set(kind, winner);
    }

    // The last holders stop cleanly.
    for (const [kind, holder] of holders) {
      const status = await holder.stop();
      if (status.code !== 0) violation(`final (${kind}): the holder stopped with ${JSON.stringify(status)}`);
    }

    reportSuite({
      suite: "election",
      rounds: figures.races,
      operations: figures.races * 2, // instances launched
      violations,
      takeovers: figures.takeovers,
      refusals: figures.refusals,
      kinds: figures.byKind,
      takeoverMsP50: percentile(figures.takeoverMs, 50),
      takeoverMsMax: percentile(figures.takeoverMs, 100),
      freshStartMsP50: percentile(figures.freshStartMs, 50),
      refusalMsP50: percentile(figures.refusalMs, 50),
      refusalMsMax: percentile(figures.refusalMs, 100),
      seconds: Math.round((performance.now() - began) / 100) / 10,
    });
    expect(messages).toEqual([]);
    expect(violations).toBe(0);
  });
});
