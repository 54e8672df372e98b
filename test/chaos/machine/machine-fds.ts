/**
 * Too many clients: a service started with `ulimit -n 256` meets 1,000 clients connecting at once,
 * each opening a stream (WatchSession on the sessions service, WatchMachine on the budget) and
 * holding it. Meanwhile a client connected before the flood keeps working: appends to new
 * sessions (each opens a journal), lock grants (each writes a lock file), a lease and a lock wait
 * that run out during the flood (their timers), registrations in the budget's tally.
 *
 * The service refuses what it cannot take (connections answered TOO_MANY_OPEN_FILES or closed at
 * once), never crashes, answers the client that was there before the flood (or refuses it with
 * TOO_MANY_OPEN_FILES, never INTERNAL), answers a health check on a fresh connection throughout,
 * and once the flood has gone has exactly the descriptors it had before (/proc/PID/fd) and serves
 * normally.
 */
import * as http2 from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { Health, HealthCheckResponse_ServingStatus } from "@berth/api/grpc/health/v1/health_pb";
import { closeClient, connectClient, makeTempDir, startService, type ServiceProcess } from "../../harness.js";
import { budgetClient, type Findings, ms, openDescriptors, sessionsClient, show, sleep, until, within } from "./machine-world.js";

export const FD_LIMIT = 256;
export const FLOOD_CLIENTS = 1000;

