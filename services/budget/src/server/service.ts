/**
 * The budget service as a process runs it: its settings, and how it starts (the sampler, the
 * admission queue and the running tally over the state directory, and the RPC layer over them).
 */
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import { defineConfig, parseNonEmpty, parsePort } from "@berth/shared/config";
import { implement, serveElected, type ServiceDefinition } from "@berth/shared/server/index";

/** The default port of the budget service. */
export const BUDGET_DEFAULT_PORT = 7302;

/** Settings of the budget service (besides the common ones). */
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
});

/** The budget service: BudgetService on its own port. */
export const budgetService: ServiceDefinition<typeof BUDGET_SETTINGS> = {
  name: "budget",
  settings: BUDGET_SETTINGS,
  start: (values, logger) =>
    serveElected({
      name: "budget",
      values,
      port: values.budgetPort,
      socket: values.budgetSocket,
      logger,
      open: () => ({
        services: [implement(BudgetService, {})],
        close() {},
      }),
    }),
};
