/**
 * `berth mcp` as an agent host runs it: the built command (`node packages/cli/bin/berth.js mcp`,
 * the bundle) spawned over stdio by the MCP SDK's own Client and StdioClientTransport, against a
 * real sessions and budget service. Every tool and resource; locks held by the MCP process and
 * freed when it is SIGKILLed; two agents served in order with rising fencing tokens; a wait that
 * returns when another client appends the checkpoint; the input schemas against what the service
 * accepts; stdout carrying nothing but protocol messages.
 */
import { spawn } from "node:child_process";
import { mkdirSync, realpathSync } from "node:fs";
import * as path from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/ajv";
import { ResourceUpdatedNotificationSchema, type CallToolResult, type Progress } from "@modelcontextprotocol/sdk/types.js";
import { Code } from "@connectrpc/connect";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { Berth, BerthClientError, build, InvalidEventError } from "@berth/client";
import { TOOLS } from "@berth/mcp";
import { startBudget } from "./budget-e2e.js";
import { makeTempDir, repoPath, startService, stopAll } from "./harness.js";

const BERTH = repoPath("packages/cli/bin/berth.js");

let sessionsUrl: string;
let budgetUrl: string;
let project: string;
/** Another client of the services, as a browser or a tool beside the agents would be. */
let other: Berth;
const agents: Agent[] = [];

beforeAll(async () => {
  project = path.join(realpathSync(makeTempDir("berth-mcp-")), "project");
  mkdirSync(path.join(project, "src"), { recursive: true });
  const [sessions, budget] = await Promise.all([startService("sessions"), startBudget()]);
  sessionsUrl = sessions.url("sessions");
  budgetUrl = budget.url;
  other = new Berth({ sessionsUrl, budgetUrl });
});
afterEach(async () => {
  await Promise.all(agents.splice(0).map((agent) => agent.client.close().catch(() => {})));
});
afterAll(stopAll);

interface Agent {
  readonly name: string;
  readonly client: Client;
  readonly pid: number;
  /** Calls a tool; `onprogress` asks for progress notifications. */
  call(name: string, args: Record<string, unknown>, onprogress?: (progress: Progress) => void): Promise<CallToolResult>;
}

/** Starts `berth mcp` for an agent named `name`, as a host does, and connects the SDK's client to it. */
async function startAgent(name: string): Promise<Agent> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [BERTH, "mcp"],
    cwd: project,
    env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? "", BERTH_SESSIONS_URL: sessionsUrl, BERTH_BUDGET_URL: budgetUrl },
    stderr: "pipe",
  });
  const client = new Client({ name, version: "1.0.0" });
  await client.connect(transport);
  const agent: Agent = {
    name,
    client,
    pid: transport.pid!,
    call: async (tool, args, onprogress) =>
      (await client.callTool({ name: tool, arguments: args }, undefined, { timeout: 60_000, ...(onprogress ? { onprogress } : {}) })) as CallToolResult,
  };
  agents.push(agent);
  return agent;
}

/** A tool's structured answer, read as the tests read JSON. */
// biome-ignore lint/suspicious/noExplicitAny: the answers are JSON of every shape; each test says what it expects of them
type Json = any;

/** The structured answer of a call that succeeded. */
function ok(result: CallToolResult): Json {
  expect(result.isError ?? false, JSON.stringify(result.content)).toBe(false);
  return result.structuredContent as Json;
}

/** The error of a call that failed as a tool error. */
function failed(result: CallToolResult): {
  code: string;
  reason?: string;
  message: string;
  advice: string;
  retryAfterMs?: number;
  facts?: Json;
} {
  expect(result.isError, JSON.stringify(result.structuredContent)).toBe(true);
  return (result.structuredContent as Json).error;
}

/** A promise resolved by the first progress notification whose message matches, and the callback that feeds it. */
function progressMatching(pattern: RegExp): { seen: Promise<string>; onprogress: (progress: Progress) => void } {
  let resolve!: (message: string) => void;
  const seen = new Promise<string>((r) => (resolve = r));
  return { seen, onprogress: (progress) => (pattern.test(progress.message ?? "") ? resolve(progress.message!) : undefined) };
}

