/**
 * The foundation against real processes: health through independent clients,
 * reflection for a real reflection client (`buf curl`), the bearer token, graceful shutdown that
 * releases the election lock, `/metrics`, file modes of the state directory, and the default host.
 *
 * Assertions about berth RPCs accept OK or UNIMPLEMENTED: they are about the foundation (auth,
 * shutdown, files), whatever a service implements.
 */
import { readdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import * as path from "node:path";
import { Code, ConnectError } from "@connectrpc/connect";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import {
  bufCurl,
  connectClient,
  curl,
  curlJson,
  grpcCodeName,
  grpcJsClient,
  grpcJsHealthClient,
  GrpcStatus,
  isGrpcError,
  listeningSockets,
  makeTempDir,
  startService,
  stopAll,
  type ConnectProtocol,
  type ServiceProcess,
} from "./harness.js";

afterAll(stopAll);

const SESSIONS_SERVICES = ["berth.locks.v1.LockService", "berth.sessions.v1.SessionService"];
const BUDGET_SERVICES = ["berth.budget.v1.BudgetService"];
const BUILT_IN_SERVICES = ["grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"];
const REFLECT_PROTOCOLS = ["grpc-v1", "grpc-v1alpha"] as const;
/** A berth RPC answered before its handler exists (UNIMPLEMENTED) or after (OK): either proves the call got through. */
const REACHED = [GrpcStatus.OK, GrpcStatus.UNIMPLEMENTED];

/** `buf curl` over gRPC with HTTP/2 prior knowledge, as a user would run it. */
const BUF_GRPC = ["--protocol", "grpc", "--http2-prior-knowledge"];

/** The gRPC status a grpc-js call ended with (0 for OK). */
async function grpcJsCode(call: Promise<unknown>): Promise<number> {
  try {
    await call;
    return GrpcStatus.OK;
  } catch (error) {
    if (isGrpcError(error)) return error.code;
    throw error;
  }
}

/** The status a connect-node call ended with (0 for OK). */
async function connectCode(call: Promise<unknown>): Promise<number> {
  try {
    await call;
    return 0;
  } catch (error) {
    return ConnectError.from(error).code;
  }
}

async function expectHealthy(url: string, services: readonly string[]): Promise<void> {
  const health = grpcJsHealthClient(url);
  try {
    for (const service of ["", ...services]) {
      expect(await health.check(service), `grpc-js Check(${JSON.stringify(service)}) at ${url}`).toEqual({ status: "SERVING" });
      const viaCurl = await curlJson(url, "/grpc.health.v1.Health/Check", { service });
      expect({ status: viaCurl.status, json: viaCurl.json }, `curl Check(${JSON.stringify(service)}) at ${url}`).toEqual({
        status: 200,
        json: { status: "SERVING" },
      });
    }
  } finally {
    health.close();
  }
}

async function expectListedByReflection(url: string, services: readonly string[], otherServices: readonly string[]): Promise<void> {
  for (const reflect of REFLECT_PROTOCOLS) {
    const listed = await bufCurl([...BUF_GRPC, "--reflect-protocol", reflect, "--list-services", url]);
    expect(listed.code, `buf curl --list-services (${reflect}) at ${url}\n${listed.stderr}`).toBe(0);
    const names = listed.stdout.split("\n").filter((line) => line.length > 0);
    expect(names, reflect).toEqual(expect.arrayContaining([...services, ...BUILT_IN_SERVICES]));
    for (const other of otherServices) expect(names, `${reflect}: ${other} belongs to the other port`).not.toContain(other);
  }
}

/** The "listening" log entries of a process, by server. */
function listeningUrls(service: ServiceProcess): Record<string, unknown> {
  return Object.fromEntries(
    service
      .entries()
      .filter((e) => e.msg === "listening")
      .map((e) => [e.server, e.url]),
  );
}

function modeOf(file: string): string {
  return (statSync(file).mode & 0o777).toString(8).padStart(3, "0");
}

describe("sessions and budget, each in its own process", () => {
  let sessions: ServiceProcess;
  let budget: ServiceProcess;
  beforeAll(async () => {
    [sessions, budget] = await Promise.all([startService("sessions"), startService("budget")]);
  });

  it("health is SERVING via grpc-js and via curl, for the server and each of its services", async () => {
    await expectHealthy(sessions.url("sessions"), SESSIONS_SERVICES);
    await expectHealthy(budget.url("budget"), BUDGET_SERVICES);
  });

  it("reflection lists each server's own services to buf curl, over grpc-v1 and grpc-v1alpha", async () => {
    await expectListedByReflection(sessions.url("sessions"), SESSIONS_SERVICES, BUDGET_SERVICES);
    await expectListedByReflection(budget.url("budget"), BUDGET_SERVICES, SESSIONS_SERVICES);
  });

  it("listens on 127.0.0.1 when no host is given", () => {
    for (const service of [sessions, budget]) {
      expect(service.command.join(" ")).not.toContain("--host");
      for (const url of Object.values(listeningUrls(service))) expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const sockets = listeningSockets(service.pid);
      expect(sockets.length, `listening sockets of pid ${service.pid}`).toBeGreaterThan(0);
      for (const socket of sockets) expect(socket.address, `pid ${service.pid} listens on ${socket.address}:${socket.port}`).toBe("127.0.0.1");
    }
  });

  it("serves /metrics in Prometheus text format", async () => {
    const health = grpcJsHealthClient(sessions.url("sessions"));
    await health.check();
    health.close();
    for (const [service, name] of [
      [sessions, "sessions"],
      [budget, "budget"],
    ] as const) {
      const response = await curl(service.url(name), "/metrics");
      expect(response.status).toBe(200);
      expect(response.headers["content-type"]).toMatch(/^text\/plain; version=0\.0\.4/);
      expect(response.body).toContain("# TYPE berth_rpc_requests_total counter");
      expect(response.body).toContain(`berth_server_info{name="${name}"} 1`);
      // Every sample line is `name{labels} value` (the exposition format's grammar, loosely).
      for (const line of response.body.split("\n").filter((l) => l.length > 0 && !l.startsWith("#"))) {
        expect(line).toMatch(/^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[^}]*\})? ([-+0-9.eE]+|NaN|[+-]Inf)$/);
      }
    }
    const afterCheck = (await curl(sessions.url("sessions"), "/metrics")).body;
    expect(afterCheck).toMatch(/berth_rpc_requests_total\{method="\/grpc\.health\.v1\.Health\/Check",code="ok"\} [1-9]/);
  });
});

