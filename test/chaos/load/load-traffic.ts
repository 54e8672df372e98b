/**
 * The load suite's unary traffic, beside its streams:
 *
 * - one appender per session (grpc-js): AppendEvent, or AppendEvents of 2–4, with `expected_seq`
 *   and an idempotency key; entry `n` of every session is `agent_phase n<n>`, which is what the
 *   watchers check. A failed append is a violation, retried with the same key so the journal
 *   stays as the watchers expect it.
 * - readers: GetSnapshot (grpc-js and Connect JSON over HTTP/1.1; never behind an acknowledged
 *   append), ListSessions (every session, sorted), Inspect (holders and waiters are the suite's
 *   own, the fencing token never below one granted), Check (a need over the budget is impossible,
 *   a small one never is) and GetState (never more committed than the budget) over connect-node gRPC.
 */
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { ExpectedState, SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ConnectError } from "@connectrpc/connect";
import { grpcCodeName, isGrpcError } from "../../harness.js";
import { between, phaseOf, pick, sleep, type LoadWorld } from "./load-world.js";

const G = 1024n ** 3n;
/** A unary call that takes this long has hung: a violation, not a slow answer. */
export const UNARY_DEADLINE_MS = 60_000;

function codeOf(error: unknown): string {
  if (isGrpcError(error)) return grpcCodeName(error.code);
  return grpcCodeName(ConnectError.from(error).code);
}

