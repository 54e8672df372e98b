// @module-tag etcd
/**
 * etcd chaos (docs/etcd.md): the sessions service on a three-member etcd cluster keeps its
 * promises while etcd's leader is SIGKILLed under load.
 *
 * Two sessions instances (`--store etcd`, every member as an endpoint) serve as one. Writers append
 * keyed events to a few sessions, alternating between the instances, and retry an append that
 * failed with the same idempotency key until it is acknowledged. Contenders take one source lock in
 * turn (Acquire through either instance, then writes fenced with their token to the lock's own
 * session, then Release). Each round SIGKILLs the member the cluster names leader once writes are
 * flowing, waits until they flow again on the new leader, and restarts the member.
 *
 * Afterwards, read back through the other instance: every session's seqs are contiguous from 1,
 * every acknowledged append is present at the seq it was acknowledged with, and no key appears
 * twice (exactly once, retries included); the fenced session's tokens never go down in seq order
 * (no two holders wrote interleaved), and every grant's token is above every earlier grant's.
 *
 * Knobs (env `BERTH_CHAOS_<NAME>`): ETCD_ROUNDS (3), ETCD_WRITERS (6), ETCD_SESSIONS (3),
 * ETCD_CONTENDERS (3).
 */
import { Code, ConnectError, type Client } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { connectClient, makeTempDir, startService, stopAll, type ServiceProcess } from "../../harness.js";
import { chaosSetting, reportSuite } from "../common/summary.js";

const ROUNDS = chaosSetting("ETCD_ROUNDS", 3);
const WRITERS = chaosSetting("ETCD_WRITERS", 6);
const SESSIONS = chaosSetting("ETCD_SESSIONS", 3);
const CONTENDERS = chaosSetting("ETCD_CONTENDERS", 3);
/** Appends acknowledged after a kill before the round's member comes back: writes flow on the new leader. */
const PROGRESS = 20;

let etcd: EtcdCluster;
let instances: ServiceProcess[] = [];
beforeAll(async () => {
  etcd = await startEtcd({ members: 3 });
  const args = ["--store", "etcd", "--etcd-endpoints", etcd.clientUrls.join(","), "--etcd-prefix", "chaos/"];
  instances = await Promise.all([startService("sessions", { args }), startService("sessions", { args })]);
});
afterAll(async () => {
  await stopAll();
  await etcd?.stop();
});

const sessionsOf = (i: number): Client<typeof SessionService> =>
  connectClient(SessionService, instances[i % 2]!.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 15_000 });
const locksOf = (i: number): Client<typeof LockService> =>
  connectClient(LockService, instances[i % 2]!.url("sessions"), { protocol: "grpc", defaultTimeoutMs: 30_000 });
const event = (label: string): Event => create(EventSchema, { kind: { case: "generate", value: { pageUrl: label } } });
const labelOf = (e: Event | undefined): string | undefined => (e?.kind.case === "generate" ? e.kind.value.pageUrl : undefined);
const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** A failure worth retrying: etcd or an instance was briefly out of reach. */
function transient(error: unknown): boolean {
  const code = ConnectError.from(error).code;
  return code === Code.Unavailable || code === Code.DeadlineExceeded || code === Code.Aborted;
}

interface Ack {
  session: string;
  key: string;
  seq: number;
}

