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
 * program that talks to one service and should load only its generated code.
 */
import { BudgetClient, type Admission, type AdmitOptions, type NeedInput } from "./budget.js";
import type { EndpointOptions } from "./endpoint.js";
import { LocksClient, type HeldLock, type LockOptions } from "./locks.js";
import type { ServiceClientOptions } from "./options.js";
import { SessionsClient, type AppendOptions, type EventInput, type SessionWatchEvent, type WatchOptions } from "./sessions.js";
import type { AppendEventResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
import type { Transport } from "@connectrpc/connect";

export * from "./budget.js";
export * from "./endpoint.js";
export * from "./errors.js";
export * from "./journal-events.js";
export * from "./lock-path.js";
export * from "./locks.js";
export * from "./options.js";
export { newRequestId } from "./request-ids.js";
export type { RevisionWatchEvent, RevisionWatchOptions } from "./revision-watch.js";
export * from "./sessions.js";
export * from "./transport.js";

/** Options of {@link Berth}: per service (`sessionsUrl`, `budgetUrl`) and for both (token, environment). */
export interface BerthOptions extends Omit<EndpointOptions, "url"> {
  /** The sessions service (journals and locks): `http://HOST:PORT` or `unix:/path`. Wins over the environment. */
  readonly sessionsUrl?: string | undefined;
  /** The budget service. Wins over the environment. */
  readonly budgetUrl?: string | undefined;
  /** Transports of one's own (tests, other interceptors), per service; win over the URLs. */
  readonly transports?: { readonly sessions?: Transport; readonly budget?: Transport } | undefined;
}

/** The sessions, locks and budget clients, with their main helpers at hand. */
export class Berth {
  readonly #options: BerthOptions;
  #sessions: SessionsClient | undefined;
  #locks: LocksClient | undefined;
  #budget: BudgetClient | undefined;

  constructor(options: BerthOptions = {}) {
    this.#options = options;
  }

  /** The session journals. Made on first use; throws EndpointError if the sessions service cannot be found. */
  get sessions(): SessionsClient {
    return (this.#sessions ??= new SessionsClient(this.serviceOptions("sessions")));
  }

  /** The source locks (on the sessions service). */
  get locks(): LocksClient {
    return (this.#locks ??= new LocksClient(this.serviceOptions("sessions")));
  }

  /** The budget. */
  get budget(): BudgetClient {
    return (this.#budget ??= new BudgetClient(this.serviceOptions("budget")));
  }

  /** {@link SessionsClient.append}. */
  append(sessionId: string, event: EventInput, options?: AppendOptions): Promise<AppendEventResponse> {
    return this.sessions.append(sessionId, event, options);
  }

  /** {@link SessionsClient.watch}. */
  watch(sessionId: string, options?: WatchOptions): AsyncGenerator<SessionWatchEvent> {
    return this.sessions.watch(sessionId, options);
  }

  /** {@link LocksClient.lock}. */
  lock(file: string, options?: LockOptions): Promise<HeldLock> {
    return this.locks.lock(file, options);
  }

  /** {@link BudgetClient.admit}. */
  admit<T>(need: NeedInput, work: (admission: Admission) => Promise<T> | T, options?: AdmitOptions): Promise<T> {
    return this.budget.admit(need, work, options);
  }

  private serviceOptions(service: "sessions" | "budget"): ServiceClientOptions {
    const { sessionsUrl, budgetUrl, transports, ...shared } = this.#options;
    return { ...shared, url: service === "sessions" ? sessionsUrl : budgetUrl, transport: transports?.[service] };
  }
}
