/**
 * The election seam (@berth/shared's Elector) on etcd: an election is a key under a lease, created
 * only if absent (one transaction), holding the winner's claim. The lease is kept alive while the
 * process lives; release revokes it, and a holder that dies or is cut off loses the election when
 * its lease expires. In etcd mode berth's sessions instances need no election among themselves
 * (etcd serialises their writes): this is for whatever must still run once per cluster.
 */
import { ElectionHeldError, type ElectionClaim, type ElectionLock, type Elector } from "@berth/shared/elector";
import { selfIdentity } from "@berth/shared/process-identity";
import { compare, op, type EtcdClient } from "@berth/etcd";
import { electionKey } from "./store-keys.js";

/** An Elector whose elections live in etcd; `ttlSeconds` is how long a dead holder keeps one (default 10 s). */
export function etcdElector(client: EtcdClient, options: { readonly ttlSeconds?: number } = {}): Elector {
  return {
    async acquire(scope: string, name: string, acquireOptions: { service?: string } = {}): Promise<ElectionLock> {
      if (!/^[A-Za-z0-9_-]{1,64}$/.test(name)) throw new Error(`election name ${JSON.stringify(name)}: must be [A-Za-z0-9_-]{1,64}`);
      const key = electionKey(scope, name);
      const where = `etcd:${client.keys.prefix}${key}`;
      const claim: ElectionClaim = { ...selfIdentity(), at: new Date().toISOString(), service: acquireOptions.service ?? name };
      const lease = await client.grantLease(options.ttlSeconds ?? 10);
      try {
        const result = await client.txn({
          compare: [compare.absent(key)],
          success: [op.put(key, JSON.stringify(claim), lease.id)],
          failure: [op.get({ key })],
        });
        if (!result.succeeded) {
          const found = result.results[0];
          const kv = found !== undefined && "get" in found ? found.get.kvs[0] : undefined;
          throw new ElectionHeldError(scope, where, kv === undefined ? undefined : parseClaim(kv.value));
        }
      } catch (error) {
        await lease.revoke().catch(() => undefined);
        throw error;
      }
      return {
        claim,
        path: where,
        // Fire and forget, as the seam's release is synchronous: if etcd cannot be told, the lease
        // expires within its TTL.
        release: () => void lease.revoke().catch(() => undefined),
      };
    },
  };
}

function parseClaim(value: Uint8Array): ElectionClaim | undefined {
  try {
    const parsed = JSON.parse(new TextDecoder().decode(value)) as ElectionClaim;
    return typeof parsed.pid === "number" ? parsed : undefined;
  } catch {
    return undefined;
  }
}
