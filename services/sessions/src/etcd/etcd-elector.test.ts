// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ElectionHeldError, type Elector } from "@berth/shared/elector";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import { etcdElector } from "./etcd-elector.js";

// The election seam's promises (as packages/shared/src/elector.test.ts states them for the file
// backend) on a real etcd member, between two processes' worth of clients.
let etcd: EtcdCluster;
const clients: EtcdClient[] = [];

beforeAll(async () => {
  etcd = await startEtcd({ electionTimeoutMs: 500 });
});
afterAll(async () => {
  for (const c of clients) c.close();
  await etcd?.stop();
});

function instance(): { client: EtcdClient; elector: Elector } {
  const client = createEtcdClient({ endpoints: etcd.clientUrls, prefix: "el-test/" });
  clients.push(client);
  return { client, elector: etcdElector(client, { ttlSeconds: 1 }) };
}

async function refusal(promise: Promise<unknown>): Promise<ElectionHeldError> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(ElectionHeldError);
  return error as ElectionHeldError;
}

/** Resolves once `key` (which exists now) is deleted: watched from the revision it was last written at. */
async function deleted(client: EtcdClient, key: string): Promise<void> {
  const kv = await client.get(key);
  if (kv === undefined) return;
  for await (const batch of client.watch({ key, startRevision: kv.modRevision + 1n, only: "delete" })) if (batch.events.length > 0) return;
}

describe("the election seam on etcd", () => {
  it("has one holder per scope and name across instances; a release lets the next one in", async () => {
    const a = instance();
    const b = instance();
    const first = await a.elector.acquire("/state/one", "svc", { service: "sessions" });
    expect(first.claim).toMatchObject({ pid: process.pid, service: "sessions" });
    const refused = await refusal(b.elector.acquire("/state/one", "svc"));
    expect(refused.holder).toMatchObject({ pid: process.pid, service: "sessions" });
    expect(refused.message).toMatch(/^\/state\/one is already served by pid \d+ \(sessions,/);
    const gone = deleted(b.client, "el/%2Fstate%2Fone/svc");
    const other = await b.elector.acquire("/state/one", "other");
    const elsewhere = await b.elector.acquire("/state/two", "svc");
    first.release();
    first.release();
    // The release's revoke is on its way (the seam's release does not wait): the next acquire waits for the key to go.
    await gone;
    const second = await b.elector.acquire("/state/one", "svc");
    expect(second.claim.service).toBe("svc");
    for (const lock of [second, other, elsewhere]) lock.release();
  });

  it("frees the election of a holder that died when its lease expires", async () => {
    const a = instance();
    const b = instance();
    await a.elector.acquire("/state/dead", "svc");
    await refusal(b.elector.acquire("/state/dead", "svc"));
    const gone = deleted(b.client, "el/%2Fstate%2Fdead/svc");
    a.client.close();
    await gone;
    const taken = await b.elector.acquire("/state/dead", "svc");
    taken.release();
  });
});
