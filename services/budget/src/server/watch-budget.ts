/**
 * The budget's watch streams: WatchBudget (every change of the queue, the reservations, the running
 * tally and the policy, by revision) and WatchMachine (the samples, by revision). Both resume from a
 * revision, describe the current state when they cannot (`reset`), and send progress when idle
 * (the progress puller every berth watch uses).
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext } from "@connectrpc/connect";
import {
  BudgetEventKind,
  BudgetEventSchema,
  BudgetEventsSchema,
  WatchProgressSchema,
  type BudgetEvent,
  type WatchBudgetRequest,
  type WatchBudgetResponseSchema,
  type WatchMachineRequest,
  type WatchMachineResponseSchema,
} from "@berth/api/berth/budget/v1/budget_service_pb";
import { QueueEntrySchema, type Machine, type Policy as PolicyMessage, type QueueEntry } from "@berth/api/berth/budget/v1/budget_pb";
import type { Clock } from "@berth/shared/clock";
import { invalidArgument } from "@berth/shared/errors";
import { abortable, abortError, PROGRESS, ProgressPuller, progressIntervalMs, shuttingDownError, streamHolds } from "@berth/shared/server/index";
import type { Budget, BudgetChange, MachineSample, Policy, QueueEntryInfo } from "../index.js";
import { durationOf, needTotalsToProto, reservationToProto, runningEntryToProto, timestampOf } from "./budget-encode.js";

/** What the watch handlers need. */
export interface WatchHandlerDeps {
  budget: Budget;
  clock: Clock;
  /** The policy as its message (cached by the caller). */
  policyMessage(policy: Policy): PolicyMessage;
  /** A sample as its message (cached by the caller). */
  machineMessage(sample: MachineSample): Machine;
}

const EVENT_KINDS: Record<BudgetChange["kind"], BudgetEventKind> = {
  request_queued: BudgetEventKind.REQUEST_QUEUED,
  request_admitted: BudgetEventKind.REQUEST_ADMITTED,
  request_refused: BudgetEventKind.REQUEST_REFUSED,
  request_timed_out: BudgetEventKind.REQUEST_TIMED_OUT,
  request_left: BudgetEventKind.REQUEST_LEFT,
  reservation_made: BudgetEventKind.RESERVATION_MADE,
  reservation_changed: BudgetEventKind.RESERVATION_CHANGED,
  reservation_released: BudgetEventKind.RESERVATION_RELEASED,
  reservation_expired: BudgetEventKind.RESERVATION_EXPIRED,
  running_registered: BudgetEventKind.RUNNING_REGISTERED,
  running_stopped: BudgetEventKind.RUNNING_STOPPED,
  running_expired: BudgetEventKind.RUNNING_EXPIRED,
  policy_changed: BudgetEventKind.POLICY_CHANGED,
};

/** A request's `start_revision`, checked: zero or more. */
export function startRevisionOf(revision: bigint): number {
  if (revision < 0n) throw invalidArgument("start_revision", `must be 0 (none) or a revision the service gave; got ${revision}`);
  // Above 2^53 is no revision berth gives: kept as the largest safe integer, which resets.
  return revision > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(revision);
}

/** The most events one `events` message may carry (`max_batch`). */
export const MAX_BATCH = 10_000;

/** A request's `max_batch`, checked: how many events of the current state go in one message (1: one `event` each). */
export function maxBatchOf(maxBatch: number): number {
  if (maxBatch > MAX_BATCH) throw invalidArgument("max_batch", `must be at most ${MAX_BATCH}; got ${maxBatch}`);
  return Math.max(1, maxBatch);
}

/** A queued request as an event shows it: its place when it joined (0 once it left), no wait reasons (GetState has them). */
function requestToProto(request: QueueEntryInfo): QueueEntry {
  return create(QueueEntrySchema, {
    id: request.id,
    owner: request.owner,
    position: request.position,
    ...(request.etaMs === undefined ? {} : { eta: durationOf(request.etaMs) }),
    etaBasis: request.etaBasis,
    need: needTotalsToProto({ start: request.needs, build: { memoryBytes: 0, cpu: 0 } }),
    enqueueTime: timestampOf(request.queuedAt),
    waitExpireTime: timestampOf(request.deadline),
  });
}

function eventOf(change: BudgetChange, revision: number, deps: WatchHandlerDeps): BudgetEvent {
  const event = create(BudgetEventSchema, { revision: BigInt(revision), time: timestampOf(change.at), kind: EVENT_KINDS[change.kind] });
  if ("request" in change) event.subject = { case: "request", value: requestToProto(change.request) };
  else if ("reservation" in change) event.subject = { case: "reservation", value: reservationToProto(change.reservation, change.reservation.runningIds) };
  else if ("running" in change) event.subject = { case: "running", value: runningEntryToProto(change.running) };
  else event.subject = { case: "policy", value: deps.policyMessage(change.policy) };
  return event;
}