describe("berth up", () => {
  let up: ServiceProcess;
  beforeAll(async () => {
    up = await startService("up");
  });

  it("serves both services, health SERVING on both ports via grpc-js and curl", async () => {
    expect(up.url("sessions")).not.toBe(up.url("budget"));
    await expectHealthy(up.url("sessions"), SESSIONS_SERVICES);
    await expectHealthy(up.url("budget"), BUDGET_SERVICES);
  });

  it("reflection lists the sessions services on the sessions port and the budget service on the budget port", async () => {
    await expectListedByReflection(up.url("sessions"), SESSIONS_SERVICES, BUDGET_SERVICES);
    await expectListedByReflection(up.url("budget"), BUDGET_SERVICES, SESSIONS_SERVICES);
  });

  for (const reflect of REFLECT_PROTOCOLS) {
    it(`buf curl calls RPCs knowing only what reflection (${reflect}) tells it`, async () => {
      const flags = [...BUF_GRPC, "--reflect-protocol", reflect];

      const health = await bufCurl([...flags, "-d", '{"service":"berth.sessions.v1.SessionService"}', `${up.url("sessions")}/grpc.health.v1.Health/Check`]);
      expect(health.code, health.stderr).toBe(0);
      expect(health.json).toEqual({ status: "SERVING" });

      // buf curl encodes these requests from the reflected descriptors (a nested message from
      // another file for Costs); the server's answer, OK or UNIMPLEMENTED, proves the request reached it.
      const listSessions = await bufCurl([...flags, "-d", '{"pageSize":1}', `${up.url("sessions")}/berth.sessions.v1.SessionService/ListSessions`]);
      expect(REACHED.map(grpcCodeName), `ListSessions: exit ${listSessions.code}\n${listSessions.stdout}${listSessions.stderr}`).toContain(
        grpcCodeName(listSessions.grpcCode ?? -1),
      );
      const costs = await bufCurl([
        ...flags,
        "-d",
        '{"spec":{"memory":"512M","cpu":1,"build":{"memory":"2G","cpu":2}}}',
        `${up.url("budget")}/berth.budget.v1.BudgetService/Costs`,
      ]);
      expect(REACHED.map(grpcCodeName), `Costs: exit ${costs.code}\n${costs.stdout}${costs.stderr}`).toContain(grpcCodeName(costs.grpcCode ?? -1));
      // The locks' own package, on the sessions port: the answer decoded from the reflected descriptors too.
      const limits = await bufCurl([...flags, "-d", "{}", `${up.url("sessions")}/berth.locks.v1.LockService/GetLimits`]);
      expect(limits.code, limits.stderr).toBe(0);
      expect(limits.json).toMatchObject({ defaultTtl: "30s", maxWait: "600s" });
    });
  }

  it("buf curl refuses, before sending, a request that does not fit the reflected schema", async () => {
    // The control for the test above: buf curl really encodes from the schema, so a field the
    // schema lacks fails on the client side (exit code below 8), not on the server.
    const result = await bufCurl([...BUF_GRPC, "-d", '{"noSuchField":"x"}', `${up.url("sessions")}/berth.sessions.v1.SessionService/ListSessions`]);
    expect(result.grpcCode, `${result.stdout}${result.stderr}`).toBeUndefined();
    expect(result.code).not.toBe(0);
    expect(result.stderr).toMatch(/noSuchField/);
  });

  it("listens on 127.0.0.1 when no host is given", () => {
    const urls = listeningUrls(up);
    expect(Object.keys(urls).sort()).toEqual(["budget", "sessions"]);
    for (const url of Object.values(urls)) expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const sockets = listeningSockets(up.pid);
    expect(sockets.map((s) => s.port).sort()).toEqual(
      Object.values(urls)
        .map((u) => Number(new URL(String(u)).port))
        .sort(),
    );
    for (const socket of sockets) expect(socket.address).toBe("127.0.0.1");
  });
});

