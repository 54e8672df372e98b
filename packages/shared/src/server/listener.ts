/**
 * One port (or unix socket) for gRPC, gRPC-Web and Connect, over HTTP/2 and HTTP/1.1.
 *
 * Node's `http2.createServer({ allowHTTP1 })` only falls back to HTTP/1.1 under TLS, so in
 * cleartext a plain `net.Server` peeks at each connection's first bytes: the HTTP/2 client preface
 * goes to an `http2` server, anything else to an `http` server, both running the same handler.
 *
 * Descriptors: the connections of every listener in the process together take at most their share
 * of the process's descriptor limit (`descriptorShares` in descriptors.ts); the rest is kept for the
 * service's own files, so a flood of clients (a runaway script, `ulimit -n` set low) cannot leave it
 * unable to open a journal or a lock file. A few spare connections over that share are accepted
 * for a moment: each is served by the spare handler (health answered, every other call refused
 * RESOURCE_EXHAUSTED TOO_MANY_OPEN_FILES) and closed once answered. Beyond those, the oldest spare
 * connection is dropped for the new one.
 *
 * Why spare connections rather than the reserve descriptor of nginx's advice (keep one open, close
 * it to accept and answer when accept(2) fails with EMFILE): the kernel refuses accept(2) only once
 * every descriptor is gone, files included, and then a health check's answer would be a journal's
 * refusal; libuv already keeps such a reserve to close connections it cannot take, but can answer
 * none. Counting connections ourselves refuses them before the limit is reached, with an answer a
 * client understands, and a health checker's fresh connection always finds a spare slot: the oldest
 * one goes for it, and a spare connection lives only until its first answer (a few milliseconds)
 * or {@link SPARE_CONNECTION_MS}, so a crowd that connects and says nothing cannot keep one.
 */
import * as fs from "node:fs";
import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import { setDefaultHighWaterMark } from "node:stream";
import type { connectNodeAdapter } from "@connectrpc/connect-node";
import { systemClock } from "../clock.js";
import { endCallWhenClientLeaves } from "./client-left.js";
import { descriptorLimit, descriptorShares, isDescriptorExhaustion, relieveDescriptorShortage } from "../descriptors.js";
import type { Logger } from "../logger.js";

/** Where a listener accepts connections. */
export type ListenAddress = { readonly host: string; readonly port: number } | { readonly socket: string };

/** Server-side HTTP/2 keepalive: a PING every `pingIntervalMs`; no ACK within `pingTimeoutMs` drops the connection. */
export interface KeepaliveOptions {
  readonly pingIntervalMs: number;
  readonly pingTimeoutMs: number;
}

/** Pings often enough to keep NAT/proxy state and notice a dead peer within a minute. */
export const DEFAULT_KEEPALIVE: KeepaliveOptions = { pingIntervalMs: 30_000, pingTimeoutMs: 10_000 };

/** The request handler `connectNodeAdapter` returns: fits both `http` and `http2` servers. */
export type NodeRequestHandler = ReturnType<typeof connectNodeAdapter>;

/** Options of `listen`. */
export interface ListenOptions {
  /** The request handler both HTTP servers run (a `connectNodeAdapter` result). */
  readonly handler: NodeRequestHandler;
  /** Default `127.0.0.1`. */
  readonly host?: string;
  /** Default 0 (an ephemeral port, for tests). */
  readonly port?: number;
  /** A unix socket path to listen on instead of host/port; created with mode 0600. */
  readonly socket?: string;
  readonly keepalive?: KeepaliveOptions;
  readonly logger?: Logger;
  /**
   * Serves the requests of spare connections (those over `maxConnections`): it should answer
   * health checks and refuse the rest quickly. Without it, a connection over the limit is closed
   * as soon as it is accepted.
   */
  readonly spareHandler?: NodeRequestHandler;
  /** The most connections the process's listeners keep open together; default its share of the descriptor limit (`descriptorShares`). */
  readonly maxConnections?: number;
  /** The most spare connections the process's listeners keep open together; default its share of the descriptor limit. */
  readonly spareConnections?: number;
}

