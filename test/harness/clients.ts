/**
 * Clients for end-to-end tests, each a different implementation on the wire so that a test proves
 * interoperability rather than connect-es talking to itself: `@grpc/grpc-js` (the reference gRPC
 * implementation for Node, with the health contract loaded by `@grpc/proto-loader` from proto/)
 * and connect-node over gRPC (HTTP/2), gRPC-Web and Connect (HTTP/1.1 or HTTP/2).
 *
 * Every client made here is closed by `stopAll()`; close one earlier with its `close()` /
 * {@link closeClient}.
 */
import { connectFailure } from "@berth/shared/server/testing/connect-failure";
import * as http from "node:http";
import * as net from "node:net";
import {
  create,
  fromBinary,
  toBinary,
  type DescMessage,
  type DescMethodBiDiStreaming,
  type DescMethodServerStreaming,
  type DescMethodUnary,
  type DescService,
  type MessageInitShape,
  type MessageShape,
} from "@bufbuild/protobuf";
import { createClient, type Client, type Interceptor, type Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcTransport, createGrpcWebTransport, Http2SessionManager } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { ErrorInfoSchema, RetryInfoSchema, type ErrorInfo } from "@berth/api/google/rpc/error_details_pb";
import { StatusSchema } from "@berth/api/google/rpc/status_pb";
import { onStopAll } from "./processes.js";
import { repoPath } from "./repo.js";

/** grpc-js status codes by name (`GrpcStatus.UNAUTHENTICATED` is 16). */
export const GrpcStatus = grpc.status;

/** The name of a gRPC status code: `grpcCodeName(16)` is `"UNAUTHENTICATED"`. */
export function grpcCodeName(code: number): string {
  return grpc.status[code] ?? `CODE_${code}`;
}

/** The grpc-js error of a failed call: `code` is the gRPC status, `details` the message. */
export type GrpcError = grpc.ServiceError;

/** True when `error` is a grpc-js call error (it carries a numeric `code`). */
export function isGrpcError(error: unknown): error is GrpcError {
  return error instanceof Error && typeof (error as Partial<GrpcError>).code === "number";
}

/** What a gRPC error's `grpc-status-details-bin` says: the google.rpc.Status's ErrorInfo and RetryInfo, and every detail's type. */
export interface GrpcStatusDetails {
  reason?: string | undefined;
  domain?: string | undefined;
  metadata: Record<string, string>;
  /** RetryInfo's delay in ms; undefined without a RetryInfo. */
  retryDelayMs?: number | undefined;
  /** The full type names of all the details, in order. */
  types: string[];
  /** The detail of `schema`'s type, decoded; undefined when there is none. */
  find<S extends DescMessage>(schema: S): MessageShape<S> | undefined;
}

/** Decodes the `grpc-status-details-bin` trailer of a failed grpc-js call (undefined when it has none). */
export function grpcStatusDetails(metadata: grpc.Metadata): GrpcStatusDetails | undefined {
  const [raw] = metadata.get("grpc-status-details-bin");
  if (raw === undefined) return undefined;
  const status = fromBinary(StatusSchema, typeof raw === "string" ? Buffer.from(raw, "base64") : raw);
  const typeOf = (url: string) => url.slice(url.lastIndexOf("/") + 1);
  const find = <S extends DescMessage>(schema: S): MessageShape<S> | undefined => {
    const any = status.details.find((d) => typeOf(d.typeUrl) === schema.typeName);
    return any === undefined ? undefined : fromBinary(schema, any.value);
  };
  const info = find(ErrorInfoSchema);
  const retry = find(RetryInfoSchema)?.retryDelay;
  return {
    reason: info?.reason,
    domain: info?.domain,
    metadata: info?.metadata ?? {},
    retryDelayMs: retry === undefined ? undefined : Number(retry.seconds) * 1000 + retry.nanos / 1e6,
    types: status.details.map((d) => typeOf(d.typeUrl)),
    find,
  };
}

/** The ErrorInfo of a grpc-js call's status (its `reason` names the case), if it had one. */
export function grpcErrorInfo(metadata: grpc.Metadata): ErrorInfo | undefined {
  return grpcStatusDetails(metadata)?.find(ErrorInfoSchema);
}