describe("with a bearer token", () => {
  const token = "e2e-secret-token";
  let sessions: ServiceProcess;
  let url: string;
  beforeAll(async () => {
    const tokenFile = path.join(makeTempDir(), "token");
    writeFileSync(tokenFile, `${token}\n`, { mode: 0o600 });
    sessions = await startService("sessions", { args: ["--token-file", tokenFile] });
    url = sessions.url("sessions");
  });

  it("refuses a call without the token, or with a wrong one, with UNAUTHENTICATED (grpc-js, curl, connect-node)", async () => {
    const client = grpcJsClient(url);
    expect(grpcCodeName(await grpcJsCode(client.unary(SessionService.method.getLimits, {})))).toBe("UNAUTHENTICATED");
    expect(grpcCodeName(await grpcJsCode(client.unary(SessionService.method.getLimits, {}, { token: "wrong" })))).toBe("UNAUTHENTICATED");

    const viaCurl = await curlJson(url, "/berth.sessions.v1.SessionService/GetLimits", {});
    expect(viaCurl.status).toBe(401);
    expect(viaCurl.json).toMatchObject({ code: "unauthenticated" });
    const wrongViaCurl = await curlJson(url, "/berth.sessions.v1.SessionService/GetLimits", {}, { authorization: "Bearer wrong" });
    expect(wrongViaCurl.status).toBe(401);

    for (const protocol of ["grpc", "connect", "grpc-web"] as ConnectProtocol[]) {
      const anonymous = connectClient(SessionService, url, { protocol });
      expect(await connectCode(anonymous.getLimits({})), protocol).toBe(Code.Unauthenticated);
    }
  });

  it("lets a call with the token through (grpc-js, curl, connect-node over every protocol)", async () => {
    const client = grpcJsClient(url, { token });
    expect(REACHED.map(grpcCodeName)).toContain(grpcCodeName(await grpcJsCode(client.unary(SessionService.method.getLimits, {}))));

    const viaCurl = await curlJson(url, "/berth.sessions.v1.SessionService/GetLimits", {}, { authorization: `Bearer ${token}` });
    expect([200, 501], JSON.stringify(viaCurl.json)).toContain(viaCurl.status);
    if (viaCurl.status === 501) expect(viaCurl.json).toMatchObject({ code: "unimplemented" });

    for (const protocol of ["grpc", "connect", "grpc-web"] as ConnectProtocol[]) {
      for (const httpVersion of protocol === "grpc" ? (["2"] as const) : (["1.1", "2"] as const)) {
        const authorized = connectClient(SessionService, url, { protocol, httpVersion, token });
        const code = await connectCode(authorized.getLimits({}));
        expect([0, Code.Unimplemented], `${protocol} over HTTP/${httpVersion}: ${Code[code] ?? "OK"}`).toContain(code);
      }
    }
  });

  it("answers health without the token", async () => {
    await expectHealthy(url, SESSIONS_SERVICES);
  });

  it("needs the token for reflection too (buf curl --reflect-header)", async () => {
    const without = await bufCurl([...BUF_GRPC, "--list-services", url]);
    expect(without.code).not.toBe(0);
    const withToken = await bufCurl([...BUF_GRPC, "--reflect-header", `authorization: Bearer ${token}`, "--list-services", url]);
    expect(withToken.code, withToken.stderr).toBe(0);
    expect(withToken.stdout).toContain("berth.sessions.v1.SessionService");
  });
});

