/**
 * The tools: locks (acquire, release, inspect, a fenced append), sessions (append, snapshot, read
 * the journal, wait) and the budget (reserve, release, state). Each takes arguments its schema
 * describes (schemas.ts: from the protos), calls the services through @berth/client, and answers
 * the structured result (the messages as proto JSON) with a line to read; a refusal is a tool
 * error with the reason and what to do (errors.ts).
 */
import { toJson } from "@bufbuild/protobuf";
import { Code } from "@connectrpc/connect";
import type { CallToolResult, ServerNotification, ServerRequest } from "@modelcontextprotocol/sdk/types.js";
import type { RequestHandlerExtra } from "@modelcontextprotocol/sdk/shared/protocol.js";
import * as z from "zod";
import { appliance, build, callWithRequestId, eventToJournal, newRequestId, start, type Admission, type Berth, type JournalEvent } from "@berth/client";
import { NeedItemSchema, ReservationSchema, ResourceSpecSchema } from "@berth/api/berth/budget/v1/budget_pb";
import { SIZE_PATTERN } from "@berth/wire/amounts";
import { AdmitStartSchema, GetStateResponseSchema, QueuedSchema, type Queued } from "@berth/api/berth/budget/v1/budget_service_pb";
import { AcquireRequestSchema, InspectResponseSchema, LeaseSchema, type Lease } from "@berth/api/berth/locks/v1/lock_service_pb";
import {
  AppendEventRequestSchema,
  JournalEntrySchema,
  ReadJournalRequestSchema,
  type AppendEventsResponse,
  type JournalEntry,
} from "@berth/api/berth/sessions/v1/session_service_pb";
import { SnapshotSchema, type Snapshot } from "@berth/api/berth/sessions/v1/snapshot_pb";
import { msOfDuration } from "@berth/client/wire-time";
import { describeFailure, MCP_REASONS, mcpRefusal, toolError } from "./errors.js";
import type { Holdings } from "./holdings.js";
import { eventsSchema, fieldsOf, sessionIdSchema } from "./schemas.js";
import { WAIT_PROGRESS_INTERVAL_MS, waitForSession } from "./session-wait.js";

/** What a tool runs with. */
export interface ToolContext {
  readonly berth: Berth;
  readonly holdings: Holdings;
  /** Who holds a lock or a reservation taken through this server, unless the call names one. */
  owner(): string;
}

type Extra = RequestHandlerExtra<ServerRequest, ServerNotification>;

/** A tool: its name, what an agent reads about it, its arguments, what it does. */
export interface ToolDefinition {
  readonly name: string;
  readonly title: string;
  readonly description: string;
  readonly input: z.ZodObject;
  /** Hints for the host (MCP's tool annotations). */
  readonly annotations: { readOnlyHint?: boolean; destructiveHint?: boolean; idempotentHint?: boolean; openWorldHint?: boolean };
  run(args: Record<string, unknown>, context: ToolContext, extra: Extra): Promise<CallToolResult>;
}

/** A result: a line for the agent to read, then the structured answer (also as JSON text, for hosts that show only text). */
function answer(summary: string, structured: Record<string, unknown>): CallToolResult {
  return { content: [{ type: "text", text: `${summary}\n${JSON.stringify(structured)}` }], structuredContent: structured };
}

/** Sends a progress notification when the caller asked for progress (a `progressToken`). */
function progressReporter(extra: Extra): (message: string) => void {
  const token = extra._meta?.progressToken;
  let count = 0;
  return (message) => {
    if (token === undefined) return;
    count++;
    extra.sendNotification({ method: "notifications/progress", params: { progressToken: token, progress: count, message } }).catch(() => {});
  };
}

/**
 * A signal for the wait of a call that, once granted, holds something: aborted if the caller
 * cancels while it waits, never after (the grant outlives the call that asked for it).
 */
function waitSignal(extra: Extra): { signal: AbortSignal; granted(): void } {
  const controller = new AbortController();
  const onCancel = () => controller.abort(extra.signal.reason);
  if (extra.signal.aborted) onCancel();
  else extra.signal.addEventListener("abort", onCancel, { once: true });
  return { signal: controller.signal, granted: () => extra.signal.removeEventListener("abort", onCancel) };
}

