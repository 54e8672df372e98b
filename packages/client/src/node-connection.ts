/**
 * The service clients' connection in Node: the endpoint from the table every berth client shares
 * (`endpoint.ts`), Connect over HTTP/1.1 and gRPC over HTTP/2 from connect-node (`transport.ts`),
 * `user@host pid N` as the owner, lock paths relative to the working directory.
 */
import type { Transport } from "@connectrpc/connect";
import type { ServiceConnection, ServiceTransports } from "./connection.js";
import { resolveEndpoint, type Endpoint, type EndpointOptions } from "./endpoint.js";
import { absoluteLockPath } from "./lock-path.js";
import { defaultOwner } from "./owner.js";
import type { ServiceName } from "./service-urls.js";
import { createTransport } from "./transport.js";

/**
 * How a service client reaches its service: the endpoint options (URL, token, token file,
 * environment; see `resolveEndpoint`), or an endpoint already resolved, or a transport of one's own
 * (an in-memory one in tests, one with other interceptors).
 */
export interface ServiceClientOptions extends EndpointOptions {
  /** The endpoint, already resolved; wins over the endpoint options. */
  readonly endpoint?: Endpoint | undefined;
  /** The transport for every call; wins over the endpoint. */
  readonly transport?: Transport | undefined;
}

/** The transports of `service` from `options`. Throws EndpointError for a configuration no service can be reached with. */
export function serviceTransports(service: ServiceName, options: ServiceClientOptions): ServiceTransports {
  const given = options.transport;
  if (given !== undefined) return { endpoint: undefined, unary: given, streams: () => given };
  const endpoint = options.endpoint ?? resolveEndpoint(service, options);
  let streams: Transport | undefined;
  return {
    endpoint,
    unary: createTransport(endpoint),
    streams: () => (streams ??= createTransport(endpoint, { protocol: "grpc" })),
  };
}

/** The connection of a service client in Node. Throws EndpointError as {@link serviceTransports} does. */
export function nodeConnection(service: ServiceName, options: ServiceClientOptions): ServiceConnection {
  return { ...serviceTransports(service, options), defaultOwner, lockPath: absoluteLockPath };
}