/** A listening server and the controls for shutting it down in steps. */
export interface Listener {
  readonly address: ListenAddress;
  /** HTTP requests (RPCs, `/metrics`) being served now. */
  readonly activeRequests: number;
  /** Open client connections. */
  readonly connections: number;
  /**
   * Accept no new connection; send GOAWAY on every HTTP/2 connection (their open streams go on,
   * and the connection closes after the last one); HTTP/1.1 connections close after their
   * current request.
   */
  stopAccepting(): void;
  /**
   * Resolves true once every connection has closed (after `stopAccepting`, that is once every
   * call has ended and its last bytes are out), false if that takes longer than `timeoutMs`.
   */
  drained(timeoutMs: number): Promise<boolean>;
  /** Drops every connection at once; resolves when the listening socket is closed. */
  destroy(): Promise<void>;
}

/** The first bytes of every HTTP/2 connection (RFC 9113, section 3.4). */
const HTTP2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

/** A connection that sends nothing for this long before we can tell its protocol is dropped. */
const FIRST_BYTES_TIMEOUT_MS = 30_000;

/** How long an HTTP/2 client has, after its preface, to complete its first SETTINGS frame. */
export const HANDSHAKE_TIMEOUT_MS = 3_000;

/**
 * How many connections the kernel may hold completed for the service before it accepts them
 * (capped by net.core.somaxconn, 4096 on current kernels). Node's default, 511, overflowed when a
 * thousand clients connected at once to a service busy on a loaded machine: the kernel then drops
 * the handshake's last ACK, and a client that believes itself connected waits for TCP's
 * retransmissions, up to two minutes, before its first byte is read. Such a burst now waits in the
 * queue for the accept loop, which answers each (spare connections included) within moments.
 */
export const LISTEN_BACKLOG = 4096;

/** How long a spare connection (one over the share of connections) may stay open before its answer. */
export const SPARE_CONNECTION_MS = 2_000;

/** Open connections of every listener in this process (what `DescriptorShares.connections` bounds). */
let processConnections = 0;
/** Spare connections of every listener in this process, oldest first: each one's `drop`. */
const processSpares = new Set<() => void>();

/** How often, at most, a refusal for want of descriptors is logged (with how many since the last line). */
const REFUSAL_LOG_INTERVAL_MS = 1000;

/**
 * What each response stream buffers before its writer waits for the peer: 16 KiB, Node 20's
 * default. Node 22 raised the default to 64 KiB, which would let a stalled watcher take four times
 * the memory and many more unread changes before berth's own bounded buffer sees it fall behind
 * (WATCHER_LAGGED): pinned, a service behaves the same on every Node.
 */
export const STREAM_HIGH_WATER_MARK = 16 * 1024;

