/**
 * The sessions service as a process runs it: its settings, and how it starts (the journal store and
 * the lock table over the state directory, and the RPC layer over them).
 */
import * as path from "node:path";
import type { Logger } from "pino";
import { LockService } from "@berth/api/berth/locks/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { defineConfig, integerParser, oneOf, parseNonEmpty, parsePort, type ConfigValues } from "@berth/shared/config";
import { fileElector } from "@berth/shared/election";
import type { ElectionLock, Elector } from "@berth/shared/elector";
import { invalidArgument } from "@berth/shared/errors";
import { implement, serveElected, type CommonValues, type ServerContext, type ServiceDefinition } from "@berth/shared/server/index";
import { formatDuration, formatSize, parseDuration, parseSize } from "@berth/shared/units";
import { createSessionStore, DEFAULT_CACHE_SIZE } from "../create-session-store.js";
import { DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_EVENTS_PER_APPEND } from "../session-store.js";
import type { SessionStoreApi } from "../session-store-api.js";
import { DEFAULT_ETCD_LEASE_TTL_SECONDS } from "../etcd/etcd-source-locks.js";
import { checkStoreSettings, openEtcdStore, peerElector } from "./open-etcd-store.js";
import { resolveSessionDirs } from "../journal/session-paths.js";
import { DEFAULT_MAX_BUFFERED } from "../watch-hub.js";
import { createSessionHandlers, type FenceCheck } from "./session-handlers.js";
import { createSourceLocks, DEFAULT_LOCK_LIMITS, PRIVATE_LOCK_FILE_MODE, SHARED_LOCK_FILE_MODE, type SourceLocks, type SourceLocksApi } from "../locks/index.js";
import { makeFenceCheck, makeLockHandlers } from "./lock-handlers.js";

/** The default port of the sessions service. */
export const SESSIONS_DEFAULT_PORT = 7301;

/** The longest `--lock-max-wait`: a day. */
const MAX_LOCK_WAIT_MS = 86_400_000;

function lockWaitParser(raw: string, field: string): number {
  let ms: number;
  try {
    ms = parseDuration(raw.trim(), field);
  } catch {
    throw invalidArgument(field, `must be a duration like 10m or 30s; got ${JSON.stringify(raw)}`);
  }
  if (ms > MAX_LOCK_WAIT_MS) throw invalidArgument(field, `must be at most 24h; got ${JSON.stringify(raw)}`);
  return ms;
}

/** How appends reach the disk (`--fsync`). */
export const FSYNC_MODES = ["batch", "always", "none"] as const;

/** Where the sessions service keeps journals and locks (`--store`). */
export const STORE_KINDS = ["file", "etcd"] as const;

