/**
 * The sessions service on etcd (`--store etcd`): the client it opens (TLS and auth passed
 * through), and the session store and source locks over it. Several instances started so on one
 * cluster and one prefix are one service: each serves every session and every lock, and none is
 * elected. Loaded only with `--store etcd` (the settings it refuses are store-settings.ts').
 */
import type { Logger } from "pino";
import { etcdClientOf } from "@berth/etcd/settings";
import type { Elector, ElectionLock } from "@berth/shared/elector";
import { selfIdentity } from "@berth/shared/process-identity";
import { EtcdJournal } from "../etcd/etcd-journal.js";
import { EtcdLocks } from "../etcd/etcd-locks.js";
import { EtcdSessionStore } from "../etcd/etcd-session-store.js";
import { createEtcdSourceLocks, type EtcdSourceLocks } from "../etcd/etcd-source-locks.js";
import { checkFencingToken } from "../locks/lock-input.js";
import type { FenceCheck } from "./session-handlers.js";
import type { SessionsValues } from "./settings.js";

/** The session store and source locks on etcd, and how to close them. */
export interface OpenedEtcdStore {
  readonly store: EtcdSessionStore;
  readonly locks: EtcdSourceLocks;
  /** The handlers' fence check: input only; the append's transaction compares the fence itself. */
  readonly fenceCheck: FenceCheck;
  close(): Promise<void>;
}

/**
 * Opens the store on the cluster the settings name. The cluster is asked once now, so that an
 * unreachable etcd (or refused credentials) fails the start with etcd's own words.
 */
export async function openEtcdStore(values: SessionsValues, logger: Logger): Promise<OpenedEtcdStore> {
  const client = await etcdClientOf(values);
  try {
    const status = await client.status();
    logger.info(
      {
        endpoints: values.etcdEndpoints,
        prefix: values.etcdPrefix,
        etcdVersion: status.version,
        leaseTtlMs: values.etcdLeaseTtl,
        maxRequestBytes: values.etcdMaxRequestBytes,
        completedRetentionMs: values.completedRetention,
      },
      "sessions and locks on etcd",
    );
  } catch (error) {
    client.close();
    throw error;
  }
  const journal = new EtcdJournal({ client, maxRequestBytes: values.etcdMaxRequestBytes, idempotencyWindowMs: values.idempotencyWindow });
  const etcdLocks = new EtcdLocks({ client });
  const locks = createEtcdSourceLocks({
    locks: etcdLocks,
    leaseTtlSeconds: Math.ceil(values.etcdLeaseTtl / 1000),
    logger: logger.child({ component: "locks" }),
    limits: { maxWaitMs: values.lockMaxWait, maxWaitersPerFile: values.lockMaxWaiters, idempotencyWindowMs: values.idempotencyWindow },
    watchBuffer: values.watchBuffer,
  });
  const store = new EtcdSessionStore({
    journal,
    client,
    fences: (file, token) => locks.fence(file, token),
    logger: logger.child({ component: "session-store" }),
    maxEventBytes: values.maxEventBytes,
    maxEventsPerAppend: values.maxEventsPerAppend,
    maxBuffered: values.watchBuffer,
    cacheSize: values.sessionCache,
    completedRetentionMs: values.completedRetention,
    idempotencyWindowMs: values.idempotencyWindow,
  });
  const fenceCheck: FenceCheck = (file, token) => {
    locks.resolveFile(file, "fence.file");
    checkFencingToken(token, "fence.fencing_token");
    return () => {};
  };
  return {
    store,
    locks,
    fenceCheck,
    async close() {
      // Locks first: their etcd leases are revoked, so they free at once rather than at their TTL.
      try {
        await locks.close();
        await store.close();
      } finally {
        client.close();
      }
    },
  };
}

/** No election: instances on one etcd are peers (etcd serialises their writes). */
export const peerElector: Elector = {
  acquire(scope: string, name: string, options: { service?: string } = {}): Promise<ElectionLock> {
    return Promise.resolve({
      claim: { ...selfIdentity(), at: new Date().toISOString(), service: options.service ?? name },
      path: `${scope} (not elected: instances on one etcd are peers)`,
      release() {},
    });
  },
};
