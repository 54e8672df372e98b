/**
 * The sessions service as a process runs it: its settings, and how it starts (the journal store and
 * the lock table over the state directory, and the RPC layer over them).
 */
import { LockService } from "@berth/api/berth/sessions/v1/lock_service_pb";
import { SessionService } from "@berth/api/berth/sessions/v1/session_service_pb";
import { defineConfig, parseNonEmpty, parsePort } from "@berth/shared/config";
import { implement, serveElected, type ServiceDefinition } from "@berth/shared/server/index";

/** The default port of the sessions service. */
export const SESSIONS_DEFAULT_PORT = 7301;

/** Settings of the sessions service (besides the common ones). */
export const SESSIONS_SETTINGS = defineConfig({
  sessionsPort: {
    flag: "sessions-port",
    env: "BERTH_SESSIONS_PORT",
    default: SESSIONS_DEFAULT_PORT,
    parse: parsePort,
    doc: "TCP port of the sessions service (0 picks a free one)",
  },
  sessionsSocket: {
    flag: "sessions-socket",
    env: "BERTH_SESSIONS_SOCKET",
    parse: parseNonEmpty,
    doc: "serve the sessions service on this unix socket (mode 0600) instead of the TCP port",
  },
});

/** The sessions service: SessionService and LockService on one port. */
export const sessionsService: ServiceDefinition<typeof SESSIONS_SETTINGS> = {
  name: "sessions",
  settings: SESSIONS_SETTINGS,
  start: (values, logger) =>
    serveElected({
      name: "sessions",
      values,
      port: values.sessionsPort,
      socket: values.sessionsSocket,
      logger,
      open: () => ({
        services: [implement(SessionService, {}), implement(LockService, {})],
        close() {},
      }),
    }),
};
