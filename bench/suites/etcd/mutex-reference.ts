/**
 * etcd's own lock handoff, the reference berth's is read against in the same run: a lock taken as
 * etcd's `concurrency.Mutex` (clientv3, 3.4) takes it, driven through berth's etcd client
 * directly, no berth service in between. Two holders, each on a client of its own (as two
 * machines would be) with one session lease kept alive throughout, hand one lock to each other
 * round after round:
 *
 * - Lock: one transaction puts the holder's key `<prefix><lease id, hex>` under its lease and reads
 *   the owner (the lowest create revision). Not the owner, it waits as `waitDeletes` does: it reads
 *   the newest key older than its own, watches that key's deletion from the read's revision on,
 *   and reads again, until no older key is left.
 * - Unlock: one delete of the key (the session lease lives on).
 *
 * Each handoff starts once the waiter's key is in the queue and etcd has its watch, and is timed from the holder's delete being sent to the waiter's watch seeing it
 * (`handoff_latency`: one delete and one watch event, the least a lock on etcd can hand over in)
 * and to the waiter's Lock returning (`lock_return_latency`: 3.4's `waitDeletes` reads once more
 * after the event before it returns).
 */
import { compare, createEtcdClient, op, type EtcdClient, type EtcdLease, type RangeResult, type TxnOpResult } from "@berth/etcd";
import { withTimeout } from "../locks.js";
import { difference, etcdCalls, watchOpened, watchRequests, type Calls } from "./etcd-calls.js";

/** Unmeasured handoffs first on each measurement (the watch streams, JIT). */
const WARM_HANDOFFS = 10;

/** What the reference measured: per handoff, in ms, and etcd's calls from each delete to the Lock's return. */
export interface MutexSamples {
  readonly handoff: number[];
  readonly lockReturn: number[];
  readonly calls: Calls;
}

export interface MutexReference {
  /** `handoffs` measured handoffs between the two holders, on a lock of its own. */
  measure(handoffs: number): Promise<MutexSamples>;
  close(): void;
}

interface Holder {
  readonly client: EtcdClient;
  readonly lease: EtcdLease;
}

/** Two holders on `endpoints` (leader first), each with its client and session lease. */
export async function startMutexReference(endpoints: readonly string[], memberUrls: readonly string[]): Promise<MutexReference> {
  const clients = [0, 1].map(() => createEtcdClient({ endpoints: [...endpoints], prefix: "bench/" }));
  try {
    const holders: Holder[] = await Promise.all(clients.map(async (client) => ({ client, lease: await client.grantLease(60) })));
    let locks = 0;
    return {
      measure: (handoffs) => measure(holders, `mutex/${Date.now()}-${++locks}/`, handoffs, memberUrls),
      close() {
        for (const client of clients) client.close();
      },
    };
  } catch (error) {
    for (const client of clients) client.close();
    throw error;
  }
}

async function measure(holders: Holder[], prefix: string, handoffs: number, memberUrls: readonly string[]): Promise<MutexSamples> {
  const samples: MutexSamples = { handoff: [], lockReturn: [], calls: new Map() };
  let holding = 0;
  await lock(holders[0]!, prefix);
  for (let i = 0; i < WARM_HANDOFFS + handoffs; i++) {
    const holder = holders[holding]!;
    const waiter = holders[1 - holding]!;
    let eventAt: number | undefined;
    const watchesBefore = await watchRequests(memberUrls);
    const locked = lock(waiter, prefix, () => (eventAt ??= performance.now())).then(() => performance.now());
    locked.catch(() => {});
    // The waiter waits in etcd: its key is in the queue and its watch is set.
    await queued(holder.client, prefix);
    await watchOpened(memberUrls, watchesBefore);
    const measured = i >= WARM_HANDOFFS;
    const callsBefore = measured ? await etcdCalls(memberUrls) : undefined;
    const sentAt = performance.now();
    await holder.client.delete({ key: keyOf(prefix, holder) });
    const returnedAt = await withTimeout(locked, 30_000, "etcd mutex: no handoff within 30 s of the delete");
    if (callsBefore) {
      for (const [method, n] of difference(await etcdCalls(memberUrls), callsBefore)) samples.calls.set(method, (samples.calls.get(method) ?? 0) + n);
    }
    if (measured) {
      samples.handoff.push(eventAt! - sentAt);
      samples.lockReturn.push(returnedAt - sentAt);
    }
    holding = 1 - holding;
  }
  await holders[holding]!.client.delete({ key: keyOf(prefix, holders[holding]!) });
  return samples;
}

const keyOf = (prefix: string, holder: Holder) => `${prefix}${holder.lease.id.toString(16)}`;

/** The oldest key under `prefix`, as the Mutex's `WithFirstCreate` reads it. */
const firstCreate = (prefix: string) => op.get({ key: prefix, prefix: true, sort: { by: "create", order: "ascend" }, limit: 1, keysOnly: true });

/** `Mutex.Lock`; `onDeleteSeen` is called when a watched key's deletion arrives. */
async function lock(holder: Holder, prefix: string, onDeleteSeen?: () => void): Promise<void> {
  const key = keyOf(prefix, holder);
  const put = await holder.client.txn({
    compare: [compare.create(key, "==", 0n)],
    success: [op.put(key, "", holder.lease.id), firstCreate(prefix)],
    failure: [op.get({ key }), firstCreate(prefix)],
  });
  const mine = put.succeeded ? put.revision : rangeOf(put.results[0]).kvs[0]!.createRevision;
  const owner = rangeOf(put.results[1]).kvs[0];
  if (owner === undefined || owner.createRevision === mine) return;
  // waitDeletes: the newest key older than this one, until there is none.
  for (;;) {
    const queue = await holder.client.range({ key: prefix, prefix: true, sort: { by: "create", order: "descend" }, keysOnly: true });
    const older = queue.kvs.find((kv) => kv.createRevision < mine);
    if (older === undefined) return;
    const stop = new AbortController();
    try {
      for await (const batch of holder.client.watch({ key: older.key, startRevision: queue.revision + 1n, only: "delete", signal: stop.signal })) {
        if (batch.events.some((event) => event.type === "delete")) break;
      }
    } finally {
      stop.abort();
    }
    onDeleteSeen?.();
  }
}

/** Resolves once two keys are under `prefix` (the holder's and the waiter's); 10 s at most. */
async function queued(client: EtcdClient, prefix: string): Promise<void> {
  const deadline = performance.now() + 10_000;
  while ((await client.range({ key: prefix, prefix: true, countOnly: true })).count < 2) {
    if (performance.now() > deadline) throw new Error(`etcd mutex: no waiter under ${prefix} within 10 s`);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
}

function rangeOf(result: TxnOpResult | undefined): RangeResult {
  if (result === undefined || !("get" in result)) throw new Error("etcd answered the mutex's transaction without its read");
  return result.get;
}
