/**
 * The gRPC transport berth's etcd client talks through: unary calls go straight onto the member's
 * HTTP/2 session (one framed request out, the response collected in one buffer), streams (watch,
 * lease keepalive) through connect-node's gRPC transport on the same session.
 *
 * Why not connect-node's unary path: it runs each call through async-iterable pipelines, linked
 * AbortControllers, fetch Headers and an error sentinel, which cost the client about twice the CPU
 * per put of @grpc/grpc-js sending the same messages. This path reuses connect's own header
 * building, validation and serialization, and fails with the same ConnectErrors (code, message,
 * metadata, cause) for the same events on the wire: grpc-transport.test.ts compares the two.
 */
import { create, isMessage, type DescMessage, type DescMethodUnary, type Message, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";
import { Code, ConnectError, type Transport, type UnaryResponse } from "@connectrpc/connect";
import { compressionBrotli, compressionGzip, createGrpcTransport, type Http2SessionManager } from "@connectrpc/connect-node";
import {
  createAsyncIterable,
  createMethodSerializationLookup,
  createMethodUrl,
  pipeTo,
  transformDecompressEnvelope,
  transformParseEnvelope,
  transformSplitEnvelope,
  validateReadWriteMaxBytes,
  type Compression,
  type Serialization,
} from "@connectrpc/connect/protocol";
import { requestHeaderWithCompression, validateResponseWithCompression, validateTrailer } from "@connectrpc/connect/protocol-grpc";
import { exchangeUnary, toWebHeaders, type ResponseHead, type UnaryExchange } from "./http2-unary.js";

/** What connect-node's gRPC transport accepts and limits by default: this transport does the same. */
const ACCEPT_COMPRESSION: Compression[] = [compressionGzip, compressionBrotli];
const LIMITS = validateReadWriteMaxBytes(undefined, undefined, undefined);

interface MethodWire {
  readonly path: string;
  readonly input: Serialization<Message>;
  readonly output: Serialization<Message>;
}

/** A transport to the member at `baseUrl` over `sessionManager`'s HTTP/2 connection. */
export function createEtcdTransport(baseUrl: string, sessionManager: Http2SessionManager): Transport {
  const streams = createGrpcTransport({ baseUrl, sessionManager });
  const methods = new Map<DescMethodUnary, MethodWire>();
  // The request headers of a call without headers of its own, by deadline: the same every time.
  const plainHeaders = new Map<number | undefined, Record<string, string>>();

  const wire = (method: DescMethodUnary): MethodWire => {
    const known = methods.get(method);
    if (known) return known;
    const url = new URL(createMethodUrl(baseUrl, method));
    if (url.origin !== sessionManager.authority) {
      throw new ConnectError(`cannot make a request to ${url.origin}: the http2 session is connected to ${sessionManager.authority}`, Code.Internal);
    }
    const serialization = createMethodSerializationLookup(method, undefined, undefined, LIMITS);
    const found = { path: url.pathname + url.search, input: serialization.getI(true), output: serialization.getO(true) };
    methods.set(method, found);
    return found;
  };

  const requestHeaders = (timeoutMs: number | undefined, header: ConstructorParameters<typeof Headers>[0]): Record<string, string> => {
    if (header !== undefined) return toNodeHeaders(requestHeaderWithCompression(true, timeoutMs, header, ACCEPT_COMPRESSION, null));
    let found = plainHeaders.get(timeoutMs);
    if (!found) {
      found = toNodeHeaders(requestHeaderWithCompression(true, timeoutMs, undefined, ACCEPT_COMPRESSION, null));
      plainHeaders.set(timeoutMs, found);
    }
    return found;
  };

  return {
    async unary<I extends DescMessage, O extends DescMessage>(
      method: DescMethodUnary<I, O>,
      signal: AbortSignal | undefined,
      timeoutMs: number | undefined,
      header: ConstructorParameters<typeof Headers>[0],
      input: MessageInitShape<I>,
    ): Promise<UnaryResponse<I, O>> {
      // As connect: no default deadline, and a deadline of 0 or less is none.
      const deadline = timeoutMs === undefined || timeoutMs <= 0 ? undefined : timeoutMs;
      const { path, input: serializeInput, output } = wire(method as unknown as DescMethodUnary);
      const message = isMessage(input, method.input) ? input : create(method.input, input);
      const exchange = await exchangeUnary({
        sessionManager,
        path,
        headers: requestHeaders(deadline, header),
        timeoutMs: deadline,
        signal,
        body: () => envelope(serializeInput.serialize(message)),
        checkHead: validateHead,
      });
      return new LazyHeadersResponse(method, exchange, (await responseMessage(exchange, output)) as MessageShape<O>);
    },
    stream: streams.stream,
  };
}

/** A gRPC message frame: not compressed, 4 bytes of length, the message. */
function envelope(bytes: Uint8Array): Buffer {
  const frame = Buffer.allocUnsafe(5 + bytes.byteLength);
  frame[0] = 0;
  frame.writeUInt32BE(bytes.byteLength, 1);
  frame.set(bytes, 5);
  return frame;
}

/**
 * Checks the response's head as connect does, and says whether it is the plain case (status 200,
 * gRPC content, no status in the head, no compression) that needs no more checks before the body.
 * Throws connect's error for a head connect refuses.
 */
interface HeadCheck {
  readonly plain: boolean;
  readonly compression: Compression | undefined;
  readonly headerError: ConnectError | undefined;
}

function validateHead(head: ResponseHead): HeadCheck {
  const type = head["content-type"];
  const encoding = head["grpc-encoding"] as string | undefined;
  if (
    head[":status"] === 200 &&
    (type === "application/grpc" || type === "application/grpc+proto") &&
    head["grpc-status"] === undefined &&
    (encoding === undefined || encoding.toLowerCase() === "identity")
  ) {
    return { plain: true, compression: undefined, headerError: undefined };
  }
  const { compression, headerError } = validateResponseWithCompression(ACCEPT_COMPRESSION, head[":status"] ?? 0, toWebHeaders(head));
  return { plain: false, compression, headerError };
}

/** The response's one message, or connect's error for what the body and trailer say. */
async function responseMessage(exchange: UnaryExchange<HeadCheck>, output: Serialization<Message>): Promise<Message | undefined> {
  const { body, trailer, headCheck } = exchange;
  if (headCheck.plain && trailer["grpc-status"] === "0" && body.byteLength >= 5 && body[0] === 0 && body.readUInt32BE(1) === body.byteLength - 5) {
    return output.parse(body.subarray(5));
  }
  const message = await pipeTo(
    createAsyncIterable([new Uint8Array(body.buffer, body.byteOffset, body.byteLength)]),
    transformSplitEnvelope(LIMITS.readMaxBytes),
    transformDecompressEnvelope(headCheck.compression ?? null, LIMITS.readMaxBytes),
    transformParseEnvelope(output),
    onlyMessage,
    { propagateDownStreamError: false },
  );
  const webHead = toWebHeaders(exchange.head);
  validateTrailer(toWebHeaders(trailer), webHead);
  if (message === undefined) {
    if (headCheck.headerError) throw headCheck.headerError;
    throw new ConnectError("protocol error: missing output message for unary method", trailer["grpc-status"] !== undefined ? Code.Unimplemented : Code.Unknown);
  }
  if (headCheck.headerError) throw new ConnectError("protocol error: received output message for unary method with error status", Code.Unknown);
  return message;
}

async function onlyMessage(messages: AsyncIterable<Message>): Promise<Message | undefined> {
  let message: Message | undefined;
  for await (const chunk of messages) {
    if (message !== undefined) throw new ConnectError("protocol error: received extra output message for unary method", Code.Unimplemented);
    message = chunk;
  }
  return message;
}

/** The response as connect's clients take it; its headers become fetch Headers only when read. */
class LazyHeadersResponse<I extends DescMessage, O extends DescMessage> implements UnaryResponse<I, O> {
  readonly stream = false;
  readonly service: DescMethodUnary<I, O>["parent"];
  private webHeader: Headers | undefined;
  private webTrailer: Headers | undefined;

  constructor(
    readonly method: DescMethodUnary<I, O>,
    private readonly exchange: UnaryExchange<HeadCheck>,
    readonly message: MessageShape<O>,
  ) {
    this.service = method.parent;
  }

  get header(): Headers {
    this.webHeader ??= toWebHeaders(this.exchange.head);
    return this.webHeader;
  }

  get trailer(): Headers {
    this.webTrailer ??= toWebHeaders(this.exchange.trailer);
    return this.webTrailer;
  }
}

function toNodeHeaders(headers: Headers): Record<string, string> {
  const result: Record<string, string> = Object.create(null);
  headers.forEach((value, key) => {
    result[key] = value;
  });
  return result;
}
