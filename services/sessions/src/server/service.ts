/**
 * The sessions service as a process runs it: how it starts (the journal store and the lock table
 * over the state directory, and the RPC layer over them) from its settings (settings.ts).
 */
import * as path from "node:path";
import type { Logger } from "pino";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { descriptorLimit, descriptorShares } from "@berth/shared/descriptors";
import { fileElector } from "@berth/shared/election";
import type { ElectionLock, Elector } from "@berth/shared/elector";
import { implement, serveElected, type ServerContext, type ServiceDefinition } from "@berth/shared/server/index";
import { createSessionStore } from "../create-session-store.js";
import type { SessionStoreApi } from "../session-store-api.js";
import { checkStoreSettings } from "./store-settings.js";
import { resolveSessionDirs } from "../journal/session-paths.js";
import { createSessionHandlers, type FenceCheck } from "./session-handlers.js";
import { createSourceLocks, PRIVATE_LOCK_FILE_MODE, SHARED_LOCK_FILE_MODE, type SourceLocks, type SourceLocksApi } from "../locks/index.js";
import { createFenceCheck, createLockHandlers } from "./lock-handlers.js";
import { SESSIONS_SETTINGS, type SessionsValues } from "./settings.js";

/** The journal store as the service opened it, and how to close it. */
export interface OpenedSessions {
  readonly store: SessionStoreApi;
  close(): Promise<void>;
}

/**
 * Opens the journal store the settings name: `<state-dir>/sessions`, or a project's live directory
 * served in place. A live directory is claimed with its own election lock
 * (`<live>/sessions/berth-sessions.lock`), so two berth services with different state directories
 * cannot both write one project's journals.
 */
export async function createSessions(values: SessionsValues, logger: Logger, elector: Elector = fileElector): Promise<OpenedSessions> {
  const dirs = resolveSessionDirs(values.liveDir === undefined ? { stateDir: values.stateDir } : { liveDir: values.liveDir });
  let liveElection: ElectionLock | undefined;
  if (values.liveDir !== undefined) liveElection = await elector.acquire(dirs.dir, "berth-sessions", { service: "sessions" });
  try {
    // Each journal kept open takes a descriptor: no more than the store's share of the limit.
    const shares = descriptorShares(descriptorLimit());
    const maxOpenJournals = Math.min(values.sessionCache, shares.journals);
    const store = createSessionStore({
      dir: dirs.dir,
      ...(dirs.legacyDir !== undefined ? { legacyDir: dirs.legacyDir } : {}),
      fsync: values.fsync,
      logger: logger.child({ component: "session-store" }),
      maxEventBytes: values.maxEventBytes,
      maxEventsPerAppend: values.maxEventsPerAppend,
      cacheSize: values.sessionCache,
      maxOpenJournals,
      maxBuffered: values.watchBuffer,
      idempotencyWindowMs: values.idempotencyWindow,
      ...(values.completedRetention !== undefined ? { completedRetentionMs: values.completedRetention } : {}),
    });
    logger.info(
      {
        dir: dirs.dir,
        legacyDir: dirs.legacyDir,
        fsync: values.fsync,
        completedRetentionMs: values.completedRetention,
        sessionCache: values.sessionCache,
        openJournals: maxOpenJournals,
        descriptorLimit: shares.limit ?? null,
      },
      "session journals",
    );
    return {
      store,
      async close() {
        try {
          await store.close();
        } finally {
          liveElection?.release();
        }
      },
    };
  } catch (error) {
    liveElection?.release();
    throw error;
  }
}

/**
 * The SessionService registration over `store`, with its gauges on the server's metrics.
 * `fenceCheck` (from the lock service) verifies the fences of appends.
 */
export function sessionServiceRegistration(store: SessionStoreApi, context: ServerContext, fenceCheck?: FenceCheck, maxMessageBytes?: number) {
  context.metrics.registerGauge("berth_sessions_open_sessions", "Sessions open in memory (the bounded LRU).", () => store.stats().openSessions);
  context.metrics.registerGauge(
    "berth_sessions_open_journals",
    "Journal files held open for appending (bounded by the service's share of its descriptor limit).",
    () => store.stats().openJournals ?? 0,
  );
  context.metrics.registerGauge("berth_sessions_watchers", "Open watchers (WatchSession and WatchSessions streams).", () => store.stats().watchers);
  return implement(SessionService, createSessionHandlers({ store, fenceCheck, ...(maxMessageBytes !== undefined ? { maxMessageBytes } : {}) }));
}