describe("sessions and locks on a 3-member etcd, its leader SIGKILLed", () => {
  it("lose no acknowledged append, duplicate none, keep seqs contiguous, one holder at a time, tokens only rise", async () => {
    const acks: Ack[] = [];
    const grants: number[] = [];
    const problems: string[] = [];
    let running = true;
    let retries = 0;
    let fencedWrites = 0;
    let refusedFences = 0;
    const file = `${makeTempDir("berth-etcd-chaos-")}/shared.ts`;

    const writer = async (w: number) => {
      for (let n = 0; running; n++) {
        const session = `s${(w + n) % SESSIONS}`;
        const key = `w${w}-${n}`;
        // The same key until acknowledged, through alternating instances.
        for (let attempt = 0; ; attempt++) {
          try {
            const answer = await sessionsOf(w + n + attempt).appendEvent({ sessionId: session, event: event(key), idempotencyKey: key });
            acks.push({ session, key, seq: Number(answer.seq) });
            break;
          } catch (error) {
            if (!transient(error)) {
              problems.push(`append ${key}: ${ConnectError.from(error).message}`);
              return;
            }
            retries++;
            await pause(50);
          }
        }
      }
    };

    const contender = async (c: number) => {
      for (let n = 0; running; n++) {
        let lease;
        try {
          lease = (await locksOf(c + n).acquire({ file, owner: `c${c}`, maxWait: { seconds: 20n }, ttl: { seconds: 60n } })).lease!;
        } catch (error) {
          if (transient(error) || ConnectError.from(error).code === Code.ResourceExhausted) {
            await pause(50);
            continue;
          }
          problems.push(`acquire: ${ConnectError.from(error).message}`);
          return;
        }
        const token = Number(lease.fencingToken);
        if (grants.length > 0 && token <= Math.max(...grants)) problems.push(`token ${token} granted after ${Math.max(...grants)}`);
        grants.push(token);
        for (let k = 0; k < 3; k++) {
          try {
            await sessionsOf(c + n + k).appendEvent({ sessionId: "fenced", event: event(`t${token}-${k}`), fence: { file, fencingToken: lease.fencingToken } });
            fencedWrites++;
          } catch (error) {
            const reason = ConnectError.from(error).findDetails(ErrorInfoSchema)[0]?.reason;
            if (reason === "FENCE_REJECTED") {
              refusedFences++;
              break;
            }
            if (!transient(error)) problems.push(`fenced append: ${ConnectError.from(error).message}`);
          }
        }
        // The lease token is known to the instance that granted it.
        await locksOf(c + n)
          .release({ leaseToken: lease.leaseToken })
          .catch(() => undefined);
      }
    };

    const loops = [...Array.from({ length: WRITERS }, (_, w) => writer(w)), ...Array.from({ length: CONTENDERS }, (_, c) => contender(c))];
    const waitForAcks = async (count: number) => {
      const target = acks.length + count;
      while (acks.length < target) {
        if (problems.length > 0) throw new Error(problems.join("\n"));
        await pause(20);
      }
    };

    const recoveries: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      await waitForAcks(PROGRESS);
      const leader = await etcd.leader();
      const killedAt = Date.now();
      await etcd.kill(leader);
      await waitForAcks(PROGRESS);
      recoveries.push(Date.now() - killedAt);
      await etcd.restart(leader);
      await etcd.waitHealthy();
    }
    await waitForAcks(PROGRESS);
    running = false;
    await Promise.all(loops);

    // Read back through the instances in turn (the journal is etcd's, either sees all of it).
    const read = async (session: string, via: number) => {
      const entries: Array<{ seq: number; label: string | undefined }> = [];
      for await (const batch of sessionsOf(via).readJournal({ sessionId: session })) {
        for (const entry of batch.entries) entries.push({ seq: Number(entry.seq), label: labelOf(entry.event) });
      }
      return entries;
    };
    let violations = problems.length;
    const report = (message: string) => {
      violations++;
      if (problems.length < 20) problems.push(message);
    };
    let entriesRead = 0;
    for (let s = 0; s < SESSIONS; s++) {
      const session = `s${s}`;
      const entries = await read(session, s);
      entriesRead += entries.length;
      entries.forEach((entry, i) => {
        if (entry.seq !== i + 1) report(`${session}: entry ${i} has seq ${entry.seq}`);
      });
      const seqOf = new Map<string, number>();
      for (const entry of entries) {
        if (entry.label === undefined) report(`${session}: seq ${entry.seq} is not a writer's event`);
        else if (seqOf.has(entry.label)) report(`${session}: ${entry.label} at seq ${seqOf.get(entry.label)} and ${entry.seq}`);
        else seqOf.set(entry.label, entry.seq);
      }
      for (const ack of acks.filter((a) => a.session === session)) {
        if (seqOf.get(ack.key) !== ack.seq) report(`${session}: ${ack.key} acknowledged at ${ack.seq}, found at ${seqOf.get(ack.key)}`);
      }
    }
    const fenced = await read("fenced", 1);
    let lastToken = 0;
    fenced.forEach((entry, i) => {
      if (entry.seq !== i + 1) report(`fenced: entry ${i} has seq ${entry.seq}`);
      const token = Number(/^t(\d+)-/.exec(entry.label ?? "")?.[1] ?? Number.NaN);
      if (!(token >= lastToken)) report(`fenced: token ${token} at seq ${entry.seq} after token ${lastToken}`);
      lastToken = token;
    });

    reportSuite({
      suite: "etcd",
      rounds: ROUNDS,
      operations: acks.length + grants.length + fencedWrites,
      violations,
      members: 3,
      leaderKills: ROUNDS,
      acknowledgedAppends: acks.length,
      retriedAppends: retries,
      entriesRead,
      grants: grants.length,
      fencedWrites,
      refusedFences,
      writesFlowAgainAfterKillMs: recoveries,
    });
    expect(problems).toEqual([]);
    expect(violations).toBe(0);
    expect(grants.length).toBeGreaterThan(0);
  });
});