function leaseJson(lease: Lease): Record<string, unknown> {
  // The lease token stays here: this server holds the lock, and releases it with lock_release.
  const { leaseToken: _, ...rest } = toJson(LeaseSchema, lease) as Record<string, unknown>;
  return rest;
}

/** A journal entry with its event as the journal holds it (`{type, ...keys}`), as session_append takes it. */
export function entryJson(entry: JournalEntry): Record<string, unknown> {
  const json = toJson(JournalEntrySchema, entry) as Record<string, unknown>;
  return { ...json, event: entry.event === undefined ? undefined : eventToJournal(entry.event) };
}

function snapshotJson(snapshot: Snapshot | undefined): unknown {
  return snapshot === undefined ? undefined : toJson(SnapshotSchema, snapshot);
}

function appendAnswer(sessionId: string, response: AppendEventsResponse, idempotencyKey: string, fence?: Record<string, unknown>): CallToolResult {
  const structured = {
    sessionId,
    firstSeq: Number(response.firstSeq),
    lastSeq: Number(response.lastSeq),
    duplicate: response.duplicate,
    idempotencyKey,
    phase: response.snapshot?.phase ?? "",
    ...(fence === undefined ? {} : { fence }),
    snapshot: snapshotJson(response.snapshot),
  };
  const seqs = response.firstSeq === response.lastSeq ? `seq ${response.firstSeq}` : `seqs ${response.firstSeq}-${response.lastSeq}`;
  return answer(
    `${response.duplicate ? "Already appended (same idempotency key): " : "Appended "}${seqs} to ${sessionId}; phase ${structured.phase || "(none)"}.`,
    structured,
  );
}

/** The arguments every append takes, from AppendEventsRequest. */
const APPEND_INPUT = {
  sessionId: sessionIdSchema("The session to append to; the first append creates it."),
  events: eventsSchema(),
  ...fieldsOf(AppendEventRequestSchema, {
    expected_seq: {
      description:
        "Optimistic concurrency: append only if this is still the session's last seq (0: only if it has no entry yet); otherwise nothing is written and the call fails with SEQ_CONFLICT carrying the current seq.",
    },
    idempotency_key: {
      max: 128,
      note: "Here the key covers the whole batch. Unset: this server makes one, and makes the call again with it while the call fails on the way. It is in the answer: call again with it after an error that says to retry.",
    },
  }),
};

/** Appends, with a key that every attempt of this call reuses. */
async function append(
  context: ToolContext,
  args: Record<string, unknown>,
  extra: Extra,
  fence?: { file: string; fencingToken: bigint },
): Promise<CallToolResult> {
  const sessionId = args.sessionId as string;
  const idempotencyKey = (args.idempotencyKey as string | undefined) || newRequestId();
  const response = await callWithRequestId(
    (key) =>
      context.berth.sessions.appendMany(sessionId, args.events as JournalEvent[], {
        idempotencyKey: key,
        expectedSeq: args.expectedSeq as number | undefined,
        fence,
        signal: extra.signal,
      }),
    { requestId: idempotencyKey, signal: extra.signal },
  );
  return appendAnswer(sessionId, response, idempotencyKey, fence === undefined ? undefined : { file: fence.file, fencingToken: String(fence.fencingToken) });
}

/** The canonical file of `file` (relative to this server's working directory), as the service names its lock. */
async function canonicalFile(context: ToolContext, file: string, signal: AbortSignal): Promise<string> {
  return (await context.berth.locks.inspect(file, { signal })).file;
}

const FILE_NOTE = "Absolute, or relative to the working directory berth mcp runs in (the agent host's cwd setting).";

