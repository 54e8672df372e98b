/**
 * Security (docs/architecture.md, "Tests and benchmarks"): what a bearer token, the file modes and the listen addresses promise,
 * checked exhaustively against `berth up` processes.
 *
 * - With a token set, every RPC of every service but health refuses with UNAUTHENTICATED when the
 *   token is missing or wrong (several ways of being wrong), over gRPC (grpc-js and connect-node),
 *   Connect (JSON over HTTP/1.1; binary over HTTP/2 for bidi streams) and gRPC-Web. The RPCs are
 *   enumerated from the service descriptors the server itself publishes by reflection (asked with
 *   the token), cross-checked against every service in the generated `@berth/api` package, so a
 *   new RPC or service is covered without editing this file. The same call with the token is
 *   answered with anything but UNAUTHENTICATED (so the refusals are not vacuous), and a refused
 *   mutating call leaves nothing behind.
 * - Health answers (Check and Watch) without a token and with a wrong one; reflection needs it
 *   (the README's promise: every RPC but health needs the token).
 * - The token never appears in the service's output.
 * - Under umask 0, after every service has written what it writes (journals, snapshots, lock files,
 *   election files, fencing records, leases, the budget's running tally), every file of the state
 *   directory is 0600 and every directory 0700, while running and after shutdown.
 * - The default listens on 127.0.0.1 only (sessions, budget and `berth up`), on exactly the ports
 *   it logs.
 * - `--sessions-socket`/`--budget-socket` create 0600 sockets (under umask 0), serve on them (token
 *   enforced there too) and open no TCP port.
 *
 * Run: `npx tsc -b && npx vitest run --config vitest.chaos.config.ts test/chaos/security/security.test.ts`.
 */
import { existsSync, lstatSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import type { DescService } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, describe, expect, it } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ServerReflection } from "@berth/api/grpc/reflection/v1/reflection_pb";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import { pushable } from "@berth/budget/server/testing";
import { fixtureArgs } from "../../budget-e2e.js";
import {
  closeClient,
  connectClient,
  curl,
  grpcCodeName,
  grpcJsHealthClient,
  listeningSockets,
  makeTempDir,
  startService,
  stopAll,
  type ServiceProcess,
} from "../../harness.js";
import { reportSuite } from "../common/summary.js";
import { Callers, categoryOf, generatedServices, inBatches, octal, servedServices, walkState, WIRES } from "./security-probes.js";

afterAll(stopAll);

const TOKEN = "chaos-security-token-4f1d9a";
/** The only service let through without the token. */
const OPEN_SERVICES = new Set([Health.typeName]);
/** Headers that must not open anything but health: no credentials, or credentials that are wrong. */
const WRONG_CREDENTIALS: ReadonlyArray<{ name: string; headers: Record<string, string> }> = [
  { name: "no header", headers: {} },
  { name: "wrong token", headers: { authorization: "Bearer not-the-token" } },
  { name: "token without scheme", headers: { authorization: TOKEN } },
  { name: "basic scheme", headers: { authorization: `Basic ${Buffer.from(`berth:${TOKEN}`).toString("base64")}` } },
  { name: "token prefix", headers: { authorization: `Bearer ${TOKEN.slice(0, -1)}` } },
  { name: "token plus a byte", headers: { authorization: `Bearer ${TOKEN}x` } },
  { name: "empty bearer", headers: { authorization: "Bearer" } },
  { name: "token in another header", headers: { "x-berth-token": TOKEN, token: TOKEN } },
];
const RIGHT_CREDENTIALS = { authorization: `Bearer ${TOKEN}` };

// ---------------------------------------------------------------------------------------------
// Findings
// ---------------------------------------------------------------------------------------------

let operations = 0;
const allViolations: string[] = [];
const figures: Record<string, unknown> = {};

