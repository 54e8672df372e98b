/**
 * `@berth/client/web`: berth from a web page, over fetch.
 *
 * ```ts
 * import { Berth } from "@berth/client/web";
 *
 * const berth = new Berth({ token });                     // http://127.0.0.1:7301 and :7302 unless told
 * await berth.append("demo", { type: "checkpoint", reason: "from the page" });
 * for await (const event of berth.watch("demo", { fromSeq: lastSeen + 1n })) { … }   // backlog, caughtUp, live
 * ```
 *
 * The same clients, errors and watches as the Node entry (`@berth/client`), on a connection made
 * for a page (`web-connection.ts`): the Connect protocol over fetch, unary calls and server
 * streams (every watch, a lock's Hold stream) alike, so no HTTP/2 is needed. What differs: the
 * service's URL and token are given (a page has no environment or files to find them in; the
 * service must allow the page's origin, `--cors-origin`), lock paths are absolute (or under the
 * `cwd` given), the default owner is the tab, and `admit` (Admit streams both ways, which fetch
 * cannot) is refused UNIMPLEMENTED `BIDI_STREAM_UNSUPPORTED`: a page reserves (`reserve`,
 * `release`). Nothing here imports a Node module; every export can be shaken out by a bundler.
 */
import { BerthBase, clientsPerService, type PerServiceOptions } from "./berth-base.js";
import { BudgetClientBase } from "./budget-base.js";
import { LocksClientBase } from "./locks-base.js";
import { SessionsClientBase } from "./sessions-base.js";
import { webConnection, type WebClientOptions } from "./web-connection.js";

export { BerthBase, clientsPerService, type PerServiceOptions, type ServiceClientFactories } from "./berth-base.js";
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
export type { ServiceConnection, ServiceTransports } from "./connection.js";
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
export {
  type AcquireOptions,
  HeldLock,
  LOCK_ERROR_DETAILS,
  type LockOptions,
  LocksClientBase,
  type LockWatchEvent,
  type LockWatchOptions,
} from "./locks-base.js";
export { type CallOptions, callOptions, delay, durationOfMs, type LinkedCall, linkedCall } from "./options.js";
export { newRequestId } from "./request-ids.js";
export type { RevisionWatchEvent, RevisionWatchOptions } from "./revision-watch.js";
export { DEFAULT_URLS, EndpointError, type ServiceName } from "./service-urls.js";
export {
  type AppendOptions,
  type EventInput,
  ExpectedState,
  type JournalEvent,
  SESSION_ERROR_DETAILS,
  SessionsClientBase,
  type SessionsWatchEvent,
  type SessionsWatchOptions,
  type SessionWatchEvent,
  type WatchOptions,
} from "./sessions-base.js";
export { browserOf, pageOwner, type WebClientOptions, webConnection, webEndpoint } from "./web-connection.js";
export { createWebTransport, type WebTransportOptions } from "./web-transport.js";

/** A client of the sessions service's journals, from a page. */
export class SessionsClient extends SessionsClientBase {
  /** Throws EndpointError for a URL a page cannot call. */
  constructor(options: WebClientOptions = {}) {
    super(webConnection("sessions", options));
  }
}

/** A client of the sessions service's source locks, from a page: lock paths absolute (or under `cwd`). */
export class LocksClient extends LocksClientBase {
  /** Throws EndpointError for a URL a page cannot call. */
  constructor(options: WebClientOptions = {}) {
    super(webConnection("sessions", options));
  }
}

/** A client of the budget service, from a page: `admit` is refused (Admit streams both ways); `reserve` and `release` instead. */
export class BudgetClient extends BudgetClientBase {
  /** Throws EndpointError for a URL a page cannot call. */
  constructor(options: WebClientOptions = {}) {
    super(webConnection("budget", options));
  }
}

/** Options of {@link Berth} in a page: per service (`sessionsUrl`, `budgetUrl`, `transports`; default `http://127.0.0.1:7301` and `:7302`) and for both (token, interceptors). */
export interface BerthOptions extends PerServiceOptions, Omit<WebClientOptions, "url" | "transport"> {}

/** The sessions, locks and budget clients of a page, with their main helpers at hand. */
export class Berth extends BerthBase<SessionsClient, LocksClient, BudgetClient> {
  constructor(options: BerthOptions = {}) {
    super(clientsPerService(options, { sessions: SessionsClient, locks: LocksClient, budget: BudgetClient }));
  }
}
