/**
 * Sleep and wake: a service stopped with SIGSTOP for longer than every lease (as a laptop's lid
 * stops it), under load, then resumed with SIGCONT.
 *
 * Sessions: leases held (one never renewed, one renewed until the pause), lock waiters queued
 * behind them (some of whose clients leave during the pause: one cancels its call, the
 * connections of others close, over gRPC and over Connect and gRPC-Web on HTTP/1.1), Hold streams,
 * watchers, and appends sent while it is stopped. After it resumes: never two holders of a file
 * and no grant to a client that left (from the service's own log of grants and ends), the first
 * live waiter granted within a second of SIGCONT, every lease that ran out ends once, in the order
 * they ran out, the live waiters get the locks in order, and every watcher has seen every entry in
 * order or was ended as lagged (and, resuming, sees the rest).
 *
 * Budget: a leased reservation that runs out during the pause, with admissions queued behind it on
 * Reserve calls and Admit streams, some of whose clients leave during the pause (the same ways).
 * After it resumes: no admission of a client that left (the service's log of admissions), the
 * first live waiter admitted within a second of SIGCONT, the rest in order.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { NeedItemKind, type NeedSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { KeepAliveStreamRequestSchema } from "@berth/api/berth/locks/v1/lock_service_pb";
import { continueProcess, stopProcess } from "@berth/shared/testing/process-stop";
import { makeTempDir, startService } from "../../harness.js";
import {
  budgetClient,
  type ClientProtocol,
  type Findings,
  show,
  judgeLockEvents,
  lockEvents,
  ms,
  sessionsClient,
  sleep,
  until,
  within,
  type SessionsClient,
} from "./machine-world.js";

/** A request stream fed by `push`, ended by `end`. */
function requestStream<T>() {
  const items: T[] = [];
  let ended = false;
  let wake: (() => void) | undefined;
  return {
    push(item: T) {
      items.push(item);
      wake?.();
    },
    end() {
      ended = true;
      wake?.();
    },
    async *[Symbol.asyncIterator](): AsyncGenerator<T> {
      for (;;) {
        const item = items.shift();
        if (item !== undefined) {
          yield item;
          continue;
        }
        if (ended) return;
        await new Promise<void>((resolve) => (wake = resolve));
        wake = undefined;
      }
    },
  };
}

/** Renews `leaseToken` every `everyMs` on a KeepAlive stream until stopped; counts the renewals answered alive. */
function keepRenewing(client: SessionsClient, leaseToken: string, everyMs: number) {
  const requests = requestStream<MessageInitShape<typeof KeepAliveStreamRequestSchema>>();
  const state = { alive: 0, lost: false, stopped: false };
  const answers = (async () => {
    try {
      for await (const { renewal } of client.locks.keepAliveStream(requests)) {
        if (renewal?.alive) state.alive++;
        else state.lost = true;
      }
    } catch {
      state.lost = true;
    }
  })();
  const timer = setInterval(() => requests.push({ leaseToken }), everyMs);
  return {
    state,
    async stop() {
      clearInterval(timer);
      state.stopped = true;
      requests.end();
      await within(answers, 10_000);
    },
  };
}

/** Follows a session's journal from seq 1: the seqs seen in order, and how it ended. */
function follow(client: SessionsClient, sessionId: string, fromSeq = 1) {
  const seen: number[] = [];
  const controller = new AbortController();
  const done = (async (): Promise<"lagged" | "ended" | string> => {
    try {
      for await (const message of client.sessions.watchSession({ sessionId, fromSeq: BigInt(fromSeq) }, { signal: controller.signal })) {
        if (message.kind.case === "entries") for (const item of message.kind.value.entries) seen.push(Number(item.entry!.seq));
      }
      return "ended";
    } catch (error) {
      if (ConnectError.from(error).code === Code.ResourceExhausted) return "lagged";
      if (controller.signal.aborted) return "ended";
      return `failed: ${ConnectError.from(error).message}`;
    }
  })();
  return { seen, done, stop: () => controller.abort() };
}

const checkpoint = (n: number) => ({ kind: { case: "checkpoint" as const, value: { reason: `machine ${n}` } } });

/** Waiters whose clients' connections close during the pause, and how they talk to the service. */
const CLOSING_PROTOCOLS: ReadonlyArray<{ owner: string; protocol: ClientProtocol }> = [
  { owner: "gone-closed", protocol: { protocol: "grpc" } },
  { owner: "gone-closed-connect-http1", protocol: { protocol: "connect", httpVersion: "1.1" } },
  { owner: "gone-closed-grpc-web-http1", protocol: { protocol: "grpc-web", httpVersion: "1.1" } },
];

