/**
 * The server bootstrap both berth services share: their RPCs plus health, reflection, the bearer
 * token, per-RPC logs and metrics, the message size limit, keepalive and graceful shutdown, on one
 * port that speaks gRPC, gRPC-Web and Connect.
 */
import { setMaxListeners } from "node:events";
import type * as http from "node:http";
import type * as http2 from "node:http2";
import type { DescFile, DescService } from "@bufbuild/protobuf";
import { createContextValues, type ConnectRouter, type Interceptor, type ServiceImpl } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { Health } from "@berth/api/grpc/health/v1/health_pb";
import * as reflectionV1 from "@berth/api/grpc/reflection/v1/reflection_pb";
import * as reflectionV1alpha from "@berth/api/grpc/reflection/v1alpha/reflection_pb";
import { answerDeliveryKey, trackAnswerDelivery, type AnswerDelivery } from "./answer-delivery.js";
import { closeWhenAnswered } from "./answered-streams.js";
import { connectionGoneOf } from "./call-connection.js";
import { bearerTokenMatches, UNAUTHENTICATED_MESSAGE } from "./auth.js";
import { failWaitingWrite } from "./closed-response.js";
import { createErrorInterceptor } from "./connect-errors.js";
import { answerCors } from "./cors.js";
import { createMessageCheckInterceptor } from "./message-checks.js";
import { createRouteGuard } from "./route-guard.js";
import { createHealthService, HealthStatus, OVERALL_HEALTH, ServingStatus } from "./health.js";
import { isGrpcContentType, useGrpcMessageEncoding } from "./grpc-message.js";
import { listen, urlOf, type KeepaliveOptions, type ListenAddress, type NodeRequestHandler } from "./listener.js";
import type { Logger } from "../logger.js";
import { callStateKey, createObserverInterceptor, recordRefusedCall, type CallState, type ObserverOptions } from "./logging.js";
import { METRICS_CONTENT_TYPE, ServerMetrics } from "./metrics.js";
import { createReflectionV1alphaService, createReflectionV1Service, ReflectionIndex } from "./reflection.js";
import { createStreamShutdownInterceptor, shuttingDownError } from "./streams.js";
import { createSpareConnectionInterceptor, spareConnectionKey } from "./spare-connections.js";

/** 4 MiB, gRPC's customary default. */
export const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;
/** How long shutdown waits for calls to finish before dropping connections. */
export const DEFAULT_DRAIN_TIMEOUT_MS = 5_000;
/** How long a stream may take to end on its own after the shutdown signal before it is cut. */
export const DEFAULT_STREAM_GRACE_MS = 1_000;

/**
 * How JSON requests are read, to the same rules as binary ones (see message-checks.ts). A
 * misspelled JSON field ("expectedSequence", "fense") would otherwise be dropped without a word,
 * silently turning off the check it asked for: refused, naming the key. A body that is not UTF-8
 * would otherwise have its bad bytes replaced by U+FFFD and be stored so, where the binary decoder
 * refuses such a string: refused. (Connect passes `textDecoder` on to its JSON serialization.)
 */
const JSON_OPTIONS = { ignoreUnknownFields: false, textDecoder: new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }) };

/** The services every berth server adds to its own. */
const BUILT_IN_SERVICES: readonly DescService[] = [Health, reflectionV1.ServerReflection, reflectionV1alpha.ServerReflection];

/** One service and its (possibly partial: missing RPCs answer UNIMPLEMENTED) implementation. */
export interface ServiceRegistration {
  readonly service: DescService;
  readonly implementation: Partial<ServiceImpl<DescService>>;
}

/** Pairs a service with its implementation, type-checking the implementation against the service. */
export function implement<S extends DescService>(service: S, implementation: Partial<ServiceImpl<S>>): ServiceRegistration {
  return { service, implementation: implementation as Partial<ServiceImpl<DescService>> };
}

/** Work to do after the last connection is closed: flush state, release the election lock. */
export type ShutdownHook = () => void | Promise<void>;

/** What handler factories get from the server they are plugged into. */
export interface ServerContext {
  /** The server's name (`sessions`, `budget`). */
  readonly name: string;
  /**
   * Aborted (reason: a ConnectError UNAVAILABLE "server shutting down") when shutdown starts.
   * Every handler's `context.signal` is aborted with it too; long waits and streams should end
   * on it. A stream that does not is cut anyway after a short grace.
   */
  readonly shutdownSignal: AbortSignal;
  /** The health status map: set a service NOT_SERVING while it cannot serve. */
  readonly health: HealthStatus;
  /** Register gauges here (`metrics.registerGauge`). */
  readonly metrics: ServerMetrics;
  readonly logger: Logger;
  /** Adds a hook run after the connections are closed (in registration order, after `options.onShutdown`). */
  onShutdown(hook: ShutdownHook): void;
}

