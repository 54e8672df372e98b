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

export * from "./berth-base.js";
export * from "./budget.js";
export * from "./connection.js";
export * from "./endpoint.js";
export * from "./errors.js";
export * from "./follow-across-restarts.js";
export * from "./journal-events.js";
export * from "./lock-path.js";
export * from "./locks.js";
export * from "./node-connection.js";
export * from "./options.js";
export { defaultOwner } from "./owner.js";
export { callWithRequestId, newRequestId } from "./request-ids.js";
export type { RevisionWatchEvent, RevisionWatchOptions } from "./revision-watch.js";
export * from "./sessions.js";
export * from "./transport.js";

/** Options of {@link Berth}: per service (`sessionsUrl`, `budgetUrl`: `http://HOST:PORT` or `unix:/path`, each winning over the environment; `transports`) and for both (token, environment). */
export interface BerthOptions extends PerServiceOptions, Omit<EndpointOptions, "url"> {}

/** The sessions, locks and budget clients, with their main helpers at hand. */
export class Berth extends BerthBase<SessionsClient, LocksClient, BudgetClient> {
  constructor(options: BerthOptions = {}) {
    super(clientsPerService(options, { sessions: SessionsClient, locks: LocksClient, budget: BudgetClient }));
  }
}
