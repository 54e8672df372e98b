/**
 * The load suite's streams, each a slot that keeps one stream open for as long as the load runs:
 * when its stream ends (by its own plan), the slot opens the next one. Four kinds:
 *
 * - WatchSession (grpc-js): from seq 1, from the live end or from somewhere between; every entry
 *   must come in seq order without a gap, and entry `n` must be the event the appender wrote as
 *   `n` (`agent_phase n<n>`); `caught_up` exactly after the backlog; a snapshot with every live
 *   entry when asked. A lagged watcher (RESOURCE_EXHAUSTED) resumes from its next seq, checked on.
 * - WatchSessions (grpc-js): per session, each change starts right after the previous one; with
 *   `include_current`, every session is described once before `caught_up`.
 * - Hold (grpc-js): a few holders per file; a granted lock is held 20–300 ms then the stream is
 *   cancelled; some withdraw while queued. Fencing tokens must rise per file, and no two clients
 *   may ever see themselves holding one file.
 * - Admit (connect-node gRPC, bidi): start, queued…, admitted, build_done → updated (for needs
 *   with a build), then release → released and the end of the stream; some clients go away while
 *   queued or admitted instead; one in ten asks for a 300 ms wait, whose WAIT_EXHAUSTED refusal is
 *   intended.
 *
 * Every stream ending is counted by code; an ending that is not the plan's is a violation.
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { NeedItemKind, RefusalKind, RefusalSchema, type NeedItemSchema } from "@berth/api/berth/budget/v1/budget_pb";
import type { AdmitRequestSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { LockService, type HoldResponse } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService, type WatchSessionResponse, type WatchSessionsResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
import { pushable } from "@berth/budget/server/testing";
import { grpcCodeName } from "../../harness.js";
import { between, phaseOf, pick, type LoadWorld, type OpenStream } from "./load-world.js";

const G = 1024n ** 3n;
const M = 1024n ** 2n;

/** The part of a grpc-js server-streaming call used here. */
interface ServerStreamCall<T> {
  on(event: "data", listener: (message: T) => void): unknown;
  on(event: "status", listener: (status: { code: number; details: string }) => void): unknown;
  on(event: "error", listener: (error: Error) => void): unknown;
  cancel(): void;
}

/** How a followed stream ended. */
interface StreamEnd {
  readonly code: string;
  readonly details: string;
  readonly cancelledByUs: boolean;
}

/** A stream kind, for the drain: watchers finish catching up, the others are cancelled at once. */
type StreamKind = "watch" | "hold" | "admit";

interface Followed {
  cancel(): void;
  readonly ended: Promise<StreamEnd>;
}

/**
 * Follows a grpc-js server stream: counts it open and its messages, registers it with the world
 * (so the drain can describe or cancel it), and resolves with its status. `cancel` marks the end
 * as the client's own doing; `beforeCancel` runs first (a holder forgets its lock before it lets go).
 */
function follow<T>(
  world: LoadWorld,
  kind: StreamKind,
  call: ServerStreamCall<T>,
  describe: () => string,
  onMessage: (message: T) => void,
  beforeCancel?: () => void,
): Followed {
  world.tally.streamOpened();
  let cancelledByUs = false;
  const cancel = () => {
    if (cancelledByUs) return;
    cancelledByUs = true;
    beforeCancel?.();
    call.cancel();
  };
  const open: OpenStream & { kind: StreamKind } = { kind, describe, cancel };
  world.open.add(open);
  const ended = new Promise<StreamEnd>((resolve) => {
    call.on("data", (message) => {
      world.tally.messages++;
      onMessage(message);
    });
    call.on("error", () => {}); // the status carries the code
    call.on("status", (status) => {
      world.open.delete(open);
      world.tally.streamClosed();
      const code = grpcCodeName(status.code);
      world.tally.ended(code);
      resolve({ code, details: status.details, cancelledByUs });
    });
  });
  return { cancel, ended };
}

/** The kind of an open stream (set by {@link follow} and the Admit slot). */
export function streamKind(stream: OpenStream): StreamKind {
  return (stream as OpenStream & { kind: StreamKind }).kind;
}

// ---------------------------------------------------------------------------------------------
// WatchSession
// ---------------------------------------------------------------------------------------------

