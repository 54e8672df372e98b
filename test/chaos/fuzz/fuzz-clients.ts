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
import { brotliDecompressSync, gunzipSync } from "node:zlib";
import { fromBinary } from "@bufbuild/protobuf";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";
import { StatusSchema } from "@berth/api/google/rpc/status_pb";

/** What one request looks like on the wire. */
export interface WireRequest {
  /** `grpc`: HTTP/2 with 5-byte envelopes; `connect`: a Connect POST (unary body or streaming envelopes). */
  readonly protocol: "grpc" | "connect";
  /** 1 or 2; gRPC is always 2. */
  readonly httpVersion: 1 | 2;
  /** `/pkg.Service/Method`. */
  readonly path: string;
  /** Request headers (lower-case names), content-type included (or left out on purpose). */
  readonly headers: Readonly<Record<string, string>>;
  /** The request body, written in this order. */
  readonly chunks: readonly Uint8Array[];
  /**
   * How the client ends its side: `end` half-closes after the body; `open` keeps the request open
   * (a bidi stream that goes on sending) until the call is settled.
   */
  readonly requestEnd: "end" | "open";
  /**
   * When the client stops listening: `status` waits for the server to end the call; `first` cancels
   * (RST_STREAM CANCEL / socket destroyed) once a first response message arrived, or waits for the
   * status if it comes first; a number cancels after that many ms whatever arrived.
   */
  readonly settle: "status" | "first" | number;
  /** No status (and, for `first`, no message) after this long is a hang. */
  readonly timeoutMs: number;
  /** Streaming Connect responses are envelopes; unary ones are one body. */
  readonly streamingResponse: boolean;
  /** The method streams both ways (over HTTP/1.1 the server refuses it with 505 and closes). */
  readonly bidi?: boolean;
}

/**
 * The outcome of a call. `code` is a gRPC/Connect code name in Connect's spelling (`ok`,
 * `invalid_argument`, `internal`...), or one of: `http_<status>` (an HTTP refusal without an RPC
 * status: 415, 405, 505...), `client_cancelled` (the client stopped listening, by plan, after
 * `messages` messages), `hang` (no answer within the timeout), `no_status` (the server ended the
 * call without any status), `connection_error` (the connection failed under the call).
 */
export interface Answer {
  readonly code: string;
  readonly message: string;
  /** The reason of the error's `google.rpc.ErrorInfo`; undefined without one (and for `ok`). */
  readonly reason?: string | undefined;
  /** Response messages (gRPC envelopes with flag 0 / Connect stream messages, or the unary body when ok). */
  readonly messages: readonly Uint8Array[];
  readonly httpStatus?: number | undefined;
  /** The response's content type (how `messages` are encoded). */
  readonly contentType?: string | undefined;
  readonly elapsedMs: number;
}

/** gRPC status numbers by Connect code name. */
export const CODE_NAMES = [
  "ok",
  "canceled",
  "unknown",
  "invalid_argument",
  "deadline_exceeded",
  "not_found",
  "already_exists",
  "permission_denied",
  "resource_exhausted",
  "failed_precondition",
  "aborted",
  "out_of_range",
  "unimplemented",
  "internal",
  "unavailable",
  "data_loss",
  "unauthenticated",
] as const;

/** A 5-byte-prefixed envelope (gRPC message, Connect streaming message). */
export function envelope(flags: number, payload: Uint8Array, declaredLength = payload.byteLength): Uint8Array {
  const out = new Uint8Array(5 + payload.byteLength);
  out[0] = flags & 0xff;
  new DataView(out.buffer).setUint32(1, declaredLength >>> 0);
  out.set(payload, 5);
  return out;
}

/** Splits envelopes; a trailing partial envelope is returned as `rest`. */
export function splitEnvelopes(data: Uint8Array): { envelopes: { flags: number; payload: Uint8Array }[]; rest: Uint8Array } {
  const envelopes: { flags: number; payload: Uint8Array }[] = [];
  let offset = 0;
  while (data.byteLength - offset >= 5) {
    const length = new DataView(data.buffer, data.byteOffset + offset + 1, 4).getUint32(0);
    if (data.byteLength - offset - 5 < length) break;
    envelopes.push({ flags: data[offset]!, payload: data.subarray(offset + 5, offset + 5 + length) });
    offset += 5 + length;
  }
  return { envelopes, rest: data.subarray(offset) };
}

