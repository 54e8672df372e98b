/**
 * A client that sends whatever bytes a test gives it, over any of the four wire protocols, and reads
 * the answer as each protocol writes it: the tool for malformed requests, which a real client
 * library refuses to send. It is written on node:http and node:http2 alone; the answers are read
 * with Connect's own protocol parsers (gRPC trailers and `grpc-status-details-bin`, gRPC-Web's
 * trailer envelope, Connect's error JSON and end-stream message), so a test compares what every
 * client of that protocol would see: the code, the ErrorInfo and the message.
 */
import * as http from "node:http";
import * as http2 from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import { codeToString, endStreamFromJson, errorFromJsonBytes } from "@connectrpc/connect/protocol-connect";
import { findTrailerError } from "@connectrpc/connect/protocol-grpc";
import { trailerParse } from "@connectrpc/connect/protocol-grpc-web";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";

/** The four protocols: gRPC, gRPC-Web (binary), Connect with protobuf binary, Connect with JSON. */
export const RAW_PROTOCOLS = ["grpc", "grpc-web", "connect", "connect-json"] as const;
export type RawProtocol = (typeof RAW_PROTOCOLS)[number];

/** Each protocol with the HTTP versions it runs on (gRPC needs HTTP/2). */
export const RAW_ROUTES: ReadonlyArray<{ readonly protocol: RawProtocol; readonly httpVersion: 1 | 2 }> = [
  { protocol: "grpc", httpVersion: 2 },
  { protocol: "grpc-web", httpVersion: 1 },
  { protocol: "grpc-web", httpVersion: 2 },
  { protocol: "connect", httpVersion: 1 },
  { protocol: "connect", httpVersion: 2 },
  { protocol: "connect-json", httpVersion: 1 },
  { protocol: "connect-json", httpVersion: 2 },
];

/** Whether a protocol carries messages as JSON. */
export function isJsonProtocol(protocol: RawProtocol): boolean {
  return protocol === "connect-json";
}

export interface RawRpcRequest {
  readonly protocol: RawProtocol;
  readonly httpVersion: 1 | 2;
  /** `/pkg.Service/Method`. */
  readonly path: string;
  /** The method streams its requests or responses: Connect then frames messages in envelopes. */
  readonly streaming: boolean;
  /**
   * The request messages, each encoded as the protocol carries it (protobuf binary, or JSON for
   * `connect-json`); each becomes one envelope (gRPC, gRPC-Web, Connect streaming) or the body
   * (Connect unary: the first only).
   */
  readonly messages?: readonly Uint8Array[];
  /** The whole body instead, as is (a truncated envelope, a compressed flag). */
  readonly body?: Uint8Array;
  /** Headers added to (or, with `null`, removed from) the protocol's own. */
  readonly headers?: Readonly<Record<string, string | null>>;
  /** Sent as `authorization: Bearer <token>`. */
  readonly token?: string;
  /** Default 10 s. */
  readonly timeoutMs?: number;
}

/** The outcome of a call, in one vocabulary for every protocol. */
export interface RawRpcAnswer {
  /** A Connect code name (`invalid_argument`, `ok`…), or `http_<status>` for an answer with no RPC status at all. */
  readonly code: string;
  readonly message: string;
  /** The ErrorInfo's reason and domain, undefined without one. */
  readonly reason: string | undefined;
  readonly domain: string | undefined;
  readonly metadata: Readonly<Record<string, string>>;
  readonly httpStatus: number;
  /** Response messages before the status. */
  readonly messages: number;
}

/** A 5-byte-prefixed envelope. */
export function envelope(flags: number, payload: Uint8Array, declaredLength = payload.byteLength): Uint8Array {
  const out = Buffer.alloc(5 + payload.byteLength);
  out[0] = flags;
  out.writeUInt32BE(declaredLength >>> 0, 1);
  out.set(payload, 5);
  return out;
}

