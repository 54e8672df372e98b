// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { createEtcdClient, type EtcdClient } from "@berth/etcd";
import { countCalls, startEtcd, type EtcdCluster } from "@berth/etcd/testing";
import type { EtcdAppendResult } from "./etcd-journal-api.js";
import { EtcdJournal, type PreparedEvent } from "./etcd-journal.js";

// One real etcd member; "instances" are journals with clients of their own under one prefix, each
// with its etcd calls listed.
let etcd: EtcdCluster;
const clients: EtcdClient[] = [];
const follows = new AbortController();
let prefixes = 0;

beforeAll(async () => {
  etcd = await startEtcd();
});
afterAll(async () => {
  follows.abort();
  for (const c of clients) c.close();
  await etcd?.stop();
});

function instances(count: number): Array<{ journal: EtcdJournal; calls: string[] }> {
  const prefix = `c${++prefixes}/`;
  return Array.from({ length: count }, () => {
    const c = createEtcdClient({ endpoints: etcd.clientUrls, prefix });
    clients.push(c);
    const { client, calls } = countCalls(c);
    return { journal: new EtcdJournal({ client }), calls };
  });
}

const ev = (n: number): PreparedEvent => ({ type: "generate", event: { type: "generate", count: n } });
/** The seqs of each append an append brought back, in order. */
const seqsOf = (result: EtcdAppendResult) => result.preceding?.map((entries) => entries.map((entry) => entry.seq));

describe("an append after another instance's", () => {
  it("brings back what the other appended since the caller's seq in its failed transaction: the retry is all it costs", async () => {
    const [a, b] = instances(2);
    const first = await a!.journal.append("gap", [ev(1)]);
    await b!.journal.append("gap", [ev(2), ev(3)]);
    await b!.journal.append("gap", [ev(4)]);
    a!.calls.length = 0;
    const result = await a!.journal.append("gap", [ev(5)], { known: { seq: 1, incarnation: first.incarnation } });
    expect(a!.calls).toEqual(["txn", "txn"]);
    expect(result).toMatchObject({ firstSeq: 5, lastSeq: 5, incarnation: first.incarnation });
    expect(seqsOf(result)).toEqual([[2, 3], [4]]);
    expect(result.preceding?.[0]?.map((entry) => entry.event)).toEqual([ev(2).event, ev(3).event]);
    // A caller that knows it all is brought nothing.
    await b!.journal.append("gap", [ev(6)]);
    const group = await a!.journal.appendGroup("gap", [[ev(7)], [ev(8)]], { seq: 5, incarnation: first.incarnation });
    expect(group.map((r) => [r.firstSeq, seqsOf(r)])).toEqual([
      [7, [[6]]],
      [8, undefined],
    ]);
    expect(seqsOf(await a!.journal.append("gap", [ev(9)], { known: { seq: 8, incarnation: first.incarnation } }))).toEqual([]);
  });

  it("commits in one transaction once the watch of the heads has brought the other's head, and brings back its appends in it", async () => {
    const [a, b] = instances(2);
    void a!.journal.followHeads({ signal: follows.signal });
    const first = await a!.journal.append("watched", [ev(1)]);
    let known = first.lastSeq;
    for (let round = 0; round < 5; round++) {
      const other = await b!.journal.append("watched", [ev(known + 1)]);
      await vi.waitFor(() => expect(a!.journal.cachedHeadSeq("watched")).toBe(other.lastSeq));
      a!.calls.length = 0;
      const result =
        round % 2 === 0
          ? await a!.journal.append("watched", [ev(other.lastSeq + 1)], { known: { seq: known, incarnation: first.incarnation } })
          : (await a!.journal.appendGroup("watched", [[ev(other.lastSeq + 1)]], { seq: known, incarnation: first.incarnation }))[0]!;
      expect(a!.calls).toEqual(["txn"]);
      expect(result.firstSeq).toBe(other.lastSeq + 1);
      expect(seqsOf(result)).toEqual([[other.lastSeq]]);
      known = result.lastSeq;
    }
  });

  it("brings nothing back beyond 100 appends, or across a deletion: the caller reads the session back", async () => {
    const [a, b] = instances(2);
    const first = await a!.journal.append("far", [ev(1)]);
    for (let i = 2; i <= 102; i++) await b!.journal.append("far", [ev(i)]);
    const far = await a!.journal.append("far", [ev(103)], { known: { seq: 1, incarnation: first.incarnation } });
    expect(far).toMatchObject({ firstSeq: 103 });
    expect(far.preceding).toBeUndefined();
    await b!.journal.delete("far");
    const again = await b!.journal.append("far", [ev(104)]);
    const after = await a!.journal.append("far", [ev(105)], { known: { seq: 103, incarnation: first.incarnation } });
    expect(after).toMatchObject({ firstSeq: 105, incarnation: again.incarnation, created: false });
    expect(after.preceding).toBeUndefined();
  });
});
