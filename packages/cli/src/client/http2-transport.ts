/**
 * A gRPC transport over HTTP/2, for the calls that stream in both directions (the budget's Admit):
 * the default transport (`createTransport`, Connect over HTTP/1.1) cannot carry them. Same
 * endpoint, same token, unix sockets too.
 */
import * as net from "node:net";
import type { Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { bearerInterceptors, type Endpoint } from "./connect.js";

/** A gRPC (HTTP/2) transport to `endpoint`, sending its token as `authorization: Bearer …`. */
export function createHttp2Transport(endpoint: Endpoint): Transport {
  const interceptors = bearerInterceptors(endpoint);
  if (endpoint.url.startsWith("unix:")) {
    const socketPath = endpoint.url.slice("unix:".length);
    return createGrpcTransport({ baseUrl: "http://localhost", interceptors, nodeOptions: { createConnection: () => net.connect(socketPath) } });
  }
  return createGrpcTransport({ baseUrl: endpoint.url, interceptors });
}