/** Keeps a WatchSession stream open until the drain has seen it catch up to the final seq. */
export async function sessionWatcherSlot(world: LoadWorld): Promise<void> {
  let resume: { session: string; next: number } | undefined;
  // A lagged watcher resumes even during the drain: it must still get every entry.
  while (world.phase === "load" || resume !== undefined) {
    const session = resume?.session ?? pick(world.random, world.sessions);
    const acked = world.acked.get(session) ?? 0;
    const roll = world.random();
    const from = resume?.next ?? (roll < 0.3 ? 1 : roll < 0.7 ? acked + 1 : between(world.random, 1, acked + 1));
    resume = undefined;
    const result = await watchSession(world, session, from, world.random() < 0.2, between(world.random, 2000, 8000));
    if (result.lagged) resume = { session, next: result.next };
  }
}

async function watchSession(
  world: LoadWorld,
  session: string,
  from: number,
  includeSnapshot: boolean,
  lifetimeMs: number,
): Promise<{ lagged: boolean; next: number }> {
  const lane = world.sessionsGrpc.borrow();
  let next = from;
  let caughtUp = false;
  let broken = false;
  let wantEnd = false;
  const where = `WatchSession(${session}, from ${from}${includeSnapshot ? ", with snapshots" : ""})`;
  const fail = (what: string) => {
    world.tally.violation(`${where}: ${what}`);
    broken = true;
    stream.cancel();
  };
  const finishIfDone = () => {
    const final = world.final?.get(session);
    if (wantEnd && final !== undefined && caughtUp && next - 1 >= final) stream.cancel();
  };
  const call = lane.client.serverStream(SessionService.method.watchSession, {
    sessionId: session,
    fromSeq: BigInt(from),
    includeSnapshot,
  }) as unknown as ServerStreamCall<WatchSessionResponse>;
  const stream = follow(
    world,
    "watch",
    call,
    () => `${where}: received up to ${next - 1}${caughtUp ? " (live)" : " (backlog)"}, final ${world.final?.get(session) ?? "not yet"}`,
    (message) => {
      if (broken) return;
      switch (message.kind.case) {
        case "entries": {
          for (const { entry, snapshot } of message.kind.value.entries) {
            const seq = Number(entry?.seq);
            if (seq !== next) return fail(`got seq ${seq} where ${next} was due (${seq < next ? "a repeat" : "a gap"})`);
            const event = entry?.event?.kind;
            const phase = event?.case === "agentPhase" ? event.value.phase : undefined;
            if (phase !== phaseOf(seq))
              return fail(`seq ${seq} carries ${event?.case ?? "no event"} ${JSON.stringify(phase)}, expected agent_phase ${phaseOf(seq)}`);
            if (caughtUp && includeSnapshot && snapshot === undefined) return fail(`live entry ${seq} came without its snapshot`);
            if (!caughtUp && snapshot !== undefined) return fail(`backlog entry ${seq} came with a snapshot`);
            next++;
          }
          return finishIfDone();
        }
        case "caughtUp": {
          const lastSeq = Number(message.kind.value.lastSeq);
          if (caughtUp) return fail("a second caught_up");
          if (lastSeq !== next - 1) return fail(`caught_up says the backlog ended at ${lastSeq} but it ended at ${next - 1}`);
          if (includeSnapshot && lastSeq > 0 && message.kind.value.snapshot === undefined) return fail("caught_up without the snapshot asked for");
          caughtUp = true;
          return finishIfDone();
        }
        default:
          return fail(`a message of no known kind (${String(message.kind.case)})`);
      }
    },
  );
  const timer = setTimeout(() => {
    wantEnd = true;
    if (world.phase === "load") stream.cancel();
    else finishIfDone();
  }, lifetimeMs);
  const end = await stream.ended;
  clearTimeout(timer);
  lane.release();
  const lagged = judgeWatchEnd(world, end, broken, "resumed from its next seq", `${where} ended with ${end.code} (${end.details}) after seq ${next - 1}`);
  return { lagged, next };
}

/**
 * Tallies how a watch stream ended: cancelled by its client and a lag (RESOURCE_EXHAUSTED, which
 * the caller resumes) are intended, anything else is a violation. True when it lagged.
 */
function judgeWatchEnd(world: LoadWorld, end: StreamEnd, broken: boolean, resumedHow: string, violation: string): boolean {
  if (end.cancelledByUs && end.code === "CANCELLED") {
    world.tally.intend("watch ended by its client");
    return false;
  }
  if (end.code === "RESOURCE_EXHAUSTED" && !broken) {
    world.tally.intend(`watcher lagged (${resumedHow})`);
    return true;
  }
  world.tally.violation(violation);
  return false;
}

