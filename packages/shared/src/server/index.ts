/** The common server both berth services run on. */
export { startServer, implement, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_DRAIN_TIMEOUT_MS, DEFAULT_STREAM_GRACE_MS } from "./start-server.js";
export type { StartServerOptions, RunningServer, ServerContext, ServiceRegistration, ShutdownHook } from "./start-server.js";
export { installSignalHandlers, FORCED_EXIT_CODE } from "./signal-handlers.js";
export type { SignalHandlerOptions } from "./signal-handlers.js";
export { HealthStatus, ServingStatus, OVERALL_HEALTH, createHealthService } from "./health.js";
export { ReflectionIndex, createReflectionV1Service, createReflectionV1alphaService } from "./reflection.js";
export { ServerMetrics, RPC_DURATION_BUCKETS, METRICS_CONTENT_TYPE } from "./metrics.js";
export type { GaugeReader, GaugeSample } from "./metrics.js";
export { berthErrorToConnect, connectCodeOf, toConnectError, createErrorInterceptor, ERROR_DETAILS_HEADER, INTERNAL_ERROR_MESSAGE } from "./connect-errors.js";
export { createAuthInterceptor, bearerTokenMatches, UNAUTHENTICATED_MESSAGE, UNAUTHENTICATED_SERVICES } from "./auth.js";
export { createObserverInterceptor, codeName } from "./logging.js";
export { OpenStreams, streamHolds } from "./open-streams.js";
export type { OpenStream, OpenStreamView } from "./open-streams.js";
export { abortable, abortError, shuttingDownError, createStreamShutdownInterceptor } from "./streams.js";
export { listen, urlOf, DEFAULT_KEEPALIVE } from "./listener.js";
export type { Listener, ListenAddress, ListenOptions, KeepaliveOptions } from "./listener.js";
export { runServices, serveElected } from "./run-services.js";
export type { ServiceDefinition, RunOptions, CommonValues, OpenedService } from "./run-services.js";