/** The sessions service stopped for `pauseMs` under load; see the module comment. */
export async function pausedSessions(findings: Findings, pauseMs: number): Promise<void> {
  const scenario = "sleep and wake (sessions)";
  const service = await startService("sessions", { args: ["--log-level", "debug"] });
  const url = service.url("sessions");
  const dir = makeTempDir("berth-machine-wake-");
  const file = (name: string) => `${dir}/${name}`;
  const c = () => sessionsClient(url);

  // c: a Hold stream holding, a Hold waiter whose client leaves, a live Hold waiter.
  const holdStreams: Array<{ owner: string; controller: AbortController; granted: Promise<boolean> }> = [];
  const hold = (owner: string) => {
    const controller = new AbortController();
    const client = c();
    const granted = (async () => {
      try {
        for await (const message of client.locks.hold({ file: file("c"), owner, maxWait: ms(120_000) }, { signal: controller.signal })) {
          if (message.kind.case === "acquired") return true;
        }
      } catch {
        // cancelled by the test
      }
      return false;
    })();
    holdStreams.push({ owner, controller, granted });
    return { controller, granted };
  };
  const holder = hold("hold-holder");
  await holder.granted;
  const goneHold = hold("gone-hold");
  const liveHold = hold("live-hold");
  // Watchers of a session with entries before, during and after the pause.
  const writer = c();
  for (let i = 1; i <= 10; i++) await writer.sessions.appendEvent({ sessionId: "watched", event: checkpoint(i) });
  const watchers = Array.from({ length: 4 }, () => follow(c(), "watched"));
  await until(() => watchers.every((w) => w.seen.length === 10), 10_000);
  // b: a holder renewing every 500 ms until the pause; its lease runs out 3/4 into it. One waiter.
  const renewer = c();
  const b = (await renewer.locks.acquire({ file: file("b"), owner: "renewer", ttl: ms(Math.round(pauseMs * 0.75)) })).lease!;
  const renewals = keepRenewing(renewer, b.leaseToken, 500);
  const liveB = c();
  const b1 = liveB.locks.acquire({ file: file("b"), owner: "live-b", maxWait: ms(120_000), ttl: ms(60_000) });
  // a, last (its lease must run out during the pause, not before): a holder that never renews, its
  // lease running out half way into the pause; behind it two waiters whose clients will leave, then two live ones.
  const dead = c();
  await dead.locks.acquire({ file: file("a"), owner: "dead", ttl: ms(Math.round(pauseMs / 2)) });
  const cancelling = c();
  const cancel = new AbortController();
  const cancelled = cancelling.locks
    .acquire({ file: file("a"), owner: "gone-cancelled", maxWait: ms(120_000) }, { signal: cancel.signal })
    .catch(() => undefined);
  const liveA1 = c();
  const liveA2 = c();
  const queued = (n: number) => until(async () => (await liveA1.locks.inspect({ file: file("a") })).waiters.length === n, 5000);
  await queued(1);
  // Clients whose connections close: on gRPC, and on Connect and gRPC-Web over HTTP/1.1 (whose
  // connection's end Node reports only after a timer-driven hand-off, unless the server looks).
  const closing = CLOSING_PROTOCOLS.map(({ owner, protocol }) => {
    const client = sessionsClient(url, protocol);
    return { client, call: client.locks.acquire({ file: file("a"), owner, maxWait: ms(120_000), ttl: ms(120_000) }).catch(() => undefined) };
  });
  const closed = Promise.all(closing.map((x) => x.call));
  await queued(1 + closing.length);
  const a1 = liveA1.locks.acquire({ file: file("a"), owner: "live-a1", maxWait: ms(120_000), ttl: ms(60_000) });
  const a1At = a1.then(() => performance.now());
  await queued(2 + closing.length);
  const a2 = liveA2.locks.acquire({ file: file("a"), owner: "live-a2", maxWait: ms(120_000), ttl: ms(60_000) });
  await queued(3 + closing.length);

  // Stopped for longer than every lease; meanwhile three clients leave and appends pile up.
  stopProcess(service.pid);
  const pausedAt = performance.now();
  cancel.abort();
  for (const { client } of closing) client.leave();
  goneHold.controller.abort();
  const appends = Array.from({ length: 20 }, (_, i) => writer.sessions.appendEvent({ sessionId: "watched", event: checkpoint(11 + i) }));
  await sleep(Math.max(0, pauseMs - (performance.now() - pausedAt)));
  const resumedAt = performance.now();
  continueProcess(service.pid);

  // After: the live waiters get a in order, b goes to its waiter, the hold passes to the live one.
  const first = await within(a1, 20_000);
  const firstGrantMs = "value" in first ? (await a1At) - resumedAt : Number.NaN;
  findings.figures.wakeFirstGrantMs = Math.round(firstGrantMs);
  findings.check(firstGrantMs < 1000, scenario, `live-a1 was granted a ${Math.round(firstGrantMs)} ms after SIGCONT, not within 1 s`);
  findings.check("value" in first && first.value.lease?.owner === "live-a1", scenario, `live-a1 was not granted a after the pause: ${show(first)}`);
  if ("value" in first && first.value.lease) await liveA1.locks.release({ leaseToken: first.value.lease.leaseToken });
  const second = await within(a2, 20_000);
  findings.check("value" in second && second.value.lease?.owner === "live-a2", scenario, `live-a2 was not granted a after live-a1: ${show(second)}`);
  const bGrant = await within(b1, 20_000);
  findings.check(
    "value" in bGrant && bGrant.value.lease?.owner === "live-b",
    scenario,
    `live-b was not granted b once the renewer's lease ran out during the pause`,
  );
  await renewals.stop();
  findings.check(renewals.state.lost, scenario, "the renewer's late renewal was answered alive: its lease had run out during the pause");
  holder.controller.abort();
  findings.check("value" in (await within(liveHold.granted, 20_000)), scenario, "the live Hold waiter was not granted c after the holder's stream ended");
  const appended = await within(Promise.all(appends), 30_000);
  findings.check("value" in appended, scenario, `the appends sent during the pause did not all complete: ${show(appended)}`);
  findings.operations += 30;

  // Watchers: every entry in order, or ended as lagged and then, resumed, the rest.
  for (const watcher of watchers) {
    const complete = await until(() => watcher.seen.length >= 30, 15_000);
    let seen = watcher.seen;
    if (!complete) {
      const how = await within(watcher.done, 1000);
      if ("value" in how && how.value === "lagged") {
        const resumed = follow(c(), "watched", seen.length + 1);
        await until(() => resumed.seen.length >= 30 - seen.length, 15_000);
        resumed.stop();
        seen = [...seen, ...resumed.seen];
        findings.figures.wakeWatchersLagged = Number(findings.figures.wakeWatchersLagged ?? 0) + 1;
      }
    }
    findings.check(seen.length === 30 && seen.every((seq, i) => seq === i + 1), scenario, `a watcher saw ${JSON.stringify(seen)} instead of 1..30 in order`);
    watcher.stop();
  }
  for (const stream of holdStreams) stream.controller.abort();
  await Promise.all([cancelled, closed]);

  // The service's own account: grants and ends.
  const events = lockEvents(service.entries());
  for (const problem of judgeLockEvents(events, new Set(["gone-cancelled", "gone-hold", ...CLOSING_PROTOCOLS.map((x) => x.owner)]))) {
    findings.violation(scenario, problem);
  }
  const expired = events.filter((e) => e.kind === "expired").map((e) => e.owner);
  findings.check(
    JSON.stringify(expired) === JSON.stringify(["dead", "renewer"]),
    scenario,
    `leases expired ${JSON.stringify(expired)}, not dead then renewer, once each`,
  );
  findings.operations += events.length;
  findings.rounds++;
  await service.stop();
}