/** Options of `startServer`. */
export interface StartServerOptions {
  /** The server's name, for logs and metrics: `sessions`, `budget`. */
  readonly name: string;
  /**
   * The services to serve, or a factory receiving the server context (for the shutdown signal,
   * health and metrics). Health and reflection are added by the server.
   */
  readonly services?: readonly ServiceRegistration[] | ((context: ServerContext) => readonly ServiceRegistration[] | Promise<readonly ServiceRegistration[]>);
  /** More registrations on the router itself; services registered here are reflected too. */
  readonly routes?: (router: ConnectRouter, context: ServerContext) => void;
  /** Files to describe through reflection besides those of the served services (their imports follow). */
  readonly files?: readonly DescFile[];
  /** Default `127.0.0.1`. */
  readonly host?: string;
  /** Default 0: an ephemeral port (read it from `address`). */
  readonly port?: number;
  /** Listen on this unix socket (mode 0600) instead of host and port. */
  readonly socket?: string;
  /** When set, every RPC but health needs `authorization: Bearer <token>`. */
  readonly token?: string;
  /** Web page origins allowed to call (`http://localhost:3000`, as parseOrigin gives them); none by default (cors.ts). */
  readonly corsOrigins?: readonly string[];
  readonly logger: Logger;
  /** The largest message read or written; larger ones fail with RESOURCE_EXHAUSTED. Default 4 MiB. */
  readonly maxMessageBytes?: number;
  readonly keepalive?: KeepaliveOptions;
  /** Default 5 s (`DEFAULT_DRAIN_TIMEOUT_MS`). */
  readonly drainTimeoutMs?: number;
  /** Default 1 s (`DEFAULT_STREAM_GRACE_MS`). */
  readonly streamGraceMs?: number;
  /** Run in order after shutdown closed every connection; a failing hook is logged and the next runs. */
  readonly onShutdown?: readonly ShutdownHook[];
  /** Extra interceptors, run inside the server's own (after error mapping, logging and the message checks). */
  readonly interceptors?: readonly Interceptor[];
  /** Client connections kept open, and spare ones answered and closed over those (see listener.ts); default their shares of the descriptor limit. */
  readonly maxConnections?: number;
  readonly spareConnections?: number;
}

/** A started server. */
export interface RunningServer {
  readonly name: string;
  readonly address: ListenAddress;
  /** `http://127.0.0.1:7301`, or `unix:/path/to/socket`. */
  readonly url: string;
  readonly health: HealthStatus;
  readonly metrics: ServerMetrics;
  /** Client connections open now (spare ones included). */
  readonly connections: number;
  /** Aborted when shutdown starts (see `ServerContext.shutdownSignal`). */
  readonly shutdownSignal: AbortSignal;
  /** Resolves once `close` has finished (every hook run). */
  readonly closed: Promise<void>;
  /**
   * Shuts down: stop accepting; health NOT_SERVING; the shutdown signal ends open streams with
   * UNAVAILABLE (streams still open after the grace are cut); HTTP/2 connections get GOAWAY;
   * in-flight calls get up to `drainTimeoutMs`; then connections are dropped and the hooks run.
   * `graceful = false` skips the waiting. Calling it again returns the same promise.
   */
  close(graceful?: boolean): Promise<void>;
}

/**
 * Starts a server; resolves once it listens, with health SERVING for every served service (unless
 * a service set its own status first). If it rejects (the port is taken…), no hook has run: the
 * caller still owns what it acquired, such as the election lock.
 */
