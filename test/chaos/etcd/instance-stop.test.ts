// @module-tag etcd
/**
 * etcd chaos (docs/etcd.md): a berth instance that holds locks is SIGSTOPped past its etcd lease
 * and resumed. Two sessions instances (`--store etcd --etcd-lease-ttl 2s`) share a three-member
 * cluster. Each round takes one lock through the instance about to stop (an Acquire lease in even
 * rounds, a Hold stream in odd ones), queues a Hold for it through the other instance, and stops
 * the first. While it is stopped, the old holder keeps writing with its fencing token through the
 * live instance, and one write of it waits in the stopped instance's socket. Once etcd expires the
 * stopped instance's lease the queued Hold is granted; the new holder writes; then the stopped
 * instance resumes, and the old holder tries its token again through both instances, renews or
 * watches its hold, and releases.
 *
 * Never two holders: no write with the old token lands after the new holder's first, the write that
 * waited in the stopped instance is refused, every write with the old token after the grant is
 * refused, the resumed instance neither renews the old lease nor sends its hold a heartbeat once the
 * new holder has the lock (the hold ends with an error), both instances name the new holder, and the
 * old holder's release frees nothing. Tokens only rise, and the fenced journal read back through
 * either instance is contiguous, with every acknowledged write at its seq.
 *
 * Knobs (env `BERTH_CHAOS_<NAME>`): ETCD_STOP_ROUNDS (4).
 */
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { LockService, type HoldResponse, type Lease } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { keepaliveIntervalMs } from "@berth/etcd";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { continueProcess, stopProcess } from "@berth/shared/testing/process-stop";
import { connectClient, makeTempDir, startService, stopAll, type ServiceProcess } from "../../harness.js";
import { chaosSetting, reportSuite } from "../common/summary.js";

const ROUNDS = chaosSetting("ETCD_STOP_ROUNDS", 4);
const LEASE_TTL_MS = 2_000;
/** The TTL less the keepalive interval, less 100 ms for the two clocks' reading. */
const EARLIEST_EXPIRY_AFTER_STOP_MS = LEASE_TTL_MS - keepaliveIntervalMs(LEASE_TTL_MS) - 100;
const SESSION = "stop-fenced";

let etcd: EtcdCluster;
let instances: ServiceProcess[] = [];
beforeAll(async () => {
  etcd = await startEtcd({ members: 3 });
  const args = ["--store", "etcd", "--etcd-endpoints", etcd.clientUrls.join(","), "--etcd-prefix", "stop/", "--etcd-lease-ttl", `${LEASE_TTL_MS}ms`];
  instances = await Promise.all([startService("sessions", { args }), startService("sessions", { args })]);
});
afterAll(async () => {
  await stopAll();
  await etcd?.stop();
});

interface Instance {
  readonly pid: number;
  readonly sessions: Client<typeof SessionService>;
  readonly locks: Client<typeof LockService>;
}
const instance = (i: number): Instance => {
  const service = instances[i % 2]!;
  const url = service.url("sessions");
  return {
    pid: service.pid,
    sessions: connectClient(SessionService, url, { protocol: "grpc", defaultTimeoutMs: 60_000 }),
    locks: connectClient(LockService, url, { protocol: "grpc", defaultTimeoutMs: 60_000 }),
  };
};
const event = (label: string): Event => create(EventSchema, { kind: { case: "generate", value: { pageUrl: label } } });
const labelOf = (e: Event | undefined): string | undefined => (e?.kind.case === "generate" ? e.kind.value.pageUrl : undefined);
const reasonOf = (error: unknown): string | undefined => ConnectError.from(error).findDetails(ErrorInfoSchema)[0]?.reason;
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A Hold stream's messages as promises: queued, granted, every heartbeat, and its end. */
function openHold(locks: Client<typeof LockService>, file: string, owner: string) {
  const abort = new AbortController();
  const messages: Array<{ at: number; kind: HoldResponse["kind"]["case"] }> = [];
  let queued!: () => void;
  let granted!: (lease: Lease) => void;
  const waiting = new Promise<void>((resolve) => (queued = resolve));
  const acquired = new Promise<Lease>((resolve) => (granted = resolve));
  const ended = (async (): Promise<{ code: Code | undefined; reason: string | undefined; at: number }> => {
    try {
      for await (const message of locks.hold({ file, owner, maxWait: { seconds: 60n } }, { signal: abort.signal, timeoutMs: 300_000 })) {
        messages.push({ at: Date.now(), kind: message.kind.case });
        if (message.kind.case === "waiting") queued();
        if (message.kind.case === "acquired") granted(message.kind.value);
      }
      return { code: undefined, reason: undefined, at: Date.now() };
    } catch (error) {
      return { code: ConnectError.from(error).code, reason: reasonOf(error), at: Date.now() };
    }
  })();
  return { waiting, acquired, ended, messages, close: () => abort.abort() };
}

