/**
 * `@berth/client`: berth from TypeScript.
 *
 * ```ts
 * import { Berth, start } from "@berth/client";
 *
 * const berth = new Berth();                     // finds the services as every berth client does
 * await berth.append("demo", { type: "generate", pageUrl: "/pricing", count: 3 });
 * for await (const event of berth.watch("demo")) { … }            // backlog, caughtUp, live
 * await using lease = await berth.lock("src/app.css");            // freed when the block ends
 * await berth.admit([start("web", { memory: "1G" })], async (admission) => { … });
 * ```
 *
 * `Berth` gathers the three service clients (`sessions`, `locks`, `budget`), each made on first
 * use; the subpaths (`@berth/client/sessions`, `/locks`, `/budget`) export each alone, for a
 * program that talks to one service and should load only its generated code. This is the Node
 * entry; a page imports `@berth/client/web` (or `@berth/client` under a bundler's `browser`
 * condition), the same clients over fetch.
 */
import { BerthBase, clientsPerService, type PerServiceOptions } from "./berth-base.js";
import { BudgetClient } from "./budget.js";
import type { EndpointOptions } from "./endpoint.js";
import { LocksClient } from "./locks.js";
import { SessionsClient } from "./sessions.js";

export { BerthBase, clientsPerService, type PerServiceOptions, type ServiceClientFactories } from "./berth-base.js";
export {
  Admission,
  type AdmitOptions,
  appliance,
  BUDGET_ERROR_DETAILS,
  BudgetClient,
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
} from "./budget.js";
export type { ServiceConnection, ServiceTransports } from "./connection.js";
export { DEFAULT_URLS, type Endpoint, ENDPOINT_VARIABLES, EndpointError, type EndpointOptions, resolveEndpoint, type ServiceName } from "./endpoint.js";
export {
  ANY_CALL_REASONS,
  type AnyCallReason,
  BerthClientError,
  type BerthReason,
  BUDGET_REASONS,
  type BudgetReason,
  CLIENT_ERROR_DOMAIN,
  CLIENT_REASONS,
  clientError,
  type ClientReason,
  ERROR_DETAILS_METADATA,
  LOCKS_REASONS,
  type LocksReason,
  SESSIONS_REASONS,
  type SessionsReason,
  withBerthErrors,
} from "./errors.js";
export { followAcrossRestarts, type FollowContext, type FollowOptions, type FollowState, tokenRefused } from "./follow-across-restarts.js";
export {
  appendableEvent,
  eventToJournal,
  type FieldKind,
  InvalidEventError,
  isTypedEventType,
  journalToEvent,
  KIND_RULES,
  MAX_OTHER_TYPE_LENGTH,
  TYPED_EVENT_TYPES,
  type TypedEventShape,
  typedEventShapes,
} from "./journal-events.js";
export { absoluteLockPath } from "./lock-path.js";
export {
  type AcquireOptions,
  HeldLock,
  LOCK_ERROR_DETAILS,
  type LockOptions,
  LocksClient,
  LocksClientBase,
  type LockWatchEvent,
  type LockWatchOptions,
} from "./locks.js";
export { nodeConnection, type ServiceClientOptions, serviceTransports } from "./node-connection.js";
export { type CallOptions, callOptions, delay, durationOfMs, type LinkedCall, linkedCall } from "./options.js";
export { defaultOwner } from "./owner.js";
export { callWithRequestId, newRequestId } from "./request-ids.js";
export type { RevisionWatchEvent, RevisionWatchOptions } from "./revision-watch.js";
export {
  type AppendOptions,
  type EventInput,
  ExpectedState,
  type JournalEvent,
  SESSION_ERROR_DETAILS,
  SessionsClient,
  SessionsClientBase,
  type SessionsWatchEvent,
  type SessionsWatchOptions,
  type SessionWatchEvent,
  type WatchOptions,
} from "./sessions.js";
export { createTransport, type TransportOptions, type TransportProtocol } from "./transport.js";

/** Options of {@link Berth}: per service (`sessionsUrl`, `budgetUrl`: `http://HOST:PORT` or `unix:/path`, each winning over the environment; `transports`) and for both (token, environment). */
export interface BerthOptions extends PerServiceOptions, Omit<EndpointOptions, "url"> {}

/** The sessions, locks and budget clients, with their main helpers at hand. */
export class Berth extends BerthBase<SessionsClient, LocksClient, BudgetClient> {
  constructor(options: BerthOptions = {}) {
    super(clientsPerService(options, { sessions: SessionsClient, locks: LocksClient, budget: BudgetClient }));
  }
}