const lockAcquire: ToolDefinition = {
  name: "lock_acquire",
  title: "Acquire a source lock",
  description:
    "Waits for the lock on a file and holds it, in this MCP server, until lock_release, or until the agent's session ends (the server's process " +
    "going away frees it at once). Other tools, people and agents asking for the same file wait in line (first come, first served) and see the owner. " +
    "Answers the grant: the canonical file and its fencing token, which grows with each grant of the file; write under the lock with " +
    "lock_append_fenced. If this server already holds the file's lock, answers that lock. A wait that runs out is WAIT_EXHAUSTED naming the holder.",
  input: z.strictObject({
    ...fieldsOf(AcquireRequestSchema, {
      file: { required: true, description: `The file to lock. ${FILE_NOTE} Every spelling of one file (symlinks, '..') is one lock.` },
      owner: { min: 1, max: 256, note: "Default: 'berth mcp for <agent>' with the user, host and pid." },
      max_wait: {},
    }),
  }),
  annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  async run(args, context, extra) {
    const file = await canonicalFile(context, args.file as string, extra.signal);
    const already = context.holdings.lock(file);
    if (already !== undefined)
      return answer(`Already held here: ${file}, fencing token ${already.fencingToken}.`, { held: true, alreadyHeld: true, ...leaseJson(already.lease) });
    const report = progressReporter(extra);
    const wait = waitSignal(extra);
    const { held, joined } = await context.holdings.acquireLock(file, () =>
      context.berth.locks.lock(file, {
        owner: (args.owner as string | undefined) ?? context.owner(),
        maxWaitMs: args.maxWaitMs as number | undefined,
        signal: wait.signal,
        onWaiting: (waiting) => report(`waiting for ${file}: #${waiting.position} in line, held by ${waiting.holder?.owner ?? "someone"}`),
      }),
    );
    wait.granted();
    return answer(`Locked ${held.file}, fencing token ${held.fencingToken}. Release it with lock_release when done.`, {
      held: true,
      alreadyHeld: joined,
      ...leaseJson(held.lease),
    });
  },
};

const lockRelease: ToolDefinition = {
  name: "lock_release",
  title: "Release a source lock",
  description: "Releases the lock this server holds on a file: the next in line gets it (with a greater fencing token). Answers whether it was held here.",
  input: z.strictObject({ ...fieldsOf(AcquireRequestSchema, { file: { required: true, description: `The locked file. ${FILE_NOTE}` } }) }),
  annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  async run(args, context, extra) {
    const file = await canonicalFile(context, args.file as string, extra.signal);
    const held = context.holdings.lock(file);
    if (held === undefined) return answer(`Not held here: ${file}.`, { file, released: false });
    const released = await held.release();
    return answer(`Released ${file}.`, { file, released: released || held.signal.aborted });
  },
};

const lockInspect: ToolDefinition = {
  name: "lock_inspect",
  title: "Who holds a file's lock",
  description:
    "Who holds the lock on a file (owner, fencing token, since when), who waits for it in order, and the last fencing token granted; heldHere says whether this server holds it.",
  input: z.strictObject({ ...fieldsOf(AcquireRequestSchema, { file: { required: true, description: `The file. ${FILE_NOTE}` } }) }),
  annotations: { readOnlyHint: true, openWorldHint: false },
  async run(args, context, extra) {
    const inspected = await context.berth.locks.inspect(args.file as string, { signal: extra.signal });
    const heldHere = context.holdings.lock(inspected.file) !== undefined;
    const holder = inspected.holder === undefined ? "free" : `held by ${inspected.holder.owner}${heldHere ? " (this server)" : ""}`;
    return answer(`${inspected.file}: ${holder}, ${inspected.waiters.length} waiting.`, { ...(toJson(InspectResponseSchema, inspected) as object), heldHere });
  },
};

const lockAppendFenced: ToolDefinition = {
  name: "lock_append_fenced",
  title: "Append under a lock held here",
  description:
    "Appends to a session fenced by the lock this server holds on a file: written only while that lock's fencing token is still the file's current " +
    "one, so a write made after the lock was lost (expired, taken over) is refused (FENCE_REJECTED) instead of overwriting a newer holder's work. " +
    "Acquire the lock with lock_acquire first. Otherwise as session_append.",
  input: z.strictObject({
    ...APPEND_INPUT,
    ...fieldsOf(AcquireRequestSchema, { file: { required: true, description: `The file whose lock this server holds. ${FILE_NOTE}` } }),
  }),
  annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  async run(args, context, extra) {
    const file = await canonicalFile(context, args.file as string, extra.signal);
    const held = context.holdings.lock(file);
    if (held === undefined) return toolError(mcpRefusal(Code.FailedPrecondition, MCP_REASONS.NOT_HELD_HERE, `this server holds no lock on ${file}`));
    return append(context, args, extra, { file: held.file, fencingToken: held.fencingToken });
  },
};

