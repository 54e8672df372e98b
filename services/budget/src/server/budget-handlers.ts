/**
 * `berth.budget.v1.BudgetService` over the budget: each RPC checks its input (budget-decode),
 * calls one method of the domain, and converts the answer (budget-encode). Domain refusals are
 * BerthErrors, mapped by the server in one place; refused admissions carry their `Refusal` detail
 * (refusals.ts).
 */
import type { ServiceImpl } from "@connectrpc/connect";
import type { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { RenewalSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { create } from "@bufbuild/protobuf";
import type { Clock } from "@berth/shared/clock";
import { systemClock } from "@berth/shared/clock";
import { BerthError, invalidArgument, isBerthError } from "@berth/shared/errors";
import { createIdentityCache } from "@berth/shared/server/identity-cache";
import { checkRequestId } from "@berth/shared/safe-id";
import { abortError, handOverGrant } from "@berth/shared/server/index";
import type { Budget, Committed, FleetPublisher, MachineSample, Policy, ReservationInfo, ReservationSnapshot, RunningAnswer } from "../index.js";
import { admitStream } from "./admit-stream.js";
import type { BudgetHandlerDeps, BudgetHandlerStats } from "./handler-deps.js";
import {
  MAX_KEEPALIVE_IDS,
  MAX_OWNER_LENGTH,
  checkId,
  checkName,
  leaseTtlMs,
  maxWaitMs,
  needItemsFromProto,
  pidFromProto,
  resourceSpecFromProto,
  runCostFromProto,
} from "./budget-decode.js";
import {
  committedToProto,
  costToProto,
  durationOf,
  fleetMachineToProto,
  machineToProto,
  policyToProto,
  queueToProto,
  reservationToProto,
  runningAnswerToProto,
  runningEntryToProto,
  timestampOf,
  verdictToProto,
} from "./budget-encode.js";
import type { PolicyExtras, ReasonContext } from "./budget-encode.js";
import { QueuedEncoder } from "./queued-encoder.js";
import { PageTokens, fleetTokens, pageSizeOf } from "./page-tokens.js";
import { refusalError } from "./refusals.js";
import { watchBudget, watchMachine, type WatchHandlerDeps } from "./watch-budget.js";

/** What the handlers need besides the budget. */
export interface BudgetHandlerOptions {
  budget: Budget;
  /** The budget's clock (waits, deadlines). Default: the system clock. */
  clock?: Clock | undefined;
  /** The lease of a Reserve that gives no ttl; read per call, so a reload applies at once. */
  defaultLeaseTtlMs: () => number;
  /** The longest lease a request may ask (read per call, like the default). */
  maxLeaseTtlMs: () => number;
  /** How often the machine is sampled (reported in Policy). */
  sampleIntervalMs: number;
  /** Counters the handlers keep up to date (for the server's gauges). */
  stats?: BudgetHandlerStats | undefined;
  /** Where GetFleet reads the fleet (`--store etcd`); undefined: GetFleet is FAILED_PRECONDITION. */
  fleet?: Pick<FleetPublisher, "list"> | undefined;
}

/** Creates the BudgetService implementation over `budget`. */
export function createBudgetHandlers(options: BudgetHandlerOptions): ServiceImpl<typeof BudgetService> {
  const { budget } = options;
  const clock = options.clock ?? systemClock;
  const extras = (): PolicyExtras => ({ sampleIntervalMs: options.sampleIntervalMs, defaultLeaseTtlMs: options.defaultLeaseTtlMs() });

  // Messages converted once per domain object: the policy, the latest sample and the committed
  // list change rarely but are part of every Check and GetState answer. The lease ttl is part of
  // the policy message and may change on reload: key by both.
  let policyKey: { policy: Policy; ttl: number } | undefined;
  const policyMessages = createIdentityCache((key: { policy: Policy; ttl: number }) => policyToProto(key.policy, extras()));
  const policyMessage = () => {
    const policy = budget.policy();
    const ttl = options.defaultLeaseTtlMs();
    if (policyKey?.policy !== policy || policyKey.ttl !== ttl) policyKey = { policy, ttl };
    return policyMessages.get(policyKey);
  };
  const machineMessages = createIdentityCache((sample: MachineSample) => machineToProto(sample)!);
  const machineMessage = (sample: MachineSample | undefined) => (sample === undefined ? undefined : machineMessages.get(sample));
  const committedMessages = createIdentityCache((committed: Committed) => committedToProto(committed));

  const reasonContext = (): ReasonContext => {
    // A check of nothing never builds a reason: it is the cheap way to read what is committed now.
    const verdict = budget.check({ start: { memoryBytes: 0, cpu: 0 }, build: { memoryBytes: 0, cpu: 0 } });
    return { committed: verdict.committed, sample: verdict.sample };
  };
  const deps: BudgetHandlerDeps = {
    budget,
    clock,
    stats: options.stats ?? { queuedMessages: 0 },
    encoder: new QueuedEncoder(reasonContext),
    reasonContext,
    leaseLimits: () => ({ defaultTtlMs: options.defaultLeaseTtlMs(), maxTtlMs: options.maxLeaseTtlMs() }),
  };
  const tokens = new PageTokens();
  const reservationMessage = (r: ReservationInfo) => reservationToProto(r, runningIdsOf(r.id));
  const watchDeps: WatchHandlerDeps = {
    budget,
    clock,
    policyMessage: (policy) => (policy === budget.policy() ? policyMessage() : policyToProto(policy, extras())),
    machineMessage: (sample) => machineMessages.get(sample),
  };
  const runningIdsOf = (id: string) => budget.getReservation(id)?.runningIds ?? [];

  return {
    check(request) {
      const need = budget.needOf(needItemsFromProto(request.need));
      const verdict = budget.check(need, { skipLoadGate: request.skipLoadGate });
      // The parts every check repeats are converted once per change.
      const parts = { policy: policyMessage(), machine: machineMessage(verdict.sample), committed: committedMessages.get(verdict.committed) };
      return { verdict: verdictToProto(verdict, need, parts) };
    },

    admit: (requests, context) => admitStream(requests, context, deps),

    async reserve(request, context) {
      const policy = budget.policy();
      const need = budget.needOf(needItemsFromProto(request.need));
      const owner = checkName(request.owner, "owner");
      const requestId = checkRequestId(request.requestId);
      const wait = maxWaitMs(request.maxWait, "max_wait", policy.maxWaitMs);
      const ttlMs = leaseTtlMs(request.ttl, "ttl", deps.leaseLimits())!;
      let reservation: ReservationSnapshot;
      try {
        reservation = await budget.reserve(need, owner, {
          ttlMs,
          requestId,
          maxWaitMs: wait,
          skipLoadGate: request.skipLoadGate,
          // The call ending (client gone, its deadline, shutdown) drops the queued request.
          signal: context.signal,
        });
      } catch (error) {
        if (context.signal.aborted) throw abortError(context.signal);
        throw refusalError(error, { reasons: reasonContext });
      }
      // A reservation its caller never learns of would hold its share of the budget to its ttl:
      // released at once when the caller has gone by the time what has arrived is read, or when
      // the answer is not delivered — unless the call has a request id, whose retry must find it.
      await handOverGrant(context, clock, requestId === undefined ? () => budget.release(reservation.id) : undefined);
      return { reservation: reservationToProto(reservation, reservation.runningIds), waited: durationOf(reservation.waitedMs) };
    },

    async keepAlive(request) {
      if (request.ids.length > MAX_KEEPALIVE_IDS) throw invalidArgument("ids", `at most ${MAX_KEEPALIVE_IDS} per call; got ${request.ids.length}`);
      request.ids.forEach((id, index) => checkId(id, `ids[${index}]`));
      const renewals = [];
      for (const id of request.ids) {
        const reservation = budget.getReservation(id);
        if (reservation !== undefined) {
          // A reservation held by its stream has no lease: it is alive, with no expiry to report.
          if (reservation.leaseExpiresAt !== undefined) budget.renew(id);
          renewals.push(
            create(RenewalSchema, {
              id,
              alive: true,
              expireTime: reservation.leaseExpiresAt === undefined ? undefined : timestampOf(reservation.leaseExpiresAt),
            }),
          );
          continue;
        }
        try {
          const entry = await budget.renewRunning(id);
          renewals.push(
            create(RenewalSchema, { id, alive: true, expireTime: entry.leaseExpiresAt === undefined ? undefined : timestampOf(entry.leaseExpiresAt) }),
          );
        } catch (error) {
          if (!isBerthError(error)) throw error;
          // No lease to renew (the entry ends with its pid or StopRunning): alive, no expiry.
          if (error.code === "invalid_argument") renewals.push(create(RenewalSchema, { id, alive: true }));
          else if (error.code === "not_found") renewals.push(create(RenewalSchema, { id, alive: false }));
          else throw error;
        }
      }
      return { renewals };
    },

    release(request) {
      const id = checkId(request.reservationId, "reservation_id");
      return { released: budget.release(id, { requestId: checkRequestId(request.requestId) }) };
    },

    releaseBuild(request) {
      const id = checkId(request.reservationId, "reservation_id");
      const reservation = budget.releaseBuild(id, { requestId: checkRequestId(request.requestId) });
      return { reservation: reservationToProto(reservation, reservation.runningIds) };
    },

    async registerRunning(request) {
      const name = checkName(request.name, "name");
      const reservationId = request.reservationId === undefined ? undefined : checkId(request.reservationId, "reservation_id");
      const requestId = checkRequestId(request.requestId);
      const { cost, declared } = runCostFromProto(request.costSource, budget.runCostOf(name, reservationId));
      const pid = pidFromProto(request.pid, "pid");
      const ttlMs = leaseTtlMs(request.ttl, "ttl", deps.leaseLimits(), { unsetIsNone: true });
      const answer: RunningAnswer =
        reservationId === undefined
          ? await budget.registerRunning(name, cost, { pid, ttlMs, requestId, declaredCost: declared })
          : await budget.consume(reservationId, name, cost, { pid, ttlMs, requestId, declaredCost: declared });
      return runningAnswerToProto(answer);
    },

    async stopRunning(request) {
      const id = checkId(request.id, "id");
      return { stopped: await budget.stopRunning(id, { requestId: checkRequestId(request.requestId) }) };
    },

    getState(request) {
      const pageSize = pageSizeOf(request.pageSize);
      const state = budget.state(pageSize);
      const context = { committed: state.committed, sample: state.sample };
      return {
        committed: committedToProto(state.committed, pageSize),
        queue: queueToProto(state.queue, state.waitFor, context),
        reservations: state.reservations.map(reservationMessage),
        running: state.running.map(runningEntryToProto),
        policy: policyMessage(),
        machine: machineMessage(state.sample),
        queueSize: state.queueSize,
        reservationCount: state.reservationCount,
        runningCount: state.runningCount,
        queueNextPageToken: tokens.encode("queue", state.queueNext),
        reservationsNextPageToken: tokens.encode("reservations", state.reservationsNext),
        runningNextPageToken: tokens.encode("running", state.runningNext),
      };
    },

    listQueue(request) {
      const pageSize = pageSizeOf(request.pageSize);
      const page = budget.listQueue(tokens.decode("queue", request.pageToken), pageSize);
      return { queue: queueToProto(page.items, page.waitFor, reasonContext()), nextPageToken: tokens.encode("queue", page.next) };
    },

    listReservations(request) {
      const pageSize = pageSizeOf(request.pageSize);
      const page = budget.listReservations(tokens.decode("reservations", request.pageToken), pageSize);
      return { reservations: page.items.map(reservationMessage), nextPageToken: tokens.encode("reservations", page.next) };
    },

    listRunning(request) {
      const pageSize = pageSizeOf(request.pageSize);
      const page = budget.listRunning(tokens.decode("running", request.pageToken), pageSize);
      return { running: page.items.map(runningEntryToProto), nextPageToken: tokens.encode("running", page.next) };
    },

    getMachine() {
      return { machine: machineMessage(budget.machine()) };
    },

    watchMachine: (request, context) => watchMachine(request, context, watchDeps),

    watchBudget: (request, context) => watchBudget(request, context, watchDeps),

    costs(request) {
      const declared = resourceSpecFromProto(request.spec);
      const costs = budget.costs(declared.run, declared.build);
      return { run: costToProto(costs.run), build: costToProto(costs.build) };
    },

    getLimits() {
      const policy = budget.policy();
      return {
        defaultTtl: durationOf(options.defaultLeaseTtlMs()),
        maxTtl: durationOf(options.maxLeaseTtlMs()),
        maxWait: durationOf(policy.maxWaitMs),
        heartbeatInterval: durationOf(policy.heartbeatMs),
        maxQueue: policy.maxQueue,
        maxOwnerLength: MAX_OWNER_LENGTH,
        idempotencyWindow: durationOf(budget.keyLimits.idempotencyWindowMs),
        admitResumeGrace: durationOf(budget.keyLimits.admitResumeGraceMs),
      };
    },

    async getFleet(request) {
      const pageSize = pageSizeOf(request.pageSize);
      const after = fleetTokens.decode(request.pageToken);
      if (options.fleet === undefined) {
        throw new BerthError(
          "failed_precondition",
          "the fleet view needs --store etcd: start every machine's budget with --store etcd --etcd-endpoints URL (BERTH_STORE=etcd, BERTH_ETCD_ENDPOINTS) on one cluster",
          { field: "store" },
          { reason: "FLEET_NEEDS_ETCD" },
        );
      }
      const page = await options.fleet.list({ after, limit: pageSize });
      const last = page.entries.at(-1);
      return { machines: page.entries.map(fleetMachineToProto), nextPageToken: page.more && last !== undefined ? fleetTokens.encode(last.machine) : "" };
    },
  };
}
