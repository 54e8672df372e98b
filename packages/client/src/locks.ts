/**
 * The locks client of the Node entry: {@link LocksClientBase} on the sessions service's endpoint,
 * Hold streams over gRPC on HTTP/2 (whose keepalive pings notice a service that went away), lock
 * paths relative to the working directory, `user@host pid N` as the owner.
 */
import { nodeConnection, type ServiceClientOptions } from "./node-connection.js";
import { LocksClientBase } from "./locks-base.js";
import { defaultOwner } from "./owner.js";

export {
  type AcquireOptions,
  HeldLock,
  LOCK_ERROR_DETAILS,
  type LockOptions,
  LocksClientBase,
  type LockWatchEvent,
  type LockWatchOptions,
} from "./locks-base.js";
export { defaultOwner };

/** A client of the sessions service's source locks. */
export class LocksClient extends LocksClientBase {
  /** Throws EndpointError when the options or the environment name no reachable service. */
  constructor(options: ServiceClientOptions = {}) {
    super(nodeConnection("sessions", options));
  }
}
