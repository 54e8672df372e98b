/**
 * The budget client of the Node entry: {@link BudgetClientBase} on the budget service's endpoint,
 * Admit streams over gRPC on HTTP/2, `user@host pid N` as the owner.
 */
import { BudgetClientBase } from "./budget-base.js";
import { nodeConnection, type ServiceClientOptions } from "./node-connection.js";

export * from "./budget-base.js";

/** A client of the budget service. */
export class BudgetClient extends BudgetClientBase {
  /** Throws EndpointError when the options or the environment name no reachable service. */
  constructor(options: ServiceClientOptions = {}) {
    super(nodeConnection("budget", options));
  }
}
