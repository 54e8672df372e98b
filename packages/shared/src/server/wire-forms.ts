/**
 * How each wire protocol carries an error: gRPC in trailers (`grpc-status`, `grpc-message`,
 * `grpc-status-details-bin`), gRPC-Web in a last envelope holding those trailers, Connect unary as
 * an error JSON body under an HTTP status, Connect streaming in its end-stream message. Written and
 * read with Connect's own protocol functions, so that an answer made here is byte for byte what
 * Connect would have written.
 *
 * Used for the answers berth gives before Connect sees a request (a missing token), and to complete
 * the errors Connect writes itself before any interceptor runs (a unary request that does not
 * decode, a message over the size limit), which otherwise leave without berth's ErrorInfo.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import type { UniversalServerRequest, UniversalServerResponse } from "@connectrpc/connect/protocol";
import {
  codeToHttpStatus,
  contentTypeStreamRegExp,
  contentTypeUnaryRegExp,
  createEndStreamSerialization,
  endStreamFlag,
  endStreamFromJson,
  errorFromJsonBytes,
  errorToJsonBytes,
} from "@connectrpc/connect/protocol-connect";
import { contentTypeRegExp as grpcContentType, findTrailerError, setTrailerStatus } from "@connectrpc/connect/protocol-grpc";
import { contentTypeRegExp as grpcWebContentType, trailerFlag, trailerParse, trailerSerialize } from "@connectrpc/connect/protocol-grpc-web";
import { ErrorInfoSchema } from "@berth/api/google/rpc/error_details_pb";

/** The four ways an RPC's answer is framed. */
export type WireForm = "grpc" | "grpc-web" | "connect-unary" | "connect-stream";

/** A request's wire form and message format. */
export interface WireFormat {
  readonly form: WireForm;
  readonly json: boolean;
}

/**
 * The form a request will be answered in, from its method and content type as Connect reads them;
 * undefined for a request Connect answers with a bare HTTP status (415: no protocol it speaks).
 */
export function wireFormatOf(request: Pick<UniversalServerRequest, "method" | "header">, streaming: boolean): WireFormat | undefined {
  const contentType = request.header.get("content-type") ?? "";
  // Connect's GET carries a unary request in the URL, with no content type; its errors are JSON like any unary one's.
  if (request.method === "GET") return { form: "connect-unary", json: true };
  if (grpcWebContentType.test(contentType))
    return contentType.startsWith("application/grpc-web-text") ? undefined : { form: "grpc-web", json: /json/i.test(contentType) };
  if (grpcContentType.test(contentType)) return { form: "grpc", json: /json/i.test(contentType) };
  if (streaming ? contentTypeStreamRegExp.test(contentType) : contentTypeUnaryRegExp.test(contentType)) {
    return { form: streaming ? "connect-stream" : "connect-unary", json: /json/i.test(contentType) };
  }
  return undefined;
}

const CONTENT_TYPES: Record<WireForm, readonly [proto: string, json: string]> = {
  grpc: ["application/grpc+proto", "application/grpc+json"],
  "grpc-web": ["application/grpc-web+proto", "application/grpc-web+json"],
  "connect-unary": ["application/json", "application/json"],
  "connect-stream": ["application/connect+proto", "application/connect+json"],
};

const endStream = createEndStreamSerialization({});

function envelope(flags: number, payload: Uint8Array): Uint8Array {
  const out = new Uint8Array(5 + payload.byteLength);
  out[0] = flags;
  new DataView(out.buffer).setUint32(1, payload.byteLength);
  out.set(payload, 5);
  return out;
}

async function* once(chunk: Uint8Array): AsyncIterable<Uint8Array> {
  yield chunk;
}

async function* nothing(): AsyncIterable<Uint8Array> {}

/** The whole answer of a call that fails with `error` before any message, in `format`'s framing. */
export function errorResponse(format: WireFormat, error: ConnectError): UniversalServerResponse {
  const contentType = CONTENT_TYPES[format.form][format.json ? 1 : 0];
  switch (format.form) {
    case "grpc":
      return { status: 200, header: new Headers({ "content-type": contentType }), trailer: setTrailerStatus(new Headers(), error), body: nothing() };
    case "grpc-web":
      return {
        status: 200,
        header: new Headers({ "content-type": contentType }),
        body: once(envelope(trailerFlag, trailerSerialize(setTrailerStatus(new Headers(), error)))),
      };
    case "connect-unary": {
      const body = errorToJsonBytes(error, {});
      const header = new Headers(error.metadata);
      header.set("content-type", contentType);
      header.set("content-length", String(body.byteLength));
      return { status: codeToHttpStatus(error.code), header, body: once(body) };
    }
    case "connect-stream":
      return {
        status: 200,
        header: new Headers({ "content-type": contentType }),
        body: once(envelope(endStreamFlag, endStream.serialize({ metadata: new Headers(), error }))),
      };
  }
}

/** True when an error carries berth's ErrorInfo (it went through berth's error mapping). */
function complete(error: ConnectError): boolean {
  return error.findDetails(ErrorInfoSchema).length > 0;
}

/** The metadata Connect puts on its own protocol errors (the encodings it accepts, on a refused one). */
const PROTOCOL_ERROR_METADATA = ["grpc-accept-encoding", "accept-encoding", "connect-accept-encoding"];

/**
 * An error as read back from a response, without the response's other headers (a parsed error's
 * metadata is every header of the block it came from), completed by `completeError`.
 */
