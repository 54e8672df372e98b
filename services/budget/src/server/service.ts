/**
 * The budget service as a process runs it: its settings, and how it starts (the sampler, the
 * admission queue and the running tally over the state directory, and the RPC layer over them).
 *
 * SIGHUP re-reads the policy from the process's command line, environment and config file: a
 * policy that does not parse or validate is logged and the one in force is kept; a good one takes
 * effect at once and re-checks the queue.
 */
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { defineConfig, parseNonEmpty, parsePort } from "@berth/shared/config";
import { invalidArgument } from "@berth/shared/errors";
import { implement, serveElected, type ServerContext, type ServiceDefinition } from "@berth/shared/server/index";
import type { ServerMetrics } from "@berth/shared/server/index";
import { formatDuration, parseDuration } from "@berth/shared/units";
import type { Budget, BudgetState, Logger } from "../index.js";
import { POLICY_SETTINGS, SAMPLER_SETTINGS, createBudget, createSampler, machineFactsOf, policyFromConfig, samplerOptionsFromConfig } from "../index.js";
import type { BudgetHandlerStats } from "./budget-handlers.js";
import { createBudgetHandlers } from "./budget-handlers.js";
import { MAX_DURATION_MS } from "./budget-codec.js";
import type { ReloadSources } from "./reload-settings.js";
import { reloadSettings } from "./reload-settings.js";

/** The default port of the budget service. */
export const BUDGET_DEFAULT_PORT = 7302;

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
  if (ms <= 0 || ms > MAX_DURATION_MS) throw invalidArgument(field, `must be a positive duration of at most ${formatDuration(MAX_DURATION_MS)}; got ${JSON.stringify(raw)}`);
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
});

/** Where a budget service re-reads its policy on SIGHUP; the process's own by default. */
export interface BudgetServiceOptions {
  reloadSources?: (() => ReloadSources) | undefined;
}

/** How long gauges share one look at the budget's state (a scrape reads several). */
const STATE_MEMO_MS = 100;

function registerGauges(metrics: ServerMetrics, budget: Budget, stats: BudgetHandlerStats): Array<() => void> {
  let memo: { at: number; state: BudgetState } | undefined;
  const state = () => {
    const now = performance.now();
    // One entry of each list is enough: the gauges read the counts and totals.
    if (memo === undefined || now - memo.at > STATE_MEMO_MS) memo = { at: now, state: budget.state(1) };
    return memo.state;
  };
  return [
    metrics.registerGauge("berth_budget_queue_length", "Requests waiting in the admission queue.", () => state().queueSize),
    metrics.registerGauge("berth_budget_reservations", "Admitted reservations in flight.", () => state().reservationCount),
    metrics.registerGauge("berth_budget_running", "Running entries counted in the tally.", () => state().runningCount),
    metrics.registerGauge("berth_budget_committed_memory_bytes", "Memory committed (running plus reservations), in bytes.", () => state().committed.memoryBytes),
    metrics.registerGauge("berth_budget_committed_cpu", "Cpu committed (running plus reservations), in cores.", () => state().committed.cpu),
    metrics.registerGauge("berth_budget_memory_budget_bytes", "The memory budget in force, in bytes.", () => budget.policy().memoryBytes),
    metrics.registerGauge("berth_budget_cpu_budget", "The cpu budget in force, in cores.", () => budget.policy().cpu),
    // Only ever grows (a counter, exported as a gauge: the server's metrics have no counters for services).
    metrics.registerGauge("berth_budget_queued_messages", "Queued messages sent on Admit streams since the start (position changes and heartbeats).", () => stats.queuedMessages),
  ];
}

/** The budget service, re-reading its policy from `options.reloadSources` on SIGHUP. */
export function createBudgetService(options: BudgetServiceOptions = {}): ServiceDefinition<typeof BUDGET_SETTINGS> {
  const sources = options.reloadSources ?? (() => ({ argv: process.argv.slice(2), env: process.env }));
  return {
    name: "budget",
    settings: BUDGET_SETTINGS,
    start: (values, logger) =>
      serveElected({
        name: "budget",
        values,
        port: values.budgetPort,
        socket: values.budgetSocket,
        logger,
        open: async () => {
          let leases = leaseSettings(values);
          const sampler = createSampler({ ...samplerOptionsFromConfig(values), logger });
          let budget: Budget;
          try {
            // The first sample comes before the policy: its defaults (75 % of the memory) are the machine's.
            await sampler.start();
            const policy = policyFromConfig(values, machineFactsOf(sampler.latest()));
            budget = await createBudget({ policy, sampler, stateDir: values.stateDir, logger: logger as Logger });
          } catch (error) {
            sampler.close();
            throw error;
          }

          const reload = () => {
            try {
              const reloaded = reloadSettings(RELOADABLE_SETTINGS, sources());
              const reloadedLeases = leaseSettings(reloaded);
              const policy = budget.reloadPolicy(policyFromConfig(reloaded, machineFactsOf(sampler.latest())));
              leases = reloadedLeases;
              logger.info({ policy, ...leases }, "SIGHUP: policy reloaded");
            } catch (error) {
              logger.error({ err: error }, `SIGHUP: the policy was not reloaded (${(error as Error).message}); the one in force stays`);
            }
          };
          const onHangup = () => reload();
          let removeGauges: Array<() => void> = [];

          return {
            services: (context: ServerContext) => {
              process.on("SIGHUP", onHangup);
              const stats: BudgetHandlerStats = { queuedMessages: 0 };
              removeGauges = registerGauges(context.metrics, budget, stats);
              return [implement(BudgetService, createBudgetHandlers({
                  budget,
                  defaultLeaseTtlMs: () => leases.leaseTtlMs,
                  maxLeaseTtlMs: () => leases.maxLeaseTtlMs,
                  sampleIntervalMs: sampler.intervalMs,
                  stats,
                }),)];
            },
            async close() {
              process.off("SIGHUP", onHangup);
              for (const remove of removeGauges) remove();
              try {
                await budget.close();
              } finally {
                sampler.close();
              }
            },
          };
        },
      }),
  };
}

/** The budget service: BudgetService on its own port, its policy re-read from this process's sources on SIGHUP. */
export const budgetService: ServiceDefinition<typeof BUDGET_SETTINGS> = createBudgetService();