const sessionAppend: ToolDefinition = {
  name: "session_append",
  title: "Append events to a session",
  description:
    "Appends events to a session's journal (agent_phase, variants_ready, agent_done, agent_error, checkpoint, or any type). Answers their seqs, " +
    "the session's phase after them and the idempotency key used: an append retried with the same key is written once (duplicate: true).",
  input: z.strictObject(APPEND_INPUT),
  annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  run: (args, context, extra) => append(context, args, extra),
};

const sessionSnapshot: ToolDefinition = {
  name: "session_snapshot",
  title: "A session's snapshot",
  description: "The session's state derived from its journal (phase, pending event, checkpoints, variants, …) and its last seq.",
  input: z.strictObject({ sessionId: sessionIdSchema("The session.") }),
  annotations: { readOnlyHint: true, openWorldHint: false },
  async run(args, context, extra) {
    const response = await context.berth.sessions.snapshot(args.sessionId as string, { signal: extra.signal });
    return answer(`${args.sessionId as string}: phase ${response.snapshot?.phase || "(none)"}, last seq ${response.lastSeq}.`, {
      sessionId: args.sessionId,
      lastSeq: Number(response.lastSeq),
      snapshot: snapshotJson(response.snapshot),
    });
  },
};

/** The most entries one session_journal call answers. */
const JOURNAL_PAGE_MAX = 500;

const sessionJournal: ToolDefinition = {
  name: "session_journal",
  title: "Read a session's journal",
  description: `A page of the session's journal from a seq: each entry's seq, type, time and event as appended. nextFromSeq reads the next page; more says whether there is one.`,
  input: z.strictObject({
    sessionId: sessionIdSchema("The session."),
    ...fieldsOf(ReadJournalRequestSchema, {
      from_seq: {},
    }),
    limit: z.number().int().min(1).max(JOURNAL_PAGE_MAX).optional().describe(`The most entries to answer: 1 to ${JOURNAL_PAGE_MAX} (default 100).`),
  }),
  annotations: { readOnlyHint: true, openWorldHint: false },
  async run(args, context, extra) {
    const limit = (args.limit as number | undefined) ?? 100;
    const fromSeq = (args.fromSeq as number | undefined) ?? 1;
    const entries: JournalEntry[] = [];
    // One more than asked: whether another page follows.
    for await (const entry of context.berth.sessions.journal(args.sessionId as string, { fromSeq, limit: limit + 1, signal: extra.signal }))
      entries.push(entry);
    const more = entries.length > limit;
    const page = entries.slice(0, limit);
    const last = page.at(-1);
    const nextFromSeq = last === undefined ? Math.max(fromSeq, 1) : Number(last.seq) + 1;
    return answer(
      page.length === 0 ? `No entries from seq ${fromSeq}.` : `Seqs ${page[0]!.seq}-${last!.seq}${more ? `; more from ${nextFromSeq}` : "; that is the end"}.`,
      { sessionId: args.sessionId, entries: page.map(entryJson), nextFromSeq, more },
    );
  },
};

/** The longest a session_wait waits. */
const WAIT_MAX_MS = 600_000;
const WAIT_DEFAULT_MS = 30_000;