/** etcd's client URLs, comma-separated: each http:// or https://. */
function etcdEndpointsParser(raw: string, field: string): string[] {
  const urls = raw
    .split(",")
    .map((url) => url.trim())
    .filter((url) => url !== "");
  if (urls.length === 0) throw invalidArgument(field, "must name at least one etcd client URL, e.g. http://127.0.0.1:2379");
  for (const url of urls) {
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw invalidArgument(field, `${JSON.stringify(url)} is not a URL; give etcd's client URLs as http://HOST:PORT or https://HOST:PORT, comma-separated`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw invalidArgument(field, `${JSON.stringify(url)} must be http:// or https://`);
  }
  return urls;
}

/** Settings of the sessions service (besides the common ones). */
export const SESSIONS_SETTINGS = defineConfig({
  sessionsPort: {
    flag: "sessions-port",
    env: "BERTH_SESSIONS_PORT",
    default: SESSIONS_DEFAULT_PORT,
    parse: parsePort,
    doc: "TCP port of the sessions service (0 picks a free one)",
  },
  sessionsSocket: {
    flag: "sessions-socket",
    env: "BERTH_SESSIONS_SOCKET",
    parse: parseNonEmpty,
    doc: "serve the sessions service on this unix socket (mode 0600) instead of the TCP port",
  },
  fsync: {
    flag: "fsync",
    env: "BERTH_FSYNC",
    default: "batch" as (typeof FSYNC_MODES)[number],
    parse: oneOf(FSYNC_MODES),
    doc: "when an append is acknowledged: batch (after fdatasync, shared by concurrent appends), always (one fdatasync per append), none (after write, as the seed)",
  },
  liveDir: {
    flag: "live-dir",
    env: "BERTH_LIVE_DIR",
    parse: parseNonEmpty,
    doc: "serve a project's live directory (<project>/.impeccable/live) in place: journals in its sessions/, the seed's legacy journals read from <project>/.impeccable-live/sessions",
  },
  maxEventBytes: {
    flag: "max-event-bytes",
    env: "BERTH_MAX_EVENT_BYTES",
    default: DEFAULT_MAX_EVENT_BYTES,
    parse: (raw: string, field: string) => {
      const bytes = parseSize(raw, field);
      if (bytes < 1024) throw invalidArgument(field, "must be at least 1K");
      return bytes;
    },
    doc: "largest event (its journal JSON) an append may carry, e.g. 1M; larger ones are INVALID_ARGUMENT (EVENT_TOO_LARGE)",
    show: formatSize,
  },
  maxEventsPerAppend: {
    flag: "max-events-per-append",
    env: "BERTH_MAX_EVENTS_PER_APPEND",
    default: DEFAULT_MAX_EVENTS_PER_APPEND,
    parse: integerParser(1, 1_000_000),
    doc: "most events one AppendEvents call may carry",
  },
  sessionCache: {
    flag: "session-cache",
    env: "BERTH_SESSION_CACHE",
    default: DEFAULT_CACHE_SIZE,
    parse: integerParser(1, 10_000_000),
    doc: "sessions kept open in memory (least recently used ones are closed beyond it)",
  },
  watchBuffer: {
    flag: "watch-buffer",
    env: "BERTH_WATCH_BUFFER",
    default: DEFAULT_MAX_BUFFERED,
    parse: integerParser(1, 1_000_000),
    doc: "entries a watcher may fall behind before it is ended (RESOURCE_EXHAUSTED, resumable)",
  },
  completedRetention: {
    flag: "completed-retention",
    env: "BERTH_COMPLETED_RETENTION",
    parse: (raw: string, field: string) => {
      const ms = parseDuration(raw, field);
      if (ms < 1000) throw invalidArgument(field, "must be at least 1s");
      return ms;
    },
    show: formatDuration,
    doc: "delete completed and discarded sessions (journal and snapshot files) this long after their completing entry, e.g. 7d; swept at start and then as they fall due (unset: kept forever)",
  },
  projectRoot: {
    flag: "project-root",
    env: "BERTH_PROJECT_ROOT",
    parse: parseNonEmpty,
    // Lock paths arrive absolute and are made canonical; only the seed's lock file names depend on a spelling.
    doc: "a project whose seed processes work in it through a symlink, spelled as they spell it: the seed's lock files of its files get the names those processes use (unset: names from canonical paths, as from the project's real directory)",
  },
  lockMaxWait: {
    flag: "lock-max-wait",
    env: "BERTH_LOCK_MAX_WAIT",
    default: DEFAULT_LOCK_LIMITS.maxWaitMs,
    parse: lockWaitParser,
    doc: "the longest a lock request waits: what an unset max_wait means, and the cap of a longer one (0: every request tries once)",
    show: formatDuration,
  },
  store: {
    flag: "store",
    env: "BERTH_STORE",
    default: "file" as (typeof STORE_KINDS)[number],
    parse: oneOf(STORE_KINDS),
    doc: "where journals and source locks are kept: file (the state directory, one elected instance) or etcd (a cluster several instances share: --etcd-endpoints)",
  },
  etcdEndpoints: {
    flag: "etcd-endpoints",
    env: "BERTH_ETCD_ENDPOINTS",
    parse: etcdEndpointsParser,
    show: (urls: string[]) => urls.join(","),
    doc: "with --store etcd: etcd's client URLs, comma-separated (http://HOST:PORT or https://HOST:PORT)",
  },
  etcdPrefix: {
    flag: "etcd-prefix",
    env: "BERTH_ETCD_PREFIX",
    default: "berth/",
    parse: parseNonEmpty,
    doc: "with --store etcd: every key berth writes is under this prefix (instances with one prefix are one service)",
  },
  etcdLeaseTtl: {
    flag: "etcd-lease-ttl",
    env: "BERTH_ETCD_LEASE_TTL",
    default: DEFAULT_ETCD_LEASE_TTL_SECONDS * 1000,
    parse: (raw: string, field: string) => {
      const ms = parseDuration(raw, field);
      if (ms < 1000 || ms > 3_600_000) throw invalidArgument(field, "must be from 1s to 1h");
      return ms;
    },
    show: formatDuration,
    doc: "with --store etcd: how long after an instance dies (or loses etcd) the locks it granted free: the TTL of their etcd leases (etcd raises it to its minimum, 2s by default)",
  },
  etcdUser: {
    flag: "etcd-user",
    env: "BERTH_ETCD_USER",
    parse: parseNonEmpty,
    doc: "with --store etcd: etcd's user, when etcd has authentication on (with --etcd-password-file)",
  },
  etcdPasswordFile: {
    flag: "etcd-password-file",
    env: "BERTH_ETCD_PASSWORD_FILE",
    parse: parseNonEmpty,
    doc: "with --store etcd: a file holding the password of --etcd-user",
  },
  etcdCaFile: {
    flag: "etcd-ca-file",
    env: "BERTH_ETCD_CA_FILE",
    parse: parseNonEmpty,
    doc: "with --store etcd over https: the CA certificate (PEM) etcd's certificates are checked against (default: the system's)",
  },
  etcdCertFile: {
    flag: "etcd-cert-file",
    env: "BERTH_ETCD_CERT_FILE",
    parse: parseNonEmpty,
    doc: "with --store etcd over https: this instance's client certificate (PEM), for etcd's --client-cert-auth",
  },
  etcdKeyFile: {
    flag: "etcd-key-file",
    env: "BERTH_ETCD_KEY_FILE",
    parse: parseNonEmpty,
    doc: "with --store etcd over https: the key (PEM) of --etcd-cert-file",
  },
  lockMaxWaiters: {
    flag: "lock-max-waiters",
    env: "BERTH_LOCK_MAX_WAITERS",
    default: DEFAULT_LOCK_LIMITS.maxWaitersPerFile,
    parse: integerParser(1, 1_000_000),
    doc: "most requests that may wait for one file's lock; more are refused (RESOURCE_EXHAUSTED TOO_MANY_WAITERS)",
  },
});

/** The loaded settings of the sessions service. */
export type SessionsValues = CommonValues & ConfigValues<typeof SESSIONS_SETTINGS>;

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
export async function openSessions(values: SessionsValues, logger: Logger, elector: Elector = fileElector): Promise<OpenedSessions> {
  const dirs = resolveSessionDirs(values.liveDir === undefined ? { stateDir: values.stateDir } : { liveDir: values.liveDir });
  let liveElection: ElectionLock | undefined;
  if (values.liveDir !== undefined) liveElection = await elector.acquire(dirs.dir, "berth-sessions", { service: "sessions" });
  try {
    const store = createSessionStore({
      dir: dirs.dir,
      ...(dirs.legacyDir !== undefined ? { legacyDir: dirs.legacyDir } : {}),
      fsync: values.fsync,
      logger: logger.child({ component: "session-store" }),
      maxEventBytes: values.maxEventBytes,
      maxEventsPerAppend: values.maxEventsPerAppend,
      cacheSize: values.sessionCache,
      maxBuffered: values.watchBuffer,
      ...(values.completedRetention !== undefined ? { completedRetentionMs: values.completedRetention } : {}),
    });
    logger.info({ dir: dirs.dir, legacyDir: dirs.legacyDir, fsync: values.fsync, completedRetentionMs: values.completedRetention }, "session journals");
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
  context.metrics.registerGauge("berth_sessions_watchers", "Open watchers (WatchSession and WatchSessions streams).", () => store.stats().watchers);
  return implement(SessionService, createSessionHandlers({ store, fenceCheck, ...(maxMessageBytes !== undefined ? { maxMessageBytes } : {}) }));
}

/**
 * Opens the source locks: fencing tokens under `<state-dir>/locks/`, and the seed's lock files in
 * `<live-dir>/locks/` (beside the seed's processes of that project) or, without a live directory,
 * in `<state-dir>/locks/`.
 */
export function openLocks(values: SessionsValues, logger: Logger): SourceLocks {
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
    limits: { maxWaitMs: values.lockMaxWait, maxWaitersPerFile: values.lockMaxWaiters },
  });
  logger.info({ projectRoot, lockFiles: locks.locksDir }, "source locks");
  return locks;
}