/** A need of `megabytes` of memory and no cpu. */
function memoryNeed(megabytes: number): MessageInitShape<typeof NeedSchema> {
  return { items: [{ kind: NeedItemKind.START, name: "work", costSource: { case: "cost", value: { memoryBytes: BigInt(megabytes * 1024 * 1024), cpu: 0 } } }] };
}

/** The budget service stopped for `pauseMs` with a leased reservation and a queue behind it; see the module comment. */
export async function pausedBudget(findings: Findings, pauseMs: number): Promise<void> {
  const scenario = "sleep and wake (budget)";
  const service = await startService("budget", { args: ["--log-level", "debug", "--memory", "100M", "--reserve", "0", "--wait", "10m"] });
  const url = service.url("budget");
  const holder = budgetClient(url);
  await holder.budget.reserve({ need: memoryNeed(60), owner: "leased", ttl: ms(2000), skipLoadGate: true });

  // The queue: Reserve calls and Admit streams; the clients of "gone-*" leave during the pause
  // (cancelling their calls, or closing their connections: over gRPC, and for Reserve over Connect
  // and gRPC-Web on HTTP/1.1 too, whose connection's end Node reports late unless the server looks).
  const queue: ReadonlyArray<{ owner: string; call: "reserve" | "admit"; protocol?: ClientProtocol }> = [
    { owner: "gone-reserve-cancelled", call: "reserve" },
    { owner: "gone-reserve-closed-connect-http1", call: "reserve", protocol: { protocol: "connect", httpVersion: "1.1" } },
    { owner: "live-1", call: "reserve" },
    { owner: "gone-admit-closed", call: "admit" },
    { owner: "gone-reserve-closed-grpc-web-http1", call: "reserve", protocol: { protocol: "grpc-web", httpVersion: "1.1" } },
    { owner: "live-2", call: "admit" },
    { owner: "gone-admit-cancelled", call: "admit" },
    { owner: "live-3", call: "reserve" },
  ];
  const owners = queue.map((q) => q.owner);
  const outcomes = new Map<string, Promise<string>>();
  const leaving: Array<() => void> = [];
  const admitStreams: Array<{ end(): void }> = [];
  for (const [i, { owner, call, protocol }] of queue.entries()) {
    const client = budgetClient(url, protocol);
    const controller = new AbortController();
    if (owner.startsWith("gone-")) leaving.push(owner.includes("-closed") ? () => client.leave() : () => controller.abort());
    if (call === "admit") {
      const requests = requestStream<MessageInitShape<typeof AdmitRequestSchema>>();
      requests.push({ kind: { case: "start", value: { need: memoryNeed(60), owner, skipLoadGate: true } } });
      admitStreams.push(requests);
      outcomes.set(
        owner,
        (async () => {
          try {
            for await (const message of client.budget.admit(requests, { signal: controller.signal })) {
              if (message.kind.case === "admitted") {
                // Holds it a moment, then lets the next one in.
                await sleep(50);
                requests.end();
                return "admitted";
              }
            }
            return "ended";
          } catch (error) {
            return ConnectError.from(error).code === Code.Canceled ? "cancelled" : `failed: ${ConnectError.from(error).message}`;
          }
        })(),
      );
    } else {
      outcomes.set(
        owner,
        client.budget.reserve({ need: memoryNeed(60), owner, maxWait: ms(600_000), skipLoadGate: true }, { signal: controller.signal }).then(
          async (answer) => {
            await sleep(50);
            await client.budget.release({ reservationId: answer.reservation!.id });
            return "admitted";
          },
          (error: unknown) => (ConnectError.from(error).code === Code.Canceled ? "cancelled" : `failed: ${ConnectError.from(error).message}`),
        ),
      );
    }
    await until(async () => (await holder.budget.getState({})).queue.length === i + 1, 5000);
  }

  stopProcess(service.pid);
  const pausedAt = performance.now();
  for (const leave of leaving) leave();
  await sleep(Math.max(0, pauseMs - (performance.now() - pausedAt)));
  const resumedAt = Date.now();
  continueProcess(service.pid);

  for (const owner of owners.filter((l) => l.startsWith("live-"))) {
    const outcome = await within(outcomes.get(owner)!, 30_000);
    findings.check("value" in outcome && outcome.value === "admitted", scenario, `${owner} was not admitted after the pause: ${show(outcome)}`);
  }
  for (const stream of admitStreams) stream.end();
  await within(Promise.all(outcomes.values()), 10_000);
  // The service's own stamp of the first admission after the pause, against the moment of SIGCONT.
  const firstAdmission = service.entries().find((e) => e.msg === "budget: admitted" && e.owner === "live-1");
  const firstAdmissionMs = typeof firstAdmission?.time === "number" ? firstAdmission.time - resumedAt : Number.NaN;
  findings.figures.wakeFirstAdmissionMs = firstAdmissionMs;
  findings.check(firstAdmissionMs < 1000, scenario, `live-1 was admitted ${firstAdmissionMs} ms after SIGCONT, not within 1 s`);
  const admitted = service
    .entries()
    .filter((e) => e.msg === "budget: admitted")
    .map((e) => String(e.owner));
  findings.check(
    JSON.stringify(admitted) === JSON.stringify(["leased", "live-1", "live-2", "live-3"]),
    scenario,
    `admitted ${JSON.stringify(admitted)}: not the live waiters in order, or a client that left`,
  );
  const ranOut = service.entries().filter((e) => e.msg === "budget: a reservation's lease ran out; releasing it").length;
  findings.check(ranOut === 1, scenario, `the leased reservation's lease ran out ${ranOut} times, not once`);
  findings.operations += owners.length + 1;
  findings.rounds++;
  await service.stop();
}
