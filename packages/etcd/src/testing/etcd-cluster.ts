/**
 * Real etcd processes for tests and benchmarks: one member or a cluster of several on loopback,
 * each on free ports with a temporary data directory. `startEtcd` resolves once every member has
 * said it serves clients and answers its health endpoint; members can then be SIGKILLed, paused
 * (SIGSTOP), resumed and restarted by pid, and `stop` (or the worker's exit) kills every process it
 * started, by pid, and removes the directories.
 *
 * The harness talks to etcd only through its HTTP endpoints (`/health` and the JSON gateway's
 * `/v3/maintenance/status`), never through berth's client, so it can test that client.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
import * as http from "node:http";
import * as net from "node:net";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { continueProcess, stopProcess } from "@berth/shared/testing/process-stop";
import { etcdBinary, etcdctlBinary } from "./etcd-installed.js";

/** Options of {@link startEtcd}. */
export interface EtcdClusterOptions {
  /** How many members (default 1). */
  members?: number;
  /**
   * Raft's election timeout in ms (default 1000, etcd's own). It also sets etcd's shortest lease:
   * 1.5 election timeouts rounded up to whole seconds (2 s at 1000 ms, 1 s at 500 ms).
   */
  electionTimeoutMs?: number;
  /** Raft's heartbeat in ms (default 100, etcd's own); at most a fifth of the election timeout. */
  heartbeatMs?: number;
  /** More etcd flags for every member (`--quota-backend-bytes`, `--max-request-bytes`…). */
  args?: readonly string[];
  /** How long to wait for every member to serve and be healthy (default 30 s). */
  readyTimeoutMs?: number;
  /** The etcd binary (default `BERTH_ETCD_BIN`, else `etcd` on PATH). */
  etcdBin?: string;
}

/** One member of a test cluster. */
export interface EtcdMember {
  /** `m0`, `m1`… */
  readonly name: string;
  /** `http://127.0.0.1:PORT`: what clients dial. */
  readonly clientUrl: string;
  readonly peerUrl: string;
  readonly dataDir: string;
  /** The pid of the running process (also while it is paused); undefined once it has exited. */
  readonly pid: number | undefined;
  /** True between a SIGSTOP and the SIGCONT the harness sent. */
  readonly paused: boolean;
  /** The last 64 KiB of the member's output (etcd's JSON log lines), for failure messages. */
  output(): string;
}

/** A running test cluster. */
export interface EtcdCluster {
  readonly members: readonly EtcdMember[];
  /** Every member's client URL, in member order (what a client's endpoint list is). */
  readonly clientUrls: readonly string[];
  /**
   * The member the live members agree is the leader; waits (up to `timeoutMs`, default 15 s) while
   * there is none, they disagree, or the one they name is not running. Paused members are not asked.
   */
  leader(timeoutMs?: number): Promise<EtcdMember>;
  /** Waits until every running, unpaused member answers its health endpoint with `true`. */
  waitHealthy(timeoutMs?: number): Promise<void>;
  /** SIGKILLs the member (resuming it first if paused) and resolves once it has exited. */
  kill(member: EtcdMember): Promise<void>;
  /** SIGSTOP: the process stays but answers nothing (a hung machine, a long GC pause). */
  pause(member: EtcdMember): void;
  /** SIGCONT after {@link pause}. */
  resume(member: EtcdMember): void;
  /** Starts a member that was killed again, on its data directory and ports; resolves once healthy. */
  restart(member: EtcdMember): Promise<void>;
  /** Runs `etcdctl` against the running members; rejects with its output on a non-zero exit. */
  etcdctl(args: readonly string[], timeoutMs?: number): Promise<string>;
  /** Kills every member by pid and removes the data directories; safe to call more than once. */
  stop(): Promise<void>;
}

const DEFAULT_READY_TIMEOUT_MS = 30_000;
const OUTPUT_KEPT = 64 * 1024;
const STATUS_TIMEOUT_MS = 1_000;

interface MemberState extends EtcdMember {
  child: ChildProcess | undefined;
  exited: Promise<void>;
  pausedNow: boolean;
  tail: string;
  /** Wakes waiters whenever the member writes output or exits. */
  listeners: Set<() => void>;
}

const liveClusters = new Set<ClusterImpl>();

// If a test worker dies without running its afterAll, leave no etcd behind: SIGKILL (which also
// ends a stopped process) every child this module started that has not exited, and drop its files.
process.once("exit", () => {
  for (const cluster of liveClusters) cluster.killNow();
});