/** Starts listening; rejects with a clear message when the port or socket is taken. */
export async function listen(options: ListenOptions): Promise<Listener> {
  // Process-wide: HTTP/2 streams take the default; no option sets it per server.
  setDefaultHighWaterMark(false, STREAM_HIGH_WATER_MARK);
  const keepalive = options.keepalive ?? DEFAULT_KEEPALIVE;
  const logger = options.logger;
  const sockets = new Set<net.Socket>();
  const sessions = new Set<http2.ServerHttp2Session>();
  /** Connections whose protocol is not known yet (no bytes seen). */
  const unclassified = new Set<net.Socket>();
  let active = 0;
  let stopping = false;
  let idleWaiters: Array<() => void> = [];

  const requestEnded = () => {
    active--;
  };
  const socketClosed = (socket: net.Socket) => {
    sockets.delete(socket);
    unclassified.delete(socket);
    if (sockets.size === 0 && idleWaiters.length > 0) {
      const waiters = idleWaiters;
      idleWaiters = [];
      for (const resolve of waiters) resolve();
    }
  };

  /** The HTTP/2 and HTTP/1.1 servers running `handler`; `afterEachAnswer` closes a connection once a response is done. */
  const httpServers = (handler: NodeRequestHandler, afterEachAnswer: boolean) => {
    const h2 = http2.createServer(
      {
        // Large messages (up to the size limit) and many concurrent streams per connection: a
        // 64 KiB window would cap a stream at one window per round trip.
        settings: { initialWindowSize: 1 << 20, maxConcurrentStreams: 10_000 },
        maxSessionMemory: 64,
      },
      (req, res) => {
        active++;
        res.once("close", requestEnded);
        // GOAWAY before the answer, so that the client reads it first and sends its next call on a
        // new connection (one sent on this connection after it would be refused, REFUSED_STREAM):
        // the streams already open are answered, then the connection closes.
        if (afterEachAnswer) req.stream.session?.close();
        handler(req, res);
      },
    );
    // No idle timeout: a watch stream may be silent for hours. Dead peers are found by pings.
    h2.setTimeout(0);
    h2.on("session", (session) => {
      sessions.add(session);
      try {
        session.setLocalWindowSize(8 << 20);
      } catch {
        // The session may already be closing; the default window still works.
      }
      // RFC 9113 §3.4: the preface is followed by a SETTINGS frame. A peer that sent the preface
      // and then bytes that never complete one (a frame header announcing megabytes, then its end
      // of input, which the session does not see in the middle of a frame) would otherwise hold the
      // connection until the keepalive gave up on it.
      let settled = false;
      session.once("remoteSettings", () => (settled = true));
      // Judged once the I/O is read: after a pause of the service, the SETTINGS may be waiting in the socket.
      const handshake = setTimeout(() => systemClock.whenAwake(() => session.destroyed || settled || session.destroy()), HANDSHAKE_TIMEOUT_MS);
      handshake.unref();
      session.once("remoteSettings", () => clearTimeout(handshake));
      session.once("close", () => clearTimeout(handshake));
      const stopPinging = startKeepalive(session, keepalive, logger);
      session.once("close", () => {
        stopPinging();
        sessions.delete(session);
      });
      session.on("error", (error) => logger?.debug({ err: error }, "http2 session error"));
      if (stopping) session.close();
    });
    h2.on("sessionError", (error) => logger?.debug({ err: error }, "http2 session error"));

    const h1 = http.createServer({ keepAliveTimeout: 5_000 }, (req, res) => {
      active++;
      const socket = req.socket;
      h1Sockets.set(socket, (h1Sockets.get(socket) ?? 0) + 1);
      res.once("close", () => {
        const left = (h1Sockets.get(socket) ?? 1) - 1;
        if (h1Sockets.has(socket)) h1Sockets.set(socket, left);
        if (stopping && left === 0) socket.end();
        requestEnded();
      });
      if (stopping || afterEachAnswer) res.setHeader("connection", "close");
      // A response sent before its request was read to the end (an oversized stream message refused
      // at its length prefix) leaves the rest of that body unread: connect destroyed the request
      // stream when it stopped reading, the socket stays paused, and the next request on this
      // keep-alive connection would wait behind it until the request timeout. Discard the rest the
      // way Node discards a body nobody read (`_dump`: drop the chunks, don't pause), and read on.
      res.once("finish", () => {
        if (req.complete) return;
        (req as http.IncomingMessage & { _dump?: () => void })._dump?.();
        if (!socket.destroyed) socket.resume();
      });
      handler(req, res);
      // Its connection's end must end the call before anything is handed to it (see client-left.ts).
      endCallWhenClientLeaves(req, res);
    });
    h1.on("clientError", (error: NodeJS.ErrnoException, socket: net.Socket) => {
      logger?.debug({ err: error }, "bad http/1.1 request");
      if (socket.writable && error.code !== "ECONNRESET") {
        socket.end("HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
      } else {
        socket.destroy();
      }
    });
    return { h2, h1 };
  };

  // HTTP/1.1 connections and how many requests each is serving, to close the idle ones at shutdown.
  const h1Sockets = new Map<net.Socket, number>();
  const served = httpServers(options.handler, false);
  const spare = options.spareHandler === undefined ? undefined : httpServers(options.spareHandler, true);

  const shares = descriptorShares(descriptorLimit());
  const maxConnections = options.maxConnections ?? shares.connections;
  const maxSpares = spare === undefined ? 0 : (options.spareConnections ?? shares.spareConnections);
  let refused = 0;
  let refusalLoggedAt = Number.NEGATIVE_INFINITY;
  const refuse = (why: string, error?: Error) => {
    refused++;
    const now = performance.now();
    if (now - refusalLoggedAt < REFUSAL_LOG_INTERVAL_MS) return;
    refusalLoggedAt = now;
    logger?.warn(
      { refused, connections: processConnections, maxConnections, spareConnections: processSpares.size, ...(error ? { err: error } : {}) },
      `refused connections: ${why}`,
    );
    refused = 0;
  };

  /** Takes a connection over the share as a spare one, dropping the oldest spare if they are all taken; false when there are none. */
  const takeSpare = (socket: net.Socket): boolean => {
    if (maxSpares <= 0) return false;
    if (processSpares.size >= maxSpares) {
      const oldest = processSpares.values().next().value;
      oldest?.();
      refuse("too many open connections; the oldest spare connection was dropped for a new one");
    }
    const drop = () => {
      processSpares.delete(drop);
      socket.destroy();
    };
    processSpares.add(drop);
    const deadline = setTimeout(drop, SPARE_CONNECTION_MS);
    deadline.unref();
    socket.once("close", () => {
      clearTimeout(deadline);
      processSpares.delete(drop);
    });
    return true;
  };

  const server = net.createServer({ noDelay: true }, (socket) => {
    if (stopping) {
      socket.destroy();
      return;
    }
    let servers = served;
    if (processConnections < maxConnections) {
      processConnections++;
      socket.once("close", () => processConnections--);
    } else if (spare !== undefined && takeSpare(socket)) {
      servers = spare;
    } else {
      socket.destroy();
      refuse("too many open connections; the rest of the descriptor limit is kept for the service's own files");
      return;
    }
    sockets.add(socket);
    unclassified.add(socket);
    socket.once("close", () => socketClosed(socket));
    // Errors before the hand-off (a reset while we peek) must not crash the process; after it,
    // the HTTP servers handle them.
    const onEarlyError = (error: Error) => logger?.debug({ err: error }, "connection error before the first request");
    socket.on("error", onEarlyError);
    socket.setTimeout(FIRST_BYTES_TIMEOUT_MS, () => systemClock.whenAwake(() => unclassified.has(socket) && socket.destroy()));

    let buffered: Buffer = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buffered = buffered.length === 0 ? chunk : Buffer.concat([buffered, chunk]);
      const n = Math.min(buffered.length, HTTP2_PREFACE.length);
      const looksLikeHttp2 = buffered.subarray(0, n).equals(HTTP2_PREFACE.subarray(0, n));
      if (looksLikeHttp2 && buffered.length < HTTP2_PREFACE.length) return; // not enough bytes yet
      socket.off("data", onData);
      socket.off("error", onEarlyError);
      unclassified.delete(socket);
      socket.setTimeout(0);
      socket.pause();
      socket.unshift(buffered);
      if (looksLikeHttp2) {
        // The http2 session reads what was unshifted from the socket's buffer before its handle.
        servers.h2.emit("connection", socket);
      } else {
        h1Sockets.set(socket, 0);
        socket.once("close", () => h1Sockets.delete(socket));
        servers.h1.emit("connection", socket);
        // The http parser consumes the handle; without resume() the unshifted request never flows.
        socket.resume();
      }
    };
    socket.on("data", onData);
  });

  const address = await bind(server, options);
  // From now on an error of the listening socket is an accept(2) that failed (every descriptor
  // taken: EMFILE, ENFILE). Node would throw it, ending the process; the connection is lost either
  // way (libuv accepts and closes it with the descriptor it keeps in reserve). Idle files are
  // closed, so the client's retry is taken.
  server.on("error", (error) => {
    if (isDescriptorExhaustion(error)) relieveDescriptorShortage();
    refuse("accept failed", error);
  });

  return {
    address,
    get activeRequests() {
      return active;
    },
    get connections() {
      return sockets.size;
    },
    stopAccepting() {
      if (stopping) return;
      stopping = true;
      server.close();
      for (const socket of unclassified) socket.destroy();
      for (const session of sessions) session.close();
      // Idle HTTP/1.1 keep-alive connections would otherwise linger until their timeout.
      for (const [socket, requests] of h1Sockets) if (requests === 0) socket.end();
    },
    drained(timeoutMs) {
      if (sockets.size === 0) return Promise.resolve(true);
      return new Promise<boolean>((resolve) => {
        const timer = setTimeout(() => {
          idleWaiters = idleWaiters.filter((w) => w !== onIdle);
          resolve(false);
        }, timeoutMs);
        timer.unref();
        const onIdle = () => {
          clearTimeout(timer);
          resolve(true);
        };
        idleWaiters.push(onIdle);
      });
    },
    async destroy() {
      stopping = true;
      const closed = new Promise<void>((resolve) => {
        if (!server.listening) return resolve();
        server.close(() => resolve());
      });
      for (const session of sessions) session.destroy();
      for (const socket of sockets) socket.destroy();
      await closed;
      if ("socket" in address) removeSocketFile(address.socket);
    },
  };
}

