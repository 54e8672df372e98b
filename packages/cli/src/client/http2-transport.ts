/**
 * A gRPC transport over HTTP/2, for the calls that stream in both directions (the budget's Admit):
 * the default transport (`createTransport`, Connect over HTTP/1.1) cannot carry them. Same
 * endpoint, same token, unix sockets too.
 */
import * as net from "node:net";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import type { Endpoint } from "./connect.js";

/** A gRPC (HTTP/2) transport to `endpoint`, sending its token as `authorization: Bearer …`. */
export function createHttp2Transport(endpoint: Endpoint): Transport {
  const interceptors: Interceptor[] = [];
  const token = endpoint.token;
  if (token !== undefined) {
    interceptors.push((next) => (req) => {
      req.header.set("authorization", `Bearer ${token}`);
      return next(req);
    });
  }
  if (endpoint.url.startsWith("unix:")) {
    const socketPath = endpoint.url.slice("unix:".length);
    return createGrpcTransport({ baseUrl: "http://localhost", interceptors, nodeOptions: { createConnection: () => net.connect(socketPath) } });
  }
  return createGrpcTransport({ baseUrl: endpoint.url, interceptors });
}