function completedOf(error: ConnectError, completeError: (error: ConnectError) => ConnectError): ConnectError {
  const metadata = new Headers();
  for (const name of PROTOCOL_ERROR_METADATA) {
    const value = error.metadata.get(name);
    if (value !== null) metadata.set(name, value);
  }
  const bare = new ConnectError(error.rawMessage, error.code, metadata, undefined, error.cause);
  bare.details.push(...error.details);
  return completeError(bare);
}

/** `headers` (a trailer block or end-stream metadata) without the status and the fields `error` will write again. */
function clearStatus(headers: Headers, error: ConnectError): void {
  for (const name of ["grpc-status", "grpc-message", "grpc-status-details-bin"]) headers.delete(name);
  error.metadata.forEach((_value, name) => headers.delete(name));
}

/** A gRPC status in `trailer` (or headers), replaced in place by its completion. */
function completeGrpcStatus(headers: Headers | undefined, completeError: (error: ConnectError) => ConnectError): void {
  if (headers === undefined) return;
  const status = headers.get("grpc-status");
  if (status === null || status === "0") return;
  const error = findTrailerError(headers);
  if (error === undefined || complete(error)) return;
  const completed = completedOf(error, completeError);
  clearStatus(headers, completed);
  setTrailerStatus(headers, completed);
}

/** A chunk that is gRPC-Web's trailer envelope, with its status completed; other chunks unchanged. */
function completeGrpcWebTrailer(chunk: Uint8Array, completeError: (error: ConnectError) => ConnectError): Uint8Array {
  if (chunk.byteLength < 5 || (chunk[0]! & trailerFlag) !== trailerFlag) return chunk;
  const trailer = trailerParse(chunk.subarray(5));
  const error = findTrailerError(trailer);
  if (error === undefined || complete(error)) return chunk;
  const completed = completedOf(error, completeError);
  clearStatus(trailer, completed);
  return envelope(trailerFlag, trailerSerialize(setTrailerStatus(trailer, completed)));
}

/** A chunk that is Connect's end-stream message, with its error completed; other chunks unchanged. */
function completeEndStream(chunk: Uint8Array, completeError: (error: ConnectError) => ConnectError): Uint8Array {
  if (chunk.byteLength < 5 || (chunk[0]! & endStreamFlag) !== endStreamFlag) return chunk;
  let end: ReturnType<typeof endStreamFromJson>;
  try {
    end = endStreamFromJson(chunk.subarray(5));
  } catch {
    return chunk;
  }
  if (end.error === undefined || complete(end.error)) return chunk;
  const completed = completedOf(end.error, completeError);
  clearStatus(end.metadata, completed);
  return envelope(endStreamFlag, endStream.serialize({ metadata: end.metadata, error: completed }));
}

async function collect(body: AsyncIterable<Uint8Array>): Promise<Uint8Array> {
  const chunks: Uint8Array[] = [];
  for await (const chunk of body) chunks.push(chunk);
  return Buffer.concat(chunks);
}

async function* mapped(body: AsyncIterable<Uint8Array>, map: (chunk: Uint8Array) => Uint8Array, atEnd: () => void): AsyncIterable<Uint8Array> {
  for await (const chunk of body) yield map(chunk);
  atEnd();
}

/**
 * `response` with every error Connect wrote itself (without berth's ErrorInfo) passed through
 * `completeError` and written again in the same framing: at once for an answer already decided, at
 * the end of a stream for one that fails later.
 */
export async function completeErrors(
  response: UniversalServerResponse,
  format: WireFormat,
  completeError: (error: ConnectError) => ConnectError,
): Promise<UniversalServerResponse> {
  switch (format.form) {
    case "grpc":
      // A failure before the first message has its status already (it may go out as headers only); a stream's comes at its end.
      completeGrpcStatus(response.header, completeError);
      completeGrpcStatus(response.trailer, completeError);
      if (response.body === undefined) return response;
      return {
        ...response,
        body: mapped(
          response.body,
          (chunk) => chunk,
          () => completeGrpcStatus(response.trailer, completeError),
        ),
      };
    case "grpc-web":
      if (response.body === undefined) return response;
      return {
        ...response,
        body: mapped(
          response.body,
          (chunk) => completeGrpcWebTrailer(chunk, completeError),
          () => {},
        ),
      };
    case "connect-stream":
      if (response.body === undefined || response.status !== 200) return response;
      return {
        ...response,
        body: mapped(
          response.body,
          (chunk) => completeEndStream(chunk, completeError),
          () => {},
        ),
      };
    case "connect-unary": {
      const contentType = response.header?.get("content-type") ?? "";
      if (response.status === 200 || response.body === undefined || !contentType.startsWith("application/json") || response.header?.has("content-encoding")) {
        return response;
      }
      const body = await collect(response.body);
      let error: ConnectError;
      try {
        error = errorFromJsonBytes(body, response.header ?? new Headers(), new ConnectError("not an error body", Code.Unknown));
      } catch {
        return { ...response, body: once(body) };
      }
      if (complete(error)) return { ...response, body: once(body) };
      const completed = completedOf(error, completeError);
      const answer = errorResponse(format, completed);
      // The response's other headers (CORS, trailers muxed in) stay; the error's are written anew.
      response.header?.forEach((value, name) => {
        if (!answer.header?.has(name)) answer.header?.append(name, value);
      });
      return answer;
    }
  }
}
