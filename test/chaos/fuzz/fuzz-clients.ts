/**
 * The fuzzer's clients: hand-made on node:http2, node:http and node:net rather than a gRPC or
 * Connect library, because a library refuses to send what the fuzzer is here to send (a truncated
 * envelope, a compressed flag without an encoding, a bidi call over HTTP/1.1, bytes that are not
 * HTTP at all). Every call ends in an {@link Answer}: the status the server gave, in one vocabulary
 * for both protocols, or what the client saw instead (no answer in time, a broken connection).
 */
import * as http from "node:http";
import * as http2 from "node:http2";
import * as net from "node:net";
import { answerOf, countMessages, type Answer, type WireRequest } from "./fuzz-framing.js";

/**
 * One HTTP/2 connection, reopened when it fails. Each fuzzing lane owns one, so a connection that a
 * case breaks (on purpose or not) never fails another lane's call.
 */
export class Http2Lane {
  private session: http2.ClientHttp2Session | undefined;
  /** Connections this lane had to open again after one was lost (GOAWAY, reset, error) or retired. */
  reconnects = 0;
  private abandonedUploads = 0;

  constructor(private readonly url: string) {}

  private connect(): http2.ClientHttp2Session {
    if (this.session !== undefined && !this.session.closed && !this.session.destroyed) return this.session;
    if (this.session !== undefined) this.reconnects++;
    // Node counts a cancelled stream's unsent request bytes against the client session's memory
    // for good (its accounting, not the server's): sessions that abandoned uploads are replaced
    // (see `call`), and the limit is generous meanwhile.
    const session = http2.connect(this.url, { maxSessionMemory: 1024, settings: { enablePush: false } });
    session.on("error", () => {}); // surfaces on the streams; a lost connection is reopened on the next call
    session.on("goaway", () => session.close());
    session.unref();
    this.session = session;
    return session;
  }

  /** Sends `request` on this lane's connection. */
  call(request: WireRequest): Promise<Answer> {
    const started = performance.now();
    const session = this.connect();
    return new Promise<Answer>((resolve) => {
      let settled = false;
      const chunks: Buffer[] = [];
      let bodyLength = 0;
      let headers: http2.IncomingHttpHeaders = {};
      let trailers: http2.IncomingHttpHeaders = {};
      let httpStatus: number | undefined;
      let stream: http2.ClientHttp2Stream;
      let cancelTimer: NodeJS.Timeout | undefined;
      const finish = (answer: Answer) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        clearTimeout(cancelTimer);
        if (!stream.writableFinished && stream.writableLength > 0) this.abandonedUploads++;
        if (!stream.closed && !stream.destroyed) stream.close(http2.constants.NGHTTP2_CANCEL);
        if (this.abandonedUploads >= 8) {
          this.abandonedUploads = 0;
          session.close();
        }
        resolve(answer);
      };
      const elapsed = () => performance.now() - started;
      const body = () => (chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
      const timer = setTimeout(
        () =>
          finish({
            code: "hang",
            message: `no ${request.settle === "first" ? "message or status" : "status"} within ${request.timeoutMs} ms`,
            messages: [],
            httpStatus,
            elapsedMs: elapsed(),
          }),
        request.timeoutMs,
      );
      try {
        stream = session.request({ ":method": "POST", ":path": request.path, ...request.headers }, { endStream: false, waitForTrailers: false });
      } catch (error) {
        clearTimeout(timer);
        resolve({ code: "connection_error", message: `request failed: ${(error as Error).message}`, messages: [], elapsedMs: elapsed() });
        return;
      }
      stream.on("response", (h) => {
        headers = h;
        httpStatus = Number(h[":status"]);
      });
      stream.on("trailers", (t) => (trailers = t));
      stream.on("data", (chunk: Buffer) => {
        chunks.push(chunk);
        bodyLength += chunk.byteLength;
        if (request.settle === "first" && countMessages(request, headers, body()) > 0) {
          finish({ code: "client_cancelled", message: "cancelled after the first message", messages: [], httpStatus, elapsedMs: elapsed() });
        }
      });
      stream.on("error", () => {}); // judged on close: a reset after a status is fine, one without is not
      // The server may end its side while ours is still open (a bidi call the client goes on with, or
      // a large body the server refused before reading it all): its answer is complete then.
      stream.on("end", () => {
        if (httpStatus === undefined) return; // no response at all: judged on close, with the reset code
        finish(answerOf(request, { httpStatus, headers, trailers, body: body() }, elapsed()));
      });
      stream.on("close", () => {
        if (settled) return;
        if (httpStatus === undefined) {
          const lost = session.destroyed || session.closed;
          finish({
            code: lost ? "connection_error" : "no_status",
            message: `${lost ? "connection lost" : "stream closed"} before any response (RST code ${stream.rstCode})`,
            messages: [],
            elapsedMs: elapsed(),
          });
          return;
        }
        const answer = answerOf(request, { httpStatus, headers, trailers, body: body() }, elapsed());
        if (answer.code === "no_status" && stream.rstCode !== undefined && stream.rstCode !== http2.constants.NGHTTP2_NO_ERROR) {
          const lost = session.destroyed || session.closed;
          finish({
            ...answer,
            code: lost ? "connection_error" : "no_status",
            message: `${lost ? "connection lost" : "stream reset"} (RST code ${stream.rstCode}) before any status; ${bodyLength} body bytes`,
          });
          return;
        }
        finish(answer);
      });
      if (typeof request.settle === "number") {
        cancelTimer = setTimeout(
          () => finish({ code: "client_cancelled", message: `cancelled after ${request.settle} ms`, messages: [], httpStatus, elapsedMs: elapsed() }),
          request.settle,
        );
      }
      void writeAll(stream, request.chunks).then(() => {
        if (request.requestEnd === "end" && !stream.destroyed) stream.end();
      });
    });
  }