// ---------------------------------------------------------------------------------------------
// WatchSessions
// ---------------------------------------------------------------------------------------------

/** Keeps a WatchSessions stream open until the drain has seen it reach every final seq. */
export async function sessionsWatcherSlot(world: LoadWorld): Promise<void> {
  let resumeWithCurrent = false;
  while (world.phase === "load" || resumeWithCurrent) {
    const includeCurrent = resumeWithCurrent || world.random() < 0.5;
    resumeWithCurrent = false;
    const lagged = await watchSessions(world, includeCurrent, world.random() < 0.1, between(world.random, 3000, 10000));
    // A lagged WatchSessions watcher resumes by watching again: here with include_current.
    if (lagged) resumeWithCurrent = true;
  }
}

async function watchSessions(world: LoadWorld, includeCurrent: boolean, includeSnapshot: boolean, lifetimeMs: number): Promise<boolean> {
  const lane = world.sessionsGrpc.borrow();
  const seen = new Map<string, number>();
  let caughtUp = !includeCurrent;
  let broken = false;
  let wantEnd = false;
  const where = `WatchSessions(${includeCurrent ? "include_current" : "live only"}${includeSnapshot ? ", with snapshots" : ""})`;
  const fail = (what: string) => {
    world.tally.violation(`${where}: ${what}`);
    broken = true;
    stream.cancel();
  };
  const done = () => {
    const final = world.final;
    if (final === undefined || !caughtUp) return false;
    // With include_current every session was described, so every one must reach its final seq;
    // live only, the sessions it has heard of must.
    const sessions = includeCurrent ? world.sessions : [...seen.keys()];
    return sessions.every((s) => (seen.get(s) ?? 0) >= (final.get(s) ?? 0));
  };
  const finishIfDone = () => {
    if (wantEnd && done()) stream.cancel();
  };
  const call = lane.client.serverStream(SessionService.method.watchSessions, {
    includeCurrent,
    includeSnapshot,
    includeCompleted: false,
  }) as unknown as ServerStreamCall<WatchSessionsResponse>;
  const stream = follow(
    world,
    "watch",
    call,
    () => {
      const behind = world.sessions
        .filter((s) => (seen.get(s) ?? 0) < (world.final?.get(s) ?? 0))
        .map((s) => `${s} at ${seen.get(s) ?? "-"} of ${world.final?.get(s)}`);
      return `${where}: ${caughtUp ? "live" : "describing"}; behind: ${behind.slice(0, 5).join(", ") || "none"}`;
    },
    (message) => {
      if (broken) return;
      switch (message.kind.case) {
        case "change": {
          const change = message.kind.value;
          const session = change.sessionId;
          const first = Number(change.firstSeq);
          const last = Number(change.lastSeq);
          if (!world.sessions.includes(session)) return fail(`a change of unknown session ${JSON.stringify(session)}`);
          if (last < first) return fail(`change of ${session} from ${first} to ${last}`);
          if (!caughtUp) {
            if (seen.has(session)) return fail(`${session} described twice before caught_up`);
          } else {
            const previous = seen.get(session);
            if (previous !== undefined && first !== previous + 1)
              return fail(`change of ${session} covers ${first}..${last} right after ${previous} (${first <= previous ? "a repeat" : "a gap"})`);
            if (includeSnapshot && change.snapshot === undefined) return fail(`change of ${session} at ${last} without its snapshot`);
          }
          seen.set(session, last);
          return finishIfDone();
        }
        case "caughtUp": {
          if (caughtUp) return fail(includeCurrent ? "a second caught_up" : "caught_up without include_current");
          const described = message.kind.value.sessions;
          if (described !== seen.size) return fail(`caught_up counts ${described} sessions, ${seen.size} were described`);
          caughtUp = true;
          return finishIfDone();
        }
        default:
          return fail(`a message of no known kind (${String(message.kind.case)})`);
      }
    },
  );
  const timer = setTimeout(() => {
    wantEnd = true;
    if (world.phase === "load") stream.cancel();
    else finishIfDone();
  }, lifetimeMs);
  const end = await stream.ended;
  clearTimeout(timer);
  lane.release();
  return judgeWatchEnd(world, end, broken, "resumed with include_current", `${where} ended with ${end.code} (${end.details})`);
}