/**
 * The grpc-js target of a base URL: `http://127.0.0.1:7301` → `127.0.0.1:7301`, `unix:/path`
 * unchanged (grpc-js understands it).
 */
export function grpcJsTarget(url: string): string {
  if (url.startsWith("unix:")) return url;
  const parsed = new URL(url);
  if (parsed.protocol !== "http:") throw new Error(`expected an http:// or unix: URL, got ${url}`);
  return parsed.host;
}

/** Options shared by the grpc-js clients. */
export interface GrpcJsCallOptions {
  /** Sent as `authorization: Bearer <token>`. */
  token?: string;
  /** More metadata (lower-case keys). */
  metadata?: Readonly<Record<string, string>>;
  /** Default 10 s, so a hung server fails the test instead of hanging it. */
  deadlineMs?: number;
}

const DEFAULT_DEADLINE_MS = 10_000;

function metadataOf(options: GrpcJsCallOptions): grpc.Metadata {
  const metadata = new grpc.Metadata();
  if (options.token !== undefined) metadata.set("authorization", `Bearer ${options.token}`);
  for (const [key, value] of Object.entries(options.metadata ?? {})) metadata.set(key, value);
  return metadata;
}

function deadlineOf(options: GrpcJsCallOptions): grpc.CallOptions {
  return { deadline: Date.now() + (options.deadlineMs ?? DEFAULT_DEADLINE_MS) };
}

/** A health status as proto-loader decodes it (enum names as strings). */
export interface HealthCheckResponse {
  status: "UNKNOWN" | "SERVING" | "NOT_SERVING" | "SERVICE_UNKNOWN";
}

/** A `grpc.health.v1.Health` client on grpc-js. */
export interface GrpcJsHealthClient {
  /** Health/Check for `service` (default `""`, the server as a whole); rejects with a {@link GrpcError}. */
  check(service?: string, options?: GrpcJsCallOptions): Promise<HealthCheckResponse>;
  /** Health/Watch: a server stream of statuses (no deadline unless given). */
  watch(service?: string, options?: GrpcJsCallOptions): grpc.ClientReadableStream<HealthCheckResponse>;
  close(): void;
}

let healthConstructor: grpc.ServiceClientConstructor | undefined;

function loadHealthConstructor(): grpc.ServiceClientConstructor {
  if (healthConstructor === undefined) {
    const definition = protoLoader.loadSync(repoPath("proto/grpc/health/v1/health.proto"), {
      keepCase: true,
      enums: String,
      defaults: true,
    });
    const loaded = grpc.loadPackageDefinition(definition) as unknown as {
      grpc: { health: { v1: { Health: grpc.ServiceClientConstructor } } };
    };
    healthConstructor = loaded.grpc.health.v1.Health;
  }
  return healthConstructor;
}

/**
 * A grpc-js client of `grpc.health.v1.Health` at `url`, built from proto/grpc/health/v1/health.proto
 * by @grpc/proto-loader: no berth code on the client side.
 */
export function grpcJsHealthClient(url: string, defaults: GrpcJsCallOptions = {}): GrpcJsHealthClient {
  const Health = loadHealthConstructor();
  const client = new Health(grpcJsTarget(url), grpc.credentials.createInsecure());
  const close = () => client.close();
  onStopAll(close);
  type UnaryFn = (req: object, md: grpc.Metadata, opts: grpc.CallOptions, cb: (error: grpc.ServiceError | null, res?: HealthCheckResponse) => void) => void;
  type StreamFn = (req: object, md: grpc.Metadata, opts?: grpc.CallOptions) => grpc.ClientReadableStream<HealthCheckResponse>;
  return {
    check(service = "", options = {}) {
      const merged = { ...defaults, ...options };
      return new Promise((resolve, reject) => {
        (client.Check as UnaryFn).call(client, { service }, metadataOf(merged), deadlineOf(merged), (error, response) => {
          if (error) reject(error);
          else resolve(response!);
        });
      });
    },
    watch(service = "", options = {}) {
      const merged = { ...defaults, ...options };
      const callOptions = merged.deadlineMs === undefined ? {} : deadlineOf(merged);
      return (client.Watch as StreamFn).call(client, { service }, metadataOf(merged), callOptions);
    },
    close,
  };
}

/**
 * A grpc-js client for any berth RPC, driven by the generated descriptors: messages are encoded
 * with protobuf-es, but the HTTP/2 framing, metadata and status handling are grpc-js's own.
 */