export async function startServer(options: StartServerOptions): Promise<RunningServer> {
  const { name, logger } = options;
  const maxMessageBytes = options.maxMessageBytes ?? DEFAULT_MAX_MESSAGE_BYTES;
  if (!Number.isInteger(maxMessageBytes) || maxMessageBytes <= 0) {
    throw new Error(`maxMessageBytes must be a positive integer, got ${maxMessageBytes}`);
  }
  const drainTimeoutMs = options.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS;
  const streamGraceMs = Math.min(options.streamGraceMs ?? DEFAULT_STREAM_GRACE_MS, drainTimeoutMs);

  const metrics = new ServerMetrics(name);
  const health = new HealthStatus();
  const shutdown = new AbortController();
  const force = new AbortController();
  // Every open call listens on these (a Hold stream, a waiting Admit): thousands of listeners are
  // the normal case for a server, not a leak.
  setMaxListeners(0, shutdown.signal, force.signal);
  const hooks: ShutdownHook[] = [...(options.onShutdown ?? [])];
  const context: ServerContext = {
    name,
    shutdownSignal: shutdown.signal,
    health,
    metrics,
    logger,
    onShutdown: (hook) => void hooks.push(hook),
  };

  const registrations = typeof options.services === "function" ? await options.services(context) : (options.services ?? []);

  const servedServices: DescService[] = [];
  const observer: ObserverOptions = { logger, metrics };
  const interceptors: Interceptor[] = [
    createObserverInterceptor(observer),
    createErrorInterceptor(logger),
    createSpareConnectionInterceptor(),
    createMessageCheckInterceptor(),
    createStreamShutdownInterceptor(force.signal),
    ...(options.interceptors ?? []),
  ];
  // The token is checked before a request's body is read, on the route (see route-guard.ts).
  const guardRoute = createRouteGuard({ token: options.token, logger });

  const states = new WeakMap<object, CallState>();
  const deliveries = new WeakMap<object, AnswerDelivery>();
  /** The requests of spare connections (see spare-connections.ts). */
  const spareCalls = new WeakSet<object>();
  const adapter = connectNodeAdapter({
    routes(router) {
      for (const { service, implementation } of registrations) router.service(service, implementation);
      options.routes?.(router, context);
      // Reflection describes whatever ended up on the router, however it was registered.
      for (const { service } of router.handlers) if (!servedServices.includes(service)) servedServices.push(service);
      const index = new ReflectionIndex([...servedServices, ...BUILT_IN_SERVICES], options.files ?? []);
      router.service(Health, createHealthService(health));
      router.service(reflectionV1.ServerReflection, createReflectionV1Service(index));
      router.service(reflectionV1alpha.ServerReflection, createReflectionV1alphaService(index));
      // Every streaming method shows in berth_streams_open from the start, at 0 until one opens.
      for (const { method } of router.handlers) if (method.methodKind !== "unary") metrics.streams.declare(`/${method.parent.typeName}/${method.name}`);
      // The token, the bodies Connect stops reading, and the errors Connect writes before any interceptor.
      router.handlers.splice(0, router.handlers.length, ...router.handlers.map(guardRoute));
    },
    interceptors,
    readMaxBytes: maxMessageBytes,
    writeMaxBytes: maxMessageBytes,
    shutdownSignal: shutdown.signal,
    // On loopback, gzipping a response costs CPU and saves nothing (a watcher's snapshot would be
    // compressed once per watcher): answer uncompressed, while still accepting compressed requests.
    compressMinBytes: Number.MAX_SAFE_INTEGER,
    // Plain `curl -d '{}'` must work: do not insist on the Connect-Protocol-Version header.
    requireConnectProtocolHeader: false,
    jsonOptions: JSON_OPTIONS,
    contextValues: (req) =>
      createContextValues().set(callStateKey, states.get(req)).set(answerDeliveryKey, deliveries.get(req)).set(spareConnectionKey, spareCalls.has(req)),
    fallback(req, res) {
      const state = states.get(req);
      if (state !== undefined) state.observed = true; // not an RPC: nothing to log per call
      serveNonRpc(req, res, metrics, options.token);
    },
  });

  const corsOrigins = new Set(options.corsOrigins ?? []);
  const handler: NodeRequestHandler = (req, res) => {
    // Before anything reads the call: a preflight carries no token, and a refused origin gets nothing.
    if (answerCors(req, res, corsOrigins) === "answered") return;
    const state: CallState = {
      peer: peerOf(req),
      started: performance.now(),
      arrivedAtWallMs: Date.now(),
      observed: false,
      connectionGone: connectionGoneOf(req, res),
    };
    states.set(req, state);
    deliveries.set(req, trackAnswerDelivery(res));
    res.once("close", () => {
      // A client gone while a message of its stream waits to be written: end that wait (see closed-response.ts).
      failWaitingWrite(res);
      if (state.observed) return;
      const trailers = (res as http2.Http2ServerResponse).stream?.sentTrailers;
      const headers = (res as http2.Http2ServerResponse).stream?.sentHeaders;
      const grpcStatus = trailers?.["grpc-status"] ?? headers?.["grpc-status"];
      recordRefusedCall(
        observer,
        state,
        (req.url ?? "").split("?", 1)[0]!,
        req.headers["content-type"],
        res.statusCode,
        typeof grpcStatus === "string" ? grpcStatus : undefined,
      );
    });
    if (req.httpVersionMajor === 2) {
      closeWhenAnswered(res as http2.Http2ServerResponse);
      if (isGrpcContentType(req.headers["content-type"])) useGrpcMessageEncoding(res);
    }
    adapter(req, res);
  };

  const listener = await listen({
    handler,
    spareHandler: (req, res) => {
      spareCalls.add(req);
      handler(req, res);
    },
    host: options.host,
    port: options.port,
    socket: options.socket,
    keepalive: options.keepalive,
    logger,
    ...(options.maxConnections !== undefined ? { maxConnections: options.maxConnections } : {}),
    ...(options.spareConnections !== undefined ? { spareConnections: options.spareConnections } : {}),
  });

  const servedNames = servedServices.map((s) => s.typeName);
  // A service that set its own status while starting (say NOT_SERVING during a replay) keeps it.
  for (const service of [OVERALL_HEALTH, ...servedNames]) {
    if (health.getStatus(service) === undefined) health.setStatus(service, ServingStatus.SERVING);
  }
  const url = urlOf(listener.address);
  logger.info({ server: name, url, services: servedNames, auth: options.token !== undefined, maxMessageBytes }, "listening");

  let closing: Promise<void> | undefined;
  let markClosed: () => void = () => {};
  const closed = new Promise<void>((resolve) => (markClosed = resolve));

  const close = (graceful = true): Promise<void> => {
    closing ??= (async () => {
      const started = performance.now();
      logger.info({ server: name, graceful, activeRequests: listener.activeRequests }, "shutting down");
      listener.stopAccepting();
      health.shutdown();
      shutdown.abort(shuttingDownError());
      if (graceful) {
        if (!(await listener.drained(streamGraceMs))) {
          force.abort(shuttingDownError());
          if (!(await listener.drained(drainTimeoutMs - streamGraceMs))) {
            logger.warn(
              { server: name, activeRequests: listener.activeRequests, connections: listener.connections, drainTimeoutMs },
              "connections still open at the drain timeout: dropping them",
            );
          }
        }
      } else {
        force.abort(shuttingDownError());
      }
      await listener.destroy();
      for (const hook of hooks) {
        try {
          await hook();
        } catch (error) {
          logger.error({ server: name, err: error }, "shutdown hook failed");
        }
      }
      logger.info({ server: name, ms: Math.round(performance.now() - started) }, "stopped");
      markClosed();
    })();
    return closing;
  };

  return {
    name,
    address: listener.address,
    url,
    health,
    metrics,
    get connections() {
      return listener.connections;
    },
    shutdownSignal: shutdown.signal,
    closed,
    close,
  };
}