const sessionWait: ToolDefinition = {
  name: "session_wait",
  title: "Wait for a session",
  description:
    "Blocks until the session reaches a seq (untilSeq), a phase, or gets an event of a type (eventType: e.g. the browser's 'checkpoint'), " +
    "whichever comes first, or until timeoutMs passes (then reached: false; call again to keep waiting). Driven by the session's watch: it returns the " +
    `moment the event is appended. Sends progress every ${WAIT_PROGRESS_INTERVAL_MS / 1000} s when the caller asks for progress (hosts often end a call after 60 s without any).`,
  input: z.strictObject({
    sessionId: sessionIdSchema("The session to wait on; it need not exist yet."),
    untilSeq: z.number().int().min(1).optional().describe("Return once the session's last seq is at least this."),
    phase: z.string().min(1).optional().describe("Return once the session's phase is this (at once if it is already)."),
    eventType: z.string().min(1).optional().describe("Return once an event of this type is appended after afterSeq, with that entry."),
    afterSeq: z
      .number()
      .int()
      .min(0)
      .optional()
      .describe("For eventType: entries after this seq count (0: the whole journal). Default: the session's last seq when the wait starts (new entries only)."),
    timeoutMs: z
      .number()
      .int()
      .min(0)
      .max(WAIT_MAX_MS)
      .optional()
      .describe(`How long to wait at most, in milliseconds (default ${WAIT_DEFAULT_MS}, at most ${WAIT_MAX_MS}).`),
  }),
  annotations: { readOnlyHint: true, openWorldHint: false },
  async run(args, context, extra) {
    const { untilSeq, phase, eventType, afterSeq } = args as { untilSeq?: number; phase?: string; eventType?: string; afterSeq?: number };
    if (untilSeq === undefined && phase === undefined && eventType === undefined)
      return toolError(mcpRefusal(Code.InvalidArgument, MCP_REASONS.NO_CONDITION, "give untilSeq, phase or eventType: what to wait for"));
    const report = progressReporter(extra);
    const outcome = await waitForSession(
      context.berth.sessions,
      args.sessionId as string,
      { untilSeq, phase, eventType, afterSeq },
      {
        timeoutMs: (args.timeoutMs as number | undefined) ?? WAIT_DEFAULT_MS,
        signal: extra.signal,
        onProgress: (lastSeq, phaseNow) => report(`still waiting: ${args.sessionId as string} at seq ${lastSeq}, phase ${phaseNow || "(none)"}`),
      },
    );
    const structured = {
      sessionId: args.sessionId,
      reached: outcome.reached,
      ...(outcome.matched === undefined ? {} : { matched: outcome.matched }),
      lastSeq: Number(outcome.lastSeq),
      phase: outcome.phase,
      ...(outcome.entry === undefined ? {} : { entry: entryJson(outcome.entry) }),
      ...(outcome.snapshot === undefined ? {} : { snapshot: snapshotJson(outcome.snapshot) }),
    };
    const summary = !outcome.reached
      ? `Timed out: ${args.sessionId as string} is at seq ${outcome.lastSeq}, phase ${outcome.phase || "(none)"}. Call again to keep waiting.`
      : outcome.matched === "eventType"
        ? `${eventType} appended at seq ${outcome.entry?.seq}.`
        : outcome.matched === "phase"
          ? `${args.sessionId as string} is in phase ${outcome.phase} (seq ${outcome.lastSeq}).`
          : `${args.sessionId as string} reached seq ${outcome.lastSeq}.`;
    return answer(summary, structured);
  },
};

/** The need item of a reservation, by kind. */
const ITEM_MAKERS = { build, start, appliance } as const;

