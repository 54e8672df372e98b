/**
 * The budget client of the Node entry: {@link BudgetClientBase} on the budget service's endpoint,
 * Admit streams over gRPC on HTTP/2, `user@host pid N` as the owner.
 */
import { BudgetClientBase } from "./budget-base.js";
import { nodeConnection, type ServiceClientOptions } from "./node-connection.js";

export {
  Admission,
  type AdmitOptions,
  appliance,
  BUDGET_ERROR_DETAILS,
  BudgetClientBase,
  type BudgetWatchEvent,
  type BudgetWatchOptions,
  build,
  DEFAULT_ADMIT_RESUME_WITHIN_MS,
  type ItemCost,
  type KeyedCallOptions,
  type MachineWatchEvent,
  type MachineWatchOptions,
  type NeedInit,
  type NeedInput,
  type NeedItemInit,
  type ReserveOptions,
  start,
  type StartedOptions,
} from "./budget-base.js";

/** A client of the budget service. */
export class BudgetClient extends BudgetClientBase {
  /** Throws EndpointError when the options or the environment name no reachable service. */
  constructor(options: ServiceClientOptions = {}) {
    super(nodeConnection("budget", options));
  }
}
