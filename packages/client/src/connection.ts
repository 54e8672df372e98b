/**
 * What a service client needs of the platform it runs on, given to it by the entry point: its
 * transports, who it is when the caller names no owner, and how a lock path the caller spelt
 * becomes the absolute path the service takes. The clients (`sessions-base.ts`, `locks-base.ts`,
 * `budget-base.ts`) know nothing else of Node or of a browser: the Node entry resolves the endpoint
 * table and speaks over connect-node (`node-connection.ts`), the browser entry over fetch
 * (`web-connection.ts`), as Connect itself keeps one core and a transport per platform.
 */
import type { Transport } from "@connectrpc/connect";
import type { Endpoint } from "./endpoint.js";

/** The two transports of a service client: one for unary calls and server streams, one for the streams that need more. */
export interface ServiceTransports {
  /** The endpoint, unless the caller gave a transport. */
  readonly endpoint: Endpoint | undefined;
  readonly unary: Transport;
  /** For Hold and Admit streams (gRPC over HTTP/2 in Node). Made on first use. */
  streams(): Transport;
}

/** A service client's transports and the platform's defaults. */
export interface ServiceConnection extends ServiceTransports {
  /** Who a lock or an admission is for when the caller does not say. */
  defaultOwner(): string;
  /** `file` as the service takes it (absolute), `cwd` being what the caller said a relative path is relative to. */
  lockPath(file: string, cwd: string | undefined): string;
}