const budgetReserve: ToolDefinition = {
  name: "budget_reserve",
  title: "Reserve memory and cpu",
  description:
    "Waits for room in the machine's load budget and holds a reservation of memory and cpu, in this MCP server, until budget_release or until the " +
    "agent's session ends. Use it before heavy work (a build, a test suite, a dev server). While queued it reports its place, the ETA and what it waits " +
    "for as progress; the answer says how long it waited. A need that can never fit is IMPOSSIBLE; a wait that runs out is WAIT_EXHAUSTED with the reasons.",
  input: z.strictObject({
    ...fieldsOf(ResourceSpecSchema, {
      memory: { pattern: SIZE_PATTERN, note: "Binary multiples: 1024 (bytes), 100k, 512M, 1.5GiB, 2G." },
      cpu: { min: 0 },
    }),
    ...fieldsOf(NeedItemSchema, {
      name: { description: "What runs, for the queue and the committed list (default 'agent work')." },
      kind: { note: "Default: build." },
    }),
    ...fieldsOf(AdmitStartSchema, {
      owner: { as: "reason", description: "Who asks and why, shown to everyone in the queue and the committed list (default: 'berth mcp for <agent>')." },
      max_wait: {},
      skip_load_gate: {},
    }),
  }),
  annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: false, openWorldHint: false },
  async run(args, context, extra) {
    const make = ITEM_MAKERS[(args.kind as keyof typeof ITEM_MAKERS | undefined) ?? "build"];
    const item = make((args.name as string | undefined) ?? "agent work", { memory: args.memory as string | undefined, cpu: args.cpu as number | undefined });
    const report = progressReporter(extra);
    const wait = waitSignal(extra);
    let lastQueued: Queued | undefined;
    // The admission lasts as long as admit's callback: until budget_release (or the end of this process).
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => (finish = resolve));
    let onAdmitted!: (admission: Admission) => void;
    const admitted = new Promise<Admission>((resolve) => (onAdmitted = resolve));
    const outcome = context.berth.budget.admit(
      [item],
      (admission) => {
        onAdmitted(admission);
        return finished;
      },
      {
        owner: (args.reason as string | undefined) ?? context.owner(),
        maxWaitMs: args.maxWaitMs as number | undefined,
        skipLoadGate: args.skipLoadGate as boolean | undefined,
        signal: wait.signal,
        // No resume: this process's end is the agent's, and the service frees the reservation then.
        resumeWithinMs: 0,
        onQueued: (queued) => {
          lastQueued = queued;
          const eta =
            queued.eta === undefined
              ? `no ETA (${queued.etaBasis.replace(/^unknown: /, "")})`
              : `about ${Math.ceil(msOfDuration(queued.eta) / 1000)} s left (${queued.etaBasis})`;
          report(`#${queued.position} in the budget's queue, ${eta}: ${queued.waitForText}`);
        },
      },
    );
    const admission = await Promise.race([
      admitted,
      outcome.then(() => {
        throw new Error("the admission ended before it was admitted");
      }),
    ]);
    outcome.catch(() => {});
    wait.granted();
    // A lost admission (the service went away) ends the callback too.
    admission.signal.addEventListener("abort", finish, { once: true });
    context.holdings.addAdmission({
      admission,
      release: async () => {
        finish();
        await outcome.catch(() => {});
      },
    });
    const reservation = toJson(ReservationSchema, admission.reservation) as Record<string, unknown>;
    return answer(`Reserved ${admission.reservation.id} after ${Math.round(admission.waitedMs)} ms. Release it with budget_release when done.`, {
      reservation,
      waitedMs: Math.round(admission.waitedMs),
      ...(lastQueued === undefined ? {} : { lastQueued: toJson(QueuedSchema, lastQueued) }),
    });
  },
};

const budgetRelease: ToolDefinition = {
  name: "budget_release",
  title: "Release a reservation",
  description: "Releases a reservation (budget_reserve's, or any reservation by its id): its memory and cpu go back to the budget and the queue moves on.",
  input: z.strictObject({ reservationId: z.string().min(1).describe("The reservation's id, as budget_reserve answered it.") }),
  annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, openWorldHint: false },
  async run(args, context, extra) {
    const id = args.reservationId as string;
    const held = context.holdings.admission(id);
    if (held !== undefined) {
      await held.release();
      return answer(`Released ${id}.`, { reservationId: id, released: true });
    }
    const released = await context.berth.budget.release(id, { signal: extra.signal });
    return answer(released ? `Released ${id}.` : `${id} was not held (released or expired already).`, { reservationId: id, released });
  },
};

const budgetState: ToolDefinition = {
  name: "budget_state",
  title: "The load budget now",
  description:
    "What the budget holds now: committed memory and cpu, the queue (each waiter's place, ETA and what it waits for), the reservations, the running " +
    "services, the policy and the last machine sample. heldHere lists the reservations this server holds.",
  input: z.strictObject({}),
  annotations: { readOnlyHint: true, openWorldHint: false },
  async run(_args, context, extra) {
    const state = await context.berth.budget.state({ signal: extra.signal });
    const heldHere = context.holdings.admissions().map((held) => held.admission.reservation.id);
    return answer(`${state.queueSize} queued, ${state.reservationCount} reservations, ${state.runningCount} running.`, {
      ...(toJson(GetStateResponseSchema, state) as object),
      heldHere,
    });
  },
};

/** Every tool, in the order tools/list gives them. */
export const TOOLS: readonly ToolDefinition[] = [
  lockAcquire,
  lockRelease,
  lockInspect,
  lockAppendFenced,
  sessionAppend,
  sessionSnapshot,
  sessionJournal,
  sessionWait,
  budgetReserve,
  budgetRelease,
  budgetState,
];

/** Runs `tool`, answering a failure as a tool error an agent can act on. */
export async function runTool(tool: ToolDefinition, args: Record<string, unknown>, context: ToolContext, extra: Extra): Promise<CallToolResult> {
  try {
    return await tool.run(args, context, extra);
  } catch (error) {
    return toolError(describeFailure(error));
  }
}
