/**
 * For tests that hold a service to the same answers over every wire protocol it speaks: a client
 * transport per protocol to one server, gRPC with protobuf binary first (the reference the others
 * are compared with). Every transport is HTTP/2, so bidirectional streams work on each.
 */
import { Http2SessionManager, createConnectTransport, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import type { Transport } from "@connectrpc/connect";

/** A protocol and message format: `application/grpc`, `application/grpc+json`, `application/connect+json`… */
export interface WireProtocol {
  readonly name: string;
  readonly transport: (baseUrl: string, sessionManager: Http2SessionManager) => Transport;
}

/** The protocols, the binary reference first. */
export const WIRE_PROTOCOLS: readonly WireProtocol[] = [
  { name: "gRPC", transport: (baseUrl, sessionManager) => createGrpcTransport({ baseUrl, sessionManager }) },
  { name: "gRPC-JSON", transport: (baseUrl, sessionManager) => createGrpcTransport({ baseUrl, sessionManager, useBinaryFormat: false }) },
  { name: "Connect", transport: (baseUrl, sessionManager) => createConnectTransport({ baseUrl, httpVersion: "2", sessionManager }) },
  {
    name: "Connect JSON",
    transport: (baseUrl, sessionManager) => createConnectTransport({ baseUrl, httpVersion: "2", sessionManager, useBinaryFormat: false }),
  },
  {
    name: "gRPC-Web JSON",
    transport: (baseUrl, sessionManager) => createGrpcWebTransport({ baseUrl, httpVersion: "2", sessionManager, useBinaryFormat: false }),
  },
];

/** A transport of `protocol` to `baseUrl`, and the way to close its connection. */
export function connectOver(protocol: WireProtocol, baseUrl: string): { transport: Transport; close: () => void } {
  const sessionManager = new Http2SessionManager(baseUrl);
  return { transport: protocol.transport(baseUrl, sessionManager), close: () => sessionManager.abort() };
}