  close(): void {
    this.session?.destroy();
    this.session = undefined;
  }
}

/** Writes chunks in order, honouring backpressure; stops quietly when the stream goes away. */
async function writeAll(stream: NodeJS.WritableStream & { destroyed: boolean; writableEnded?: boolean }, chunks: readonly Uint8Array[]): Promise<void> {
  for (const chunk of chunks) {
    if (stream.destroyed) return;
    const ok = stream.write(chunk);
    if (!ok) {
      await new Promise<void>((resolve) => {
        const done = () => {
          stream.removeListener("drain", done);
          stream.removeListener("close", done);
          resolve();
        };
        stream.once("drain", done);
        stream.once("close", done);
      });
    }
  }
}

/**
 * HTTP/1.1 requests for the Connect protocol, over a keep-alive pool shared by every lane. Idle
 * sockets are dropped after 2 s, well before the server's keep-alive timeout (5 s), and a request
 * that fails on a reused socket before any answer (the server closed it while idle: a race every
 * keep-alive client has) is sent once more on a fresh one and counted in `keepAliveRetries`.
 */
export class Http1Client {
  private readonly agent = new http.Agent({ keepAlive: true, maxSockets: 16, timeout: 2_000 });
  private readonly target: URL;
  keepAliveRetries = 0;

  constructor(url: string) {
    this.target = new URL(url);
  }

  async call(request: WireRequest): Promise<Answer> {
    const first = await this.once(request, this.agent);
    if (!first.retry) return first.answer;
    this.keepAliveRetries++;
    return (await this.once(request, false)).answer;
  }