function peerOf(req: http.IncomingMessage | http2.Http2ServerRequest): string {
  const socket = req.socket;
  const address = socket?.remoteAddress;
  if (address === undefined) return "unix";
  return `${address}:${socket.remotePort}`;
}

/**
 * `/metrics` (GET or HEAD) and `/debug/streams` (the open streams as JSON, the longest open first);
 * anything else that is not an RPC path gets a 404 that says what exists.
 */
function serveNonRpc(req: http.IncomingMessage | http2.Http2ServerRequest, res: unknown, metrics: ServerMetrics, token: string | undefined): void {
  const response = res as http.ServerResponse;
  const path = (req.url ?? "").split("?", 1)[0];
  const page = req.method === "GET" || req.method === "HEAD" ? PAGES.get(path ?? "") : undefined;
  if (page !== undefined) {
    // The counters name sessions' activity and the machine's load, the stream list its clients:
    // behind the token like any RPC (Prometheus sends it with `authorization: {credentials: …}`
    // in the scrape config).
    if (token !== undefined && !bearerTokenMatches(req.headers.authorization ?? null, token)) {
      const body = `${UNAUTHENTICATED_MESSAGE}\n`;
      response.writeHead(401, { "content-type": "text/plain; charset=utf-8", "content-length": Buffer.byteLength(body), "www-authenticate": "Bearer" });
      response.end(req.method === "HEAD" ? undefined : body);
      return;
    }
    const { contentType, body } = page(metrics);
    response.writeHead(200, { "content-type": contentType, "content-length": Buffer.byteLength(body) });
    response.end(req.method === "HEAD" ? undefined : body);
    return;
  }
  const body = `no route for ${req.method} ${path}: RPCs are POST /<package>.<Service>/<Method>; metrics are GET /metrics, the open streams GET /debug/streams\n`;
  response.writeHead(404, { "content-type": "text/plain; charset=utf-8", "content-length": Buffer.byteLength(body) });
  response.end(body);
}

/** The pages served besides the RPCs. */
const PAGES: ReadonlyMap<string, (metrics: ServerMetrics) => { contentType: string; body: string }> = new Map([
  ["/metrics", (metrics: ServerMetrics) => ({ contentType: METRICS_CONTENT_TYPE, body: metrics.render() })],
  [
    "/debug/streams",
    (metrics: ServerMetrics) => ({ contentType: "application/json", body: `${JSON.stringify({ streams: metrics.streams.list() }, null, 1)}\n` }),
  ],
]);
