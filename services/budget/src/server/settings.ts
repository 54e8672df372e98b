/**
 * The budget service's settings: flags, `BERTH_BUDGET_*` variables and config-file keys, besides the
 * common ones every service has (`commonServerConfig`). The policy's and the sampler's own settings
 * are declared beside the code that reads them (policy.ts, sampler.ts) and spread in here.
 */
import { defineConfig, integerParser, parseNonEmpty, parsePort, type ConfigValues } from "@berth/shared/config";
import { invalidArgument } from "@berth/shared/errors";
import { IDEMPOTENCY_SETTINGS } from "@berth/shared/idempotency";
import type { CommonValues } from "@berth/shared/server/index";
import { formatDuration, parseDuration } from "@berth/shared/units";
import { DEFAULT_ADMIT_RESUME_GRACE_MS, DEFAULT_WATCH_BUFFER, DEFAULT_WATCH_HISTORY, POLICY_SETTINGS, SAMPLER_SETTINGS } from "../index.js";
import { MAX_DURATION_MS } from "./budget-decode.js";
import { ETCD_SETTINGS } from "@berth/etcd/settings";

/** The default port of the budget service. */
export const BUDGET_DEFAULT_PORT = 7302;

/** How long a dead budget's machine stays in the fleet view by default. */
export const DEFAULT_FLEET_TTL_MS = 5_000;

/** The default lease of a Reserve that gives no ttl. */
export const DEFAULT_LEASE_TTL_MS = 30_000;
/** The default longest lease a request may ask: longer is INVALID_ARGUMENT. */
export const DEFAULT_MAX_LEASE_TTL_MS = 3_600_000;

function leaseParser(raw: string, field: string): number {
  let ms: number;
  try {
    ms = parseDuration(raw.trim(), field);
  } catch {
    throw invalidArgument(field, `must be a duration like 30s or 2m; got ${JSON.stringify(raw)}`);
  }
  if (ms <= 0 || ms > MAX_DURATION_MS)
    throw invalidArgument(field, `must be a positive duration of at most ${formatDuration(MAX_DURATION_MS)}; got ${JSON.stringify(raw)}`);
  return ms;
}

/** The settings SIGHUP re-reads: the policy and the leases. */
export const RELOADABLE_SETTINGS = defineConfig({
  ...POLICY_SETTINGS,
  leaseTtl: {
    flag: "lease-ttl",
    env: "BERTH_BUDGET_LEASE_TTL",
    default: DEFAULT_LEASE_TTL_MS,
    parse: leaseParser,
    doc: "lease of a Reserve that gives no ttl (renewed by KeepAlive)",
    show: formatDuration,
  },
  maxLeaseTtl: {
    flag: "max-lease-ttl",
    env: "BERTH_BUDGET_MAX_LEASE_TTL",
    default: DEFAULT_MAX_LEASE_TTL_MS,
    parse: leaseParser,
    doc: "longest lease a Reserve or RegisterRunning may ask (longer is refused)",
    show: formatDuration,
  },
});

/** The lease settings, checked together: the default lease must be one a request could ask for. */
export function leaseSettings(values: { leaseTtl: number; maxLeaseTtl: number }): { leaseTtlMs: number; maxLeaseTtlMs: number } {
  if (values.leaseTtl > values.maxLeaseTtl) {
    throw invalidArgument("lease-ttl", `must be at most max-lease-ttl (${formatDuration(values.maxLeaseTtl)}); got ${formatDuration(values.leaseTtl)}`);
  }
  return { leaseTtlMs: values.leaseTtl, maxLeaseTtlMs: values.maxLeaseTtl };
}

/** Settings of the budget service (besides the common ones): where it listens, its policy, its sampler. */
export const BUDGET_SETTINGS = defineConfig({
  budgetPort: {
    flag: "budget-port",
    env: "BERTH_BUDGET_PORT",
    default: BUDGET_DEFAULT_PORT,
    parse: parsePort,
    doc: "TCP port of the budget service (0 picks a free one)",
  },
  budgetSocket: {
    flag: "budget-socket",
    env: "BERTH_BUDGET_SOCKET",
    parse: parseNonEmpty,
    doc: "serve the budget service on this unix socket (mode 0600) instead of the TCP port",
  },
  ...RELOADABLE_SETTINGS,
  ...SAMPLER_SETTINGS,
  ...ETCD_SETTINGS,
  fleetTtl: {
    flag: "fleet-ttl",
    env: "BERTH_BUDGET_FLEET_TTL",
    default: DEFAULT_FLEET_TTL_MS,
    parse: (raw: string, field: string) => {
      const ms = parseDuration(raw.trim(), field);
      if (ms < 1000 || ms > 600_000) throw invalidArgument(field, `must be from 1s to 10m; got ${JSON.stringify(raw)}`);
      return ms;
    },
    show: formatDuration,
    doc: "with --store etcd: how long a machine whose budget died stays in the fleet view (the TTL of its etcd lease; etcd raises it to its minimum, 2s by default)",
  },
  machineName: {
    flag: "machine-name",
    env: "BERTH_BUDGET_MACHINE_NAME",
    parse: (raw: string, field: string) => {
      if (raw.trim() === "" || raw.length > 253) throw invalidArgument(field, "must be 1 to 253 characters");
      return raw;
    },
    doc: "with --store etcd: the name this machine is published under in the fleet view (default: the hostname); one budget per name",
  },
  ...IDEMPOTENCY_SETTINGS,
  admitResumeGrace: {
    flag: "admit-resume-grace",
    env: "BERTH_BUDGET_ADMIT_RESUME_GRACE",
    default: DEFAULT_ADMIT_RESUME_GRACE_MS,
    parse: (raw: string, field: string) => {
      const ms = parseDuration(raw.trim(), field);
      if (ms > 600_000) throw invalidArgument(field, `must be at most 10m; got ${JSON.stringify(raw)}`);
      return ms;
    },
    show: formatDuration,
    doc: "how long an Admit stream whose start carried a request_id keeps its place in the queue, or its reservation, after its connection broke, for the client to resume it (0: none)",
  },
  watchHistory: {
    flag: "watch-history",
    env: "BERTH_BUDGET_WATCH_HISTORY",
    default: DEFAULT_WATCH_HISTORY,
    parse: integerParser(1),
    doc: "how many of the latest changes WatchBudget can replay to a watcher that resumes",
  },
  watchBuffer: {
    flag: "watch-buffer",
    env: "BERTH_BUDGET_WATCH_BUFFER",
    default: DEFAULT_WATCH_BUFFER,
    parse: integerParser(1),
    doc: "how many changes a WatchBudget watcher may fall behind before it is ended WATCHER_LAGGED (at most --watch-history, so that it resumes without a gap)",
  },
});

/** The loaded settings of the budget service. */
export type BudgetValues = CommonValues & ConfigValues<typeof BUDGET_SETTINGS>;
