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

export * from "./berth-base.js";
export * from "./budget-base.js";
export * from "./connection.js";
export * from "./errors.js";
export * from "./follow-across-restarts.js";
export * from "./journal-events.js";
export * from "./locks-base.js";
export * from "./options.js";
export { newRequestId } from "./request-ids.js";
export type { RevisionWatchEvent, RevisionWatchOptions } from "./revision-watch.js";
export { DEFAULT_URLS, EndpointError, type ServiceName } from "./service-urls.js";
export * from "./sessions-base.js";
export * from "./web-connection.js";
export * from "./web-transport.js";

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