/** Pings the peer every interval; destroys the session when an ACK is overdue. Returns the stopper. */
function startKeepalive(session: http2.ServerHttp2Session, options: KeepaliveOptions, logger: Logger | undefined): () => void {
  let overdue: NodeJS.Timeout | undefined;
  const interval = setInterval(() => {
    if (session.destroyed || session.closed || overdue !== undefined) return;
    const timer = setTimeout(() => {
      // After a pause of the service the ACK may be in the socket, unread: judge once it is read.
      systemClock.whenAwake(() => {
        if (overdue !== timer || session.destroyed) return;
        logger?.warn({ timeoutMs: options.pingTimeoutMs }, "http2 keepalive ping not acknowledged: dropping the connection");
        session.destroy();
      });
    }, options.pingTimeoutMs);
    overdue = timer;
    overdue.unref();
    const sent = session.ping(() => {
      // An error here means the session is going away; either way this ping is settled.
      clearTimeout(overdue);
      overdue = undefined;
    });
    if (!sent) {
      clearTimeout(overdue);
      overdue = undefined;
    }
  }, options.pingIntervalMs);
  interval.unref();
  return () => {
    clearInterval(interval);
    clearTimeout(overdue);
  };
}

async function bind(server: net.Server, options: ListenOptions): Promise<ListenAddress> {
  if (options.socket !== undefined) {
    const path = options.socket;
    await removeStaleSocket(path);
    // The socket file is created by bind(2) with the process umask: narrow it for that call so
    // the socket is never reachable by others, not even for a moment.
    const previous = trySetUmask(0o177);
    try {
      await listenOn(server, { path }, `unix socket ${path}`);
    } finally {
      if (previous !== undefined) trySetUmask(previous);
    }
    fs.chmodSync(path, 0o600);
    return { socket: path };
  }
  const host = options.host ?? "127.0.0.1";
  await listenOn(server, { host, port: options.port ?? 0 }, `${host}:${options.port ?? 0}`);
  const bound = server.address() as net.AddressInfo;
  return { host, port: bound.port };
}

