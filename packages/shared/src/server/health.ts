/**
 * `grpc.health.v1.Health`: a map from service name to serving status, with watchers. The empty
 * name "" stands for the whole server. Check answers NOT_FOUND for a name the server never
 * registered; Watch answers SERVICE_UNKNOWN for it and keeps the stream open, as the spec says.
 */
import { Code, ConnectError, type HandlerContext, type ServiceImpl } from "@connectrpc/connect";
import { create } from "@bufbuild/protobuf";
import {
  type Health,
  HealthCheckResponseSchema,
  HealthCheckResponse_ServingStatus,
  type HealthCheckRequest,
  type HealthCheckResponse,
} from "@berth/api/grpc/health/v1/health_pb";
import { abortError } from "./streams.js";

/** The serving status values of `grpc.health.v1` (SERVING, NOT_SERVING, SERVICE_UNKNOWN…). */
export const ServingStatus = HealthCheckResponse_ServingStatus;
/** A serving status of `grpc.health.v1`. */
export type ServingStatus = HealthCheckResponse_ServingStatus;

/** The name that stands for the whole server. */
export const OVERALL_HEALTH = "";

type Listener = (status: ServingStatus) => void;

/**
 * The status map behind the Health service. Services set their own status (e.g. NOT_SERVING while
 * they replay journals); the server sets "" and every served service SERVING once it listens and
 * everything NOT_SERVING when it shuts down.
 */
export class HealthStatus {
  private readonly statuses = new Map<string, ServingStatus>();
  private readonly listeners = new Map<string, Set<Listener>>();
  private shuttingDown = false;

  /**
   * Sets the status of `service` ("" for the whole server) and tells its watchers. Ignored once
   * the server is shutting down: nothing may look SERVING after that.
   */
  setStatus(service: string, status: ServingStatus): void {
    if (this.shuttingDown) return;
    this.update(service, status);
  }

  /** The status of `service`, or undefined when the name is unknown. */
  getStatus(service: string): ServingStatus | undefined {
    return this.statuses.get(service);
  }

  /** Every known name and its status. */
  entries(): ReadonlyMap<string, ServingStatus> {
    return this.statuses;
  }

  /** Marks everything NOT_SERVING for good (further `setStatus` calls are ignored). */
  shutdown(): void {
    if (this.shuttingDown) return;
    this.shuttingDown = true;
    for (const service of this.statuses.keys()) this.update(service, ServingStatus.NOT_SERVING);
  }

  /** Calls `listener` on every change of `service`'s status; returns the unsubscribe function. */
  subscribe(service: string, listener: Listener): () => void {
    let set = this.listeners.get(service);
    if (set === undefined) {
      set = new Set();
      this.listeners.set(service, set);
    }
    set.add(listener);
    return () => {
      set.delete(listener);
      if (set.size === 0 && this.listeners.get(service) === set) this.listeners.delete(service);
    };
  }

  private update(service: string, status: ServingStatus): void {
    if (this.statuses.get(service) === status) return;
    this.statuses.set(service, status);
    const set = this.listeners.get(service);
    if (set === undefined) return;
    for (const listener of [...set]) listener(status);
  }
}

/** The `grpc.health.v1.Health` implementation over a status map. */
export function createHealthService(health: HealthStatus): ServiceImpl<typeof Health> {
  return {
    check(request: HealthCheckRequest): HealthCheckResponse {
      const status = health.getStatus(request.service);
      if (status === undefined) {
        throw new ConnectError(`unknown service ${JSON.stringify(request.service)}: no health status is registered for it`, Code.NotFound);
      }
      return create(HealthCheckResponseSchema, { status });
    },

    async *watch(request: HealthCheckRequest, context: HandlerContext): AsyncGenerator<HealthCheckResponse> {
      // Only the latest status matters to a watcher: a slow reader gets the newest value, never
      // a backlog (the spec allows skipping intermediate states).
      let pending: ServingStatus | undefined;
      let wake: (() => void) | undefined;
      const unsubscribe = health.subscribe(request.service, (status) => {
        pending = status;
        wake?.();
      });
      const onAbort = () => wake?.();
      context.signal.addEventListener("abort", onAbort);
      try {
        let last = health.getStatus(request.service) ?? ServingStatus.SERVICE_UNKNOWN;
        yield create(HealthCheckResponseSchema, { status: last });
        for (;;) {
          // A change already queued goes out before the stream ends, so that a watcher sees
          // NOT_SERVING before the UNAVAILABLE of a shutdown.
          if (pending !== undefined) {
            const status = pending;
            pending = undefined;
            if (status !== last) {
              last = status;
              yield create(HealthCheckResponseSchema, { status });
            }
            continue;
          }
          if (context.signal.aborted) throw abortError(context.signal);
          await new Promise<void>((resolve) => (wake = resolve));
          wake = undefined;
        }
      } finally {
        unsubscribe();
        context.signal.removeEventListener("abort", onAbort);
      }
    },
  };
}