type BudgetResponse = MessageInitShape<typeof WatchBudgetResponseSchema>;
type MachineResponse = MessageInitShape<typeof WatchMachineResponseSchema>;

const eventResponse = (event: BudgetEvent): BudgetResponse => ({ kind: { case: "event", value: event } });
const caughtUpResponse = (revision: number, reset: boolean, queueSize?: number): BudgetResponse => ({
  kind: { case: "caughtUp", value: { revision: BigInt(revision), reset, ...(queueSize !== undefined ? { queueSize } : {}) } },
});

/** WatchBudget: see its comment in budget_service.proto. */
export async function* watchBudget(request: WatchBudgetRequest, context: HandlerContext, deps: WatchHandlerDeps): AsyncGenerator<BudgetResponse> {
  const startRevision = startRevisionOf(request.startRevision);
  const progressMs = progressIntervalMs(request.progressInterval);
  const maxBatch = maxBatchOf(request.maxBatch);
  const watch = deps.budget.watch({ includeCurrent: request.includeCurrent, startRevision, queueLimit: request.queueLimit });
  streamHolds(context, "a watcher of the budget");
  const changes = abortable({ [Symbol.asyncIterator]: () => watch.changes }, context.signal)[Symbol.asyncIterator]();
  // The revision the client is up to: every change up to it was sent.
  let upTo = watch.caughtUp === undefined ? deps.budget.revision : watch.current !== undefined ? watch.caughtUp.revision : startRevision;
  // `caught_up` of replayed changes, sent after the last of them (they come through the watcher).
  let caughtUp: number | undefined;
  try {
    if (watch.current !== undefined) {
      if (maxBatch === 1) for (const change of watch.current) yield eventResponse(eventOf(change, upTo, deps));
      else
        for (let start = 0; start < watch.current.length; start += maxBatch) {
          const events = watch.current.slice(start, start + maxBatch).map((change) => eventOf(change, upTo, deps));
          yield { kind: { case: "events", value: create(BudgetEventsSchema, { events }) } };
        }
      yield caughtUpResponse(upTo, watch.caughtUp!.reset, watch.caughtUp!.queueSize);
    } else if (watch.caughtUp !== undefined) {
      if (watch.caughtUp.revision === startRevision) yield caughtUpResponse(startRevision, false);
      else caughtUp = watch.caughtUp.revision;
    }
    const puller = new ProgressPuller(changes, deps.clock);
    for (;;) {
      const step = await puller.next(caughtUp === undefined ? progressMs : undefined);
      if (step === PROGRESS) {
        yield { kind: { case: "progress", value: create(WatchProgressSchema, { revision: BigInt(upTo), sendTime: timestampOf(deps.clock.now()) }) } };
        continue;
      }
      if (step.done) break;
      upTo = step.value.revision;
      yield eventResponse(eventOf(step.value.value, step.value.revision, deps));
      if (caughtUp !== undefined && upTo >= caughtUp) {
        yield caughtUpResponse(caughtUp, false);
        caughtUp = undefined;
      }
    }
    if (context.signal.aborted) throw abortError(context.signal);
    // The watcher ended without the call ending: the budget closed.
    throw shuttingDownError();
  } finally {
    await watch.changes.return();
  }
}

/** WatchMachine: see its comment in budget_service.proto. */
export async function* watchMachine(request: WatchMachineRequest, context: HandlerContext, deps: WatchHandlerDeps): AsyncGenerator<MachineResponse> {
  const startRevision = startRevisionOf(request.startRevision);
  const progressMs = progressIntervalMs(request.progressInterval);
  const samples = abortable(deps.budget.watchMachine(context.signal, { startRevision }), context.signal)[Symbol.asyncIterator]();
  const puller = new ProgressPuller(samples, deps.clock);
  let sent = 0;
  try {
    for (;;) {
      const step = await puller.next(progressMs);
      if (step === PROGRESS) {
        yield { revision: BigInt(sent), progress: create(WatchProgressSchema, { revision: BigInt(sent), sendTime: timestampOf(deps.clock.now()) }) };
        continue;
      }
      if (step.done) break;
      sent = step.value.revision;
      yield { machine: deps.machineMessage(step.value.sample), revision: BigInt(sent), reset: step.value.reset };
    }
    // abortable: a shutdown ends the stream with UNAVAILABLE and a cancel with CANCELED, rather than a clean end.
    if (context.signal.aborted) throw abortError(context.signal);
  } finally {
    await samples.return?.();
  }
}