describe("berth mcp", () => {
  it("answers initialize as berth, with instructions, and lists every tool and resource", async () => {
    const agent = await startAgent("lister");
    expect(agent.client.getServerVersion()).toMatchObject({ name: "berth" });
    expect(agent.client.getInstructions()).toMatch(/lock_acquire/);
    expect(agent.client.getServerCapabilities()?.resources).toMatchObject({ subscribe: true });
    const { tools } = await agent.client.listTools();
    expect(tools.map((t) => t.name)).toEqual(TOOLS.map((t) => t.name));
    for (const tool of tools) {
      expect(tool.description!.length, tool.name).toBeGreaterThan(60);
      expect(tool.inputSchema.type).toBe("object");
    }
    const { resources } = await agent.client.listResources();
    expect(resources.map((r) => r.uri)).toEqual(expect.arrayContaining(["berth://locks", "berth://budget"]));
    const { resourceTemplates } = await agent.client.listResourceTemplates();
    expect(resourceTemplates.map((t) => t.uriTemplate)).toEqual(["berth://sessions/{sessionId}"]);
  });

  it("writes nothing but protocol messages to stdout, logs to stderr, and exits 0 when stdin closes", async () => {
    const child = spawn(process.execPath, [BERTH, "mcp"], {
      cwd: project,
      env: { PATH: process.env.PATH, BERTH_SESSIONS_URL: sessionsUrl, BERTH_BUDGET_URL: budgetUrl },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stdout = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
    child.stderr.resume();
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const requests = [
      { jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "raw", version: "1" } } },
      { jsonrpc: "2.0", method: "notifications/initialized" },
      { jsonrpc: "2.0", id: 2, method: "tools/list" },
      {
        jsonrpc: "2.0",
        id: 3,
        method: "tools/call",
        params: { name: "session_append", arguments: { sessionId: "raw", events: [{ type: "agent_phase", phase: "a" }] } },
      },
      { jsonrpc: "2.0", id: 4, method: "tools/call", params: { name: "session_snapshot", arguments: { sessionId: "never-appended" } } },
      { jsonrpc: "2.0", id: 5, method: "tools/call", params: { name: "lock_acquire", arguments: { file: "src/raw.ts" } } },
      { jsonrpc: "2.0", id: 6, method: "resources/read", params: { uri: "berth://locks" } },
    ];
    // One at a time: each answer read before the next request, then stdin closed.
    for (const request of requests) {
      child.stdin.write(`${JSON.stringify(request)}\n`);
      if (!("id" in request)) continue;
      while (!stdout.split("\n").some((line) => line.includes(`"id":${request.id}`))) await new Promise((resolve) => child.stdout.once("data", resolve));
    }
    child.stdin.end();
    expect(await exited).toBe(0);
    const lines = stdout.split("\n").filter((line) => line !== "");
    expect(lines).toHaveLength(6);
    for (const line of lines) expect(JSON.parse(line)).toMatchObject({ jsonrpc: "2.0" });
    // The lock the process held went with it.
    expect((await other.locks.inspect(path.join(project, "src/raw.ts"))).holder).toBeUndefined();
  });
});

