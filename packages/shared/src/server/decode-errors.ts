/**
 * Requests whose bytes do not decode are the caller's mistake, not the server's. connect-es answers
 * them with INTERNAL ("parse binary: premature EOF", "decompression failed"); berth answers
 * INVALID_ARGUMENT, as connect-go does and as berth promises for every wrong input, so that INTERNAL
 * keeps meaning "a bug in berth" in logs, metrics and alerts. (A compressed flag without an encoding
 * stays INTERNAL: the gRPC compression spec demands exactly that.)
 *
 * Streams decode inside the handler, where the error interceptor maps them with
 * {@link asInvalidArgumentIfDecodeError}. A unary request is decoded before any interceptor runs, so
 * {@link mapDecodeErrors} wraps each route and corrects the status on its way out: the gRPC trailer,
 * the gRPC-Web trailer block, or the Connect error body. It also answers the gRPC calls whose decode
 * error connect-es fails to write at all (see {@link unwritableErrorAnswer}).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { UniversalHandler, UniversalServerResponse } from "@connectrpc/connect/protocol";

/** The status connect-es gives a request it cannot decode (and only such a request). */
function isDecodeFailure(code: number, message: string): boolean {
  return code === Code.Internal && (message.startsWith("parse binary:") || message === "decompression failed");
}

/** A ConnectError for a request that did not decode, as INVALID_ARGUMENT; any other error unchanged. */
export function asInvalidArgumentIfDecodeError(error: ConnectError): ConnectError {
  if (!isDecodeFailure(error.code, error.rawMessage)) return error;
  const mapped = new ConnectError(`the request did not decode: ${error.rawMessage}`, Code.InvalidArgument, error.metadata, undefined, error);
  mapped.details.push(...error.details);
  return mapped;
}

const GRPC_STATUS = "grpc-status";
const GRPC_MESSAGE = "grpc-message";

/** Fixes a gRPC status carried in headers or trailers, in place. */
function fixGrpcStatus(headers: Headers | undefined): void {
  if (headers === undefined) return;
  const status = headers.get(GRPC_STATUS);
  if (status === null) return;
  let message: string;
  try {
    message = decodeURIComponent(headers.get(GRPC_MESSAGE) ?? "");
  } catch {
    return;
  }
  if (!isDecodeFailure(Number(status), message)) return;
  headers.set(GRPC_STATUS, String(Code.InvalidArgument));
  headers.set(GRPC_MESSAGE, encodeURIComponent(`the request did not decode: ${message}`));
}

/** gRPC-Web puts its trailers in a last, uncompressed envelope with flag 0x80: `name: value\r\n` lines. */
function fixGrpcWebTrailerEnvelope(chunk: Uint8Array): Uint8Array {
  if (chunk.byteLength < 5 || chunk[0] !== 0x80) return chunk;
  const block = Buffer.from(chunk.buffer, chunk.byteOffset + 5, chunk.byteLength - 5).toString("latin1");
  const headers = new Headers();
  for (const line of block.split("\r\n")) {
    const colon = line.indexOf(":");
    if (colon > 0) headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
  }
  const before = headers.get(GRPC_STATUS);
  fixGrpcStatus(headers);
  if (headers.get(GRPC_STATUS) === before) return chunk;
  let text = "";
  headers.forEach((value, name) => (text += `${name}: ${value}\r\n`));
  const payload = Buffer.from(text, "latin1");
  const out = Buffer.alloc(5 + payload.byteLength);
  out[0] = 0x80;
  out.writeUInt32BE(payload.byteLength, 1);
  payload.copy(out, 5);
  return out;
}

/** A Connect unary error body (`{"code":"internal","message":"parse binary: …"}`) → INVALID_ARGUMENT, or undefined. */
function fixConnectErrorBody(body: Uint8Array): Uint8Array | undefined {
  let parsed: { code?: unknown; message?: unknown };
  try {
    parsed = JSON.parse(Buffer.from(body).toString("utf8")) as { code?: unknown; message?: unknown };
  } catch {
    return undefined;
  }
  if (parsed.code !== "internal" || typeof parsed.message !== "string" || !isDecodeFailure(Code.Internal, parsed.message)) return undefined;
  return Buffer.from(JSON.stringify({ ...parsed, code: "invalid_argument", message: `the request did not decode: ${parsed.message}` }), "utf8");
}