/** The LockService registration over `locks`, with its gauges on the server's metrics. */
export function lockServiceRegistration(locks: SourceLocksApi, context: ServerContext) {
  context.metrics.registerGauge("berth_locks_held", "Source locks held through berth (leases and Hold streams).", () => locks.stats().held);
  context.metrics.registerGauge("berth_locks_waiting", "Requests waiting for a source lock.", () => locks.stats().waiting);
  context.metrics.registerGauge("berth_locks_blocked_by_lock_files", "Locks whose queue waits for a lock file held by a process using the seed's library.", () => locks.stats().blockedByLockFiles);
  return implement(LockService, makeLockHandlers({ locks }));
}

/** The sessions service: SessionService and LockService on one port. */
export const sessionsService: ServiceDefinition<typeof SESSIONS_SETTINGS> = {
  name: "sessions",
  settings: SESSIONS_SETTINGS,
  start: (values, logger) => {
    checkStoreSettings(values);
    if (values.store === "etcd") {
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
        const sessions = await openSessions(values, logger);
        let locks: SourceLocks;
        try {
          locks = openLocks(values, logger);
        } catch (error) {
          await sessions.close();
          throw error;
        }
        return {
          services: (context: ServerContext) => [sessionServiceRegistration(sessions.store, context, makeFenceCheck(locks), values.maxMessageBytes), lockServiceRegistration(locks, context)],
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