/**
 * Starts `members` etcd processes on loopback and waits until each serves clients and is healthy.
 * If starting fails (a port taken in the meantime, etcd missing), everything started is removed.
 *
 * ```ts
 * const etcd = await startEtcd({ members: 3 });
 * afterAll(() => etcd.stop());
 * const client = createEtcdClient({ endpoints: etcd.clientUrls });
 * ```
 */
export async function startEtcd(options: EtcdClusterOptions = {}): Promise<EtcdCluster> {
  // Free ports are found by binding port 0 and letting go; another process may take one before
  // etcd binds it. That shows as an exit with "address already in use": try again with new ports.
  for (let attempt = 1; ; attempt++) {
    const cluster = new ClusterImpl(options, await freePorts(2 * (options.members ?? 1)));
    try {
      await cluster.start();
      return cluster;
    } catch (error) {
      await cluster.stop();
      if (attempt >= 3 || !/address already in use/.test(String(error))) throw error;
    }
  }
}

/** Stops every cluster this module started that is still running (for an afterAll of last resort). */
export async function stopAllEtcd(): Promise<void> {
  await Promise.all([...liveClusters].map((cluster) => cluster.stop()));
}

class ClusterImpl implements EtcdCluster {
  readonly members: MemberState[];
  readonly clientUrls: string[];
  private readonly baseDir: string;
  private readonly initialCluster: string;
  private readonly options: EtcdClusterOptions;
  private stopped = false;

  constructor(options: EtcdClusterOptions, ports: number[]) {
    this.options = options;
    const count = options.members ?? 1;
    if (!Number.isInteger(count) || count < 1) throw new Error(`members: must be a positive integer, got ${count}`);
    this.baseDir = mkdtempSync(path.join(tmpdir(), "berth-etcd-"));
    this.members = Array.from({ length: count }, (_, i) => {
      const member: MemberState = {
        name: `m${i}`,
        clientUrl: `http://127.0.0.1:${ports[2 * i]}`,
        peerUrl: `http://127.0.0.1:${ports[2 * i + 1]}`,
        dataDir: path.join(this.baseDir, `m${i}`),
        get pid() {
          return member.child && member.child.exitCode === null && member.child.signalCode === null ? member.child.pid : undefined;
        },
        get paused() {
          return member.pausedNow;
        },
        output: () => member.tail,
        child: undefined,
        exited: Promise.resolve(),
        pausedNow: false,
        tail: "",
        listeners: new Set(),
      };
      return member;
    });
    this.clientUrls = this.members.map((m) => m.clientUrl);
    this.initialCluster = this.members.map((m) => `${m.name}=${m.peerUrl}`).join(",");
    liveClusters.add(this);
  }

  async start(): Promise<void> {
    for (const member of this.members) mkdirSync(member.dataDir, { mode: 0o700 });
    for (const member of this.members) this.spawnMember(member);
    await Promise.all(this.members.map((member) => this.waitServing(member)));
    await this.waitHealthy();
  }

  private spawnMember(member: MemberState): void {
    const election = this.options.electionTimeoutMs ?? 1000;
    const heartbeat = this.options.heartbeatMs ?? Math.min(100, Math.floor(election / 5));
    const args = [
      "--name",
      member.name,
      "--data-dir",
      member.dataDir,
      "--listen-client-urls",
      member.clientUrl,
      "--advertise-client-urls",
      member.clientUrl,
      "--listen-peer-urls",
      member.peerUrl,
      "--initial-advertise-peer-urls",
      member.peerUrl,
      "--initial-cluster",
      this.initialCluster,
      "--initial-cluster-state",
      "new",
      "--initial-cluster-token",
      path.basename(this.baseDir),
      "--heartbeat-interval",
      String(heartbeat),
      "--election-timeout",
      String(election),
      "--logger",
      "zap",
      "--log-outputs",
      "stderr",
      ...(this.options.args ?? []),
    ];
    const child = spawn(this.etcdBin(), args, { env: etcdFreeEnv(), stdio: ["ignore", "pipe", "pipe"] });
    member.child = child;
    member.pausedNow = false;
    const wake = () => {
      for (const listener of [...member.listeners]) listener();
    };
    const append = (chunk: Buffer) => {
      member.tail = (member.tail + chunk.toString("utf8")).slice(-OUTPUT_KEPT);
      wake();
    };
    child.stdout!.on("data", append);
    child.stderr!.on("data", append);
    member.exited = new Promise((resolve) => {
      child.once("error", (error) => {
        // Most often ENOENT: etcd is not installed (Debian: etcd-server) or BERTH_ETCD_BIN is wrong.
        member.tail += `\ncannot run ${this.etcdBin()}: ${error.message}`;
        resolve();
        wake();
      });
      child.once("close", () => {
        resolve();
        wake();
      });
    });
  }