export interface GrpcJsClient {
  /** A unary call; rejects with a {@link GrpcError} carrying the gRPC status. */
  unary<I extends DescMessage, O extends DescMessage>(
    method: DescMethodUnary<I, O>,
    request: MessageInitShape<I>,
    options?: GrpcJsCallOptions,
  ): Promise<MessageShape<O>>;
  /** A server-streaming call (no deadline unless given). */
  serverStream<I extends DescMessage, O extends DescMessage>(
    method: DescMethodServerStreaming<I, O>,
    request: MessageInitShape<I>,
    options?: GrpcJsCallOptions,
  ): grpc.ClientReadableStream<MessageShape<O>>;
  /** A bidirectional call (no deadline unless given): write `MessageInitShape<I>` objects, read `MessageShape<O>`. */
  bidi<I extends DescMessage, O extends DescMessage>(
    method: DescMethodBiDiStreaming<I, O>,
    options?: GrpcJsCallOptions,
  ): grpc.ClientDuplexStream<MessageInitShape<I>, MessageShape<O>>;
  close(): void;
}

/**
 * A {@link GrpcJsClient} for the server at `url`; `defaults` apply to every call (e.g. `{ token }`).
 * `channelOptions` are grpc-js's own channel settings, for tests of the connection itself, e.g.
 * `{ "grpc.keepalive_time_ms": 100 }` so that the client pings the server over an idle stream.
 */
export function grpcJsClient(url: string, defaults: GrpcJsCallOptions = {}, channelOptions: grpc.ChannelOptions = {}): GrpcJsClient {
  const client = new grpc.Client(grpcJsTarget(url), grpc.credentials.createInsecure(), channelOptions);
  const close = () => client.close();
  onStopAll(close);
  const pathOf = (method: { parent: DescService; name: string }) => `/${method.parent.typeName}/${method.name}`;
  return {
    unary(method, request, options = {}) {
      const merged = { ...defaults, ...options };
      return new Promise((resolve, reject) => {
        client.makeUnaryRequest(
          pathOf(method),
          (message: MessageInitShape<typeof method.input>) => Buffer.from(toBinary(method.input, create(method.input, message))),
          (bytes: Buffer) => fromBinary(method.output, bytes),
          request,
          metadataOf(merged),
          deadlineOf(merged),
          (error, response) => {
            if (error) reject(error);
            else resolve(response!);
          },
        );
      });
    },
    serverStream(method, request, options = {}) {
      const merged = { ...defaults, ...options };
      return client.makeServerStreamRequest(
        pathOf(method),
        (message: MessageInitShape<typeof method.input>) => Buffer.from(toBinary(method.input, create(method.input, message))),
        (bytes: Buffer) => fromBinary(method.output, bytes),
        request,
        metadataOf(merged),
        merged.deadlineMs === undefined ? {} : deadlineOf(merged),
      );
    },
    bidi(method, options = {}) {
      const merged = { ...defaults, ...options };
      return client.makeBidiStreamRequest(
        pathOf(method),
        (message: MessageInitShape<typeof method.input>) => Buffer.from(toBinary(method.input, create(method.input, message))),
        (bytes: Buffer) => fromBinary(method.output, bytes),
        metadataOf(merged),
        merged.deadlineMs === undefined ? {} : deadlineOf(merged),
      );
    },
    close,
  };
}

/** The wire protocol of a {@link connectClient}. */
export type ConnectProtocol = "grpc" | "connect" | "grpc-web";

/** Options of {@link connectClient}. */
export interface ConnectClientOptions {
  protocol: ConnectProtocol;
  /** Sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  /** More request headers on every call. */
  headers?: Readonly<Record<string, string>>;
  /**
   * For `connect` and `grpc-web` (gRPC is always HTTP/2). Default `"1.1"`: what browsers behind
   * proxies and plain curl use, and the path most likely to differ from gRPC's.
   */
  httpVersion?: "1.1" | "2";
  /** Protobuf binary (default) or JSON (`false`; Connect and gRPC-Web only). */
  useBinaryFormat?: boolean;
  /** A deadline for every call unless the call sets its own. Default 10 s. */
  defaultTimeoutMs?: number;
}