describe("graceful shutdown", () => {
  for (const kind of ["sessions", "budget", "up"] as const) {
    it(`${kind}: SIGTERM ends open streams, exits 0 promptly and releases the election lock`, async () => {
      const first = await startService(kind);
      const servers = kind === "up" ? (["sessions", "budget"] as const) : ([kind] as const);

      // An open stream per server: shutdown must end it rather than wait for the client.
      const streams = servers.map((server) => {
        const health = grpcJsHealthClient(first.url(server));
        const watch = health.watch();
        const statuses: string[] = [];
        watch.on("data", (message: { status: string }) => statuses.push(message.status));
        const ended = new Promise<string>((resolve) => {
          watch.on("error", (error: unknown) => resolve(isGrpcError(error) ? grpcCodeName(error.code) : String(error)));
          watch.on("end", () => resolve("OK"));
        });
        return { statuses, ended };
      });
      await expect.poll(() => streams.every((s) => s.statuses.includes("SERVING")), { timeout: 10_000 }).toBe(true);

      const started = performance.now();
      const status = await first.stop("SIGTERM");
      const elapsedMs = performance.now() - started;
      expect(status, first.output()).toEqual({ code: 0, signal: null });
      // The stream grace is 1 s; allow for a loaded machine, but not for waiting on the client.
      expect(elapsedMs).toBeLessThan(5_000);
      for (const stream of streams) expect(await stream.ended).toBe("UNAVAILABLE");
      for (const server of servers) {
        expect(
          first.entries().some((e) => e.msg === "stopped" && e.server === server),
          `"stopped" logged for ${server}`,
        ).toBe(true);
      }

      // The lock is free the moment the process is gone: a new instance starts on the first try.
      const second = await startService(kind, { stateDir: first.stateDir });
      for (const server of servers) await expectHealthy(second.url(server), []);
      expect(await second.stop()).toEqual({ code: 0, signal: null });
    });
  }
});

it("berth up: Ctrl-C (SIGINT) stops both services and exits 0", async () => {
  const up = await startService("up");
  expect(await up.stop("SIGINT"), up.output()).toEqual({ code: 0, signal: null });
  expect(
    up
      .entries()
      .filter((e) => e.msg === "stopped")
      .map((e) => e.server)
      .sort(),
  ).toEqual(["budget", "sessions"]);
});

describe("the state directory", () => {
  it("is created 0700 with lock files 0600, whatever the umask", async () => {
    const stateDir = path.join(makeTempDir(), "nested", "state");
    const up = await startService("up", { stateDir, umask: 0o000 });
    expect(modeOf(stateDir)).toBe("700");
    expect(modeOf(path.dirname(stateDir))).toBe("700");
    const lockFiles = readdirSync(stateDir).filter((name) => name.endsWith(".lock"));
    expect(lockFiles.sort()).toEqual(["budget.lock", "sessions.lock"]);
    for (const name of lockFiles) {
      expect(modeOf(path.join(stateDir, name)), name).toBe("600");
      // The claim names the holder, so that a second instance can say who it is.
      expect(JSON.parse(readFileSync(path.join(stateDir, name), "utf8"))).toMatchObject({ pid: up.pid });
    }
    await up.stop();
  });

  it("holds nothing that others can read or write (every file 0600, every directory 0700)", async () => {
    const stateDir = path.join(makeTempDir(), "state");
    const up = await startService("up", { stateDir, umask: 0o000 });
    await up.stop();
    const open: string[] = [];
    const walk = (dir: string) => {
      for (const entry of readdirSync(dir, { withFileTypes: true })) {
        const full = path.join(dir, entry.name);
        if (entry.isDirectory()) {
          if (modeOf(full) !== "700") open.push(`${path.relative(stateDir, full)}/ ${modeOf(full)}`);
          walk(full);
        } else if (modeOf(full) !== "600") open.push(`${path.relative(stateDir, full)} ${modeOf(full)}`);
      }
    };
    walk(stateDir);
    expect(open).toEqual([]);
  });
});