  private etcdBin(): string {
    return this.options.etcdBin ?? etcdBinary();
  }

  /** Waits for the log line etcd writes once it serves clients (it comes after joining the cluster). */
  private waitServing(member: MemberState): Promise<void> {
    return this.until(
      member,
      () => /"msg":"serving client traffic/.test(member.tail),
      this.options.readyTimeoutMs ?? DEFAULT_READY_TIMEOUT_MS,
      `${member.name} did not start serving clients`,
    );
  }

  /**
   * Resolves when `check` is true, re-checking whenever the member writes output or exits; rejects
   * with the member's output when it exits first or `timeoutMs` passes.
   */
  private until(member: MemberState, check: () => boolean, timeoutMs: number, what: string): Promise<void> {
    return new Promise((resolve, reject) => {
      const done = (error?: Error) => {
        clearTimeout(timer);
        member.listeners.delete(listener);
        if (error) reject(error);
        else resolve();
      };
      const listener = () => {
        if (check()) done();
        else if (member.pid === undefined) done(new Error(`${what}: etcd ${member.name} exited\n${member.tail.slice(-4000)}`));
      };
      const timer = setTimeout(() => done(new Error(`${what} within ${timeoutMs} ms\n${member.tail.slice(-4000)}`)), timeoutMs);
      member.listeners.add(listener);
      listener();
    });
  }

  async waitHealthy(timeoutMs = this.options.readyTimeoutMs ?? DEFAULT_READY_TIMEOUT_MS): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (const member of this.members) {
      if (member.pid === undefined || member.pausedNow) continue;
      // Health needs a leader; a member gets one a few heartbeats after it serves. Each miss waits
      // for the member's next log line (elections, joins are logged) or 100 ms, whichever is first.
      while (!(await isHealthy(member.clientUrl))) {
        if (Date.now() > deadline) throw new Error(`etcd ${member.name} is not healthy within ${timeoutMs} ms\n${member.tail.slice(-4000)}`);
        await this.nextOutput(member, 100);
      }
    }
  }

  /** Resolves on the member's next output or exit, or after `ms`. */
  private nextOutput(member: MemberState, ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        member.listeners.delete(done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      member.listeners.add(done);
    });
  }

  async leader(timeoutMs = 15_000): Promise<EtcdMember> {
    const deadline = Date.now() + timeoutMs;
    let last = "no member answered";
    for (;;) {
      const asked = this.members.filter((m) => m.pid !== undefined && !m.pausedNow);
      const statuses = await Promise.all(asked.map((m) => memberStatus(m.clientUrl)));
      const answered = statuses.filter((s): s is MemberStatus => s !== undefined);
      const leaders = new Set(answered.map((s) => s.leader));
      const byId = new Map(answered.map((s, i) => [s.memberId, asked[i]!]));
      if (answered.length === asked.length && leaders.size === 1) {
        const [id] = leaders;
        const member = id && id !== "0" ? byId.get(id) : undefined;
        if (member) return member;
        last = `they name leader ${id}, not a running member`;
      } else if (answered.length > 0) {
        last = `${answered.length} of ${asked.length} answered, naming ${[...leaders].join(", ")}`;
      }
      if (Date.now() > deadline) throw new Error(`no agreed leader within ${timeoutMs} ms: ${last}`);
      // An election takes an election timeout or two; ask again after a heartbeat's worth.
      await this.nextOutput(asked[0] ?? this.members[0]!, 100);
    }
  }

  async kill(member: EtcdMember): Promise<void> {
    const state = this.own(member);
    if (state.pid === undefined) return;
    state.child!.kill("SIGKILL");
    state.pausedNow = false;
    await state.exited;
  }

  pause(member: EtcdMember): void {
    const state = this.own(member);
    if (state.pid === undefined) throw new Error(`etcd ${member.name} is not running`);
    stopProcess(state.pid);
    state.pausedNow = true;
  }

  resume(member: EtcdMember): void {
    const state = this.own(member);
    if (state.pid === undefined) throw new Error(`etcd ${member.name} is not running`);
    continueProcess(state.pid);
    state.pausedNow = false;
  }

  async restart(member: EtcdMember): Promise<void> {
    const state = this.own(member);
    if (state.pid !== undefined) throw new Error(`etcd ${member.name} is still running (pid ${state.pid}): kill it first`);
    if (this.stopped) throw new Error("the cluster was stopped");
    state.tail = "";
    this.spawnMember(state);
    await this.waitServing(state);
    await this.waitHealthy();
  }

  etcdctl(args: readonly string[], timeoutMs = 60_000): Promise<string> {
    const endpoints = this.members.filter((m) => m.pid !== undefined && !m.pausedNow).map((m) => m.clientUrl);
    return new Promise((resolve, reject) => {
      const child = spawn(etcdctlBinary(), [`--endpoints=${endpoints.join(",")}`, ...args], {
        env: { ...etcdFreeEnv(), ETCDCTL_API: "3" },
        stdio: ["ignore", "pipe", "pipe"],
        timeout: timeoutMs,
        killSignal: "SIGKILL",
      });
      let out = "";
      child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
      child.stderr.on("data", (chunk: Buffer) => (out += chunk.toString("utf8")));
      child.once("error", reject);
      child.once("close", (code, signal) => {
        if (code === 0) resolve(out);
        else reject(new Error(`etcdctl ${args.join(" ")} exited ${code ?? signal}\n${out}`));
      });
    });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const member of this.members) {
      if (member.pid !== undefined) member.child!.kill("SIGKILL");
    }
    await Promise.all(this.members.map((m) => m.exited));
    rmSync(this.baseDir, { recursive: true, force: true });
    liveClusters.delete(this);
  }

  /** The synchronous part of {@link stop}, for the process's exit handler. */
  killNow(): void {
    for (const member of this.members) {
      if (member.pid !== undefined) member.child!.kill("SIGKILL");
    }
    rmSync(this.baseDir, { recursive: true, force: true });
  }

  private own(member: EtcdMember): MemberState {
    const state = this.members.find((m) => m === member);
    if (!state) throw new Error(`etcd ${member.name} is not a member of this cluster`);
    return state;
  }
}