describe("locks", () => {
  it("acquire holds the lock in the MCP process; inspect, a fenced append under it, release; a fenced append without it is refused", async () => {
    const agent = await startAgent("agent-a");
    const file = path.join(project, "src/app.ts");
    const acquired = ok(await agent.call("lock_acquire", { file: "src/app.ts" }));
    expect(acquired).toMatchObject({ held: true, alreadyHeld: false, file });
    expect(acquired.leaseToken).toBeUndefined();
    expect(acquired.owner).toMatch(/^berth mcp for agent-a \(/);
    const token = BigInt(acquired.fencingToken);
    // The same file again: the lock already held, not a second place in line behind itself.
    expect(ok(await agent.call("lock_acquire", { file }))).toMatchObject({ alreadyHeld: true, fencingToken: acquired.fencingToken });
    // Two at once for a free file: one grant, which both answer.
    const both = await Promise.all([agent.call("lock_acquire", { file: "src/twice.ts" }), agent.call("lock_acquire", { file: "src/twice.ts" })]);
    expect(both.map((result) => ok(result).alreadyHeld).sort()).toEqual([false, true]);
    expect(ok(both[0]!).fencingToken).toBe(ok(both[1]!).fencingToken);
    ok(await agent.call("lock_release", { file: "src/twice.ts" }));

    const inspected = ok(await agent.call("lock_inspect", { file: "src/../src/app.ts" }));
    expect(inspected).toMatchObject({ file, heldHere: true, holder: { owner: acquired.owner } });
    expect((await other.locks.inspect(file)).holder?.fencingToken).toBe(token);

    const appended = ok(
      await agent.call("lock_append_fenced", { file: "src/app.ts", sessionId: "fenced", events: [{ type: "agent_phase", phase: "writing" }] }),
    );
    expect(appended).toMatchObject({ sessionId: "fenced", firstSeq: 1, lastSeq: 1, phase: "new", fence: { file, fencingToken: String(token) } });

    expect(ok(await agent.call("lock_release", { file }))).toEqual({ file, released: true });
    expect((await other.locks.inspect(file)).holder).toBeUndefined();
    expect(ok(await agent.call("lock_release", { file }))).toEqual({ file, released: false });
    expect(ok(await agent.call("lock_inspect", { file }))).toMatchObject({ heldHere: false });

    const refused = failed(await agent.call("lock_append_fenced", { file, sessionId: "fenced", events: [{ type: "agent_phase", phase: "late" }] }));
    expect(refused).toMatchObject({ code: "failed_precondition", reason: "NOT_HELD_HERE" });
    expect(refused.advice).toMatch(/lock_acquire/);
  });

  it("a lock held through MCP is freed the moment the MCP process is SIGKILLed: the waiter gets it, with a greater token", async () => {
    const [holder, waiter] = await Promise.all([startAgent("holder"), startAgent("waiter")]);
    const file = path.join(project, "src/killed.ts");
    const held = ok(await holder.call("lock_acquire", { file }));
    const queued = progressMatching(/#1 in line, held by berth mcp for holder/);
    const waiting = waiter.call("lock_acquire", { file, maxWaitMs: 60_000 }, queued.onprogress);
    await queued.seen;
    process.kill(holder.pid, "SIGKILL");
    const granted = ok(await waiting);
    expect(granted.owner).toMatch(/^berth mcp for waiter /);
    expect(BigInt(granted.fencingToken)).toBeGreaterThan(BigInt(held.fencingToken));
    expect((await other.locks.inspect(file)).holder?.owner).toBe(granted.owner);
  });

  it("two agents contending for one file are served in arrival order, each with a greater fencing token", async () => {
    const [first, second] = await Promise.all([startAgent("first"), startAgent("second")]);
    const file = path.join(project, "src/contended.ts");
    const blocker = await other.locks.lock(file, { owner: "blocker" });
    const firstQueued = progressMatching(/#1 in line/);
    const firstCall = first.call("lock_acquire", { file, maxWaitMs: 60_000 }, firstQueued.onprogress);
    await firstQueued.seen;
    const secondQueued = progressMatching(/#2 in line/);
    let secondDone = false;
    const secondCall = second.call("lock_acquire", { file, maxWaitMs: 60_000 }, secondQueued.onprogress).finally(() => (secondDone = true));
    await secondQueued.seen;

    await blocker.release();
    const firstGrant = ok(await firstCall);
    expect(firstGrant.owner).toMatch(/^berth mcp for first /);
    expect(BigInt(firstGrant.fencingToken)).toBeGreaterThan(blocker.fencingToken);
    expect(secondDone).toBe(false);
    expect((await other.locks.inspect(file)).waiters.map((w) => w.owner)).toEqual([expect.stringMatching(/^berth mcp for second /)]);

    ok(await first.call("lock_release", { file }));
    const secondGrant = ok(await secondCall);
    expect(secondGrant.owner).toMatch(/^berth mcp for second /);
    expect(BigInt(secondGrant.fencingToken)).toBeGreaterThan(BigInt(firstGrant.fencingToken));
  });

  it("a wait that runs out is a tool error naming the reason, the holder and what to do", async () => {
    const agent = await startAgent("impatient");
    const file = path.join(project, "src/busy.ts");
    await using _held = await other.locks.lock(file, { owner: "the other tool" });
    const error = failed(await agent.call("lock_acquire", { file, maxWaitMs: 0 }));
    expect(error).toMatchObject({ code: "resource_exhausted", reason: "WAIT_EXHAUSTED", facts: { lockHeld: { owner: "the other tool" } } });
    expect(error.advice).toMatch(/try again later/);
    expect((await agent.call("lock_acquire", { file, maxWaitMs: 0 })).content).toEqual([
      { type: "text", text: expect.stringMatching(/^RESOURCE_EXHAUSTED WAIT_EXHAUSTED: .*\nWhat to do: /) },
    ]);
  });
});

describe("sessions", () => {
  it("append makes an idempotency key and a retry with it is written once; snapshot; journal in pages; a stale expectedSeq is SEQ_CONFLICT", async () => {
    const agent = await startAgent("writer");
    const first = ok(await agent.call("session_append", { sessionId: "s-append", events: [{ type: "generate", pageUrl: "/pricing", count: 3 }] }));
    expect(first).toMatchObject({ sessionId: "s-append", firstSeq: 1, lastSeq: 1, duplicate: false, phase: "generate_requested" });
    expect(first.idempotencyKey).toMatch(/^[0-9a-f-]{36}$/);
    const retried = ok(
      await agent.call("session_append", {
        sessionId: "s-append",
        events: [{ type: "generate", pageUrl: "/pricing", count: 3 }],
        idempotencyKey: first.idempotencyKey,
      }),
    );
    expect(retried).toMatchObject({ firstSeq: 1, duplicate: true, idempotencyKey: first.idempotencyKey });

    const batch = ok(
      await agent.call("session_append", {
        sessionId: "s-append",
        expectedSeq: 1,
        events: [
          { type: "agent_phase", phase: "planning", prompt: "kept as given" },
          { type: "agent_phase", phase: "writing" },
          { type: "variants_ready", arrivedVariants: 3 },
          { type: "my_tool_note", text: "any type" },
        ],
      }),
    );
    expect(batch).toMatchObject({ firstSeq: 2, lastSeq: 5, phase: "variants_ready" });

    const snapshot = ok(await agent.call("session_snapshot", { sessionId: "s-append" }));
    expect(snapshot).toMatchObject({ lastSeq: 5, snapshot: { id: "s-append", phase: "variants_ready", pageUrl: "/pricing" } });

    const page1 = ok(await agent.call("session_journal", { sessionId: "s-append", limit: 2 }));
    expect(page1.entries.map((e: Json) => e.seq)).toEqual(["1", "2"]);
    expect(page1.entries[1].event).toEqual({ type: "agent_phase", phase: "planning", prompt: "kept as given" });
    expect(page1).toMatchObject({ nextFromSeq: 3, more: true });
    const page2 = ok(await agent.call("session_journal", { sessionId: "s-append", fromSeq: page1.nextFromSeq, limit: 3 }));
    expect(page2.entries.map((e: Json) => e.type)).toEqual(["agent_phase", "variants_ready", "my_tool_note"]);
    expect(page2).toMatchObject({ nextFromSeq: 6, more: false });

    const conflict = failed(await agent.call("session_append", { sessionId: "s-append", expectedSeq: 2, events: [{ type: "agent_done" }] }));
    expect(conflict).toMatchObject({ code: "aborted", reason: "SEQ_CONFLICT", facts: { seqConflict: { currentSeq: "5" } } });
    expect(conflict.advice).toMatch(/session_snapshot/);
    expect(conflict.advice).toMatch(/re-read, redo the change, append again/);

    const reused = failed(
      await agent.call("session_append", { sessionId: "s-append", events: [{ type: "agent_done" }], idempotencyKey: first.idempotencyKey }),
    );
    expect(reused.reason).toBe("IDEMPOTENCY_KEY_REUSED");
    const missing = failed(await agent.call("session_snapshot", { sessionId: "never-seen" }));
    expect(missing).toMatchObject({ code: "not_found", reason: "SESSION_NOT_FOUND" });
  });

  it("wait returns when a browser-like client appends the checkpoint, with that entry", async () => {
    const agent = await startAgent("waiter-for-checkpoint");
    const done = ok(await agent.call("session_append", { sessionId: "s-wait", events: [{ type: "agent_done", arrivedVariants: 2 }] }));
    // Entries after the agent's own count: the checkpoint may come before or after the watch opens.
    const waiting = agent.call("session_wait", { sessionId: "s-wait", eventType: "checkpoint", afterSeq: done.lastSeq, timeoutMs: 60_000 });
    await other.append("s-wait", { type: "agent_phase", phase: "not this one" });
    await other.append("s-wait", { type: "checkpoint", revision: 7, visibleVariant: 2 });
    const reached = ok(await waiting);
    expect(reached).toMatchObject({
      reached: true,
      matched: "eventType",
      lastSeq: 3,
      entry: { seq: "3", type: "checkpoint", event: { type: "checkpoint", revision: 7 } },
    });
  });

  it("wait: a phase already reached answers at once; a seq reached later; a wait that runs out says so; no condition is refused", async () => {
    const agent = await startAgent("waiter-for-phase");
    ok(await agent.call("session_append", { sessionId: "s-phase", events: [{ type: "generate", count: 1 }] }));
    expect(ok(await agent.call("session_wait", { sessionId: "s-phase", phase: "generate_requested" }))).toMatchObject({
      reached: true,
      matched: "phase",
      lastSeq: 1,
    });
    const seq = agent.call("session_wait", { sessionId: "s-phase", untilSeq: 3, timeoutMs: 60_000 });
    await other.sessions.appendMany("s-phase", [
      { type: "agent_phase", phase: "a" },
      { type: "agent_phase", phase: "b" },
    ]);
    expect(ok(await seq)).toMatchObject({ reached: true, matched: "untilSeq", lastSeq: 3 });
    const timedOut = ok(await agent.call("session_wait", { sessionId: "s-phase", eventType: "never", timeoutMs: 100 }));
    expect(timedOut).toMatchObject({ reached: false, lastSeq: 3, phase: "generate_requested" });
    expect(failed(await agent.call("session_wait", { sessionId: "s-phase" }))).toMatchObject({ reason: "NO_CONDITION" });
  });
});

describe("budget", () => {
  it("reserve holds memory and cpu in the MCP process, state lists it, release gives it back; an impossible need is IMPOSSIBLE", async () => {
    const agent = await startAgent("builder");
    const reserved = ok(await agent.call("budget_reserve", { memory: "1G", cpu: 1, name: "tests", reason: "agent builder runs the tests" }));
    const id = reserved.reservation.id as string;
    expect(reserved.reservation.owner).toBe("agent builder runs the tests");
    const state = ok(await agent.call("budget_state", {}));
    expect(state.heldHere).toEqual([id]);
    expect(state.reservations.map((r: Json) => r.id)).toContain(id);
    expect(ok(await agent.call("budget_release", { reservationId: id }))).toEqual({ reservationId: id, released: true });
    expect((await other.budget.state()).reservations.map((r) => r.id)).not.toContain(id);

    const impossible = failed(await agent.call("budget_reserve", { memory: "100G" }));
    expect(impossible).toMatchObject({ reason: "IMPOSSIBLE" });
    expect(impossible.advice).toMatch(/ask for less/);
    expect(impossible.facts?.refusal).toBeDefined();
  });

  it("a reserve that waits tells its place, ETA and what it waits for as progress, and is admitted when room comes back; the process's end releases what it holds", async () => {
    const [big, patient] = await Promise.all([startAgent("big"), startAgent("patient")]);
    const first = ok(await big.call("budget_reserve", { memory: "3G", kind: "start" }));
    // With an ETA and what it rests on, or none and why (the holder has no lease; its owner may have no past runs).
    const queued = progressMatching(/#1 in the budget's queue, (about \d+ s left \(.+\)|no ETA \(.+\)): .*memory/);
    const second = patient.call("budget_reserve", { memory: "2G", maxWaitMs: 60_000 }, queued.onprogress);
    expect(await queued.seen).toMatch(/needs 2G/);
    // The agent holding the 3G goes away without releasing: the service frees it at once.
    process.kill(big.pid, "SIGKILL");
    const admitted = ok(await second);
    expect(admitted.lastQueued).toMatchObject({ position: 1 });
    expect(admitted.lastQueued.waitForText).toMatch(/memory/);
    expect((await other.budget.state()).reservations.map((r) => r.id)).not.toContain(first.reservation.id);
    ok(await patient.call("budget_release", { reservationId: admitted.reservation.id }));
  });
});

describe("resources", () => {
  /** Subscribes `agent` to `uri`; the promise resolves at the next resources/updated for it. */
  async function nextUpdate(agent: Agent, uri: string): Promise<() => Promise<void>> {
    const waiters: Array<() => void> = [];
    agent.client.setNotificationHandler(ResourceUpdatedNotificationSchema, (notification) => {
      if (notification.params.uri === uri) for (const wake of waiters.splice(0)) wake();
    });
    await agent.client.subscribeResource({ uri });
    return () => new Promise<void>((resolve) => waiters.push(resolve));
  }

  it("a session's snapshot: read, listed, and updated when another client appends", async () => {
    const agent = await startAgent("reader");
    await other.append("s-resource", { type: "generate", count: 2 });
    const uri = "berth://sessions/s-resource";
    const read = await agent.client.readResource({ uri });
    expect(JSON.parse((read.contents[0] as { text: string }).text)).toMatchObject({
      sessionId: "s-resource",
      lastSeq: 1,
      snapshot: { phase: "generate_requested" },
    });
    expect((await agent.client.listResources()).resources.map((r) => r.uri)).toContain(uri);
    const updated = (await nextUpdate(agent, uri))();
    await other.append("s-resource", { type: "agent_phase", phase: "writing" });
    await updated;
    expect(JSON.parse(((await agent.client.readResource({ uri })).contents[0] as { text: string }).text)).toMatchObject({ lastSeq: 2 });
    await expect(agent.client.readResource({ uri: "berth://sessions/no-such-session" })).rejects.toThrow(/SESSION_NOT_FOUND/);
  });

  it("the locks: read with heldHere, and updated when another client takes a lock", async () => {
    const agent = await startAgent("lock-watcher");
    const file = path.join(project, "src/watched.ts");
    ok(await agent.call("lock_acquire", { file }));
    const read = JSON.parse(((await agent.client.readResource({ uri: "berth://locks" })).contents[0] as { text: string }).text);
    expect(read.heldHere).toEqual([file]);
    expect(read.locks).toEqual(
      expect.arrayContaining([{ file, holder: expect.objectContaining({ owner: expect.stringMatching(/lock-watcher/), kind: "stream" }), waiters: [] }]),
    );
    const updated = (await nextUpdate(agent, "berth://locks"))();
    await using _ = await other.locks.lock(path.join(project, "src/other.ts"));
    await updated;
  });

  it("the budget: read, and updated when another client reserves", async () => {
    const agent = await startAgent("budget-watcher");
    const read = JSON.parse(((await agent.client.readResource({ uri: "berth://budget" })).contents[0] as { text: string }).text);
    expect(read).toMatchObject({ heldHere: [], policy: expect.any(Object) });
    const updated = (await nextUpdate(agent, "berth://budget"))();
    const { reservation } = await other.budget.reserve([build("x", { memory: "100M" })]);
    await updated;
    await other.budget.release(reservation!.id);
  });
});

describe("the input schemas", () => {
  /** An append's arguments, checked by session_append's schema, the service (through @berth/client, as the tool calls it) and the tool. */
  const CASES: ReadonlyArray<readonly [string, Record<string, unknown>]> = [
    ["a typed event", { events: [{ type: "generate", count: 3, pageUrl: "/" }] }],
    ["a typed event with other keys", { events: [{ type: "agent_phase", phase: "x", anything: { nested: [1, null] } }] }],
    ["any other type", { events: [{ type: "my.own-type", count: "any" }] }],
    ["a Value field of any JSON", { events: [{ type: "variant_plan", plan: [1, "two", { three: null }] }] }],
    ["an int64 field", { events: [{ type: "checkpoint", revision: 9007199254740991 }] }],
    ["a count that is a string", { events: [{ type: "generate", count: "3" }] }],
    ["a negative count", { events: [{ type: "generate", count: -1 }] }],
    ["a count past uint32", { events: [{ type: "generate", count: 4294967296 }] }],
    ["a fractional count", { events: [{ type: "generate", count: 1.5 }] }],
    ["a phase that is a number", { events: [{ type: "agent_phase", phase: 7 }] }],
    ["a boolean that is a string", { events: [{ type: "agent_done", carbonize: "true" }] }],
    ["waivers that are not a list", { events: [{ type: "detector_waivers", waivers: {} }] }],
    ["an int64 past 2^53", { events: [{ type: "checkpoint", revision: 2 ** 60 }] }],
    ["an empty type", { events: [{ type: "" }] }],
    ["a 128-character type", { events: [{ type: "t".repeat(128) }] }],
    ["a 129-character type", { events: [{ type: "t".repeat(129) }] }],
    ["no type", { events: [{ phase: "x" }] }],
    ["no event", { events: [] }],
    ["a session id with a space", { sessionId: "bad id", events: [{ type: "agent_phase" }] }],
    ["a 129-character session id", { sessionId: "s".repeat(129), events: [{ type: "agent_phase" }] }],
    ["a 128-character idempotency key", { idempotencyKey: "k".repeat(128), events: [{ type: "agent_phase" }] }],
    ["a 129-character idempotency key", { idempotencyKey: "k".repeat(129), events: [{ type: "agent_phase" }] }],
  ];

  it("session_append's schema accepts exactly what the service accepts, and the tool answers as both do", async () => {
    const agent = await startAgent("schema-checker");
    const tool = (await agent.client.listTools()).tools.find((t) => t.name === "session_append")!;
    const validate = new AjvJsonSchemaValidator().getValidator(tool.inputSchema as never);
    const verdicts: string[] = [];
    let n = 0;
    for (const [name, args] of CASES) {
      const sessionId = (args.sessionId as string | undefined) ?? `schema-${n++}`;
      const full: Record<string, unknown> = { sessionId, ...args };
      const schema = validate(full).valid;
      const service = await other.sessions
        .appendMany(sessionId, full.events as never, full.idempotencyKey === undefined ? {} : { idempotencyKey: full.idempotencyKey as string })
        .then(
          () => true,
          (error: unknown) => {
            if (error instanceof InvalidEventError || (error instanceof BerthClientError && error.reason === "INVALID_FIELD")) return false;
            throw error;
          },
        );
      // Another session for the tool: the first append took this one.
      const viaTool = await agent.call("session_append", { ...full, sessionId: (args.sessionId as string | undefined) ?? `${sessionId}-tool` });
      verdicts.push(`${name}: schema ${schema}, service ${service}, tool ${!viaTool.isError}`);
      expect(schema, `${name}: the schema and the service disagree`).toBe(service);
      expect(!viaTool.isError, `${name}: the tool and the service disagree`).toBe(service);
    }
    // Both verdicts occur: the cases are not all alike.
    expect(verdicts.some((v) => v.includes("schema true")) && verdicts.some((v) => v.includes("schema false"))).toBe(true);
  });

  it("lock_acquire's owner and budget_reserve's sizes: the schema accepts what the service accepts", async () => {
    const agent = await startAgent("schema-checker-2");
    const { tools } = await agent.client.listTools();
    const validator = (name: string) => new AjvJsonSchemaValidator().getValidator(tools.find((t) => t.name === name)!.inputSchema as never);
    const refusedArgument = (error: unknown) => {
      if (error instanceof BerthClientError && error.code === Code.InvalidArgument) return false;
      throw error;
    };
    const lock = validator("lock_acquire");
    for (const owner of ["o", "o".repeat(256), "", "o".repeat(257)]) {
      const file = path.join(project, "src/schema.ts");
      const service = await other.locks.lock(file, { owner, maxWaitMs: 0 }).then(async (held) => (await held.release(), true), refusedArgument);
      const viaTool = await agent.call("lock_acquire", { file, owner, maxWaitMs: 0 });
      if (!viaTool.isError) ok(await agent.call("lock_release", { file }));
      expect(lock({ file, owner }).valid, `owner of ${owner.length}`).toBe(service);
      expect(!viaTool.isError, `owner of ${owner.length}`).toBe(service);
    }
    const reserve = validator("budget_reserve");
    for (const memory of ["100M", "1024", " 512 m ", ".5G", "1.5GiB", "1g", "5 GB", "lots", "1Gi", "-1G", "1e3", "1 G B"]) {
      const service = await other.budget.check([build("x", { memory })]).then(() => true, refusedArgument);
      expect(reserve({ memory }).valid, memory).toBe(service);
    }
  });
});