interface Write {
  readonly token: bigint;
  readonly label: string;
  readonly via: string;
  /** The seq it was acknowledged at, or why it was refused. */
  readonly outcome: { seq: number } | { refused: string };
  readonly at: number;
}

describe("sessions and locks on a 3-member etcd, a berth instance SIGSTOPped past its lease", () => {
  it("never two holders: the stopped instance's locks free, its holder's writes and renewals are refused once they do, tokens only rise", async () => {
    const problems: string[] = [];
    const writes: Write[] = [];
    const grants: bigint[] = [];
    const freedAfterMs: number[] = [];
    let n = 0;
    const dir = makeTempDir("berth-etcd-stop-");

    const write = async (via: Instance, name: string, file: string, token: bigint): Promise<Write> => {
      const label = `t${token}-${n++}`;
      let outcome: Write["outcome"];
      try {
        const answer = await via.sessions.appendEvent({ sessionId: SESSION, event: event(label), fence: { file, fencingToken: token } });
        outcome = { seq: Number(answer.seq) };
      } catch (error) {
        outcome = { refused: reasonOf(error) ?? Code[ConnectError.from(error).code] ?? "unknown" };
      }
      const done: Write = { token, label, via: name, outcome, at: Date.now() };
      writes.push(done);
      return done;
    };
    const refusedFence = (w: Write) => "refused" in w.outcome && w.outcome.refused === "FENCE_REJECTED";

    for (let round = 0; round < ROUNDS; round++) {
      const stopped = instance(round);
      const live = instance(round + 1);
      const file = `${dir}/round-${round}.ts`;
      const byHold = round % 2 === 1;

      // The old holder, through the instance about to stop.
      let oldLease: Lease;
      let oldHold: ReturnType<typeof openHold> | undefined;
      if (byHold) {
        oldHold = openHold(stopped.locks, file, `old-${round}`);
        oldLease = await oldHold.acquired;
      } else {
        oldLease = (await stopped.locks.acquire({ file, owner: `old-${round}`, ttl: { seconds: 600n } })).lease!;
      }
      const oldToken = oldLease.fencingToken;
      if (grants.some((g) => g >= oldToken)) problems.push(`round ${round}: token ${oldToken} granted after ${grants.join(",")}`);
      grants.push(oldToken);
      for (const via of [stopped, live]) {
        const w = await write(via, "either", file, oldToken);
        if (!("seq" in w.outcome)) problems.push(`round ${round}: the holder's write through a running instance was refused: ${w.outcome.refused}`);
      }

      // The next holder queues through the other instance.
      const next = openHold(live.locks, file, `next-${round}`);
      await next.waiting;

      stopProcess(stopped.pid);
      const stoppedAt = Date.now();
      // One write sits in the stopped instance's socket until it resumes.
      const waitingWrite = write(stopped, "stopped", file, oldToken);
      // And, for a lease, a renewal: the resumed instance reads both before its timers run.
      const waitingRenewal = byHold ? undefined : stopped.locks.keepAlive({ leaseTokens: [oldLease.leaseToken] });
      // The old holder goes on writing through the live instance until the lock has moved.
      let moved = false;
      const oldWriter = (async () => {
        while (!moved) {
          await write(live, "live", file, oldToken);
          await pause(25);
        }
      })();
      const newLease = await next.acquired;
      moved = true;
      await oldWriter;
      const grantedAt = Date.now();
      freedAfterMs.push(grantedAt - stoppedAt);
      const newToken = newLease.fencingToken;
      if (newToken <= oldToken) problems.push(`round ${round}: token ${newToken} granted after ${oldToken}`);
      grants.push(newToken);
      // etcd counts the TTL from the instance's last keepalive, which may be one interval older than the stop.
      if (grantedAt - stoppedAt < EARLIEST_EXPIRY_AFTER_STOP_MS)
        problems.push(
          `round ${round}: the lock moved ${grantedAt - stoppedAt} ms after its instance stopped, before its ${LEASE_TTL_MS} ms lease could expire (${EARLIEST_EXPIRY_AFTER_STOP_MS} ms at the earliest, counted from its last keepalive)`,
        );

      // The new holder writes; the old one is refused through the live instance.
      for (let k = 0; k < 2; k++) {
        const w = await write(live, "live", file, newToken);
        if (!("seq" in w.outcome)) problems.push(`round ${round}: the new holder's write was refused: ${w.outcome.refused}`);
      }
      const late = await write(live, "live", file, oldToken);
      if (!refusedFence(late))
        problems.push(`round ${round}: a write with the lost token ${oldToken} through the live instance: ${JSON.stringify(late.outcome)}`);

      continueProcess(stopped.pid);
      const waited = await waitingWrite;
      if (!refusedFence(waited)) problems.push(`round ${round}: the write that waited in the stopped instance: ${JSON.stringify(waited.outcome)}`);

      // After it resumes the stopped instance no longer vouches for the old holder.
      if (byHold) {
        const end = await oldHold!.ended;
        if (end.code === undefined) problems.push(`round ${round}: the old hold ended OK, as if released`);
        const lie = oldHold!.messages.find((m) => m.kind === "heartbeat" && m.at >= grantedAt);
        if (lie) problems.push(`round ${round}: the old hold got a heartbeat ${lie.at - grantedAt} ms after the lock moved`);
      } else {
        for (const renewing of [waitingRenewal!, stopped.locks.keepAlive({ leaseTokens: [oldLease.leaseToken] })]) {
          const renewal = (await renewing).renewals[0];
          if (renewal?.alive !== false)
            problems.push(`round ${round}: the lost lease was renewed through the resumed instance: ${JSON.stringify(renewal?.expireTime)}`);
        }
      }
      for (const via of [stopped, live]) {
        const w = await write(via, "either", file, oldToken);
        if (!refusedFence(w)) problems.push(`round ${round}: a write with the lost token after the resume: ${JSON.stringify(w.outcome)}`);
        const holder = (await via.locks.inspect({ file })).holder;
        if (holder?.fencingToken !== newToken)
          problems.push(`round ${round}: an instance names holder ${holder?.fencingToken} (${holder?.owner}), not ${newToken}`);
      }
      if (!byHold) {
        const released = await stopped.locks.release({ leaseToken: oldLease.leaseToken }).catch((error: unknown) => ConnectError.from(error));
        if (!(released instanceof ConnectError) && released.released) problems.push(`round ${round}: the lost lease's release said it released`);
      }
      const still = await write(live, "live", file, newToken);
      if (!("seq" in still.outcome)) problems.push(`round ${round}: the new holder lost the lock to the old holder's release: ${still.outcome.refused}`);

      next.close();
      await next.ended;
    }

    // The journal, read back through each instance.
    let violations = problems.length;
    const report = (message: string) => {
      violations++;
      if (problems.length < 20) problems.push(message);
    };
    const acknowledged = writes.filter((w) => "seq" in w.outcome) as Array<Write & { outcome: { seq: number } }>;
    for (let via = 0; via < 2; via++) {
      const entries: Array<{ seq: number; label: string | undefined }> = [];
      for await (const batch of instance(via).sessions.readJournal({ sessionId: SESSION })) {
        for (const entry of batch.entries) entries.push({ seq: Number(entry.seq), label: labelOf(entry.event) });
      }
      let lastToken = 0n;
      entries.forEach((entry, i) => {
        if (entry.seq !== i + 1) report(`via ${via}: entry ${i} has seq ${entry.seq}`);
        const token = BigInt(/^t(\d+)-/.exec(entry.label ?? "")?.[1] ?? "0");
        if (token < lastToken) report(`via ${via}: token ${token} written at seq ${entry.seq} after token ${lastToken}`);
        lastToken = token;
      });
      const seqOf = new Map(entries.map((e) => [e.label, e.seq]));
      if (entries.length !== acknowledged.length) report(`via ${via}: ${entries.length} entries, ${acknowledged.length} acknowledged`);
      for (const w of acknowledged)
        if (seqOf.get(w.label) !== w.outcome.seq) report(`via ${via}: ${w.label} acknowledged at ${w.outcome.seq}, found at ${seqOf.get(w.label)}`);
    }

    reportSuite({
      suite: "etcd-instance-stop",
      rounds: ROUNDS,
      operations: writes.length + grants.length,
      violations,
      members: 3,
      leaseTtlMs: LEASE_TTL_MS,
      grants: grants.length,
      acknowledgedWrites: acknowledged.length,
      refusedLostFence: writes.filter(refusedFence).length,
      lockFreedAfterStopMs: freedAfterMs,
    });
    expect(problems).toEqual([]);
    expect(violations).toBe(0);
  });
});