function listenOn(server: net.Server, options: net.ListenOptions, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (error: NodeJS.ErrnoException) => {
      server.off("listening", onListening);
      if (error.code === "EADDRINUSE") {
        reject(new Error(`cannot listen on ${what}: it is already in use (another berth server, or set another port/socket)`, { cause: error }));
      } else if (error.code === "EACCES") {
        reject(new Error(`cannot listen on ${what}: permission denied`, { cause: error }));
      } else {
        reject(new Error(`cannot listen on ${what}: ${error.message}`, { cause: error }));
      }
    };
    const onListening = () => {
      server.off("error", onError);
      resolve();
    };
    server.once("error", onError);
    server.once("listening", onListening);
    server.listen({ ...options, backlog: LISTEN_BACKLOG });
  });
}

/** A socket file left by a dead server is removed; one that still answers means a live server. */
async function removeStaleSocket(path: string): Promise<void> {
  let stat: fs.Stats;
  try {
    stat = fs.lstatSync(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw error;
  }
  if (!stat.isSocket()) throw new Error(`cannot listen on unix socket ${path}: a file that is not a socket is in the way`);
  const live = await new Promise<boolean>((resolve) => {
    const probe = net.connect({ path });
    probe.once("connect", () => {
      probe.destroy();
      resolve(true);
    });
    probe.once("error", () => resolve(false));
  });
  if (live) throw new Error(`cannot listen on unix socket ${path}: another server is listening on it`);
  fs.unlinkSync(path);
}

function removeSocketFile(path: string): void {
  try {
    fs.unlinkSync(path);
  } catch {
    // Already gone (Node removes it when the server closes).
  }
}

/** `process.umask(mask)`; undefined where it cannot be set (worker threads). */
function trySetUmask(mask: number): number | undefined {
  try {
    return process.umask(mask);
  } catch {
    return undefined;
  }
}

/** The base URL clients use: `http://host:port` (IPv6 in brackets) or `unix:/path`. */
export function urlOf(address: ListenAddress): string {
  if ("socket" in address) return `unix:${address.socket}`;
  const host = address.host.includes(":") ? `[${address.host}]` : address.host;
  return `http://${host}:${address.port}`;
}