/** One phase's findings: every broken promise is recorded, so a phase reports all it saw. */
class Findings {
  readonly violations: string[] = [];
  check(ok: boolean, what: string): void {
    operations++;
    if (!ok) {
      this.violations.push(what);
      allViolations.push(what);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The suite
// ---------------------------------------------------------------------------------------------

const started = performance.now();
let up: ServiceProcess;
let stateDir: string;
let projectRoot: string;
let served: Record<"sessions" | "budget", DescService[]>;

describe("security", () => {
  it("starts berth up with a token (from a token file) under umask 0", async () => {
    const dir = makeTempDir("berth-chaos-security-");
    const tokenFile = path.join(dir, "token");
    writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
    stateDir = path.join(dir, "state");
    projectRoot = path.join(dir, "project");
    up = await startService("up", { stateDir, umask: 0o000, args: [...fixtureArgs(), "--token-file", tokenFile] });
    served = { sessions: await servedServices(up.url("sessions"), TOKEN), budget: await servedServices(up.url("budget"), TOKEN) };
  });

  it("publishes by reflection every service the API defines, and only those", async () => {
    const findings = new Findings();
    const generated = await generatedServices();
    const publishedNames = new Set([...served.sessions, ...served.budget].map((s) => s.typeName));
    for (const name of generated)
      findings.check(publishedNames.has(name), `${name} is defined in @berth/api but neither server publishes it by reflection: its RPCs would go untested`);
    for (const name of publishedNames) findings.check(generated.includes(name), `${name} is published by reflection but not defined in @berth/api`);
    for (const server of ["sessions", "budget"] as const) {
      const names = served[server].map((s) => s.typeName);
      findings.check(names.includes(Health.typeName), `${server} does not publish ${Health.typeName}`);
    }
    figures.services = [...publishedNames].sort();
    figures.rpcs = [...served.sessions, ...served.budget].reduce((sum, s) => sum + s.methods.length, 0);
    expect(findings.violations).toEqual([]);
  });

  it("refuses every RPC but health without the token or with a wrong one, on every wire", async () => {
    const findings = new Findings();
    let refused = 0;
    for (const server of ["sessions", "budget"] as const) {
      const callers = new Callers(up.url(server));
      const tasks: Array<() => Promise<void>> = [];
      for (const service of served[server]) {
        if (OPEN_SERVICES.has(service.typeName)) continue;
        for (const method of service.methods) {
          for (const wire of WIRES) {
            for (const credentials of WRONG_CREDENTIALS) {
              tasks.push(async () => {
                const outcome = await callers.call(wire, method, credentials.headers, false);
                const what = `${server} ${service.typeName}/${method.name} over ${wire} with ${credentials.name}`;
                findings.check(outcome.code === "UNAUTHENTICATED", `${what}: ${outcome.code}, expected UNAUTHENTICATED`);
                findings.check(outcome.messages === 0, `${what}: the stream yielded ${outcome.messages} message(s) before its status`);
                if (outcome.code === "UNAUTHENTICATED") refused++;
              });
            }
            // With the token the same call gets through to the handler (whatever it then answers),
            // so the refusals above are the token's doing and not a broken call.
            tasks.push(async () => {
              const outcome = await callers.call(wire, method, RIGHT_CREDENTIALS, true);
              findings.check(outcome.code !== "UNAUTHENTICATED", `${server} ${service.typeName}/${method.name} over ${wire} WITH the token: UNAUTHENTICATED`);
            });
          }
        }
      }
      await inBatches(tasks, 16);
      callers.close();
    }
    figures.refusedCalls = refused;
    figures.wires = WIRES;
    figures.wrongCredentials = WRONG_CREDENTIALS.map((c) => c.name);
    expect(findings.violations).toEqual([]);
  });

  it("leaves nothing behind after a refused mutating call", async () => {
    const findings = new Findings();
    const sessionsUrl = up.url("sessions");
    const budgetUrl = up.url("budget");
    const anonymous = {
      sessions: connectClient(SessionService, sessionsUrl, { protocol: "grpc" }),
      locks: connectClient(LockService, sessionsUrl, { protocol: "connect" }),
      budget: connectClient(BudgetService, budgetUrl, { protocol: "grpc", headers: { authorization: "Bearer nope" } }),
    };
    const refusedCode = async (call: Promise<unknown>) => {
      try {
        await call;
        return "OK";
      } catch (error) {
        return grpcCodeName(ConnectError.from(error).code);
      }
    };
    const needItems = [{ kind: NeedItemKind.START, name: "web", costSource: { case: "cost" as const, value: { memoryBytes: 1n << 30n, cpu: 1 } } }];
    const attempts: Record<string, Promise<unknown>> = {
      AppendEvent: anonymous.sessions.appendEvent({ sessionId: "refused", event: { kind: { case: "agentPhase", value: { phase: "x" } } } }),
      AppendEvents: anonymous.sessions.appendEvents({ sessionId: "refused-batch", events: [{ kind: { case: "agentPhase", value: { phase: "x" } } }] }),
      Acquire: anonymous.locks.acquire({ file: "/refused.css", owner: "intruder", ttl: { seconds: 60n } }),
      Hold: (async () => {
        for await (const _ of anonymous.locks.hold({ file: "/refused-hold.css", owner: "intruder" }));
      })(),
      Reserve: anonymous.budget.reserve({ owner: "intruder", need: { items: needItems }, ttl: { seconds: 60n } }),
      RegisterRunning: anonymous.budget.registerRunning({
        name: "intruder",
        costSource: { case: "cost", value: { memoryBytes: 1n << 30n, cpu: 1 } },
        pid: process.pid,
      }),
      Admit: (async () => {
        async function* start() {
          yield { kind: { case: "start" as const, value: { label: "intruder", need: { items: needItems } } } };
          await new Promise((resolve) => setTimeout(resolve, 500));
        }
        for await (const _ of anonymous.budget.admit(start()));
      })(),
    };
    // Each outcome is taken at once, so no refusal is left unhandled while an earlier one is awaited.
    const outcomes = Object.entries(attempts).map(([name, attempt]) => [name, refusedCode(attempt)] as const);
    for (const [name, outcome] of outcomes) {
      const code = await outcome;
      findings.check(code === "UNAUTHENTICATED", `a valid ${name} without the right token answered ${code}`);
    }

    const sessions = connectClient(SessionService, sessionsUrl, { protocol: "grpc", token: TOKEN });
    const locks = connectClient(LockService, sessionsUrl, { protocol: "grpc", token: TOKEN });
    const budget = connectClient(BudgetService, budgetUrl, { protocol: "grpc", token: TOKEN });
    for (const sessionId of ["refused", "refused-batch"]) {
      const created = await sessions.getSnapshot({ sessionId }).then(
        () => true,
        (error: unknown) => (ConnectError.from(error).code === Code.NotFound ? false : Promise.reject(error)),
      );
      findings.check(!created, `a refused append created session ${sessionId}`);
    }
    for (const file of ["/refused.css", "/refused-hold.css"]) {
      const inspected = await locks.inspect({ file });
      findings.check(inspected.holder === undefined && inspected.waiters.length === 0, `a refused lock call left a holder or waiter on ${file}`);
    }
    // The positive controls above may have left empty reservations of their own: look for the intruder's.
    const state = await budget.getState({});
    const left = [
      ...state.reservations.filter((r) => r.owner === "intruder").map((r) => `reservation ${r.id}`),
      ...state.queue.filter((q) => q.owner === "intruder").map((q) => `queued at ${q.position}`),
      ...state.running.filter((r) => r.name === "intruder").map((r) => `running ${r.id}`),
    ];
    findings.check(left.length === 0, `a refused budget call left state behind: ${left.join(", ")}`);
    for (const client of [...Object.values(anonymous), sessions, locks, budget]) closeClient(client);
    expect(findings.violations).toEqual([]);
  });

  it("answers health without the token and with a wrong one, on every wire; reflection needs it", async () => {
    const findings = new Findings();
    for (const server of ["sessions", "budget"] as const) {
      const url = up.url(server);
      // The server as a whole, and each service it names in its "listening" line (its own API:
      // health and reflection themselves have no status of their own, as in grpc-go).
      const listening = up.entries().find((e) => e.msg === "listening" && e.server === server);
      const own = Array.isArray(listening?.services) ? (listening.services as string[]) : [];
      findings.check(own.length > 0, `${server} named no services in its "listening" log line`);
      const names = ["", ...own];
      const callers = new Callers(url);
      for (const credentials of WRONG_CREDENTIALS.slice(0, 2)) {
        for (const wire of WIRES) {
          for (const method of Health.methods) {
            const outcome = await callers.call(wire, method, credentials.headers, true);
            // Check("") answers SERVING; Watch("") streams: its first message is enough.
            const ok = method.methodKind === "unary" ? outcome.code === "OK" : outcome.code === "RECEIVED";
            findings.check(ok, `${server} health ${method.name} over ${wire} with ${credentials.name}: ${outcome.code}`);
          }
        }
      }
      callers.close();
      // Every served service reports SERVING to a client without any credentials (grpc-js, as orchestrators probe).
      const health = grpcJsHealthClient(url);
      for (const name of names) {
        const status = await health.check(name).then(
          (r) => r.status,
          (error: { code: number }) => grpcCodeName(error.code),
        );
        findings.check(status === "SERVING", `${server} health Check(${JSON.stringify(name)}) without a token: ${status}`);
      }
      health.close();
      // Reflection with the token answers (servedServices used it); without, it is refused (covered
      // above, method by method); say so here too, as the one exception is health alone.
      findings.check(
        served[server].some((s) => s.typeName === ServerReflection.typeName),
        `${server} does not publish ${ServerReflection.typeName}`,
      );
    }
    expect(findings.violations).toEqual([]);
  });

  it("creates every state file 0600 and every directory 0700 under umask 0, while running and after shutdown", async () => {
    const findings = new Findings();
    const sessionsUrl = up.url("sessions");
    const budgetUrl = up.url("budget");
    const sessions = connectClient(SessionService, sessionsUrl, { protocol: "grpc", token: TOKEN });
    const locks = connectClient(LockService, sessionsUrl, { protocol: "grpc", token: TOKEN });
    const budget = connectClient(BudgetService, budgetUrl, { protocol: "grpc", token: TOKEN, defaultTimeoutMs: 30_000 });
    const phase = (name: string) => ({ kind: { case: "agentPhase" as const, value: { phase: name } } });

    // sessions: journals (with idempotency keys), batches, snapshots written on demand.
    for (const sessionId of ["alpha", "beta", "gamma"]) {
      await sessions.appendEvent({
        sessionId,
        event: { kind: { case: "generate", value: { pageUrl: "http://localhost:3000/", count: 2 } } },
        idempotencyKey: `${sessionId}-1`,
      });
      await sessions.appendEvents({ sessionId, events: [phase("a"), phase("b")], expected: { case: "expectedSeq", value: 1n } });
      await sessions.flushSnapshot({ sessionId });
    }
    await sessions.appendEvent({ sessionId: "gamma", event: { kind: { case: "complete", value: {} } } });

    // locks: a lease (Acquire, then a fenced append), a Hold stream, and a released lease.
    const lease = await locks.acquire({ file: path.join(projectRoot, "src/app.css"), owner: "security-suite", ttl: { seconds: 120n } });
    await sessions.appendEvent({
      sessionId: "alpha",
      event: phase("fenced"),
      fence: { file: path.join(projectRoot, "src/app.css"), fencingToken: lease.lease!.fencingToken },
    });
    const released = await locks.acquire({ file: path.join(projectRoot, "src/other.css"), owner: "security-suite", ttl: { seconds: 120n } });
    await locks.release({ leaseToken: released.lease!.leaseToken });
    const holdAbort = new AbortController();
    const holdStream = locks
      .hold(
        { file: path.join(projectRoot, "src/held.css"), owner: "security-suite", maxWait: { seconds: 10n } },
        { signal: holdAbort.signal, timeoutMs: 120_000 },
      )
      [Symbol.asyncIterator]();
    const first = await holdStream.next();
    findings.check(!first.done && first.value.kind.case === "acquired", `Hold did not acquire src/held.css: ${JSON.stringify(first.value?.kind.case)}`);

    // budget: a leased reservation, a running entry with a pid (the tally on disk), an Admit stream
    // that reports a start.
    const need = { items: [{ kind: NeedItemKind.START, name: "web", costSource: { case: "cost" as const, value: { memoryBytes: 1n << 29n, cpu: 0.5 } } }] };
    await budget.reserve({ owner: "security lease", need, ttl: { seconds: 120n } });
    await budget.registerRunning({ name: "security-running", costSource: { case: "cost", value: { memoryBytes: 1n << 28n, cpu: 0.25 } }, pid: process.pid });
    const admitRequests = pushable<Parameters<typeof budget.admit>[0] extends AsyncIterable<infer R> ? R : never>();
    admitRequests.push({ kind: { case: "start", value: { owner: "security admit", need } } });
    const admitted = budget.admit(admitRequests, { timeoutMs: 60_000 })[Symbol.asyncIterator]();
    const seen: string[] = [];
    for (;;) {
      const next = await admitted.next();
      if (next.done) break;
      seen.push(String(next.value.kind.case));
      if (next.value.kind.case === "admitted") admitRequests.push({ kind: { case: "started", value: { name: "web", pid: process.pid } } });
      if (next.value.kind.case === "updated") break;
    }
    findings.check(seen.includes("updated"), `Admit did not get to 'updated': ${seen.join(", ")}`);
    admitRequests.push({ kind: { case: "release", value: {} } });
    while (!(await admitted.next()).done);
    admitRequests.end();

    const checkModes = (when: string) => {
      const entries = walkState(stateDir);
      for (const entry of entries) {
        const expected = entry.kind === "dir" ? 0o700 : 0o600;
        findings.check(entry.kind !== "other", `${when}: ${entry.relative} is neither a file, a directory nor a socket`);
        findings.check(entry.mode === expected, `${when}: ${entry.relative} (${entry.kind}) is ${octal(entry.mode)}, expected ${octal(expected)}`);
      }
      return entries;
    };
    const running = checkModes("while running");
    holdAbort.abort();
    await holdStream.return?.();
    for (const client of [sessions, locks, budget]) closeClient(client);
    const status = await up.stop();
    findings.check(status.code === 0, `berth up did not exit 0 on SIGTERM: ${JSON.stringify(status)}`);
    const stopped = checkModes("after shutdown");

    const categories: Record<string, number> = {};
    const files = new Set([...running, ...stopped].filter((e) => e.kind === "file").map((e) => e.relative));
    for (const file of files) categories[categoryOf(file)] = (categories[categoryOf(file)] ?? 0) + 1;
    for (const required of ["journal", "snapshot", "snapshot-meta", "election", "source-lock", "fencing", "running-tally"]) {
      findings.check(
        (categories[required] ?? 0) > 0,
        `no ${required} file was found in the state dir (the suite did not exercise it, or it lives elsewhere): ${running.map((e) => e.relative).join(", ")}`,
      );
    }
    figures.stateEntries = { running: running.length, afterShutdown: stopped.length };
    figures.stateFiles = Object.fromEntries(Object.entries(categories).sort());
    figures.stateListing = running
      .filter((e) => e.kind === "file")
      .map((e) => e.relative)
      .sort();
    figures.tokenInOutput = up.output().includes(TOKEN);
    findings.check(!up.output().includes(TOKEN), "the token appears in the service's output");
    expect(findings.violations).toEqual([]);
  });

  it("listens on 127.0.0.1 only by default, on exactly the ports it logs (sessions, budget, up)", async () => {
    const findings = new Findings();
    const seen: string[] = [];
    for (const kind of ["sessions", "budget", "up"] as const) {
      const service = await startService(kind, kind === "sessions" ? {} : { args: fixtureArgs() });
      const sockets = listeningSockets(service.pid);
      const logged = Object.values(service.urls)
        .map((url) => Number(new URL(url).port))
        .sort();
      findings.check(sockets.length > 0, `${kind}: no listening socket found for pid ${service.pid}`);
      for (const socket of sockets) {
        seen.push(`${kind} ${socket.address}:${socket.port}`);
        findings.check(socket.address === "127.0.0.1", `${kind} listens on ${socket.address}:${socket.port}`);
      }
      findings.check(
        JSON.stringify(sockets.map((s) => s.port).sort()) === JSON.stringify(logged),
        `${kind} listens on ports ${sockets.map((s) => s.port)} but logged ${logged}`,
      );
      await service.stop();
    }
    figures.listening = seen;
    expect(findings.violations).toEqual([]);
  });

  it("serves on 0600 unix sockets (umask 0, token from BERTH_TOKEN) and opens no TCP port", async () => {
    const findings = new Findings();
    const dir = makeTempDir("berth-chaos-sockets-");
    const sockets = { sessions: path.join(dir, "sessions.sock"), budget: path.join(dir, "budget.sock") };
    const service = await startService("up", {
      umask: 0o000,
      ephemeralPorts: false,
      env: { BERTH_TOKEN: TOKEN },
      args: [...fixtureArgs(), "--sessions-socket", sockets.sessions, "--budget-socket", sockets.budget],
    });
    for (const server of ["sessions", "budget"] as const) {
      const file = sockets[server];
      const stat = lstatSync(file);
      findings.check(stat.isSocket(), `${file} is not a socket`);
      findings.check((stat.mode & 0o777) === 0o600, `${server} socket ${file} is ${octal(stat.mode & 0o777)}, expected 600`);
      findings.check(service.url(server) === `unix:${file}`, `${server} logged ${service.url(server)}, expected unix:${file}`);
      const url = service.url(server);
      const health = grpcJsHealthClient(url);
      const status = await health.check().then(
        (r) => r.status,
        (error: { code: number }) => grpcCodeName(error.code),
      );
      findings.check(status === "SERVING", `${server} health over its socket without a token: ${status}`);
      health.close();
      const callers = new Callers(url);
      const method = server === "sessions" ? SessionService.method.getSnapshot : BudgetService.method.getState;
      for (const wire of WIRES) {
        const refused = await callers.call(wire, method, {}, false);
        findings.check(refused.code === "UNAUTHENTICATED", `${server} ${method.name} over its socket (${wire}) without a token: ${refused.code}`);
        const answered = await callers.call(wire, method, RIGHT_CREDENTIALS, false);
        // GetSnapshot({}) is INVALID_ARGUMENT (no id): either way the handler answered.
        findings.check(
          answered.code !== "UNAUTHENTICATED" && answered.code !== "UNAVAILABLE",
          `${server} ${method.name} over its socket (${wire}) with the token: ${answered.code}`,
        );
      }
      callers.close();
    }
    const tcp = listeningSockets(service.pid);
    findings.check(tcp.length === 0, `with sockets only, berth up still listens on TCP ${tcp.map((s) => `${s.address}:${s.port}`).join(", ")}`);
    // Not RPCs, but they tell what the services do and who their clients are: /metrics and
    // /debug/streams need the token as well.
    for (const page of ["/metrics", "/debug/streams"]) {
      const withoutToken = (await curl(service.url("sessions"), page)).status;
      if (page === "/metrics") figures.metricsStatusWithoutToken = withoutToken;
      findings.check(withoutToken === 401, `${page} without the token answered ${withoutToken}, not 401`);
      const withToken = (await curl(service.url("sessions"), page, { headers: { authorization: `Bearer ${TOKEN}` } })).status;
      findings.check(withToken === 200, `${page} with the token answered ${withToken}, not 200`);
    }
    findings.check(!service.output().includes(TOKEN), "the token (BERTH_TOKEN) appears in the service's output");
    const status = await service.stop();
    findings.check(status.code === 0, `berth up (sockets) did not exit 0 on SIGTERM: ${JSON.stringify(status)}`);
    for (const file of Object.values(sockets)) findings.check(!existsSync(file), `${file} is left behind after a graceful stop`);
    expect(findings.violations).toEqual([]);
  });

  it("reports", () => {
    reportSuite({
      suite: "security",
      rounds: 5, // berth up instances: token/umask 0, sessions, budget, up (default listen), up on sockets
      operations,
      violations: allViolations.length,
      durationS: Math.round((performance.now() - started) / 100) / 10,
      ...figures,
      stateListing: undefined,
      ...(allViolations.length > 0 ? { firstViolations: allViolations.slice(0, 10) } : {}),
    });
    if (figures.stateListing !== undefined) process.stdout.write(`security: state files seen: ${JSON.stringify(figures.stateListing)}\n`);
    expect(allViolations).toEqual([]);
  });
});