/**
 * Opens the source locks: fencing tokens under `<state-dir>/locks/`, and the seed's lock files in
 * `<live-dir>/locks/` (beside the seed's processes of that project) or, without a live directory,
 * in `<state-dir>/locks/`.
 */
export function createLocks(values: SessionsValues, logger: Logger): SourceLocks {
  const projectRoot = values.projectRoot === undefined ? undefined : path.resolve(values.projectRoot);
  const liveDir = path.resolve(values.liveDir ?? values.stateDir);
  // In the state directory the lock files are as private as the rest of it; in a project's live
  // directory they are readable like the seed's, for the project's seed processes.
  const lockFileMode = values.liveDir === undefined ? PRIVATE_LOCK_FILE_MODE : SHARED_LOCK_FILE_MODE;
  const locks = createSourceLocks({
    projectRoot,
    stateDir: path.resolve(values.stateDir),
    liveDir,
    lockFileMode,
    logger: logger.child({ component: "locks" }),
    limits: { maxWaitMs: values.lockMaxWait, maxWaitersPerFile: values.lockMaxWaiters, idempotencyWindowMs: values.idempotencyWindow },
    watchBuffer: values.watchBuffer,
  });
  logger.info({ projectRoot, lockFiles: locks.locksDir }, "source locks");
  return locks;
}

/** The LockService registration over `locks`, with its gauges on the server's metrics. */
export function lockServiceRegistration(locks: SourceLocksApi, context: ServerContext) {
  context.metrics.registerGauge("berth_locks_held", "Source locks held through berth (leases and Hold streams).", () => locks.stats().held);
  context.metrics.registerGauge("berth_locks_waiting", "Requests waiting for a source lock.", () => locks.stats().waiting);
  context.metrics.registerGauge(
    "berth_locks_blocked_by_lock_files",
    "Locks whose queue waits for a lock file held by a process using the seed's library.",
    () => locks.stats().blockedByLockFiles,
  );
  return implement(LockService, createLockHandlers({ locks }));
}

/** The sessions service: SessionService and LockService on one port. */
export const sessionsService: ServiceDefinition<typeof SESSIONS_SETTINGS> = {
  name: "sessions",
  settings: SESSIONS_SETTINGS,
  start: async (values, logger) => {
    checkStoreSettings(values);
    if (values.store === "etcd") {
      // Loaded only here: a service on the file store never has etcd's client or its messages.
      const { openEtcdStore, peerElector } = await import("./open-etcd-store.js");
      // Instances on one etcd are peers: etcd serialises their writes, so nothing is elected.
      return serveElected({
        name: "sessions",
        values,
        port: values.sessionsPort,
        socket: values.sessionsSocket,
        logger,
        elector: peerElector,
        open: async () => {
          const opened = await openEtcdStore(values, logger);
          return {
            services: (context: ServerContext) => [
              sessionServiceRegistration(opened.store, context, opened.fenceCheck, values.maxMessageBytes),
              lockServiceRegistration(opened.locks, context),
            ],
            close: () => opened.close(),
          };
        },
      });
    }
    return serveElected({
      name: "sessions",
      values,
      port: values.sessionsPort,
      socket: values.sessionsSocket,
      logger,
      open: async () => {
        const sessions = await createSessions(values, logger);
        let locks: SourceLocks;
        try {
          locks = createLocks(values, logger);
        } catch (error) {
          await sessions.close();
          throw error;
        }
        return {
          services: (context: ServerContext) => [
            sessionServiceRegistration(sessions.store, context, createFenceCheck(locks), values.maxMessageBytes),
            lockServiceRegistration(locks, context),
          ],
          async close() {
            // Locks first: their lock files go and the fencing state is persisted even if the store's close fails.
            try {
              locks.close();
            } finally {
              await sessions.close();
            }
          },
        };
      },
    });
  },
};