function contentTypeOf(protocol: RawProtocol, streaming: boolean): string {
  switch (protocol) {
    case "grpc":
      return "application/grpc+proto";
    case "grpc-web":
      return "application/grpc-web+proto";
    case "connect":
      return streaming ? "application/connect+proto" : "application/proto";
    case "connect-json":
      return streaming ? "application/connect+json" : "application/json";
  }
}

function bodyOf(request: RawRpcRequest): Uint8Array {
  if (request.body !== undefined) return request.body;
  const messages = request.messages ?? [];
  const enveloped = request.protocol === "grpc" || request.protocol === "grpc-web" || request.streaming;
  if (!enveloped) return messages[0] ?? new Uint8Array();
  return Buffer.concat(messages.map((m) => envelope(0, m)));
}

function headersOf(request: RawRpcRequest, body: Uint8Array): Record<string, string> {
  const headers: Record<string, string | null> = { "content-type": contentTypeOf(request.protocol, request.streaming) };
  if (request.protocol === "grpc") headers.te = "trailers";
  if (request.protocol === "connect" || request.protocol === "connect-json") headers["connect-protocol-version"] = "1";
  if (request.token !== undefined) headers.authorization = `Bearer ${request.token}`;
  if (request.httpVersion === 1) headers["content-length"] = String(body.byteLength);
  Object.assign(headers, request.headers);
  return Object.fromEntries(Object.entries(headers).filter((entry): entry is [string, string] => entry[1] !== null));
}

interface RawResponse {
  status: number;
  headers: Headers;
  trailers: Headers;
  body: Buffer;
}

function toHeaders(node: http.IncomingHttpHeaders | http2.IncomingHttpHeaders): Headers {
  const headers = new Headers();
  for (const [name, value] of Object.entries(node)) {
    if (name.startsWith(":") || value === undefined) continue;
    for (const one of Array.isArray(value) ? value : [String(value)]) headers.append(name, one);
  }
  return headers;
}

/** Splits envelopes; bytes after the last whole one are ignored. */
function envelopesOf(body: Buffer): Array<{ flags: number; payload: Buffer }> {
  const out: Array<{ flags: number; payload: Buffer }> = [];
  let offset = 0;
  while (body.byteLength - offset >= 5) {
    const length = body.readUInt32BE(offset + 1);
    if (body.byteLength - offset - 5 < length) break;
    out.push({ flags: body[offset]!, payload: body.subarray(offset + 5, offset + 5 + length) });
    offset += 5 + length;
  }
  return out;
}

function answerFrom(error: ConnectError | undefined, httpStatus: number, messages: number): RawRpcAnswer {
  if (error === undefined) return { code: "ok", message: "", reason: undefined, domain: undefined, metadata: {}, httpStatus, messages };
  const info = error.findDetails(ErrorInfoSchema)[0];
  return {
    code: codeToString(error.code),
    message: error.rawMessage,
    reason: info?.reason,
    domain: info?.domain,
    metadata: info?.metadata ?? {},
    httpStatus,
    messages,
  };
}

function noStatus(raw: RawResponse, messages = 0): RawRpcAnswer {
  return {
    code: `http_${raw.status}`,
    message: raw.body.subarray(0, 300).toString("utf8"),
    reason: undefined,
    domain: undefined,
    metadata: {},
    httpStatus: raw.status,
    messages,
  };
}

