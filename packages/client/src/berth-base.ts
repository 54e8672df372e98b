/**
 * `Berth`, on any platform: the three service clients, each made on first use by the entry point's
 * factories, with their main helpers at hand.
 */
import type { AppendEventResponse } from "@berth/api/berth/sessions/v1/session_service_pb";
import type { Transport } from "@connectrpc/connect";
import type { Admission, AdmitOptions, BudgetClientBase, NeedInput } from "./budget-base.js";
import type { HeldLock, LockOptions, LocksClientBase } from "./locks-base.js";
import type { AppendOptions, EventInput, SessionsClientBase, SessionWatchEvent, WatchOptions } from "./sessions-base.js";

/** How an entry point makes each service client. */
export interface ServiceClientFactories<S, L, B> {
  sessions(): S;
  locks(): L;
  budget(): B;
}

/** What `Berth` takes per service, on every entry; the rest of its options are each client's, shared by both services. */
export interface PerServiceOptions {
  /** The sessions service (journals and locks). */
  readonly sessionsUrl?: string | undefined;
  /** The budget service. */
  readonly budgetUrl?: string | undefined;
  /** Transports of one's own (tests, other interceptors), per service; win over the URLs. */
  readonly transports?: { readonly sessions?: Transport; readonly budget?: Transport } | undefined;
}

type ClientClass<O, C> = new (options: O) => C;

/** The factories of an entry's three clients from `Berth`'s options: each service's URL and transport, the rest given to both. */
export function clientsPerService<O extends { readonly url?: string | undefined; readonly transport?: Transport | undefined }, S, L, B>(
  options: PerServiceOptions & Omit<O, "url" | "transport">,
  classes: { readonly sessions: ClientClass<O, S>; readonly locks: ClientClass<O, L>; readonly budget: ClientClass<O, B> },
): ServiceClientFactories<S, L, B> {
  const { sessionsUrl, budgetUrl, transports, ...shared } = options;
  const of = (service: "sessions" | "budget") =>
    ({ ...shared, url: service === "sessions" ? sessionsUrl : budgetUrl, transport: transports?.[service] }) as unknown as O;
  return {
    sessions: () => new classes.sessions(of("sessions")),
    locks: () => new classes.locks(of("sessions")),
    budget: () => new classes.budget(of("budget")),
  };
}

/** The sessions, locks and budget clients, with their main helpers at hand (`Berth` of each entry). */
export class BerthBase<
  S extends SessionsClientBase = SessionsClientBase,
  L extends LocksClientBase = LocksClientBase,
  B extends BudgetClientBase = BudgetClientBase,
> {
  readonly #make: ServiceClientFactories<S, L, B>;
  #sessions: S | undefined;
  #locks: L | undefined;
  #budget: B | undefined;

  constructor(make: ServiceClientFactories<S, L, B>) {
    this.#make = make;
  }

  /** The session journals. Made on first use; throws EndpointError if the sessions service cannot be found. */
  get sessions(): S {
    return (this.#sessions ??= this.#make.sessions());
  }

  /** The source locks (on the sessions service). */
  get locks(): L {
    return (this.#locks ??= this.#make.locks());
  }

  /** The budget. */
  get budget(): B {
    return (this.#budget ??= this.#make.budget());
  }

  /** {@link SessionsClientBase.append}. */
  append(sessionId: string, event: EventInput, options?: AppendOptions): Promise<AppendEventResponse> {
    return this.sessions.append(sessionId, event, options);
  }

  /** {@link SessionsClientBase.watch}. */
  watch(sessionId: string, options?: WatchOptions): AsyncGenerator<SessionWatchEvent> {
    return this.sessions.watch(sessionId, options);
  }

  /** {@link LocksClientBase.lock}. */
  lock(file: string, options?: LockOptions): Promise<HeldLock> {
    return this.locks.lock(file, options);
  }

  /** {@link BudgetClientBase.admit}. */
  admit<T>(need: NeedInput, work: (admission: Admission) => Promise<T> | T, options?: AdmitOptions): Promise<T> {
    return this.budget.admit(need, work, options);
  }
}
