/**
 * The budget service as a process runs it: how it starts (the sampler, the admission queue and the
 * running tally over the state directory, and the RPC layer over them) from its settings
 * (settings.ts).
 *
 * SIGHUP re-reads the policy from the process's command line, environment and config file: a
 * policy that does not parse or validate is logged and the one in force is kept; a good one takes
 * effect at once and re-checks the queue.
 */
import { hostname } from "node:os";
import { systemClock } from "@berth/shared/clock";
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { EtcdClient } from "@berth/etcd";
import { checkEtcdSettings, etcdClientOf } from "@berth/etcd/settings";
import type { Logger } from "pino";
import { implement, serveElected, type ServerContext, type ServiceDefinition } from "@berth/shared/server/index";
import type { ServerMetrics } from "@berth/shared/server/index";
import type { Budget, BudgetState, FleetPublisher, FleetReports, MachineSampler } from "../index.js";
import { createBudget, createSampler, machineFactsOf, policyFromConfig, ProcessTable, samplerOptionsFromConfig, startFleetReports } from "../index.js";
import type { BudgetHandlerStats } from "./handler-deps.js";
import { createBudgetHandlers } from "./budget-handlers.js";
import type { ReloadSources } from "./reload-settings.js";
import { reloadSettings } from "./reload-settings.js";
import { BUDGET_SETTINGS, RELOADABLE_SETTINGS, leaseSettings, type BudgetValues } from "./settings.js";

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
    metrics.registerGauge(
      "berth_budget_committed_memory_bytes",
      "Memory committed (running plus reservations), in bytes.",
      () => state().committed.memoryBytes,
    ),
    metrics.registerGauge("berth_budget_committed_cpu", "Cpu committed (running plus reservations), in cores.", () => state().committed.cpu),
    metrics.registerGauge("berth_budget_memory_budget_bytes", "The memory budget in force, in bytes.", () => budget.policy().memoryBytes),
    metrics.registerGauge("berth_budget_cpu_budget", "The cpu budget in force, in cores.", () => budget.policy().cpu),
    // Only ever grows (a counter, exported as a gauge: the server's metrics have no counters for services).
    metrics.registerGauge(
      "berth_budget_queued_messages",
      "Queued messages sent on Admit streams since the start (position changes and heartbeats).",
      () => stats.queuedMessages,
    ),
  ];
}

/** This machine in the fleet view: its entry published on etcd, and how to read everyone's. */
interface OpenedFleet {
  readonly publisher: FleetPublisher;
  readonly reports: FleetReports;
  close(): Promise<void>;
}

/**
 * With `--store etcd`: publishes this machine to the fleet view. etcd is asked now (the first
 * entry is published before the service serves), so an unreachable cluster fails the start with
 * etcd's own words rather than leaving a machine silently out of the view.
 */
async function openFleet(values: BudgetValues, budget: Budget, sampler: MachineSampler, logger: Logger): Promise<OpenedFleet> {
  // Loaded only here: a budget on the file store never has etcd's client or its messages.
  const { EtcdFleetPublisher } = await import("../etcd/index.js");
  const client: EtcdClient = await etcdClientOf(values);
  const machine = values.machineName ?? hostname();
  const publisher = new EtcdFleetPublisher({ client, ttlSeconds: Math.ceil(values.fleetTtl / 1000), logger: logger.child({ component: "fleet" }) });
  const reports = startFleetReports({ budget, sampler, publisher, identity: { machine, hostname: hostname(), pid: process.pid }, logger });
  try {
    await reports.publishNow();
  } catch (error) {
    await reports.close().catch(() => undefined);
    client.close();
    throw error;
  }
  logger.info(
    { endpoints: values.etcdEndpoints, prefix: values.etcdPrefix, machine, fleetTtlMs: values.fleetTtl },
    "publishing this machine to the fleet view on etcd",
  );
  return {
    publisher,
    reports,
    async close() {
      try {
        // Revokes the entry's lease: the machine leaves the view at once, not at its TTL.
        await reports.close();
      } finally {
        client.close();
      }
    },
  };
}

/** The budget service, re-reading its policy from `options.reloadSources` on SIGHUP. */
export function createBudgetService(options: BudgetServiceOptions = {}): ServiceDefinition<typeof BUDGET_SETTINGS> {
  const sources = options.reloadSources ?? (() => ({ argv: process.argv.slice(2), env: process.env }));
  return {
    name: "budget",
    settings: BUDGET_SETTINGS,
    start: (values, logger) => {
      checkEtcdSettings(values);
      return serveElected({
        name: "budget",
        values,
        port: values.budgetPort,
        socket: values.budgetSocket,
        logger,
        open: async () => {
          let leases = leaseSettings(values);
          const sampler = createSampler({ ...samplerOptionsFromConfig(values), logger });
          let budget: Budget;
          let fleet: OpenedFleet | undefined;
          try {
            // The first sample comes before the policy: its defaults (75 % of the memory) are the machine's.
            await sampler.start();
            const policy = policyFromConfig(values, machineFactsOf(sampler.latest()));
            budget = await createBudget({
              policy,
              sampler,
              processes: new ProcessTable({ clock: systemClock, procRoot: values.procRoot }),
              stateDir: values.stateDir,
              logger,
              idempotencyWindowMs: values.idempotencyWindow,
              admitResumeGraceMs: values.admitResumeGrace,
              watchHistory: values.watchHistory,
              watchBuffer: values.watchBuffer,
            });
          } catch (error) {
            sampler.close();
            throw error;
          }
          if (values.store === "etcd") {
            try {
              fleet = await openFleet(values, budget, sampler, logger);
            } catch (error) {
              await budget.close().catch(() => undefined);
              sampler.close();
              throw error;
            }
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
              return [
                implement(
                  BudgetService,
                  createBudgetHandlers({
                    budget,
                    defaultLeaseTtlMs: () => leases.leaseTtlMs,
                    maxLeaseTtlMs: () => leases.maxLeaseTtlMs,
                    sampleIntervalMs: sampler.intervalMs,
                    stats,
                    fleet: fleet?.publisher,
                  }),
                ),
              ];
            },
            async close() {
              process.off("SIGHUP", onHangup);
              for (const remove of removeGauges) remove();
              try {
                await fleet
                  ?.close()
                  .catch((error: unknown) => logger.warn({ err: error }, "fleet: the entry was not withdrawn; it leaves the view at its TTL"));
                await budget.close();
              } finally {
                sampler.close();
              }
            },
          };
        },
      });
    },
  };
}

/** The budget service: BudgetService on its own port, its policy re-read from this process's sources on SIGHUP. */
export const budgetService: ServiceDefinition<typeof BUDGET_SETTINGS> = createBudgetService();