/** A protocol a test runs a case on, with the name its cases carry. */
export interface NamedProtocol {
  name: string;
  options: ConnectClientOptions;
}

/** Each protocol and format once: gRPC, gRPC-Web, Connect binary and Connect JSON, over HTTP/2 and HTTP/1.1 between them. */
export const PROTOCOLS: readonly NamedProtocol[] = [
  { name: "gRPC", options: { protocol: "grpc" } },
  { name: "gRPC-Web HTTP/1.1", options: { protocol: "grpc-web", httpVersion: "1.1" } },
  { name: "Connect binary HTTP/2", options: { protocol: "connect", httpVersion: "2" } },
  { name: "Connect JSON HTTP/1.1", options: { protocol: "connect", httpVersion: "1.1", useBinaryFormat: false } },
];

/** Every protocol and format on every HTTP version it runs on. */
export const EVERY_PROTOCOL: readonly NamedProtocol[] = [
  { name: "gRPC", options: { protocol: "grpc" } },
  ...(["1.1", "2"] as const).flatMap((httpVersion): NamedProtocol[] => [
    { name: `gRPC-Web HTTP/${httpVersion}`, options: { protocol: "grpc-web", httpVersion } },
    { name: `Connect binary HTTP/${httpVersion}`, options: { protocol: "connect", httpVersion } },
    { name: `Connect JSON HTTP/${httpVersion}`, options: { protocol: "connect", httpVersion, useBinaryFormat: false } },
  ]),
];

const closers = new WeakMap<object, () => void>();

/**
 * A connect-node client of `service` at `url` (`http://…` or `unix:/path`) over the given protocol.
 *
 * ```ts
 * const client = connectClient(SessionService, service.url("sessions"), { protocol: "grpc", token });
 * await client.getSnapshot({ sessionId: "s1" });
 * ```
 */
export function connectClient<S extends DescService>(service: S, url: string, options: ConnectClientOptions): Client<S> {
  const httpVersion = options.protocol === "grpc" ? "2" : (options.httpVersion ?? "1.1");
  const socketPath = url.startsWith("unix:") ? url.slice("unix:".length) : undefined;
  const baseUrl = socketPath === undefined ? url : "http://localhost";
  const headerInterceptor: Interceptor = (next) => async (req) => {
    if (options.token !== undefined) req.header.set("authorization", `Bearer ${options.token}`);
    for (const [name, value] of Object.entries(options.headers ?? {})) req.header.set(name, value);
    return next(req);
  };
  const common = {
    baseUrl,
    interceptors: [headerInterceptor],
    defaultTimeoutMs: options.defaultTimeoutMs ?? DEFAULT_DEADLINE_MS,
    ...(options.useBinaryFormat === undefined ? {} : { useBinaryFormat: options.useBinaryFormat }),
  };

  let transport: Transport;
  let close: () => void;
  if (httpVersion === "2") {
    // An explicit session manager, so the connection can be closed when the test is done rather
    // than idling until the server's shutdown has to drop it.
    const sessionManager = new Http2SessionManager(baseUrl, {}, socketPath === undefined ? {} : { createConnection: () => net.connect(socketPath) });
    close = () => sessionManager.abort();
    if (options.protocol === "grpc") transport = createGrpcTransport({ ...common, sessionManager });
    else if (options.protocol === "grpc-web") transport = createGrpcWebTransport({ ...common, httpVersion: "2", sessionManager });
    else transport = createConnectTransport({ ...common, httpVersion: "2", sessionManager });
  } else {
    const agent = new http.Agent({ keepAlive: true });
    close = () => agent.destroy();
    const nodeOptions: http.RequestOptions = socketPath === undefined ? { agent } : { agent, socketPath };
    if (options.protocol === "grpc-web") transport = createGrpcWebTransport({ ...common, httpVersion: "1.1", nodeOptions });
    else transport = createConnectTransport({ ...common, httpVersion: "1.1", nodeOptions });
  }
  const client = createClient(service, transport);
  closers.set(client, close);
  onStopAll(close);
  return client;
}

/** Closes the connections of a client made by {@link connectClient} (stopAll does it otherwise). */
export function closeClient(client: object): void {
  closers.get(client)?.();
}

/** The error a call that must fail ended with; throws when it succeeded. */
export const callFailure = connectFailure;
