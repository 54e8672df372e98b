/**
 * The budget chaos suite's Admit streams: one read continuously ({@link AdmitCall}), a session that
 * waits, builds, starts and ends it at random, and one cut under its client and resumed on another
 * connection with its request id (or left to the grace).
 */
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import type { AdmitRequestSchema, AdmitResponse, AdmitStartSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { pushable } from "@berth/budget/server/testing";
import { closeClient, connectClient, cuttableProxy } from "../../harness.js";
import type { Sleeper } from "./budget-sleepers.js";
import { ANSWER_MS, costOf, delay, durationOf, POLICY_WAIT_MS, RESUME_GRACE_MS, type BudgetClient, type BudgetRun } from "./budget-run.js";

type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;
type AdmitStartInit = MessageInitShape<typeof AdmitStartSchema>;

/** An Admit stream read continuously into `responses`; waits are bounded and woken by each message. */
class AdmitCall {
  readonly responses: AdmitResponse[] = [];
  ended = false;
  failure: ConnectError | undefined;
  readonly done: Promise<void>;
  private readonly requests = pushable<AdmitRequestInit>();
  private readonly controller = new AbortController();
  private readonly wakers = new Set<() => void>();

  constructor(client: BudgetClient, start: AdmitStartInit) {
    this.requests.push({ kind: { case: "start", value: start } });
    this.done = (async () => {
      try {
        for await (const response of client.admit(this.requests, { signal: this.controller.signal })) {
          this.responses.push(response);
          this.wake();
        }
      } catch (error) {
        this.failure = ConnectError.from(error);
      } finally {
        this.ended = true;
        // Our side ends too, as a finished client's would (connect-node keeps it open otherwise).
        this.requests.end();
        this.wake();
      }
    })();
  }

  send(request: AdmitRequestInit): void {
    this.requests.push(request);
  }

  /** Closes the request side: the server sees the client finish. */
  endRequests(): void {
    this.requests.end();
  }

  /** Cancels the call (an RST_STREAM to the server). */
  cancel(): void {
    this.controller.abort();
  }

  count(kind: AdmitResponse["kind"]["case"]): number {
    return this.responses.filter((r) => r.kind.case === kind).length;
  }

  has(kind: AdmitResponse["kind"]["case"]): boolean {
    return this.responses.some((r) => r.kind.case === kind);
  }

  /** Waits until `predicate` holds, the call ends, `timeoutMs` passes or `signal` fires; returns `predicate()`. */
  async until(predicate: () => boolean, timeoutMs: number, signal?: AbortSignal): Promise<boolean> {
    const end = performance.now() + timeoutMs;
    while (!predicate() && !this.ended && !signal?.aborted) {
      const left = end - performance.now();
      if (left <= 0) break;
      await new Promise<void>((resolve) => {
        const done = () => {
          clearTimeout(timer);
          this.wakers.delete(done);
          signal?.removeEventListener("abort", done);
          resolve();
        };
        const timer = setTimeout(done, left);
        this.wakers.add(done);
        signal?.addEventListener("abort", done, { once: true });
      });
    }
    return predicate();
  }

  private wake(): void {
    for (const waker of [...this.wakers]) waker();
  }
}

/** Admit → wait → BuildDone / Started → Release, cancel or close; or cancel while queued. */
export async function admitSession(run: BudgetRun, client: BudgetClient, label: string): Promise<void> {
  const { rng, between, randomNeed, sleepers, stop, stats, violation, op, classify, retire } = run;
  stats.sessions++;
  const need = randomNeed(label);
  const maxWaitMs = rng() < 0.2 ? undefined : rng() < 0.1 ? 0 : Math.round(between(500, POLICY_WAIT_MS));
  if (maxWaitMs === 0) stats.zeroWaits++;
  const call = new AdmitCall(client, { owner: label, need: { items: need.items }, maxWait: maxWaitMs === undefined ? undefined : durationOf(maxWaitMs) });
  op();
  let cancelled = false;
  const cancel = () => {
    cancelled = true;
    call.cancel();
  };
  const admittedOrEnded = () => call.has("admitted");
  if (rng() < 0.15) {
    await call.until(admittedOrEnded, between(20, 1500), stop.signal);
    if (!call.has("admitted") && !call.ended) {
      if (rng() < 0.3) {
        // Withdrawn by a Release while queued: the server answers released and ends the stream.
        call.send({ kind: { case: "release", value: {} } });
        op();
        await call.done;
        stats.withdrawnWhileQueued++;
        if (call.has("queued")) stats.queued++;
        if (call.has("admitted")) stats.admitted++; // admitted just before the release arrived
        if (call.failure !== undefined) classify(call.failure, label, need, false);
        else if (!call.has("released")) violation(`${label}: a release while queued ended the stream without a released answer`);
        return;
      }
      cancel();
      stats.cancelledWhileQueued++;
    }
  }
  if (!cancelled) {
    const bound = (maxWaitMs ?? POLICY_WAIT_MS) + ANSWER_MS;
    await call.until(admittedOrEnded, bound, stop.signal);
    if (!call.has("admitted") && !call.ended) {
      if (!stop.signal.aborted) violation(`${label}: neither admitted nor refused within ${bound} ms`);
      cancel();
      stats.cancelledWhileQueued++;
    }
  }
  if (call.has("queued")) stats.queued++;
  if (!call.has("admitted")) {
    await call.done;
    if (call.failure !== undefined) classify(call.failure, label, need, cancelled);
    else violation(`${label}: the stream ended with neither an admission nor a refusal`);
    return;
  }

  stats.admitted++;
  if (need.impossible) violation(`${label}: a need larger than the whole budget was admitted`);
  const admitted = call.responses.find((r) => r.kind.case === "admitted")!;
  const reservation = admitted.kind.case === "admitted" ? admitted.kind.value.reservation : undefined;
  const startMemory = need.starts.reduce((sum, s) => sum + s.memoryBytes, 0);
  if (Number(reservation?.start?.memoryBytes ?? -1n) !== startMemory || Number(reservation?.build?.memoryBytes ?? -1n) !== (need.build?.memoryBytes ?? 0)) {
    violation(
      `${label}: admitted with start ${reservation?.start?.memoryBytes} / build ${reservation?.build?.memoryBytes}, asked ${startMemory} / ${need.build?.memoryBytes ?? 0}`,
    );
  }
  await delay(between(0, 150));

  const started: Sleeper[] = [];
  let updates = 0;
  /** Sends a request that the server answers with `updated`; the answer, or undefined when none came. */
  const step = async (request: AdmitRequestInit, what: string): Promise<AdmitResponse | undefined> => {
    call.send(request);
    op();
    const want = ++updates;
    if (await call.until(() => call.count("updated") >= want, ANSWER_MS)) return call.responses.filter((r) => r.kind.case === "updated")[want - 1];
    violation(`${label}: no answer to ${what}: ${call.failure === undefined ? "timed out" : `${Code[call.failure.code]} ${call.failure.rawMessage}`}`);
    return undefined;
  };
  try {
    if (need.build !== undefined && rng() < 0.7) await step({ kind: { case: "buildDone", value: {} } }, "build_done");
    for (const part of need.starts) {
      if (call.ended || rng() < 0.5) continue;
      const sleeper = sleepers.start(part.memoryBytes, part.cpu);
      started.push(sleeper);
      const leased = rng() < 0.2;
      const request: AdmitRequestInit = {
        kind: {
          case: "started",
          value: { name: part.name, costSource: costOf(part), pid: sleeper.pid, ttl: leased ? durationOf(between(300, 800)) : undefined },
        },
      };
      sleeper.registration = "pending";
      if (rng() < 0.1) {
        // Gone before the answer: whether the entry exists is the server's race to decide.
        call.send(request);
        op();
        sleeper.registration = "uncertain";
        cancel();
        stats.cancelledWhileAdmitted++;
        break;
      }
      const answer = await step(request, `started ${part.name}`);
      const entry = answer?.kind.case === "updated" ? answer.kind.value.running : undefined;
      if (entry === undefined) {
        sleeper.registration = "uncertain";
        break;
      }
      sleepers.confirm(sleeper, entry.id, leased);
      stats.runningRegistered++;
      if (entry.pid !== sleeper.pid) violation(`${label}: running entry ${entry.id} has pid ${entry.pid}, reported ${sleeper.pid}`);
    }
    if (!cancelled) {
      await delay(between(0, 150));
      const ending = rng();
      if (ending < 0.4) {
        call.send({ kind: { case: "release", value: {} } });
        op();
        if (!(await call.until(() => call.has("released"), ANSWER_MS))) violation(`${label}: no answer to release`);
        stats.releasedByMessage++;
      } else if (ending < 0.8) {
        cancel();
        stats.cancelledWhileAdmitted++;
      } else {
        call.endRequests();
        stats.requestSideClosed++;
      }
    }
    await call.done;
    if (call.failure !== undefined && !(cancelled && call.failure.code === Code.Canceled))
      violation(`${label}: stream failed: ${Code[call.failure.code]} ${call.failure.rawMessage}`);
  } finally {
    for (const sleeper of started) retire(client, sleeper);
  }
}

/**
 * An Admit with a request id on a connection of its own, cut while queued or admitted; then
 * resumed with the same id on the client's connection (or, now and then, left to the grace).
 */
export async function resumeSession(run: BudgetRun, client: BudgetClient, label: string): Promise<void> {
  const { url, rng, between, randomNeed, stop, stats, violation, op, classify } = run;
  stats.sessions++;
  let need = randomNeed(label);
  while (need.impossible) need = randomNeed(label);
  const start: AdmitStartInit = { owner: label, need: { items: need.items }, requestId: `${label}-admit`, maxWait: durationOf(POLICY_WAIT_MS) };
  const proxy = await cuttableProxy(url);
  const own = connectClient(BudgetService, proxy.url, { protocol: "grpc", defaultTimeoutMs: 120_000 });
  try {
    const first = new AdmitCall(own, start);
    op();
    // Cut while queued, or once admitted (as long as the queue takes, within bounds).
    const untilAdmitted = rng() < 0.5;
    await first.until(() => first.has("admitted") || (!untilAdmitted && first.has("queued")), untilAdmitted ? POLICY_WAIT_MS : between(100, 3000), stop.signal);
    if (first.ended) {
      if (first.failure !== undefined) classify(first.failure, label, need, false);
      return;
    }
    const firstAdmitted = first.responses.find((r) => r.kind.case === "admitted");
    const held = firstAdmitted?.kind.case === "admitted" ? firstAdmitted.kind.value.reservation?.id : undefined;
    if (first.has("queued")) stats.queued++;
    proxy.cut();
    await first.done;
    if (rng() < 0.15) {
      // Left to the grace: the end of the run checks that nothing of it is held.
      stats.abandonedToGrace++;
      return;
    }
    await delay(between(0, RESUME_GRACE_MS / 2));
    const resumed = new AdmitCall(client, start);
    op();
    const bound = POLICY_WAIT_MS + ANSWER_MS;
    await resumed.until(() => resumed.has("admitted"), bound, stop.signal);
    if (!resumed.has("admitted")) {
      if (!resumed.ended) resumed.cancel();
      await resumed.done;
      // A resume that found the admission gone (refused meanwhile) queues anew or is refused: both fine.
      if (resumed.failure !== undefined && !(stop.signal.aborted && resumed.failure.code === Code.Canceled))
        classify(resumed.failure, label, need, stop.signal.aborted);
      return;
    }
    const admitted = resumed.responses.find((r) => r.kind.case === "admitted");
    const reservationId = admitted?.kind.case === "admitted" ? admitted.kind.value.reservation?.id : undefined;
    if (held !== undefined) {
      stats.resumedAdmitted++;
      if (reservationId !== held) violation(`${label}: resumed to reservation ${reservationId}, it held ${held}`);
    } else {
      stats.resumedQueued++;
      if (resumed.responses[0]?.kind.case === "admitted") stats.admittedWhileAway++;
    }
    stats.admitted++;
    op();
    const mine = (await client.listReservations({ pageSize: 1000 })).reservations.filter((r) => r.owner === label);
    if (mine.length > 1 || (mine.length === 1 && mine[0]!.id !== reservationId))
      violation(`${label}: ${mine.length} reservations (${mine.map((r) => r.id).join(", ")}) for one request id; the stream holds ${reservationId}`);
    if (resumed.has("released")) {
      // The resume came after the grace (a loaded machine): the service answered the first answer and its end.
      return;
    }
    await delay(between(0, 300));
    resumed.send({ kind: { case: "release", value: {} } });
    op();
    if (!(await resumed.until(() => resumed.has("released"), ANSWER_MS))) violation(`${label}: no answer to release after a resume`);
    stats.releasedByMessage++;
    await resumed.done;
  } finally {
    closeClient(own);
    await proxy.close();
  }
}