function concat(chunks: readonly Uint8Array[]): Uint8Array {
  return Buffer.concat(chunks.map((c) => Buffer.from(c.buffer, c.byteOffset, c.byteLength)));
}

/** `grpc-message` is percent-encoded. */
function decodeGrpcMessage(value: string | string[] | undefined): string {
  const raw = Array.isArray(value) ? value.join(",") : (value ?? "");
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

function grpcCodeName(status: string | string[] | undefined): string | undefined {
  if (status === undefined) return undefined;
  const n = Number(Array.isArray(status) ? status[0] : status);
  return Number.isInteger(n) && n >= 0 && n < CODE_NAMES.length ? CODE_NAMES[n] : `bad_grpc_status_${String(status)}`;
}

const ERROR_INFO_TYPE = "google.rpc.ErrorInfo";

/** The ErrorInfo reason among Connect error details (`[{"type", "value"}]`, values in base64). */
function connectReasonOf(details: unknown): string | undefined {
  if (!Array.isArray(details)) return undefined;
  const info = (details as Array<{ type?: unknown; value?: unknown }>).find((d) => d.type === ERROR_INFO_TYPE && typeof d.value === "string");
  if (info === undefined) return undefined;
  try {
    return fromBinary(ErrorInfoSchema, Buffer.from(info.value as string, "base64")).reason;
  } catch {
    return undefined;
  }
}

/** The ErrorInfo reason in a gRPC `grpc-status-details-bin` value (a base64 google.rpc.Status). */
function grpcReasonOf(value: unknown): string | undefined {
  if (typeof value !== "string") return undefined;
  try {
    const status = fromBinary(StatusSchema, Buffer.from(value, "base64"));
    const info = status.details.find((d) => d.typeUrl.endsWith(`/${ERROR_INFO_TYPE}`));
    return info === undefined ? undefined : fromBinary(ErrorInfoSchema, info.value).reason;
  } catch {
    return undefined;
  }
}

/** A Connect error body (`{"code": "...", "message": "..."}`) → its code and message, if it is one. */
function connectErrorOf(body: Uint8Array): { code: string; message: string; reason: string | undefined } | undefined {
  try {
    const parsed = JSON.parse(Buffer.from(body).toString("utf8")) as { code?: unknown; message?: unknown; details?: unknown };
    if (typeof parsed.code === "string")
      return { code: parsed.code, message: typeof parsed.message === "string" ? parsed.message : "", reason: connectReasonOf(parsed.details) };
  } catch {
    // not JSON
  }
  return undefined;
}

/** The end-stream message of a Connect stream: `{"error": {...}}` or `{}` for success. */
function connectEndStreamOf(payload: Uint8Array): { code: string; message: string; reason?: string | undefined } {
  try {
    const parsed = JSON.parse(Buffer.from(payload).toString("utf8")) as { error?: { code?: unknown; message?: unknown; details?: unknown } };
    if (parsed.error === undefined) return { code: "ok", message: "" };
    return {
      code: typeof parsed.error.code === "string" ? parsed.error.code : "unknown",
      message: typeof parsed.error.message === "string" ? parsed.error.message : "",
      reason: connectReasonOf(parsed.error.details),
    };
  } catch {
    return { code: "bad_end_stream", message: Buffer.from(payload).toString("utf8").slice(0, 200) };
  }
}

/** What a response looked like once the call is over, turned into an Answer. */
interface RawResponse {
  httpStatus?: number;
  headers: http.IncomingHttpHeaders | http2.IncomingHttpHeaders;
  trailers: http.IncomingHttpHeaders | http2.IncomingHttpHeaders;
  body: Uint8Array;
}

/** How a response is framed, from its content type (a server may answer in another protocol than the one asked for). */
type ResponseFraming = "grpc" | "grpc-web" | "connect-stream" | "unary";

function framingOf(request: WireRequest, headers: http.IncomingHttpHeaders | http2.IncomingHttpHeaders): ResponseFraming {
  const contentType = String(headers["content-type"] ?? "");
  if (contentType.startsWith("application/grpc-web")) return "grpc-web";
  if (contentType.startsWith("application/grpc")) return "grpc";
  if (contentType.startsWith("application/connect+")) return "connect-stream";
  if (headers["grpc-status"] !== undefined) return "grpc";
  if (request.protocol === "connect" && request.streamingResponse && contentType === "") return "connect-stream";
  return "unary";
}

/** gRPC-Web carries its trailers as a last envelope (flag 0x80) of `name: value` lines. */
function grpcWebTrailers(payload: Uint8Array): Record<string, string> {
  const out: Record<string, string> = {};
  for (const line of Buffer.from(payload).toString("latin1").split("\r\n")) {
    const colon = line.indexOf(":");
    if (colon > 0) out[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
  }
  return out;
}

/**
 * A payload the server compressed (it may, when the request's accept-encoding allows), inflated;
 * a payload that does not inflate is returned as is (and fails to parse, which the judge reports).
 */
function inflate(payload: Uint8Array, encoding: unknown): Uint8Array {
  try {
    if (encoding === "gzip") return gunzipSync(payload);
    if (encoding === "br") return brotliDecompressSync(payload);
  } catch {
    // left as is
  }
  return payload;
}

/** The envelopes of a body, each payload inflated when its compressed flag is set. */
function envelopesOf(body: Uint8Array, encoding: unknown): { flags: number; payload: Uint8Array }[] {
  return splitEnvelopes(body).envelopes.map((e) => ((e.flags & 0x01) !== 0 ? { flags: e.flags, payload: inflate(e.payload, encoding) } : e));
}

function answerOf(request: WireRequest, raw: RawResponse, elapsedMs: number): Answer {
  const contentType = String(raw.headers["content-type"] ?? "");
  const base = { httpStatus: raw.httpStatus, elapsedMs, contentType };
  const framing = framingOf(request, raw.headers);
  if (framing === "grpc" || framing === "grpc-web") {
    const envelopes = envelopesOf(raw.body, raw.headers["grpc-encoding"]);
    const messages = envelopes.filter((e) => (e.flags & 0x80) === 0).map((e) => e.payload);
    const webTrailer = framing === "grpc-web" ? envelopes.find((e) => (e.flags & 0x80) !== 0) : undefined;
    const trailers: Record<string, unknown> = { ...raw.headers, ...raw.trailers, ...(webTrailer ? grpcWebTrailers(webTrailer.payload) : {}) };
    const code = grpcCodeName(trailers["grpc-status"] as string | undefined);
    if (code !== undefined) {
      const reason = grpcReasonOf(trailers["grpc-status-details-bin"]);
      return { ...base, code, message: decodeGrpcMessage(trailers["grpc-message"] as string | undefined), reason, messages };
    }
    if (raw.httpStatus !== undefined && raw.httpStatus !== 200)
      return { ...base, code: `http_${raw.httpStatus}`, message: Buffer.from(raw.body).toString("utf8").slice(0, 200), messages: [] };
    return { ...base, code: "no_status", message: `HTTP ${raw.httpStatus}, ${raw.body.byteLength} body bytes, no grpc-status`, messages };
  }
  if (framing === "connect-stream" && raw.httpStatus === 200) {
    const envelopes = envelopesOf(raw.body, raw.headers["connect-content-encoding"]);
    const end = envelopes.find((e) => (e.flags & 0x02) !== 0);
    const messages = envelopes.filter((e) => (e.flags & 0x02) === 0).map((e) => e.payload);
    if (end === undefined) return { ...base, code: "no_status", message: "Connect stream without an end-stream message", messages };
    return { ...base, ...connectEndStreamOf(end.payload), messages };
  }
  const body = inflate(raw.body, raw.headers["content-encoding"]);
  if (raw.httpStatus === 200) return { ...base, code: "ok", message: "", messages: [body] };
  const error = connectErrorOf(body);
  if (error !== undefined) return { ...base, ...error, messages: [] };
  return { ...base, code: `http_${raw.httpStatus}`, message: Buffer.from(body).toString("utf8").slice(0, 200), messages: [] };
}

/** Messages seen so far in a partial response (to settle `first`). */
function countMessages(request: WireRequest, headers: http.IncomingHttpHeaders | http2.IncomingHttpHeaders, body: Uint8Array): number {
  const framing = framingOf(request, headers);
  if (framing === "unary") return 0;
  const { envelopes } = splitEnvelopes(body);
  return envelopes.filter((e) => (framing === "connect-stream" ? (e.flags & 0x02) === 0 : (e.flags & 0x80) === 0)).length;
}

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

/** Joins request chunks (for logging a reproducer). */
export function requestBytes(request: WireRequest): Uint8Array {
  return concat(request.chunks);
}
