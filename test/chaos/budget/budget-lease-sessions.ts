/**
 * The budget chaos suite's unary sessions: a leased reservation renewed, built, started and
 * released (or let expire), a walk of a list's pages while everything else goes on, and the reads.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { Sleeper } from "./budget-sleepers.js";
import { ANSWER_MS, costOf, delay, durationOf, POLICY_WAIT_MS, type BudgetClient, type BudgetRun } from "./budget-run.js";

/** Reserve with a short lease → KeepAlive / ReleaseBuild / RegisterRunning → Release, or let it expire. */
export async function leaseSession(run: BudgetRun, client: BudgetClient, label: string): Promise<void> {
  const { rng, between, randomNeed, sleepers, stop, stats, violation, op, classify, retire } = run;
  stats.sessions++;
  const need = randomNeed(label);
  const ttlMs = Math.round(between(600, 1500));
  const maxWaitMs = Math.round(between(1000, POLICY_WAIT_MS));
  const controller = new AbortController();
  let cancelled = false;
  const cancel = () => {
    if (cancelled) return;
    cancelled = true;
    controller.abort();
  };
  const cancelTimer = rng() < 0.1 ? setTimeout(cancel, between(20, 1500)) : undefined;
  stop.signal.addEventListener("abort", cancel);
  op();
  let reservationId: string;
  // A retried Reserve: the same request id sent twice at once; both must get the one reservation.
  const retried = rng() < 0.25;
  const request = {
    owner: label,
    need: { items: need.items },
    ttl: durationOf(ttlMs),
    maxWait: durationOf(maxWaitMs),
    requestId: retried ? `${label}-reserve` : "",
  };
  try {
    const reserve = () => client.reserve(request, { signal: controller.signal, timeoutMs: maxWaitMs + ANSWER_MS });
    const [answer, again] = await Promise.all([reserve(), retried ? (op(), reserve()) : undefined]);
    if (answer.reservation === undefined) return violation(`${label}: Reserve answered without a reservation`);
    reservationId = answer.reservation.id;
    if (again !== undefined) {
      stats.repeatedRequests++;
      if (again.reservation?.id !== reservationId)
        violation(`${label}: a Reserve repeated with its request id got reservation ${again.reservation?.id}, the first ${reservationId}`);
    }
    if ((answer.waited?.seconds ?? 0n) > 0n || (answer.waited?.nanos ?? 0) > 0) stats.queued++;
  } catch (error) {
    const failure = ConnectError.from(error);
    if (cancelled && failure.code === Code.Canceled) stats.cancelledWhileQueued++;
    classify(failure, label, need, cancelled);
    return;
  } finally {
    clearTimeout(cancelTimer);
    stop.signal.removeEventListener("abort", cancel);
  }
  stats.admitted++;
  stats.admittedByReserve++;
  if (need.impossible) violation(`${label}: a need larger than the whole budget was admitted`);

  let lapsed = false;
  let entryLeased = false;
  let sleeper: Sleeper | undefined;
  const lost = (error: unknown): boolean => {
    const failure = ConnectError.from(error);
    // Under load a renewal may come late: the lease lapses and the reservation is gone. Allowed.
    if (failure.code === Code.NotFound) {
      lapsed = true;
      return true;
    }
    violation(`${label}: unexpected ${Code[failure.code]}: ${failure.rawMessage}`);
    return false;
  };

  // Renew the reservation (and a leased entry) every quarter ttl while the session holds it.
  const holding = new AbortController();
  const renewals = (async () => {
    while (!holding.signal.aborted && !lapsed) {
      await delay(ttlMs / 4, holding.signal);
      if (holding.signal.aborted) return;
      const ids = [reservationId];
      if (entryLeased && sleeper?.entryId !== undefined) ids.push(sleeper.entryId);
      op();
      const { renewals } = await client.keepAlive({ ids });
      if (renewals[0]?.alive !== true) lapsed = true;
    }
  })();
  try {
    if (need.build !== undefined && rng() < 0.5) {
      op();
      await client.releaseBuild({ reservationId }).catch(lost);
    }
    const part = need.starts[0]!;
    if (!lapsed && rng() < 0.6) {
      sleeper = sleepers.start(part.memoryBytes, part.cpu);
      const leased = rng() < 0.4;
      sleeper.registration = "pending";
      op();
      try {
        const repeated = rng() < 0.25;
        const registration = {
          name: part.name,
          costSource: costOf(part),
          pid: sleeper.pid,
          reservationId,
          ttl: leased ? durationOf(between(500, 1000)) : undefined,
          requestId: repeated ? `${label}-running` : "",
        };
        const [answer, again] = await Promise.all([client.registerRunning(registration), repeated ? (op(), client.registerRunning(registration)) : undefined]);
        if (again !== undefined) {
          stats.repeatedRequests++;
          if (again.running?.id !== answer.running?.id)
            violation(`${label}: a RegisterRunning repeated with its request id made entry ${again.running?.id} beside ${answer.running?.id}`);
        }
        sleepers.confirm(sleeper, answer.running!.id, leased);
        entryLeased = leased;
        stats.runningRegistered++;
      } catch (error) {
        sleeper.registration = "refused";
        lost(error);
      }
    }
    await delay(between(50, 1000));
  } finally {
    holding.abort();
    await renewals.catch((error: unknown) => violation(`${label}: KeepAlive failed: ${String(error)}`));
    if (sleeper !== undefined) retire(client, sleeper);
  }
  if (rng() < 0.3) {
    stats.leasesLeftToExpire++;
    return;
  }
  op();
  const { released } = await client.release({ reservationId });
  if (!released) lapsed = true;
  if (lapsed) stats.leasesLapsedUnderLoad++;
  // Released means gone: a renewal now finds nothing to renew.
  op();
  const after = await client.keepAlive({ ids: [reservationId] });
  if (after.renewals[0]?.alive !== false) violation(`${label}: KeepAlive still finds reservation ${reservationId} alive after its release`);
}