  private once(request: WireRequest, agent: http.Agent | false): Promise<{ answer: Answer; retry: boolean }> {
    const started = performance.now();
    return new Promise((resolve) => {
      let settled = false;
      const chunks: Buffer[] = [];
      let response: http.IncomingMessage | undefined;
      let cancelTimer: NodeJS.Timeout | undefined;
      const elapsed = () => performance.now() - started;
      const body = () => Buffer.concat(chunks);
      const finish = (answer: Answer, retry = false) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        clearTimeout(cancelTimer);
        // A socket whose request is not fully written (the server answered early) or whose answer
        // is not fully read must not go back to the pool.
        if (!req.destroyed && (!req.writableFinished || response?.complete !== true)) req.destroy();
        lastOf(answer.code);
        resolve({ answer, retry });
      };
      let history = "no socket yet";
      let lastOf: (code: string) => void = () => {};
      const timer = setTimeout(
        () =>
          finish({
            code: "hang",
            message: `no answer within ${request.timeoutMs} ms (${history}, request written: ${req.writableFinished})`,
            messages: [],
            httpStatus: response?.statusCode,
            elapsedMs: elapsed(),
          }),
        request.timeoutMs,
      );
      const req = http.request({
        host: this.target.hostname,
        port: this.target.port,
        method: "POST",
        path: request.path,
        agent,
        headers: request.headers,
      });
      req.on("socket", (socket: net.Socket & { berthFuzzLast?: string }) => {
        history = `${req.reusedSocket ? `reused socket, before: ${socket.berthFuzzLast}` : "fresh socket"}; body ${request.chunks.reduce((n, c) => n + c.byteLength, 0)} bytes`;
        const head = Buffer.concat(request.chunks.map((c) => Buffer.from(c)))
          .subarray(0, 200)
          .toString("hex");
        socket.berthFuzzLast = `${request.path} ${JSON.stringify(request.headers)} body ${head}`;
        lastOf = (code) => (socket.berthFuzzLast += ` answered ${code}`);
      });
      req.on("response", (res) => {
        response = res;
        res.on("data", (chunk: Buffer) => {
          chunks.push(chunk);
          if (request.settle === "first" && countMessages(request, res.headers, body()) > 0) {
            finish({ code: "client_cancelled", message: "cancelled after the first message", messages: [], httpStatus: res.statusCode, elapsedMs: elapsed() });
          }
        });
        res.on("end", () =>
          finish({ ...answerOf(request, { httpStatus: res.statusCode, headers: res.headers, trailers: res.trailers, body: body() }, elapsed()) }),
        );
        res.on("error", () => {});
        res.on("close", () => {
          if (!res.complete)
            finish({ code: "connection_error", message: "the response was cut off", messages: [], httpStatus: res.statusCode, elapsedMs: elapsed() });
        });
      });
      req.on("error", (error: NodeJS.ErrnoException) => {
        // An answer already received counts, even if the server then closed the socket under the rest of our body.
        if (response !== undefined) return;
        const retry = req.reusedSocket && (error.code === "ECONNRESET" || error.code === "EPIPE");
        const uploading = request.chunks.reduce((n, c) => n + c.byteLength, 0);
        if (!retry && (error.code === "EPIPE" || error.code === "ECONNRESET") && request.bidi) {
          // connect answers a bidi call over HTTP/1.1 with 505 and "Connection: close" before
          // reading the body, and Node closes the socket under the rest of the upload, so the
          // client may meet the reset before it reads the 505 — with a 200 KB body as with 4 MB,
          // and even once the request reports finished (its bytes may still sit in the socket's
          // buffer). Not a server failure (health is checked after every batch): counted apart.
          finish({
            code: "closed_during_upload",
            message: `${error.code} during a ${uploading}-byte upload of a bidi call over HTTP/1.1`,
            messages: [],
            elapsedMs: elapsed(),
          });
          return;
        }
        if (!retry && (error.code === "EPIPE" || error.code === "ECONNRESET") && (req.socket?.bytesRead ?? 0) > 0) {
          // The server answered and hung up while the client was still uploading (a 505 for a
          // stream over HTTP/1.1, a refusal of an oversized body): HTTP/1.1 allows that, and
          // Node's client loses the answer to the write error. The bytes arrived; the call was answered.
          finish({
            code: "answered_then_closed",
            message: `${req.socket?.bytesRead} bytes of answer, then the server closed the connection during a ${uploading}-byte upload`,
            messages: [],
            elapsedMs: elapsed(),
          });
          return;
        }
        finish(
          {
            code: "connection_error",
            message: `request failed: ${error.message} (${req.reusedSocket ? "reused" : "fresh"} socket, ${uploading} body bytes)`,
            messages: [],
            elapsedMs: elapsed(),
          },
          retry,
        );
      });
      if (typeof request.settle === "number") {
        cancelTimer = setTimeout(
          () => finish({ code: "client_cancelled", message: `cancelled after ${request.settle} ms`, messages: [], elapsedMs: elapsed() }),
          request.settle,
        );
      }
      void writeAll(req, request.chunks).then(() => {
        if (!req.destroyed) req.end();
      });
    });
  }

  close(): void {
    this.agent.destroy();
  }
}

/** What a server did with bytes that are not a valid request at all. */
export interface SocketAnswer {
  /** `closed` (the server hung up), `answered` (it sent bytes and then hung up), or `hang`. */
  readonly outcome: "closed" | "answered" | "hang" | "error";
  readonly firstBytes: string;
  readonly elapsedMs: number;
}

/**
 * Opens a TCP connection, writes `bytes`, half-closes, and waits for the server to close it. A
 * server may answer (HTTP 400, an HTTP/2 GOAWAY) or just hang up; keeping the connection open after
 * the client has nothing more to send is a hang.
 */
export function rawSocketCall(url: string, bytes: Uint8Array, timeoutMs: number): Promise<SocketAnswer> {
  const target = new URL(url);
  const started = performance.now();
  return new Promise((resolve) => {
    let received = Buffer.alloc(0);
    let settled = false;
    const socket = net.connect({ host: target.hostname, port: Number(target.port) });
    const finish = (outcome: SocketAnswer["outcome"]) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      socket.destroy();
      resolve({ outcome, firstBytes: received.subarray(0, 64).toString("latin1"), elapsedMs: performance.now() - started });
    };
    const timer = setTimeout(() => finish("hang"), timeoutMs);
    socket.on("connect", () => {
      socket.write(bytes);
      socket.end();
    });
    socket.on("data", (chunk: Buffer) => {
      if (received.byteLength < 4096) received = Buffer.concat([received, chunk]);
    });
    socket.on("error", () => finish(received.byteLength > 0 ? "answered" : "closed"));
    socket.on("close", () => finish(received.byteLength > 0 ? "answered" : "closed"));
  });
}