async function collect(body: AsyncIterable<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for await (const chunk of body) chunks.push(chunk);
  return Buffer.concat(chunks);
}

/** `body`, with `last` called once it has ended and `map` applied to each chunk. */
async function* passThrough(body: AsyncIterable<Uint8Array>, map: (chunk: Uint8Array) => Uint8Array, last: () => void): AsyncIterable<Uint8Array> {
  for await (const chunk of body) yield map(chunk);
  last();
}

const identity = (chunk: Uint8Array) => chunk;

/**
 * The answer to a gRPC or gRPC-Web request whose own error connect-es could not write. It
 * percent-encodes the message into a trailer with `encodeURIComponent`, which throws on a lone
 * surrogate; a JSON request holding one in a field of the wrong type gets an error message quoting
 * it, the handler rejects, and the call is left unanswered until the client gives up. Such a
 * failure only happens before any interceptor (later errors are cleaned by the error
 * interceptor), that is while decoding the request: INVALID_ARGUMENT.
 */
function unwritableErrorAnswer(contentType: string): UniversalServerResponse | undefined {
  const web = contentType.startsWith("application/grpc-web");
  if (!web && !contentType.startsWith("application/grpc")) return undefined;
  const status = {
    [GRPC_STATUS]: String(Code.InvalidArgument),
    [GRPC_MESSAGE]: encodeURIComponent("the request did not decode (a JSON string in it is not valid Unicode)"),
  };
  const responseType = contentType.includes("json")
    ? web
      ? "application/grpc-web+json"
      : "application/grpc+json"
    : web
      ? "application/grpc-web+proto"
      : "application/grpc+proto";
  if (!web) {
    return { status: 200, header: new Headers({ "content-type": responseType }), trailer: new Headers(status), body: (async function* () {})() };
  }
  let block = "";
  for (const [name, value] of Object.entries(status)) block += `${name}: ${value}\r\n`;
  const payload = Buffer.from(block, "latin1");
  const envelope = Buffer.alloc(5 + payload.byteLength);
  envelope[0] = 0x80;
  envelope.writeUInt32BE(payload.byteLength, 1);
  payload.copy(envelope, 5);
  return {
    status: 200,
    header: new Headers({ "content-type": responseType }),
    body: (async function* () {
      yield envelope;
    })(),
  };
}

/** The same route, answering a request that did not decode with INVALID_ARGUMENT whatever the protocol. */
export function mapDecodeErrors(handler: UniversalHandler): UniversalHandler {
  const mapped = async (request: Parameters<UniversalHandler>[0]): Promise<UniversalServerResponse> => {
    let response: UniversalServerResponse;
    try {
      response = await handler(request);
    } catch (error) {
      const answer = error instanceof URIError ? unwritableErrorAnswer(request.header.get("content-type") ?? "") : undefined;
      if (answer === undefined) throw error;
      return answer;
    }
    const contentType = response.header?.get("content-type") ?? "";
    if (contentType.startsWith("application/grpc-web")) {
      if (response.body === undefined) return response;
      return { ...response, body: passThrough(response.body, fixGrpcWebTrailerEnvelope, () => {}) };
    }
    if (contentType.startsWith("application/grpc")) {
      // A unary failure has set its status already (it may go out as headers only); a stream's comes at its end.
      fixGrpcStatus(response.header);
      fixGrpcStatus(response.trailer);
      if (response.body === undefined) return response;
      return { ...response, body: passThrough(response.body, identity, () => fixGrpcStatus(response.trailer)) };
    }
    if (response.status === 500 && contentType.startsWith("application/json") && response.body !== undefined && !response.header?.has("content-encoding")) {
      const body = await collect(response.body);
      const fixed = fixConnectErrorBody(body);
      if (fixed !== undefined && response.header?.has("content-length")) response.header.set("content-length", String(fixed.byteLength));
      return {
        ...response,
        status: fixed === undefined ? response.status : 400,
        body: (async function* () {
          yield fixed ?? body;
        })(),
      };
    }
    return response;
  };
  return Object.assign(mapped, {
    protocolNames: handler.protocolNames,
    service: handler.service,
    method: handler.method,
    requestPath: handler.requestPath,
    allowedMethods: handler.allowedMethods,
    supportedContentType: handler.supportedContentType,
  });
}
