/**
 * Running out of file descriptors, end to end: a service started under `ulimit -n 256` meets a
 * crowd of 1,000 clients, each on a connection of its own holding a stream (WatchSession reading
 * its backlog from a journal on the sessions service, WatchMachine on the budget), while a client
 * connected before the crowd touches 1,000 distinct sessions (registers running work in the
 * budget's tally) and a health checker opens a fresh connection for every probe.
 *
 * The promises: no call is ever answered INTERNAL; a call the service refuses for want of
 * descriptors is RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES with a RetryInfo (a connection beyond
 * every descriptor the service can give is closed unanswered: counted, not a failure);
 * `grpc.health.v1.Health/Check` on a fresh connection answers SERVING throughout (but while the
 * crowd's thousand connections arrive at once, when its connection may be closed unanswered with
 * theirs: counted apart, never refused nor INTERNAL); the journals held open stay within the
 * service's share of the limit; and once the crowd has left, every refused call succeeds at its
 * first retry. The sessions service on the file store and on etcd (which keeps no journal open,
 * but whose client needs descriptors for its connections to etcd), and the budget.
 */
import { readdirSync, readlinkSync } from "node:fs";
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { Health, HealthCheckResponse_ServingStatus } from "@berth/api/grpc/health/v1/health_pb";
import { descriptorShares } from "@berth/shared/descriptors";
import { closeClient, connectClient, onStore, startService, stopAll, STORES, storeTags, type ServiceProcess } from "./harness.js";

afterAll(stopAll);

const FD_LIMIT = 256;
const CROWD = 1000;
const TOUCHED = 1000;
/** Sessions with a backlog the crowd's watchers read from the journal. */
const WATCHED = 50;
/** How many of the crowd's refused members retry once it has left (each on a connection of its own). */
const RETRYING = 200;
/** How long the crowd's members have to hold their stream or be turned away. */
const CROWD_SETTLE_MS = 90_000;
/** Registrations in the budget's running tally during the crowd (each rewrites the whole tally file). */
const REGISTERED = 200;

/** What became of one call: served, refused as promised, a broken promise, or a connection closed unanswered. */
type Outcome = { kind: "ok" } | { kind: "refused"; detail: string } | { kind: "violation"; detail: string } | { kind: "dropped"; detail: string };

/**
 * A failed call's outcome. Answered by the service (every error of berth's carries an ErrorInfo),
 * it must be RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES with a RetryInfo (or, on etcd, UNAVAILABLE
 * ETCD_UNAVAILABLE with one: etcd did not answer within the request timeout); without an ErrorInfo the
 * service closed the connection unanswered (or never took it), which the client reports as it
 * sees fit, but never as INTERNAL.
 */
function outcomeOf(error: unknown): Outcome {
  const connect = ConnectError.from(error);
  const reason = connect.findDetails(ErrorInfoSchema)[0]?.reason;
  const detail = `${Code[connect.code]} ${reason ?? "(no ErrorInfo)"}: ${connect.rawMessage}`;
  if (reason === undefined) return connect.code === Code.Internal ? { kind: "violation", detail } : { kind: "dropped", detail };
  const retry = connect.findDetails(RetryInfoSchema).length > 0;
  if (connect.code === Code.ResourceExhausted && reason === "TOO_MANY_OPEN_FILES" && retry) return { kind: "refused", detail };
  // etcd slower than the request timeout (both cores busy beside the crowd): a refusal to retry as well, never about descriptors.
  if (connect.code === Code.Unavailable && reason === "ETCD_UNAVAILABLE" && retry) return { kind: "refused", detail };
  return { kind: "violation", detail };
}

async function outcome(call: Promise<unknown>): Promise<Outcome> {
  try {
    await call;
    return { kind: "ok" };
  } catch (error) {
    return outcomeOf(error);
  }
}

