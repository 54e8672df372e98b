/** The budget client against an in-memory budget service (Connect's router transport). */
import { Code, ConnectError, createRouterTransport, type ServiceImpl } from "@connectrpc/connect";
import { NeedItemKind, RefusalKind, RefusalSchema } from "@berth/api/berth/budget/v1/budget_pb";
import {
  BudgetEventKind,
  BudgetService,
  type AdmitRequest,
  type WatchBudgetRequest,
  type WatchMachineRequest,
} from "@berth/api/berth/budget/v1/budget_service_pb";
import { ErrorInfoSchema, RetryInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { describe, expect, it } from "vitest";
import { BudgetClient, build, start, type BudgetWatchEvent } from "./budget.js";
import { BerthClientError } from "./errors.js";

function client(impl: Partial<ServiceImpl<typeof BudgetService>>): BudgetClient {
  return new BudgetClient({ transport: createRouterTransport((router) => router.service(BudgetService, impl)) });
}

describe("need items", () => {
  it("carry memory as the size typed, or bytes already read as the size string that reads back exactly", () => {
    expect(start("web", { memory: "1.5GiB", cpu: 0.5 }).costSource).toEqual({ case: "spec", value: { memory: "1.5GiB", cpu: 0.5 } });
    expect(start("web", { memory: 2 * 1024 ** 3 }).costSource).toEqual({ case: "spec", value: { memory: "2147483648" } });
    expect(build("web", { memory: 1536, wave: 1 })).toMatchObject({
      kind: NeedItemKind.BUILD,
      wave: 1,
      costSource: { case: "spec", value: { build: { memory: "1536" } } },
    });
    expect(() => start("web", { memory: -1 })).toThrow(RangeError);
  });
});

/** An Admit stream that queues once, admits, answers `started` and `build_done`, and `release`; the kinds it received, in order. */
function admittingService() {
  const received: AdmitRequest["kind"]["case"][] = [];
  let first: AdmitRequest | undefined;
  const impl: Partial<ServiceImpl<typeof BudgetService>> = {
    async *admit(requests) {
      for await (const request of requests) {
        received.push(request.kind.case);
        switch (request.kind.case) {
          case "start":
            first = request;
            yield { kind: { case: "queued", value: { position: 1, waitForText: "memory" } } };
            yield { kind: { case: "admitted", value: { reservation: { id: "r-1", owner: request.kind.value.owner }, waited: { nanos: 5_000_000 } } } };
            break;
          case "started":
            yield {
              kind: {
                case: "updated",
                value: { reservation: { id: "r-1" }, running: { id: "run-1", name: request.kind.value.name, pid: request.kind.value.pid } },
              },
            };
            break;
          case "buildDone":
            yield { kind: { case: "updated", value: { reservation: { id: "r-1", owner: "after build" } } } };
            break;
          case "release":
            yield { kind: { case: "released", value: { reservationId: "r-1" } } };
            return;
        }
      }
    },
  };
  return { impl, received, start: () => first };
}

describe("admit", () => {
  it("tells onQueued, runs the work once admitted, answers its exchanges, and releases when it settles", async () => {
    const service = admittingService();
    const queued: number[] = [];
    let held: { releasedId: string | undefined; signal: AbortSignal } | undefined;
    const result = await client(service.impl).admit(
      [build("web", { memory: "2G", cpu: 2 }), start("web", { memory: "1G" })],
      async (admission) => {
        held = admission;
        expect(admission.reservation.id).toBe("r-1");
        expect(admission.waitedMs).toBe(5);
        const built = await admission.buildDone();
        expect(built?.owner).toBe("after build");
        const updated = await admission.started("web", { pid: 4242, spec: { memory: "1G" } });
        expect(updated.running).toMatchObject({ id: "run-1", name: "web", pid: 4242 });
        expect(service.received).toEqual(["start", "buildDone", "started"]);
        return "done";
      },
      { owner: "my-tool web", maxWaitMs: 30_000, onQueued: (q) => queued.push(q.position) },
    );
    expect(result).toBe("done");
    expect(service.received).toEqual(["start", "buildDone", "started", "release"]);
    expect(queued).toEqual([1]);
    expect(held?.releasedId).toBe("r-1");
    expect(held?.signal.aborted).toBe(true);
    const start0 = service.start()!.kind;
    expect(start0.case === "start" && start0.value).toMatchObject({ owner: "my-tool web", maxWait: { seconds: 30n } });
    expect(start0.case === "start" && start0.value.need?.items.map((i) => [i.kind, i.name])).toEqual([
      [NeedItemKind.BUILD, "web"],
      [NeedItemKind.START, "web"],
    ]);
  });

  it("releases when the work throws, and throws the work's own error as it is", async () => {
    const service = admittingService();
    const mistake = new Error("the build failed");
    await expect(
      client(service.impl).admit([start("job")], async () => {
        throw mistake;
      }),
    ).rejects.toBe(mistake);
    expect(service.received).toEqual(["start", "release"]);
  });

  it("a refusal throws with its Refusal and RetryInfo, before any work", async () => {
    const budget = client({
      async *admit(requests) {
        for await (const _ of requests) {
          throw new ConnectError("the queue is full", Code.ResourceExhausted, undefined, [
            { desc: ErrorInfoSchema, value: { reason: "QUEUE_FULL" } },
            { desc: RetryInfoSchema, value: { retryDelay: { seconds: 2n } } },
            { desc: RefusalSchema, value: { kind: RefusalKind.QUEUE_FULL, message: "the queue is full (1000)" } },
          ]);
        }
      },
    });
    let ran = false;
    const error = (await budget.admit([start("job")], () => (ran = true)).catch((e: unknown) => e)) as BerthClientError;
    expect(ran).toBe(false);
    expect(error).toBeInstanceOf(BerthClientError);
    expect(error.reason).toBe("QUEUE_FULL");
    expect(error.retryAfterMs).toBe(2000);
    expect(error.refusal).toMatchObject({ kind: RefusalKind.QUEUE_FULL, message: "the queue is full (1000)" });
  });

  it("is lost when the stream breaks while the work runs: its signal aborts, a pending exchange fails", async () => {
    const starts: string[] = [];
    const budget = client({
      async *admit(requests) {
        for await (const request of requests) {
          if (request.kind.case === "start") starts.push(request.kind.value.requestId);
          if (request.kind.case === "start") yield { kind: { case: "admitted", value: { reservation: { id: "r-2" } } } };
          else throw new ConnectError("shutting down", Code.Unavailable);
        }
      },
    });
    await budget.admit(
      [start("job")],
      async (admission) => {
        await expect(admission.started("job")).rejects.toMatchObject({ code: Code.Unavailable });
        expect(admission.signal.aborted).toBe(true);
        expect(admission.lost).toMatchObject({ code: Code.Unavailable, rawMessage: "shutting down" });
      },
      { resumeWithinMs: 0 },
    );
    // Never resumed, so sent without a request id: the service frees it when its connection goes.
    expect(starts).toEqual([""]);
  });

  it("a stream that breaks while queued is resumed on a new stream with the admission's request id: its place, then its admission", async () => {
    const starts: AdmitRequest[] = [];
    const budget = client({
      async *admit(requests) {
        for await (const request of requests) {
          if (request.kind.case !== "start") continue;
          starts.push(request);
          yield { kind: { case: "queued", value: { position: starts.length } } };
          // The first connection breaks (no ErrorInfo: a failure on the way, not berth's answer).
          if (starts.length === 1) throw new ConnectError("connection reset", Code.Unavailable);
          yield { kind: { case: "admitted", value: { reservation: { id: "r-3" } } } };
        }
      },
      release: () => ({ released: true }),
    });
    const places: number[] = [];
    const held = await budget.admit([start("job")], (admission) => admission.reservation.id, { onQueued: (q) => places.push(q.position) });
    expect(held).toBe("r-3");
    expect(places).toEqual([1, 2]);
    const ids = starts.map((r) => (r.kind.case === "start" ? r.kind.value.requestId : ""));
    expect(ids[0]).toMatch(/^[0-9a-f-]{36}$/);
    expect(ids[1]).toBe(ids[0]);
  });

  it("a stream that breaks while admitted is resumed: what was unanswered is sent again (a started with its own request id), the admission goes on", async () => {
    const startedIds: string[] = [];
    let streams = 0;
    const budget = client({
      async *admit(requests) {
        streams++;
        for await (const request of requests) {
          if (request.kind.case === "start") yield { kind: { case: "admitted", value: { reservation: { id: "r-4" } } } };
          else if (request.kind.case === "started") {
            startedIds.push(request.kind.value.requestId);
            if (streams === 1) throw new ConnectError("stream reset", Code.Internal);
            yield { kind: { case: "updated", value: { reservation: { id: "r-4" }, running: { id: "run-4" } } } };
          } else if (request.kind.case === "release") {
            yield { kind: { case: "released", value: { reservationId: "r-4" } } };
            return;
          }
        }
      },
    });
    await budget.admit([start("job")], async (admission) => {
      const updated = await admission.started("job");
      expect(updated.running?.id).toBe("run-4");
      expect(admission.signal.aborted).toBe(false);
    });
    expect(streams).toBe(2);
    expect(startedIds).toHaveLength(2);
    expect(startedIds[1]).toBe(startedIds[0]);
  });

  it("an admission the service ended while the client was away is lost on resume", async () => {
    let streams = 0;
    const budget = client({
      async *admit(requests) {
        streams++;
        for await (const request of requests) {
          if (request.kind.case !== "start") continue;
          yield { kind: { case: "admitted", value: { reservation: { id: "r-5" } } } };
          if (streams === 1) throw new ConnectError("connection reset", Code.Unavailable);
          yield { kind: { case: "released", value: { reservationId: "r-5" } } };
          return;
        }
      },
    });
    await budget.admit([start("job")], async (admission) => {
      await new Promise((resolve) => admission.signal.addEventListener("abort", resolve));
      expect(admission.lost).toMatchObject({ code: Code.FailedPrecondition });
      expect(admission.lost?.rawMessage).toMatch(/released reservation r-5 while this client was away/);
    });
  });
});

describe("keyed calls", () => {
  it("carry a request id, and are made again with it when they fail on the way; a refusal is not retried", async () => {
    const ids: string[] = [];
    let failures = 2;
    const budget = client({
      reserve(request) {
        ids.push(request.requestId);
        if (failures-- > 0) throw new ConnectError("connection reset", Code.Unavailable);
        return { reservation: { id: "r-6", owner: request.owner } };
      },
      release(request) {
        ids.push(request.requestId);
        throw new ConnectError("reused", Code.AlreadyExists, undefined, [
          { desc: ErrorInfoSchema, value: { reason: "IDEMPOTENCY_KEY_REUSED", domain: "berth.budget" } },
        ]);
      },
    });
    const { reservation } = await budget.reserve([start("job")], { owner: "ci" });
    expect(reservation?.id).toBe("r-6");
    expect(ids).toHaveLength(3);
    expect(new Set(ids).size).toBe(1);
    const refused = (await budget.release("r-6", { requestId: "mine" }).catch((e: unknown) => e)) as BerthClientError;
    expect([refused.code, refused.reason]).toEqual([Code.AlreadyExists, "IDEMPOTENCY_KEY_REUSED"]);
    expect(ids.slice(3)).toEqual(["mine"]);
  });
});

describe("state", () => {
  it("with all, fetches the rest of each list and empties the tokens", async () => {
    const budget = client({
      getState: () => ({
        queue: [{ owner: "q1" }],
        queueNextPageToken: "q",
        reservations: [{ id: "r1" }],
        reservationsNextPageToken: "",
        running: [],
        runningNextPageToken: "n",
      }),
      listQueue: (request) => (request.pageToken === "q" ? { queue: [{ owner: "q2" }], nextPageToken: "q2" } : { queue: [{ owner: "q3" }], nextPageToken: "" }),
      listRunning: () => ({ running: [{ id: "run" }], nextPageToken: "" }),
    });
    const state = await budget.state({ all: true, pageSize: 1 });
    expect(state.queue.map((q) => q.owner)).toEqual(["q1", "q2", "q3"]);
    expect(state.running.map((r) => r.id)).toEqual(["run"]);
    expect([state.queueNextPageToken, state.runningNextPageToken]).toEqual(["", ""]);
  });
});

/** RESOURCE_EXHAUSTED WATCHER_LAGGED as WatchBudget ends a watcher that fell behind: the revision in its ErrorInfo metadata. */
function budgetLagged(resumeRevision: bigint): ConnectError {
  return new ConnectError("the watcher fell too far behind", Code.ResourceExhausted, undefined, [
    { desc: ErrorInfoSchema, value: { reason: "WATCHER_LAGGED", domain: "berth.budget", metadata: { resumeRevision: String(resumeRevision) } } },
  ]);
}

const budgetEvent = (revision: bigint) => ({ kind: { case: "event" as const, value: { revision, kind: BudgetEventKind.RESERVATION_MADE } } });

/** What a watch yielded, as short labels: `event 11`, `caughtUp 10 reset`, `resumed 11`. */
async function labels(watch: AsyncIterable<BudgetWatchEvent>, count: number): Promise<string[]> {
  const seen: string[] = [];
  for await (const item of watch) {
    if (item.kind === "event") seen.push(`event ${item.event.revision}`);
    else seen.push(`${item.kind} ${item.revision}${item.kind === "caughtUp" && item.reset ? " reset" : ""}`);
    if (seen.length === count) break;
  }
  return seen;
}

describe("watchBudget", () => {
  it("resumes a watch ended WATCHER_LAGGED from the revision its ErrorInfo names, without asking for the current state again", async () => {
    const requests: WatchBudgetRequest[] = [];
    const budget = client({
      async *watchBudget(request) {
        requests.push(request);
        if (requests.length === 1) {
          yield { kind: { case: "caughtUp", value: { revision: 10n } } };
          yield budgetEvent(11n);
          yield budgetEvent(12n);
          throw budgetLagged(11n);
        }
        yield budgetEvent(12n);
        yield { kind: { case: "caughtUp", value: { revision: 12n } } };
        yield budgetEvent(13n);
      },
    });
    const seen = await labels(budget.watchBudget({ includeCurrent: true, progressIntervalMs: 500 }), 7);
    expect(seen).toEqual(["caughtUp 10", "event 11", "event 12", "resumed 11", "event 12", "caughtUp 12", "event 13"]);
    expect(requests.map((r) => [r.includeCurrent, r.startRevision, r.progressInterval?.nanos])).toEqual([
      [true, 0n, 500_000_000],
      [false, 11n, 500_000_000],
    ]);
  });

  it("asks for the current state in batches and yields each event of an events message on its own, keeping its revision", async () => {
    const requests: WatchBudgetRequest[] = [];
    const budget = client({
      async *watchBudget(request) {
        requests.push(request);
        if (requests.length === 1) {
          yield { kind: { case: "events", value: { events: [budgetEvent(20n).kind.value, budgetEvent(20n).kind.value] } } };
          yield { kind: { case: "caughtUp", value: { revision: 20n } } };
          throw budgetLagged(20n);
        }
        yield budgetEvent(21n);
      },
    });
    expect(await labels(budget.watchBudget({ includeCurrent: true }), 5)).toEqual(["event 20", "event 20", "caughtUp 20", "resumed 20", "event 21"]);
    expect(requests.map((r) => [r.includeCurrent, r.startRevision, r.maxBatch, r.queueLimit])).toEqual([
      [true, 0n, 1000, 0],
      [false, 20n, 1000, 0],
    ]);
  });

  it("asks for the front of the queue only with queueLimit, and passes caughtUp's queueSize on", async () => {
    const requests: WatchBudgetRequest[] = [];
    const budget = client({
      async *watchBudget(request) {
        requests.push(request);
        yield budgetEvent(30n);
        yield { kind: { case: "caughtUp", value: { revision: 30n, queueSize: 7 } } };
      },
    });
    const seen: BudgetWatchEvent[] = [];
    for await (const item of budget.watchBudget({ includeCurrent: true, queueLimit: 1 })) {
      seen.push(item);
      if (item.kind === "caughtUp") break;
    }
    expect(seen.at(-1)).toEqual({ kind: "caughtUp", revision: 30n, reset: false, queueSize: 7 });
    expect(requests[0]?.queueLimit).toBe(1);
  });

  it("passes a reset caughtUp through: the state described replaces the caller's view", async () => {
    let calls = 0;
    const budget = client({
      async *watchBudget() {
        if (calls++ === 0) {
          yield budgetEvent(20n);
          throw budgetLagged(20n);
        }
        yield budgetEvent(90n);
        yield { kind: { case: "caughtUp", value: { revision: 90n, reset: true } } };
      },
    });
    expect(await labels(budget.watchBudget({ startRevision: 19n }), 4)).toEqual(["event 20", "resumed 20", "event 90", "caughtUp 90 reset"]);
  });

  it("throws rather than spin when a resume lags again at once from the same revision", async () => {
    const starts: bigint[] = [];
    const budget = client({
      async *watchBudget(request) {
        starts.push(request.startRevision);
        throw budgetLagged(30n);
      },
    });
    const seen: string[] = [];
    const error = await (async () => {
      for await (const item of budget.watchBudget({ startRevision: 30n })) seen.push(item.kind);
    })().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BerthClientError);
    expect(error).toMatchObject({ code: Code.ResourceExhausted, reason: "WATCHER_LAGGED" });
    expect(seen).toEqual(["resumed"]);
    expect(starts).toEqual([30n, 30n]);
  });

  it("resumes again after a resumed stream handed something on, even from the same revision", async () => {
    let calls = 0;
    const budget = client({
      async *watchBudget() {
        calls++;
        if (calls === 3) {
          yield budgetEvent(41n);
          return;
        }
        // A progress is something handed on: the stream was read before it lagged again.
        if (calls === 2) yield { kind: { case: "progress", value: { revision: 40n } } };
        throw budgetLagged(40n);
      },
    });
    expect(await labels(budget.watchBudget({ startRevision: 40n }), 5)).toEqual(["resumed 40", "progress 40", "resumed 40", "event 41"]);
  });

  it("with resume: false, or another error, throws it", async () => {
    const lagging = client({
      async *watchBudget() {
        throw budgetLagged(5n);
      },
    });
    await expect(labels(lagging.watchBudget({ startRevision: 5n, resume: false }), 1)).rejects.toMatchObject({ reason: "WATCHER_LAGGED" });
    const failing = client({
      async *watchBudget() {
        throw new ConnectError("the budget service is shutting down", Code.Unavailable, undefined, [
          { desc: ErrorInfoSchema, value: { reason: "SHUTTING_DOWN" } },
        ]);
      },
    });
    await expect(labels(failing.watchBudget(), 1)).rejects.toMatchObject({ code: Code.Unavailable, reason: "SHUTTING_DOWN" });
  });
});

describe("watchMachine", () => {
  it("sends start_revision and the progress interval, and yields each sample with its revision, and progress", async () => {
    const requests: WatchMachineRequest[] = [];
    const budget = client({
      async *watchMachine(request) {
        requests.push(request);
        yield { machine: { cores: 4 }, revision: 8n, reset: true };
        yield { revision: 8n, progress: { revision: 8n } };
        yield { machine: { cores: 4 }, revision: 9n };
      },
    });
    const seen: string[] = [];
    for await (const item of budget.watchMachine({ startRevision: 3n, progressIntervalMs: 250 })) {
      seen.push(item.kind === "sample" ? `sample ${item.revision}${item.reset ? " reset" : ""} ${item.machine.cores}` : `progress ${item.revision}`);
    }
    expect(seen).toEqual(["sample 8 reset 4", "progress 8", "sample 9 4"]);
    expect(requests.map((r) => [r.startRevision, r.progressInterval?.nanos])).toEqual([[3n, 250_000_000]]);
  });
});