/** An enveloped Connect streaming request body holding one JSON message. */
function envelope(message: object): Buffer {
  const body = Buffer.from(JSON.stringify(message));
  const head = Buffer.alloc(5);
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

/** `count` clients, each on its own connection, opening a server stream at `path` at once and holding it. */
async function flood(url: string, count: number, path: string, request: (i: number) => object) {
  const sessions: http2.ClientHttp2Session[] = [];
  let served = 0;
  let refused = 0;
  await Promise.all(
    Array.from(
      { length: count },
      (_, i) =>
        new Promise<void>((resolve) => {
          let settled = false;
          const settle = (ok: boolean) => {
            if (settled) return;
            settled = true;
            if (ok) served++;
            else refused++;
            resolve();
          };
          const session = http2.connect(url);
          sessions.push(session);
          session.on("error", () => settle(false));
          session.on("close", () => settle(false));
          const stream = session.request({ ":method": "POST", ":path": path, "content-type": "application/connect+json" });
          stream.on("response", (headers) => settle(headers[":status"] === 200));
          stream.on("error", () => settle(false));
          stream.on("close", () => settle(false));
          stream.on("data", () => {});
          stream.end(envelope(request(i)));
          // A client the service never answers counts as refused (it took no descriptor of the service's).
          setTimeout(() => settle(false), 20_000).unref();
        }),
    ),
  );
  return {
    served,
    refused,
    leave() {
      for (const session of sessions) session.destroy();
    },
  };
}

function refusalOf(error: unknown): string {
  const connect = ConnectError.from(error);
  return `${Code[connect.code]} ${connect.findDetails(ErrorInfoSchema)[0]?.reason ?? ""}: ${connect.rawMessage}`;
}

/** Calls `call`; a refusal other than TOO_MANY_OPEN_FILES is a violation. Returns whether it was served. */
async function served(findings: Findings, scenario: string, what: string, call: () => Promise<unknown>): Promise<boolean> {
  const outcome = await within(call(), 20_000);
  if ("value" in outcome) return true;
  if ("timedOut" in outcome) findings.violation(scenario, `${what}: no answer within 20 s`);
  else if (!refusalOf(outcome.error).startsWith("ResourceExhausted TOO_MANY_OPEN_FILES")) findings.violation(scenario, `${what}: ${refusalOf(outcome.error)}`);
  return false;
}

/** A health Check on a fresh connection, as an orchestrator's probe makes it: anything but SERVING is a violation. */
async function healthAnswers(findings: Findings, scenario: string, url: string, what: string): Promise<void> {
  const health = connectClient(Health, url, { protocol: "grpc", defaultTimeoutMs: 10_000 });
  const answer = await within(health.check({}), 20_000);
  closeClient(health);
  const serving = "value" in answer && answer.value.status === HealthCheckResponse_ServingStatus.SERVING;
  findings.check(serving, scenario, `health check ${what}: ${"error" in answer ? refusalOf(answer.error) : show(answer)}`);
}

/** What the descriptors of `pid` name (sockets and pipes by kind). */
function descriptorTargets(pid: number): string[] {
  const targets: string[] = [];
  openDescriptors(pid, (target) => {
    targets.push(target.replace(/\[\d+\]$/, ""));
    return false;
  });
  return targets.sort();
}

/** What `after` holds beyond `before` (as multisets), journals aside. */
function newTargets(before: readonly string[], after: readonly string[]): string[] {
  const left = [...before];
  const added: string[] = [];
  for (const target of after) {
    if (target.endsWith(".jsonl")) continue;
    const i = left.indexOf(target);
    if (i >= 0) left.splice(i, 1);
    else added.push(target);
  }
  return added;
}

/**
 * How many descriptors `service` settles at (the same count twice, 200 ms apart), but the journals
 * it keeps open for the sessions in its cache (one each, by design: they are counted apart).
 */
async function settledDescriptors(service: ServiceProcess): Promise<number> {
  const count = () => openDescriptors(service.pid, (target) => target.endsWith(".jsonl"));
  let last = count();
  await until(
    async () => {
      await sleep(200);
      const now = count();
      const same = now === last;
      last = now;
      return same;
    },
    10_000,
    0,
  );
  return last;
}

/** The sessions service under `ulimit -n 256` and a flood; see the module comment. */
export async function floodedSessions(findings: Findings): Promise<void> {
  const scenario = "too many clients (sessions)";
  const service = await startService("sessions", { fdLimit: FD_LIMIT });
  const url = service.url("sessions");
  const dir = makeTempDir("berth-machine-fds-");
  const client = sessionsClient(url);
  // Warm up what the flood's clients and the worker will use, then count.
  await client.sessions.appendEvent({ sessionId: "warm", event: { kind: { case: "checkpoint", value: { reason: "warm" } } } });
  const warm = (await client.locks.acquire({ file: `${dir}/warm`, owner: "warm" })).lease!;
  await client.locks.release({ leaseToken: warm.leaseToken });
  // A watch: libuv's one inotify descriptor, kept for the process's life once made, is made now.
  const watcher = new AbortController();
  for await (const message of client.sessions.watchSession({ sessionId: "warm" }, { signal: watcher.signal })) if (message.kind.case === "caughtUp") break;
  watcher.abort();
  const before = await settledDescriptors(service);
  const targetsBefore = descriptorTargets(service.pid);

  // A lease and a wait that run out while the flood is on.
  const lease = (await client.locks.acquire({ file: `${dir}/leased`, owner: "short lease", ttl: ms(1500) })).lease!;
  await client.locks.acquire({ file: `${dir}/blocked`, owner: "blocker", ttl: ms(600_000) });
  const waiting = within(client.locks.acquire({ file: `${dir}/blocked`, owner: "waiter", maxWait: ms(2000) }), 30_000);
  const crowd = await flood(url, FLOOD_CLIENTS, "/berth.sessions.v1.SessionService/WatchSession", (i) => ({ sessionId: `crowd-${i % 50}` }));
  findings.check(crowd.refused > 0, scenario, `all ${FLOOD_CLIENTS} clients were taken with ${FD_LIMIT} descriptors: nothing was refused`);
  let answered = 0;
  for (let i = 0; i < 60; i++) {
    if (
      await served(findings, scenario, `append to new session ${i} during the flood`, () =>
        client.sessions.appendEvent({ sessionId: `during-${i}`, event: { kind: { case: "checkpoint", value: { reason: "flood" } } } }),
      )
    )
      answered++;
    if (i % 10 === 0) await healthAnswers(findings, scenario, url, `${i / 10} during the flood`);
    if (
      await served(findings, scenario, `grant ${i} during the flood`, async () => {
        const granted = (await client.locks.acquire({ file: `${dir}/during-${i % 20}`, owner: "during" })).lease!;
        await client.locks.release({ leaseToken: granted.leaseToken });
      })
    )
      answered++;
  }
  await sleep(2500);
  const waited = await waiting;
  findings.check(
    "error" in waited && ConnectError.from(waited.error).code === Code.ResourceExhausted,
    scenario,
    `the lock wait that ran out during the flood: ${show(waited)}`,
  );
  findings.check(service.exitStatus() === undefined, scenario, `the service exited during the flood: ${show(service.exitStatus())}`);
  crowd.leave();

  // Gone: the same descriptors as before, and normal service.
  const after = await until(() => openDescriptors(service.pid, (target) => target.endsWith(".jsonl")) <= before, 20_000).then(() =>
    settledDescriptors(service),
  );
  findings.check(
    after === before,
    scenario,
    `${before} descriptors (but cached sessions' journals) before the flood, ${after} after it: ${show(newTargets(targetsBefore, descriptorTargets(service.pid)))}`,
  );
  const check = await within(client.locks.checkToken({ file: `${dir}/leased`, fencingToken: lease.fencingToken }), 10_000);
  findings.check("value" in check && !check.value.current, scenario, `the short lease did not run out during the flood: ${show(check)}`);
  const after1 = await within(client.sessions.appendEvent({ sessionId: "after", event: { kind: { case: "checkpoint", value: { reason: "after" } } } }), 10_000);
  findings.check("value" in after1, scenario, `append after the flood: ${show(after1)}`);
  const fresh = sessionsClient(url);
  const granted = await within(fresh.locks.acquire({ file: `${dir}/after`, owner: "after" }), 10_000);
  findings.check("value" in granted, scenario, `a new client's grant after the flood: ${show(granted)}`);
  findings.figures.fdSessionsAccepted = crowd.served;
  findings.figures.fdSessionsRefused = crowd.refused;
  findings.figures.fdSessionsAnsweredDuring = answered;
  findings.figures.fdSessionsBeforeAfter = `${before}/${after}`;
  findings.operations += FLOOD_CLIENTS + 120;
  findings.rounds++;
  await service.stop();
}

/** The budget service under `ulimit -n 256` and a flood; see the module comment. */
export async function floodedBudget(findings: Findings): Promise<void> {
  const scenario = "too many clients (budget)";
  const service = await startService("budget", { fdLimit: FD_LIMIT, args: ["--memory", "100M", "--reserve", "0"] });
  const url = service.url("budget");
  const client = budgetClient(url).budget;
  await client.registerRunning({ name: "warm", costSource: { case: "cost", value: { memoryBytes: 1n, cpu: 0 } } });
  const before = await settledDescriptors(service);
  await client.reserve({ need: { items: [] }, owner: "short lease", ttl: ms(1500) });
  const crowd = await flood(url, FLOOD_CLIENTS, "/berth.budget.v1.BudgetService/WatchMachine", () => ({}));
  findings.check(crowd.refused > 0, scenario, `all ${FLOOD_CLIENTS} clients were taken with ${FD_LIMIT} descriptors: nothing was refused`);
  let answered = 0;
  for (let i = 0; i < 30; i++) {
    if (i % 5 === 0) await healthAnswers(findings, scenario, url, `${i / 5} during the flood`);
    if (
      await served(findings, scenario, `registration ${i} during the flood`, () =>
        client.registerRunning({ name: `during-${i}`, costSource: { case: "cost", value: { memoryBytes: 1n, cpu: 0 } } }),
      )
    )
      answered++;
  }
  await sleep(2000);
  findings.check(service.exitStatus() === undefined, scenario, `the service exited during the flood: ${show(service.exitStatus())}`);
  crowd.leave();
  const after = await until(() => openDescriptors(service.pid) <= before, 20_000).then(() => settledDescriptors(service));
  findings.check(after === before, scenario, `${before} descriptors before the flood, ${after} after it`);
  const state = await within(client.getState({}), 10_000);
  findings.check("value" in state && state.value.reservations.length === 0, scenario, `the short lease did not run out during the flood: ${show(state)}`);
  const registered = await within(
    budgetClient(url).budget.registerRunning({ name: "after", costSource: { case: "cost", value: { memoryBytes: 1n, cpu: 0 } } }),
    10_000,
  );
  findings.check("value" in registered, scenario, `a new client's registration after the flood: ${show(registered)}`);
  findings.figures.fdBudgetAccepted = crowd.served;
  findings.figures.fdBudgetRefused = crowd.refused;
  findings.figures.fdBudgetAnsweredDuring = answered;
  findings.figures.fdBudgetBeforeAfter = `${before}/${after}`;
  findings.operations += FLOOD_CLIENTS + 30;
  findings.rounds++;
  await service.stop();
}
