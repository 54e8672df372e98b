/**
 * The fuzzer's wire format, in one vocabulary for gRPC and Connect: what a request looks like on
 * the wire (headers, enveloped or plain chunks, how it ends and settles), and a response read back
 * into an {@link Answer} — the status the server gave (from trailers, a Connect error body or
 * end-stream message, gRPC-Web trailers), its ErrorInfo reason, the messages that came first.
 */
import type * as http from "node:http";
import type * as http2 from "node:http2";
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
export interface RawResponse {
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

export function answerOf(request: WireRequest, raw: RawResponse, elapsedMs: number): Answer {
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
export function countMessages(request: WireRequest, headers: http.IncomingHttpHeaders | http2.IncomingHttpHeaders, body: Uint8Array): number {
  const framing = framingOf(request, headers);
  if (framing === "unary") return 0;
  const { envelopes } = splitEnvelopes(body);
  return envelopes.filter((e) => (framing === "connect-stream" ? (e.flags & 0x02) === 0 : (e.flags & 0x80) === 0)).length;
}

/** Joins request chunks (for logging a reproducer). */
export function requestBytes(request: WireRequest): Uint8Array {
  return concat(request.chunks);
}
