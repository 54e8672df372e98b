/**
 * The sessions service's settings: flags, `BERTH_*` variables and config-file keys, besides the
 * common ones every service has (`commonServerConfig`).
 */
import { defineConfig, integerParser, oneOf, parseNonEmpty, parsePort, type ConfigValues } from "@berth/shared/config";
import { invalidArgument } from "@berth/shared/errors";
import { IDEMPOTENCY_SETTINGS } from "@berth/shared/idempotency";
import type { CommonValues } from "@berth/shared/server/index";
import { formatDuration, formatSize, parseDuration, parseSize } from "@berth/shared/units";
import { DEFAULT_CACHE_SIZE } from "../create-session-store.js";
import { DEFAULT_MAX_EVENT_BYTES, DEFAULT_MAX_EVENTS_PER_APPEND } from "../session-store.js";
import { DEFAULT_MAX_BUFFERED } from "../watch-hub.js";
import { DEFAULT_LOCK_LIMITS } from "../locks/index.js";
import { DEFAULT_ETCD_LEASE_TTL_SECONDS, ETCD_DEFAULT_MAX_REQUEST_BYTES } from "../etcd/etcd-defaults.js";
import { ETCD_SETTINGS } from "@berth/etcd/settings";

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
    doc: "sessions kept open in memory (least recently used ones are closed beyond it); of these, the journal files held open are at most a share of the descriptor limit (ulimit -n), logged at start",
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
    doc: "delete completed and discarded sessions (journals and snapshots, in files or in etcd) this long after their completing entry, e.g. 7d; swept at start and then as they fall due (unset: kept forever)",
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
  ...ETCD_SETTINGS,
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
  etcdMaxRequestBytes: {
    flag: "etcd-max-request-bytes",
    env: "BERTH_ETCD_MAX_REQUEST_BYTES",
    default: ETCD_DEFAULT_MAX_REQUEST_BYTES,
    parse: (raw: string, field: string) => {
      const bytes = parseSize(raw, field);
      if (bytes < 64 * 1024) throw invalidArgument(field, "must be at least 64K");
      return bytes;
    },
    show: formatSize,
    doc: "with --store etcd: etcd's --max-request-bytes, as the cluster runs (etcd's default 1.5M): an append larger than one etcd request carries is INVALID_ARGUMENT naming it, refused before it is sent",
  },
  lockMaxWaiters: {
    flag: "lock-max-waiters",
    env: "BERTH_LOCK_MAX_WAITERS",
    default: DEFAULT_LOCK_LIMITS.maxWaitersPerFile,
    parse: integerParser(1, 1_000_000),
    doc: "most requests that may wait for one file's lock; more are refused (RESOURCE_EXHAUSTED TOO_MANY_WAITERS)",
  },
  ...IDEMPOTENCY_SETTINGS,
});

/** The loaded settings of the sessions service. */
export type SessionsValues = CommonValues & ConfigValues<typeof SESSIONS_SETTINGS>;
