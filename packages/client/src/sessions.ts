/**
 * The sessions client of the Node entry: {@link SessionsClientBase} on the endpoint the shared table
 * finds (or the URL, token or transport given), over connect-node.
 */
import { nodeConnection, type ServiceClientOptions } from "./node-connection.js";
import { SessionsClientBase } from "./sessions-base.js";

export {
  type AppendOptions,
  type EventInput,
  ExpectedState,
  type JournalEvent,
  SESSION_ERROR_DETAILS,
  SessionsClientBase,
  type SessionsWatchEvent,
  type SessionsWatchOptions,
  type SessionWatchEvent,
  type WatchOptions,
} from "./sessions-base.js";

/** A client of the sessions service's journals. */
export class SessionsClient extends SessionsClientBase {
  /** Throws EndpointError when the options or the environment name no reachable service. */
  constructor(options: ServiceClientOptions = {}) {
    super(nodeConnection("sessions", options));
  }
}