/** Runs one unary call, counting it; a failure is a violation. Returns undefined on failure. */
async function unary<T>(world: LoadWorld, what: string, call: () => Promise<T>): Promise<T | undefined> {
  const started = performance.now();
  try {
    const result = await call();
    world.tally.took(what.split(/[ (]/, 1)[0]!, performance.now() - started);
    world.tally.answered();
    world.tally.ended("OK");
    return result;
  } catch (error) {
    const code = codeOf(error);
    world.tally.operations++;
    world.tally.ended(code);
    world.tally.violation(`${what} failed with ${code}: ${(error as Error).message}`);
    return undefined;
  }
}

// ---------------------------------------------------------------------------------------------
// Appenders
// ---------------------------------------------------------------------------------------------

/** Appends to `session` (its only writer) while `appending()` holds. */
export async function appender(world: LoadWorld, session: string, appending: () => boolean, pauseMs: readonly [number, number]): Promise<void> {
  while (appending()) {
    const last = world.acked.get(session) ?? 0;
    const count = world.random() < 0.25 ? between(world.random, 2, 4) : 1;
    if (!(await appendOnce(world, session, last, count))) return;
    await sleep(between(world.random, pauseMs[0], pauseMs[1]));
  }
}

/** The expectation of an append after seq `last`: that seq, or no session yet. */
function expectedAt(last: number) {
  return last === 0 ? { case: "expectedState" as const, value: ExpectedState.NO_SESSION } : { case: "expectedSeq" as const, value: BigInt(last) };
}

/** Appends entries last+1..last+count; true once acknowledged at exactly those seqs. */
async function appendOnce(world: LoadWorld, session: string, last: number, count: number): Promise<boolean> {
  const key = `${session}-${last + 1}`;
  const events = Array.from({ length: count }, (_, i) => ({ kind: { case: "agentPhase" as const, value: { phase: phaseOf(last + 1 + i) } } }));
  for (let attempt = 1; attempt <= 5; attempt++) {
    const lane = world.sessionsGrpc.borrow();
    const what = `${count === 1 ? "AppendEvent" : "AppendEvents"} of ${session} ${last + 1}..${last + count} (attempt ${attempt})`;
    const range = await unary(world, what, async () => {
      if (count === 1) {
        const answer = await lane.client.unary(
          SessionService.method.appendEvent,
          { sessionId: session, event: events[0], expected: expectedAt(last), idempotencyKey: key },
          { deadlineMs: UNARY_DEADLINE_MS },
        );
        return { first: Number(answer.seq), last: Number(answer.seq) };
      }
      const answer = await lane.client.unary(
        SessionService.method.appendEvents,
        { sessionId: session, events, expected: expectedAt(last), idempotencyKey: key },
        { deadlineMs: UNARY_DEADLINE_MS },
      );
      return { first: Number(answer.firstSeq), last: Number(answer.lastSeq) };
    }).finally(() => lane.release());
    if (range === undefined) {
      // Retried with the same key: if the first try landed, the retry answers its seqs.
      await sleep(1000);
      continue;
    }
    if (range.first !== last + 1 || range.last !== last + count) {
      world.tally.violation(`${what}: acknowledged at ${range.first}..${range.last}`);
      return false;
    }
    world.acked.set(session, last + count);
    return true;
  }
  world.tally.violation(`append of ${session} ${last + 1}..${last + count} never succeeded: its appender stops`);
  return false;
}

// ---------------------------------------------------------------------------------------------
// Readers
// ---------------------------------------------------------------------------------------------

/** Reads while the load runs: snapshots, the session list, locks, verdicts and the budget's state. */
export async function reader(world: LoadWorld, admitSlots: number, pauseMs: readonly [number, number]): Promise<void> {
  while (world.phase === "load") {
    const roll = world.random();
    if (roll < 0.3) await getSnapshot(world);
    else if (roll < 0.4) await listSessions(world);
    else if (roll < 0.6) await inspect(world);
    else if (roll < 0.8) await check(world);
    else await getState(world, admitSlots);
    await sleep(between(world.random, pauseMs[0], pauseMs[1]));
  }
}

async function getSnapshot(world: LoadWorld): Promise<void> {
  const session = pick(world.random, world.sessions);
  const acked = world.acked.get(session) ?? 0;
  const viaJson = world.random() < 0.5;
  const what = `GetSnapshot(${session}) over ${viaJson ? "Connect JSON" : "grpc-js"}`;
  let answer: { lastSeq: bigint } | undefined;
  if (viaJson) {
    const lane = world.sessionsJson.borrow();
    answer = await unary(world, what, () => lane.client.getSnapshot({ sessionId: session }, { timeoutMs: UNARY_DEADLINE_MS })).finally(() => lane.release());
  } else {
    const lane = world.sessionsGrpc.borrow();
    answer = await unary(world, what, () =>
      lane.client.unary(SessionService.method.getSnapshot, { sessionId: session }, { deadlineMs: UNARY_DEADLINE_MS }),
    ).finally(() => lane.release());
  }
  if (answer === undefined) return;
  if (Number(answer.lastSeq) < acked) world.tally.violation(`${what}: last seq ${answer.lastSeq} behind the acknowledged ${acked}`);
}

async function listSessions(world: LoadWorld): Promise<void> {
  const lane = world.sessionsJson.borrow();
  const answer = await unary(world, "ListSessions", () => lane.client.listSessions({}, { timeoutMs: UNARY_DEADLINE_MS })).finally(() => lane.release());
  if (answer === undefined) return;
  const ids = answer.sessions.map((s) => s.id);
  const expected = [...world.sessions].sort();
  if (JSON.stringify(ids) !== JSON.stringify(expected)) world.tally.violation(`ListSessions: ${JSON.stringify(ids)}, expected ${JSON.stringify(expected)}`);
}

async function inspect(world: LoadWorld): Promise<void> {
  const file = pick(world.random, world.files);
  const granted = world.lastToken.get(file) ?? 0n;
  const lane = world.sessionsGrpc.borrow();
  const answer = await unary(world, `Inspect(${file})`, () =>
    lane.client.unary(LockService.method.inspect, { file }, { deadlineMs: UNARY_DEADLINE_MS }),
  ).finally(() => lane.release());
  if (answer === undefined) return;
  if (answer.lastFencingToken < granted)
    world.tally.violation(`Inspect(${file}): last fencing token ${answer.lastFencingToken} below the ${granted} already granted`);
  const strangers = [answer.holder?.owner, ...answer.waiters.map((w) => w.owner)].filter((owner) => owner !== undefined && !owner.startsWith("hold-"));
  if (strangers.length > 0) world.tally.violation(`Inspect(${file}): holders or waiters that are none of the suite's: ${JSON.stringify(strangers)}`);
}

async function check(world: LoadWorld): Promise<void> {
  const huge = world.random() < 0.5;
  const need = {
    items: [
      { kind: NeedItemKind.START, name: "probe", costSource: { case: "cost" as const, value: { memoryBytes: huge ? 64n * G : G / 4n, cpu: huge ? 1 : 0.25 } } },
    ],
  };
  const lane = world.budget.borrow();
  const what = `Check(${huge ? "64G" : "256M"})`;
  const answer = await unary(world, what, () => lane.client.check({ need }, { timeoutMs: UNARY_DEADLINE_MS })).finally(() => lane.release());
  if (answer === undefined) return;
  const verdict = answer.verdict;
  if (huge && (verdict?.impossible === undefined || verdict.fits))
    world.tally.violation(`${what}: not impossible on a 4G budget (${JSON.stringify({ fits: verdict?.fits, impossible: verdict?.impossible })})`);
  if (!huge && verdict?.impossible !== undefined) world.tally.violation(`${what}: impossible on a 4G budget: ${verdict.impossible}`);
}

async function getState(world: LoadWorld, admitSlots: number): Promise<void> {
  const lane = world.budget.borrow();
  const answer = await unary(world, "GetState", () => lane.client.getState({}, { timeoutMs: UNARY_DEADLINE_MS })).finally(() => lane.release());
  if (answer === undefined) return;
  const committed = answer.committed;
  if ((committed?.memoryBytes ?? 0n) > world.budgetMemoryBytes || (committed?.cpu ?? 0) > world.budgetCpu + 1e-9) {
    world.tally.violation(
      `GetState: committed ${committed?.memoryBytes} bytes / ${committed?.cpu} cpu over the ${world.budgetMemoryBytes} / ${world.budgetCpu} budget`,
    );
  }
  // A client that went away may still be counted for a moment while its slot's next request is
  // already queued, so up to two per Admit slot; a leak would grow past that (and the end state,
  // checked after the drain, must be empty).
  if (answer.queue.length + answer.reservations.length > 2 * admitSlots)
    world.tally.violation(`GetState: ${answer.queue.length} queued and ${answer.reservations.length} reserved, from ${admitSlots} Admit streams`);
  if (answer.running.length > 0) world.tally.violation(`GetState: ${answer.running.length} running entries, none was started`);
}