/** Reads a response as the protocol of the request writes it. */
function interpret(request: RawRpcRequest, raw: RawResponse): RawRpcAnswer {
  const contentType = raw.headers.get("content-type") ?? "";
  if (contentType.startsWith("application/grpc-web")) {
    const envelopes = envelopesOf(raw.body);
    const trailer = envelopes.find((e) => (e.flags & 0x80) !== 0);
    const messages = envelopes.filter((e) => (e.flags & 0x80) === 0).length;
    const status = trailer === undefined ? raw.headers : trailerParse(trailer.payload);
    if (!status.has("grpc-status")) return noStatus(raw, messages);
    return answerFrom(findTrailerError(status), raw.status, messages);
  }
  if (contentType.startsWith("application/grpc")) {
    const status = new Headers(raw.headers);
    raw.trailers.forEach((value, name) => status.set(name, value));
    const messages = envelopesOf(raw.body).length;
    if (!status.has("grpc-status")) return noStatus(raw, messages);
    return answerFrom(findTrailerError(status), raw.status, messages);
  }
  if (contentType.startsWith("application/connect+")) {
    const envelopes = envelopesOf(raw.body);
    const end = envelopes.find((e) => (e.flags & 0x02) !== 0);
    const messages = envelopes.filter((e) => (e.flags & 0x02) === 0).length;
    if (end === undefined) return noStatus(raw, messages);
    return answerFrom(endStreamFromJson(end.payload).error, raw.status, messages);
  }
  if (raw.status === 200 && !request.streaming) return answerFrom(undefined, 200, 1);
  if (contentType.startsWith("application/json")) {
    try {
      return answerFrom(errorFromJsonBytes(raw.body, raw.headers, new ConnectError("not an error body", Code.Unknown)), raw.status, 0);
    } catch {
      return noStatus(raw);
    }
  }
  return noStatus(raw);
}

/** Sends one request on a connection of its own and reads the whole answer. */
export async function rawRpc(url: string, request: RawRpcRequest): Promise<RawRpcAnswer> {
  const body = bodyOf(request);
  const headers = headersOf(request, body);
  const timeoutMs = request.timeoutMs ?? 10_000;
  const raw =
    request.httpVersion === 2 ? await http2Call(url, request.path, headers, body, timeoutMs) : await http1Call(url, request.path, headers, body, timeoutMs);
  return interpret(request, raw);
}

function http2Call(url: string, path: string, headers: Record<string, string>, body: Uint8Array, timeoutMs: number): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(url);
    const timer = setTimeout(() => {
      session.destroy();
      reject(new Error(`no answer to ${path} within ${timeoutMs} ms`));
    }, timeoutMs);
    session.on("error", (error) => {
      clearTimeout(timer);
      reject(error);
    });
    const stream = session.request({ ":method": "POST", ":path": path, ...headers });
    const response: RawResponse = { status: 0, headers: new Headers(), trailers: new Headers(), body: Buffer.alloc(0) };
    const chunks: Buffer[] = [];
    stream.on("response", (h) => {
      response.status = Number(h[":status"]);
      response.headers = toHeaders(h);
    });
    stream.on("trailers", (t) => (response.trailers = toHeaders(t)));
    stream.on("data", (chunk: Buffer) => chunks.push(chunk));
    // The server may answer before it read the whole body (a message over the limit): the answer counts.
    stream.on("error", () => {});
    stream.on("close", () => {
      clearTimeout(timer);
      session.close();
      if (response.status === 0) {
        reject(new Error(`${path}: the stream closed without an answer (RST code ${stream.rstCode})`));
        return;
      }
      response.body = Buffer.concat(chunks);
      resolve(response);
    });
    stream.end(body);
  });
}

function http1Call(url: string, path: string, headers: Record<string, string>, body: Uint8Array, timeoutMs: number): Promise<RawResponse> {
  return new Promise((resolve, reject) => {
    let answered = false;
    const request = http.request(`${url}${path}`, { method: "POST", agent: false, headers }, (res) => {
      answered = true;
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => {
        clearTimeout(timer);
        resolve({ status: res.statusCode ?? 0, headers: toHeaders(res.headers), trailers: toHeaders(res.trailers), body: Buffer.concat(chunks) });
      });
      res.on("error", reject);
    });
    const timer = setTimeout(() => {
      request.destroy();
      reject(new Error(`no answer to ${path} within ${timeoutMs} ms`));
    }, timeoutMs);
    // The server may answer, then close, before it read the whole body: the answer counts.
    request.on("error", (error) => {
      if (!answered) {
        clearTimeout(timer);
        reject(error);
      }
    });
    request.end(body);
  });
}