// ---------------------------------------------------------------------------------------------
// Hold
// ---------------------------------------------------------------------------------------------

/** Keeps taking turns on the world's files with Hold streams until the drain. */
export async function holdSlot(world: LoadWorld, slot: string): Promise<void> {
  for (let turn = 0; world.phase === "load"; turn++) await holdOnce(world, `hold-${slot}-${turn}`);
}

async function holdOnce(world: LoadWorld, owner: string): Promise<void> {
  const file = pick(world.random, world.files);
  const lane = world.sessionsGrpc.borrow();
  const withdrawAfterMs = world.random() < 0.15 ? between(world.random, 0, 150) : undefined;
  let acquired = false;
  let broken = false;
  const timers: NodeJS.Timeout[] = [];
  const where = `Hold(${file}) by ${owner}`;
  const fail = (what: string) => {
    world.tally.violation(`${where}: ${what}`);
    broken = true;
    stream.cancel();
  };
  const letGo = () => {
    if (world.holders.get(file) === owner) world.holders.delete(file);
  };
  const call = lane.client.serverStream(LockService.method.hold, { file, owner, maxWait: { seconds: 300n } }) as unknown as ServerStreamCall<HoldResponse>;
  const stream = follow(
    world,
    "hold",
    call,
    () => `${where}: ${acquired ? "holding" : "waiting"}`,
    (message) => {
      if (broken) return;
      switch (message.kind.case) {
        case "waiting": {
          const { position, holder } = message.kind.value;
          if (acquired) return fail("a waiting message after acquired");
          if (position < 1) return fail(`waiting at position ${position}`);
          if (holder !== undefined && !holder.owner.startsWith("hold-"))
            return fail(`waiting behind a holder that is none of the suite's: ${JSON.stringify(holder.owner)}`);
          return;
        }
        case "acquired": {
          if (acquired) return fail("acquired twice");
          acquired = true;
          const token = message.kind.value.fencingToken;
          const previous = world.lastToken.get(file) ?? 0n;
          if (token <= previous) return fail(`fencing token ${token} after ${previous} was granted: tokens must rise`);
          world.lastToken.set(file, token);
          const other = world.holders.get(file);
          if (other !== undefined) return fail(`granted while ${other} still holds it`);
          world.holders.set(file, owner);
          if (world.phase !== "load") return stream.cancel();
          timers.push(setTimeout(() => stream.cancel(), between(world.random, 20, 300)));
          return;
        }
        case "heartbeat":
          if (!acquired) fail("a heartbeat before acquired");
          return;
        default:
          return fail(`a message of no known kind (${String(message.kind.case)})`);
      }
    },
    letGo,
  );
  if (withdrawAfterMs !== undefined) {
    timers.push(
      setTimeout(() => {
        if (!acquired) stream.cancel();
      }, withdrawAfterMs),
    );
  }
  const end = await stream.ended;
  for (const timer of timers) clearTimeout(timer);
  lane.release();
  letGo();
  if (end.cancelledByUs && end.code === "CANCELLED") {
    world.tally.intend(acquired ? "lock held, then released by ending the stream" : "left the lock queue");
    return;
  }
  world.tally.violation(`${where} ended with ${end.code} (${end.details}) ${acquired ? "while holding" : "while waiting"}`);
}

// ---------------------------------------------------------------------------------------------
// Admit
// ---------------------------------------------------------------------------------------------

type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;
type NeedItemInit = MessageInitShape<typeof NeedItemSchema>;

function item(kind: NeedItemKind, name: string, memoryBytes: bigint, cpu: number): NeedItemInit {
  return { kind, name, costSource: { case: "cost", value: { memoryBytes, cpu } } };
}

/** Keeps admitting on the budget until the drain. */
export async function admitSlot(world: LoadWorld, slot: string): Promise<void> {
  for (let turn = 0; world.phase === "load"; turn++) await admitOnce(world, `admit-${slot}-${turn}`);
}