/** Counts of outcomes, with the first few details of each kind. */
class Tally {
  readonly counts = { ok: 0, refused: 0, violation: 0, dropped: 0 };
  readonly samples: Record<Outcome["kind"], string[]> = { ok: [], refused: [], violation: [], dropped: [] };
  add(result: Outcome): Outcome {
    this.counts[result.kind]++;
    if (result.kind !== "ok" && this.samples[result.kind].length < 3) this.samples[result.kind].push(result.detail);
    return result;
  }
  get total(): number {
    return this.counts.ok + this.counts.refused + this.counts.violation + this.counts.dropped;
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Health checks SERVING, each on a fresh connection (as a probe of an orchestrator opens one),
 * every `everyMs` until stopped: the probes that overlap the crowd's connecting are counted apart
 * (`connecting`: a probe's connection may then be one of those closed unanswered, or wait in the
 * kernel's backlog behind a thousand, as nothing tells it from the crowd's before its request is
 * read); at all other times (`steady`) every probe must be answered.
 */
function healthProbes(url: string, everyMs: number) {
  const tallies = { connecting: new Tally(), steady: new Tally() };
  let connecting = false;
  /** Crowds that started connecting so far. */
  let crowds = 0;
  let running = true;
  const loop = (async () => {
    // Stopped once asked and once more than ten probes fell outside the crowds' connecting: the
    // count the tests require, whatever the machine's speed made of the phases' length.
    while (running || tallies.steady.total <= 10) {
      const health = connectClient(Health, url, { protocol: "grpc", defaultTimeoutMs: 5_000 });
      const crowdsBefore = crowds;
      const overlapsBefore = connecting;
      const result = await outcome(
        health.check({}).then((answer) => {
          if (answer.status !== HealthCheckResponse_ServingStatus.SERVING) throw new Error(`health answered ${answer.status}`);
        }),
      );
      tallies[overlapsBefore || connecting || crowds !== crowdsBefore ? "connecting" : "steady"].add(result);
      closeClient(health);
      await sleep(everyMs);
    }
  })();
  return {
    ...tallies,
    /** Counts the probes made until `crowdConnecting` settles apart. */
    async whileConnecting<T>(crowdConnecting: Promise<T>): Promise<T> {
      connecting = true;
      crowds++;
      try {
        return await crowdConnecting;
      } finally {
        connecting = false;
      }
    },
    /** Stops probing, after more than ten steady probes in all. */
    async stop() {
      running = false;
      await loop;
    },
  };
}

/**
 * `count` clients, each on a connection of its own, opening a stream with `open` and holding it.
 * Resolves once each one's stream delivers (held) or has ended (refused or dropped, its index kept
 * for a retry). `leave()` closes them all.
 */
async function crowd(count: number, open: (i: number, signal: AbortSignal) => AsyncIterable<unknown>) {
  const tally = new Tally();
  const aborts: AbortController[] = [];
  const turnedAway: number[] = [];
  const ended: Promise<void>[] = [];
  let holding = 0;
  let settledCount = 0;
  const connecting = Promise.all(
    Array.from(
      { length: count },
      (_, i) =>
        new Promise<void>((resolve) => {
          let once = false;
          const settled = () => {
            if (once) return;
            once = true;
            settledCount++;
            resolve();
          };
          const abort = new AbortController();
          aborts.push(abort);
          ended.push(
            (async () => {
              let held = false;
              try {
                // Held once the first message comes; the rest is read until the client leaves.
                for await (const _message of open(i, abort.signal)) {
                  if (held) continue;
                  held = true;
                  holding++;
                  settled();
                }
              } catch (error) {
                if (!abort.signal.aborted && tally.add(outcomeOf(error)).kind !== "ok") turnedAway.push(i);
              } finally {
                settled();
              }
            })(),
          );
        }),
    ),
  );
  // A member that neither delivers nor ends within the deadline is counted (and let go) rather
  // than holding the test until its timeout, which would say nothing of where it hung.
  let deadline: NodeJS.Timeout | undefined;
  await Promise.race([connecting, new Promise<void>((resolve) => (deadline = setTimeout(resolve, CROWD_SETTLE_MS)))]);
  clearTimeout(deadline);
  const stuck = count - settledCount;
  return {
    tally,
    holding,
    turnedAway,
    /** Members whose stream neither delivered nor ended within {@link CROWD_SETTLE_MS}. */
    stuck,
    async leave() {
      for (const abort of aborts) abort.abort();
      await Promise.all(ended);
    },
  };
}

/** Descriptors `pid` holds (/proc/PID/fd): all of them, and its journals. */
function descriptorsOf(pid: number): { all: number; journals: number } {
  let all = 0;
  let journals = 0;
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    all++;
    try {
      if (readlinkSync(`/proc/${pid}/fd/${fd}`).endsWith(".jsonl")) journals++;
    } catch {
      // closed while we looked
    }
  }
  return { all, journals };
}

/** Resolves once `pid` holds fewer than half its limit of descriptors: the service has seen the crowd's connections close. */
async function crowdGone(service: ServiceProcess): Promise<void> {
  const deadline = performance.now() + 20_000;
  while (descriptorsOf(service.pid).all >= FD_LIMIT / 2) {
    if (performance.now() > deadline) throw new Error(`the service still holds ${descriptorsOf(service.pid).all} descriptors 20 s after the crowd left`);
    await sleep(20);
  }
}

function sessionsClientOf(url: string): Client<typeof SessionService> {
  return connectClient(SessionService, url, { protocol: "grpc", defaultTimeoutMs: 60_000 });
}

/** A watch of `sessionId` from seq 1 on a connection of its own, closed with the signal. */
function watchAlone(url: string, sessionId: string, signal: AbortSignal): AsyncIterable<unknown> {
  const client = connectClient(SessionService, url, { protocol: "grpc", defaultTimeoutMs: 600_000 });
  signal.addEventListener("abort", () => closeClient(client), { once: true });
  return client.watchSession({ sessionId, fromSeq: 1n }, { signal });
}

/** Retries each of `indexes` once, `batch` at a time, each a watch read to its caught-up marker on a connection of its own. */
async function retryWatches(url: string, indexes: readonly number[], batch: number): Promise<Tally> {
  const tally = new Tally();
  for (let from = 0; from < indexes.length; from += batch) {
    await Promise.all(
      indexes.slice(from, from + batch).map(async (i) => {
        const abort = new AbortController();
        tally.add(
          await outcome(
            (async () => {
              for await (const message of watchAlone(url, `watched-${i % WATCHED}`, abort.signal)) {
                if ((message as { kind: { case: string } }).kind.case === "caughtUp") return;
              }
              throw new Error("the watch ended before its caught-up marker");
            })(),
          ),
        );
        abort.abort();
      }),
    );
  }
  return tally;
}

const checkpoint = (reason: string) => ({ kind: { case: "checkpoint" as const, value: { reason } } });

for (const store of STORES) {
  describe(`the sessions service under ulimit -n ${FD_LIMIT} (${store} store)`, storeTags(store), () => {
    it(`meets a crowd of ${CROWD} watchers while a client touches ${TOUCHED} sessions: no INTERNAL, refusals TOO_MANY_OPEN_FILES, health answers, retries succeed once the crowd leaves`, {
      timeout: 240_000,
    }, async () => {
      const service = await startService("sessions", await onStore(store, { fdLimit: FD_LIMIT }));
      const url = service.url("sessions");
      const started = service.entries().find((entry) => entry.msg === "session journals");
      const client = sessionsClientOf(url);
      for (let i = 0; i < WATCHED; i++) {
        await client.appendEvents({ sessionId: `watched-${i}`, events: Array.from({ length: 20 }, (_, n) => checkpoint(`backlog ${n}`)) });
      }
      const health = healthProbes(url, 100);

      const watchers = await health.whileConnecting(crowd(CROWD, (i, signal) => watchAlone(url, `watched-${i % WATCHED}`, signal)));
      const touches = new Tally();
      const refusedTouches: number[] = [];
      let most = { all: 0, journals: 0 };
      for (let i = 0; i < TOUCHED; i++) {
        if (touches.add(await outcome(client.appendEvent({ sessionId: `touched-${i}`, event: checkpoint("touch") }))).kind !== "ok") refusedTouches.push(i);
        if (i % 50 === 0) {
          const now = descriptorsOf(service.pid);
          most = { all: Math.max(most.all, now.all), journals: Math.max(most.journals, now.journals) };
        }
      }
      await watchers.leave();
      await crowdGone(service);

      const retriedTouches = new Tally();
      for (const i of refusedTouches) retriedTouches.add(await outcome(client.appendEvent({ sessionId: `touched-${i}`, event: checkpoint("retry") })));
      const retriedWatches = await retryWatches(url, watchers.turnedAway.slice(0, RETRYING), 50);
      const fresh = new Tally();
      fresh.add(await outcome(client.appendEvent({ sessionId: "after-the-crowd", event: checkpoint("after") })));
      await health.stop();
      await service.stop();

      const report = JSON.stringify({
        started,
        holding: watchers.holding,
        stuck: watchers.stuck,
        watchers: watchers.tally,
        touches,
        retriedTouches,
        retriedWatches,
        fresh,
        health: { connecting: health.connecting, steady: health.steady },
        most,
      });
      // Journals: the file store bounds those it keeps open by its share of the limit (plus, maybe,
      // the one a read has open at the moment /proc is looked at); etcd keeps none.
      expect(started?.openJournals, report).toBe(store === "file" ? descriptorShares(FD_LIMIT).journals : undefined);
      expect(most.journals, report).toBeLessThanOrEqual(descriptorShares(FD_LIMIT).journals + 1);
      // The crowd: as many as the share of connections held their stream; the others were refused or closed, never INTERNAL.
      expect(watchers.stuck, report).toBe(0);
      expect(watchers.holding, report).toBeGreaterThan(0);
      expect(watchers.holding + watchers.turnedAway.length, report).toBe(CROWD);
      expect(watchers.tally.counts.violation, report).toBe(0);
      expect(touches.counts.violation + touches.counts.dropped, report).toBe(0);
      // Once the crowd has left, every refused call succeeds at its first retry.
      expect(retriedTouches.counts.ok, report).toBe(refusedTouches.length);
      expect(retriedWatches.counts.ok, report).toBe(Math.min(RETRYING, watchers.turnedAway.length));
      expect(fresh.counts.ok, report).toBe(1);
      // Health answered SERVING to every probe, throughout.
      expect(health.steady.total, report).toBeGreaterThan(10);
      expect(health.steady.counts.ok, report).toBe(health.steady.total);
      expect(health.connecting.counts.refused + health.connecting.counts.violation, report).toBe(0);
      console.log(`descriptors, sessions on ${store}: ${report}`);
    });
  });
}

describe(`the budget service under ulimit -n ${FD_LIMIT}`, () => {
  it(`meets a crowd of ${CROWD} machine watchers while a client registers running work: no INTERNAL, refusals TOO_MANY_OPEN_FILES, health answers, retries succeed once the crowd leaves`, {
    timeout: 240_000,
  }, async () => {
    const service = await startService("budget", { fdLimit: FD_LIMIT, args: ["--memory", "100G", "--reserve", "0"] });
    const url = service.url("budget");
    const client = connectClient(BudgetService, url, { protocol: "grpc", defaultTimeoutMs: 60_000 });
    // Connected before the crowd comes.
    await client.getLimits({});
    const health = healthProbes(url, 100);
    // Seconds each phase took: where the time went if a phase is slow on a busy machine.
    const phases: Record<string, number> = {};
    let phaseStart = performance.now();
    const phase = (name: string) => {
      phases[name] = Math.round(performance.now() - phaseStart) / 1000;
      phaseStart = performance.now();
    };
    const watchers = await health.whileConnecting(
      crowd(CROWD, (_i, signal) => {
        const member = connectClient(BudgetService, url, { protocol: "grpc", defaultTimeoutMs: 600_000 });
        signal.addEventListener("abort", () => closeClient(member), { once: true });
        return member.watchMachine({}, { signal });
      }),
    );
    phase("crowd");
    const register = (name: string) => client.registerRunning({ name, costSource: { case: "cost", value: { memoryBytes: 1n, cpu: 0 } } });
    const registrations = new Tally();
    const refused: number[] = [];
    for (let i = 0; i < REGISTERED; i++) if (registrations.add(await outcome(register(`during-${i}`))).kind !== "ok") refused.push(i);
    phase("registrations");
    await watchers.leave();
    await crowdGone(service);
    phase("leave");
    const retried = new Tally();
    for (const i of refused) retried.add(await outcome(register(`during-${i}`)));
    const retriedWatches = new Tally();
    await Promise.all(
      watchers.turnedAway.slice(0, 50).map(async () => {
        const member = connectClient(BudgetService, url, { protocol: "grpc", defaultTimeoutMs: 30_000 });
        retriedWatches.add(
          await outcome(
            (async () => {
              for await (const _sample of member.watchMachine({})) return;
            })(),
          ),
        );
        closeClient(member);
      }),
    );
    phase("retries");
    await health.stop();
    await service.stop();

    const report = JSON.stringify({
      holding: watchers.holding,
      stuck: watchers.stuck,
      watchers: watchers.tally,
      registrations,
      retried,
      retriedWatches,
      health: { connecting: health.connecting, steady: health.steady },
      phases,
    });
    expect(watchers.stuck, report).toBe(0);
    expect(watchers.holding, report).toBeGreaterThan(0);
    expect(watchers.tally.counts.violation, report).toBe(0);
    expect(registrations.counts.violation + registrations.counts.dropped, report).toBe(0);
    expect(retried.counts.ok, report).toBe(refused.length);
    expect(retriedWatches.counts.ok, report).toBe(Math.min(50, watchers.turnedAway.length));
    expect(health.steady.total, report).toBeGreaterThan(10);
    expect(health.steady.counts.ok, report).toBe(health.steady.total);
    expect(health.connecting.counts.refused + health.connecting.counts.violation, report).toBe(0);
    console.log(`descriptors, budget: ${report}`);
  });
});
