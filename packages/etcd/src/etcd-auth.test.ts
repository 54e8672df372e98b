// @module-tag etcd
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createEtcdClient, EtcdReason, type EtcdClient } from "./index.js";
import { startEtcd, type EtcdCluster } from "./testing/index.js";

// etcd with auth enabled: a root user (required first) and a user whose role covers berth's prefix.
// Its simple tokens expire after 1 s unused (5 minutes by default), to see the client renew one.
describe("etcd with auth", () => {
  let etcd: EtcdCluster;
  const clients: EtcdClient[] = [];
  const client = (auth?: { username: string; password: string }) => {
    const c = createEtcdClient({ endpoints: etcd.clientUrls, ...(auth ? { auth } : {}) });
    clients.push(c);
    return c;
  };

  beforeAll(async () => {
    etcd = await startEtcd({ args: ["--auth-token-ttl", "1"] });
    await etcd.etcdctl(["user", "add", "root:root-secret", "--interactive=false"]);
    await etcd.etcdctl(["user", "add", "berth:berth-secret", "--interactive=false"]);
    await etcd.etcdctl(["role", "add", "berth"]);
    await etcd.etcdctl(["role", "grant-permission", "berth", "readwrite", "berth/", "--prefix=true"]);
    await etcd.etcdctl(["user", "grant-role", "berth", "berth"]);
    await etcd.etcdctl(["auth", "enable"]);
  });
  afterAll(async () => {
    for (const c of clients) c.close();
    await etcd?.stop();
  });

  it("serves a client that authenticates, on every call and stream", async () => {
    const c = client({ username: "berth", password: "berth-secret" });
    const put = await c.put("k", "v");
    expect((await c.get("k"))?.modRevision).toBe(put.revision);
    const abort = new AbortController();
    const watched = (async () => {
      for await (const batch of c.watch({ key: "k", startRevision: put.revision, signal: abort.signal })) return batch.revision;
      return undefined;
    })();
    expect(await watched).toBe(put.revision);
    const lease = await c.grantLease(5);
    await lease.revoke();
  });

  it("authenticates again when etcd has dropped its token", async () => {
    const c = client({ username: "berth", password: "berth-secret" });
    await c.put("before", "1");
    // What is tested is time passing: the token expires unused.
    await new Promise((resolve) => setTimeout(resolve, 2_500));
    expect((await c.put("after", "2")).revision).toBeGreaterThan(0n);
  });

  it("refuses a client without credentials, or with wrong ones, as berth's configuration error", async () => {
    await expect(client().put("k", "v")).rejects.toMatchObject({ code: "internal", reason: EtcdReason.AUTH });
    await expect(client({ username: "berth", password: "wrong" }).put("k", "v")).rejects.toMatchObject({ code: "internal", reason: EtcdReason.AUTH });
  });

  it("refuses a key outside the user's rights as the same kind of error", async () => {
    const outside = createEtcdClient({ endpoints: etcd.clientUrls, prefix: "elsewhere/", auth: { username: "berth", password: "berth-secret" } });
    clients.push(outside);
    await expect(outside.put("k", "v")).rejects.toMatchObject({ code: "internal", reason: EtcdReason.AUTH });
  });
});