async function admitOnce(world: LoadWorld, label: string): Promise<void> {
  const lane = world.budget.borrow();
  const random = world.random;
  const shortWait = random() < 0.1;
  const withBuild = random() < 0.4;
  const leaveWhileQueued = random() < 0.1;
  const disconnectWhenAdmitted = random() < 0.2;
  // Start 512M/0.5 cpu, or a 1G/1 cpu build and a 256M/0.25 start: the 4G/4 cpu budget admits
  // 8 of the first or 3 of the second at once, so most requests queue.
  const items = withBuild
    ? [item(NeedItemKind.BUILD, "web", 1n * G, 1), item(NeedItemKind.START, "web", 256n * M, 0.25)]
    : [item(NeedItemKind.START, "api", 512n * M, 0.5)];
  const requests = pushable<AdmitRequestInit>();
  requests.push({
    kind: { case: "start", value: { owner: label, need: { items }, maxWait: shortWait ? { nanos: 300_000_000 } : { seconds: 120n } } },
  });
  const controller = new AbortController();
  let cancelledByUs = false;
  let admitted = false;
  let released = false;
  let finishing = false;
  let leaving = false;
  const timers: NodeJS.Timeout[] = [];
  const cancel = () => {
    if (cancelledByUs) return;
    cancelledByUs = true;
    controller.abort();
  };
  const where = `Admit(${label}${withBuild ? ", build+start" : ", start"}${shortWait ? ", 300 ms wait" : ""})`;
  const open: OpenStream & { kind: StreamKind } = { kind: "admit", describe: () => `${where}: ${admitted ? "admitted" : "queued"}`, cancel };
  const finish = () => {
    if (finishing) return;
    finishing = true;
    if (disconnectWhenAdmitted || world.phase !== "load") cancel();
    else requests.push({ kind: { case: "release", value: {} } });
  };
  world.tally.streamOpened();
  world.open.add(open);
  try {
    for await (const response of lane.client.admit(requests, { signal: controller.signal, timeoutMs: 600_000 })) {
      world.tally.messages++;
      switch (response.kind.case) {
        case "queued":
          if (admitted) world.tally.violation(`${where}: queued after admitted`);
          if (response.kind.value.position < 1) world.tally.violation(`${where}: queued at position ${response.kind.value.position}`);
          if (leaveWhileQueued && !leaving) {
            leaving = true;
            timers.push(setTimeout(() => !admitted && cancel(), between(random, 0, 300)));
          }
          break;
        case "admitted": {
          if (admitted) world.tally.violation(`${where}: admitted twice`);
          admitted = true;
          const start = response.kind.value.reservation?.start;
          const expected = withBuild ? 256n * M : 512n * M;
          if (start?.memoryBytes !== expected)
            world.tally.violation(`${where}: the reservation's start share is ${start?.memoryBytes} bytes, expected ${expected}`);
          timers.push(
            setTimeout(
              () => {
                if (world.phase !== "load") cancel();
                else if (withBuild) requests.push({ kind: { case: "buildDone", value: {} } });
                else finish();
              },
              between(random, 50, 300),
            ),
          );
          break;
        }
        case "updated": {
          const build = response.kind.value.reservation?.build;
          if (!withBuild) world.tally.violation(`${where}: an 'updated' nobody asked for`);
          if ((build?.memoryBytes ?? 0n) !== 0n || (build?.cpu ?? 0) !== 0)
            world.tally.violation(`${where}: after build_done the build share is still ${build?.memoryBytes} bytes / ${build?.cpu} cpu`);
          finish();
          break;
        }
        case "released":
          released = true;
          break;
        default:
          world.tally.violation(`${where}: a message of no known kind (${String(response.kind.case)})`);
      }
    }
    world.tally.ended("OK");
    if (released) world.tally.intend("admitted, then released");
    else world.tally.violation(`${where}: the stream ended without 'released' (${admitted ? "admitted" : "never admitted"})`);
  } catch (error) {
    const failure = ConnectError.from(error);
    const code = grpcCodeName(failure.code);
    world.tally.ended(code);
    if (cancelledByUs && failure.code === Code.Canceled) {
      world.tally.intend(admitted ? "client went away while admitted" : "client went away while queued");
    } else if (
      shortWait &&
      !admitted &&
      failure.code === Code.ResourceExhausted &&
      failure.findDetails(RefusalSchema)[0]?.kind === RefusalKind.WAIT_EXHAUSTED
    ) {
      world.tally.intend("300 ms wait ran out (WAIT_EXHAUSTED)");
    } else {
      world.tally.violation(`${where} ended with ${code}: ${failure.rawMessage}`);
    }
  } finally {
    for (const timer of timers) clearTimeout(timer);
    // connect-node keeps its half of the HTTP/2 stream open while the request iterable waits.
    requests.end();
    world.open.delete(open);
    world.tally.streamClosed();
    lane.release();
  }
}
