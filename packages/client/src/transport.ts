/**
 * Transports to an endpoint: the Connect protocol with binary messages over HTTP/1.1 for unary
 * calls and server streams (the quickest to set up, and it works over any proxy), and gRPC over
 * HTTP/2 for the calls that need it (Admit streams both ways; a Hold stream is best on HTTP/2,
 * whose keepalive pings notice a service that went away). Both reach `unix:` sockets too, and send
 * the endpoint's token as `authorization: Bearer …` on every call.
 */
import * as net from "node:net";
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport } from "@connectrpc/connect-node";
import { bearerInterceptors } from "./bearer.js";
import type { Endpoint } from "./endpoint.js";

/** Which wire protocol a transport speaks. */
export type TransportProtocol = "connect" | "grpc";

/** Options of {@link createTransport}. */
export interface TransportOptions {
  /** `connect` (HTTP/1.1, the default) or `grpc` (HTTP/2: every kind of call, bidirectional streams included). */
  readonly protocol?: TransportProtocol;
  /** More interceptors, run after the one that sends the token. */
  readonly interceptors?: readonly Interceptor[];
}

/** A transport to `endpoint`. */
export function createTransport(endpoint: Pick<Endpoint, "url" | "token">, options: TransportOptions = {}): Transport {
  const interceptors = [...bearerInterceptors(endpoint.token), ...(options.interceptors ?? [])];
  const socketPath = endpoint.url.startsWith("unix:") ? endpoint.url.slice("unix:".length) : undefined;
  const baseUrl = socketPath === undefined ? endpoint.url : "http://localhost";
  if (options.protocol === "grpc") {
    return createGrpcTransport({
      baseUrl,
      interceptors,
      ...(socketPath === undefined ? {} : { nodeOptions: { createConnection: () => net.connect(socketPath) } }),
    });
  }
  return createConnectTransport({
    baseUrl,
    httpVersion: "1.1",
    useBinaryFormat: true,
    interceptors,
    ...(socketPath === undefined ? {} : { nodeOptions: { socketPath } }),
  });
}