/**
 * Walks one of the lists a few entries a page while everything else goes on: no entry twice, and
 * every entry there before the first page and still there after the last is listed.
 */
export async function pagerSession(run: BudgetRun, client: BudgetClient, label: string): Promise<void> {
  const { rng, between, upTo, stats, violation, op } = run;
  const lists = {
    queue: async (token: string, pageSize: number) => {
      const page = await client.listQueue({ pageToken: token, pageSize });
      return { keys: page.queue.map((q) => q.owner), next: page.nextPageToken };
    },
    reservations: async (token: string, pageSize: number) => {
      const page = await client.listReservations({ pageToken: token, pageSize });
      return { keys: page.reservations.map((r) => r.id), next: page.nextPageToken };
    },
    running: async (token: string, pageSize: number) => {
      const page = await client.listRunning({ pageToken: token, pageSize });
      return { keys: page.running.map((e) => e.id), next: page.nextPageToken };
    },
  };
  const name = (["queue", "reservations", "running"] as const)[Math.floor(rng() * 3)]!;
  const list = lists[name];
  const whole = async () => {
    op();
    return new Set((await list("", 1000)).keys);
  };
  const before = await whole();
  const seen = new Map<string, number>();
  let token = "";
  do {
    op();
    const page = await list(token, upTo(4));
    for (const key of page.keys) seen.set(key, (seen.get(key) ?? 0) + 1);
    token = page.next;
    await delay(between(0, 50));
  } while (token !== "");
  const after = await whole();
  stats.pagedWalks++;
  for (const [key, times] of seen) if (times > 1) violation(`${label}: ${name} entry ${key} listed ${times} times in one walk of the pages`);
  for (const key of before)
    if (after.has(key) && !seen.has(key)) violation(`${label}: ${name} entry ${key}, there before and after the walk, was not on any page`);
}

/** The unary reads: a verdict and the machine. */
export async function lookSession(run: BudgetRun, client: BudgetClient, label: string): Promise<void> {
  const { randomNeed, violation, op } = run;
  const need = randomNeed(label);
  op();
  const { verdict } = await client.check({ need: { items: need.items } });
  if (need.impossible !== (verdict?.impossible !== undefined))
    violation(`${label}: Check's impossible is ${verdict?.impossible} for a need that is ${need.impossible ? "" : "not "}impossible`);
  op();
  await client.getMachine({});
}
