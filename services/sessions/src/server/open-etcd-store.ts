/**
 * The sessions service on etcd (`--store etcd`): the settings it refuses, the client it opens
 * (TLS and auth passed through), and the session store and source locks over it. Several
 * instances started so on one cluster and one prefix are one service: each serves every session
 * and every lock, and none is elected.
 */
import { readFileSync } from "node:fs";
import type { Logger } from "pino";
import { createEtcdClient, type EtcdClient, type EtcdTlsOptions } from "@berth/etcd";
import type { Elector, ElectionLock } from "@berth/shared/elector";
import { BerthError } from "@berth/shared/errors";
import { selfIdentity } from "@berth/shared/process-identity";
import { EtcdJournal } from "../etcd/etcd-journal.js";
import { EtcdLocks } from "../etcd/etcd-locks.js";
import { EtcdSessionStore } from "../etcd/etcd-session-store.js";
import { createEtcdSourceLocks, type EtcdSourceLocks } from "../etcd/etcd-source-locks.js";
import { checkFencingToken } from "../locks/lock-input.js";
import type { FenceCheck } from "./session-handlers.js";
import type { SessionsValues } from "./settings.js";

/** The settings the etcd store has no use for, and why: refused at start rather than ignored. */
const FILE_ONLY: ReadonlyArray<{ key: keyof SessionsValues; flag: string; why: string }> = [
  { key: "liveDir", flag: "--live-dir", why: "a project's live directory is served in place from its files, with the seed's processes beside it" },
  { key: "projectRoot", flag: "--project-root", why: "it names the seed's lock files, which the etcd store does not keep" },
  { key: "completedRetention", flag: "--completed-retention", why: "the etcd store does not sweep completed sessions yet" },
];

const ETCD_ONLY: ReadonlyArray<{ key: keyof SessionsValues; flag: string }> = [
  { key: "etcdEndpoints", flag: "--etcd-endpoints" },
  { key: "etcdUser", flag: "--etcd-user" },
  { key: "etcdPasswordFile", flag: "--etcd-password-file" },
  { key: "etcdCaFile", flag: "--etcd-ca-file" },
  { key: "etcdCertFile", flag: "--etcd-cert-file" },
  { key: "etcdKeyFile", flag: "--etcd-key-file" },
];

function refuse(field: string, message: string): BerthError {
  return new BerthError("invalid_argument", message, { field }, { reason: "UNSUPPORTED_SETTINGS" });
}

/** Refuses combinations of settings the chosen store cannot serve, naming the setting and what to do. */
export function checkStoreSettings(values: SessionsValues): void {
  if (values.store === "file") {
    for (const { key, flag } of ETCD_ONLY) {
      if (values[key] !== undefined)
        throw refuse(key, `${flag} is for --store etcd, and the store is file: add --store etcd (BERTH_STORE=etcd), or drop ${flag}`);
    }
    return;
  }
  if (values.etcdEndpoints === undefined)
    throw refuse("etcdEndpoints", "--store etcd needs --etcd-endpoints (BERTH_ETCD_ENDPOINTS): etcd's client URLs, e.g. http://127.0.0.1:2379");
  for (const { key, flag, why } of FILE_ONLY) {
    if (values[key] !== undefined) throw refuse(key, `${flag} cannot be served with --store etcd: ${why}; drop it, or use --store file`);
  }
  if ((values.etcdUser === undefined) !== (values.etcdPasswordFile === undefined)) {
    throw refuse("etcdUser", "--etcd-user and --etcd-password-file go together: give both, or neither");
  }
  if ((values.etcdCertFile === undefined) !== (values.etcdKeyFile === undefined)) {
    throw refuse("etcdCertFile", "--etcd-cert-file and --etcd-key-file go together: give both, or neither");
  }
}

function readSetting(file: string, flag: string): string {
  try {
    return readFileSync(file, "utf8");
  } catch (error) {
    throw refuse(flag, `${flag} ${file}: cannot be read (${(error as NodeJS.ErrnoException).code ?? (error as Error).message})`);
  }
}

/** The etcd client the settings describe. */
export function etcdClientOf(values: SessionsValues): EtcdClient {
  const tls: EtcdTlsOptions = {
    ...(values.etcdCaFile !== undefined ? { ca: readSetting(values.etcdCaFile, "--etcd-ca-file") } : {}),
    ...(values.etcdCertFile !== undefined ? { cert: readSetting(values.etcdCertFile, "--etcd-cert-file") } : {}),
    ...(values.etcdKeyFile !== undefined ? { key: readSetting(values.etcdKeyFile, "--etcd-key-file") } : {}),
  };
  return createEtcdClient({
    endpoints: values.etcdEndpoints ?? [],
    prefix: values.etcdPrefix,
    ...(Object.keys(tls).length > 0 ? { tls } : {}),
    ...(values.etcdUser !== undefined && values.etcdPasswordFile !== undefined
      ? { auth: { username: values.etcdUser, password: readSetting(values.etcdPasswordFile, "--etcd-password-file").replace(/\r?\n$/, "") } }
      : {}),
  });
}

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
  const client = etcdClientOf(values);
  try {
    const status = await client.status();
    logger.info(
      { endpoints: values.etcdEndpoints, prefix: values.etcdPrefix, etcdVersion: status.version, leaseTtlMs: values.etcdLeaseTtl },
      "sessions and locks on etcd",
    );
  } catch (error) {
    client.close();
    throw error;
  }
  const journal = new EtcdJournal({ client });
  const etcdLocks = new EtcdLocks({ client });
  const locks = createEtcdSourceLocks({
    locks: etcdLocks,
    leaseTtlSeconds: Math.ceil(values.etcdLeaseTtl / 1000),
    logger: logger.child({ component: "locks" }),
    limits: { maxWaitMs: values.lockMaxWait, maxWaitersPerFile: values.lockMaxWaiters },
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