/** The environment without etcd's own `ETCD_*`/`ETCDCTL_*` variables, so no developer setting leaks in. */
function etcdFreeEnv(): NodeJS.ProcessEnv {
  return Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("ETCD")));
}

/** `count` distinct free TCP ports on 127.0.0.1, held together until all are known. */
async function freePorts(count: number): Promise<number[]> {
  const servers = await Promise.all(
    Array.from(
      { length: count },
      () =>
        new Promise<net.Server>((resolve, reject) => {
          const server = net.createServer();
          server.once("error", reject);
          server.listen(0, "127.0.0.1", () => resolve(server));
        }),
    ),
  );
  const ports = servers.map((s) => (s.address() as net.AddressInfo).port);
  await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  return ports;
}

interface MemberStatus {
  memberId: string;
  leader: string;
}

/** The member's `/v3/maintenance/status` (member id and leader id, as decimal strings), or undefined. */
async function memberStatus(clientUrl: string): Promise<MemberStatus | undefined> {
  const body = await httpRequest(`${clientUrl}/v3/maintenance/status`, "POST", "{}");
  if (body === undefined) return undefined;
  try {
    const status = JSON.parse(body) as { header?: { member_id?: string }; leader?: string };
    if (!status.header?.member_id) return undefined;
    return { memberId: status.header.member_id, leader: status.leader ?? "0" };
  } catch {
    return undefined;
  }
}

async function isHealthy(clientUrl: string): Promise<boolean> {
  const body = await httpRequest(`${clientUrl}/health`, "GET");
  return body !== undefined && /"health":\s*"true"/.test(body);
}

/** The response body of a 200 answer, or undefined on any other status, error or timeout. */
function httpRequest(url: string, method: string, body?: string): Promise<string | undefined> {
  return new Promise((resolve) => {
    const request = http.request(url, { method, timeout: STATUS_TIMEOUT_MS, headers: body ? { "content-type": "application/json" } : {} }, (response) => {
      let text = "";
      response.setEncoding("utf8");
      response.on("data", (chunk: string) => (text += chunk));
      response.on("end", () => resolve(response.statusCode === 200 ? text : undefined));
      response.on("error", () => resolve(undefined));
    });
    request.on("timeout", () => request.destroy());
    request.on("error", () => resolve(undefined));
    request.end(body);
  });
}
