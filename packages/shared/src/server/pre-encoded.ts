/**
 * Responses with a field sent already encoded, and the one rule for when that is allowed.
 *
 * A response that many calls share (a journal entry and its snapshot reaching every watcher, a
 * queue heartbeat reaching thousands of waiters) is cheaper when its costly field is encoded once
 * and placed in each response as bytes: protobuf-es writes a message's `$unknown` fields verbatim,
 * and a binary client decodes them as the declared field (the bytes on the wire are those of a
 * set field). The JSON codecs skip `$unknown`, so a JSON call given such a response would get the
 * message without the field (a `queued` heartbeat arrived as `{}`). Every handler that pre-encodes
 * asks {@link sendsBinary} first and builds the real message when it says no.
 */
import type { UnknownField } from "@bufbuild/protobuf";
import { WireType } from "@bufbuild/protobuf/wire";
import type { HandlerContext } from "@connectrpc/connect";

/**
 * The content types whose messages are protobuf binary: gRPC and gRPC-Web (bare or `+proto`),
 * Connect unary (`application/proto`) and streaming (`application/connect+proto`).
 */
const BINARY_CONTENT_TYPE = /^application\/(?:grpc(?:-web)?(?:\+proto)?|(?:connect\+)?proto)\s*(?:;|$)/i;

/**
 * True when the call's responses are written as protobuf binary, so that a field pre-encoded in
 * `$unknown` reaches the client. Anything else (a `+json` or `/json` content type, a Connect GET,
 * whose encoding is in its query, a content type not recognised) gets real fields: a real message
 * is always correct, pre-encoded bytes only in binary.
 */
export function sendsBinary(context: Pick<HandlerContext, "requestMethod" | "requestHeader">): boolean {
  if (context.requestMethod !== "POST") return false;
  const contentType = context.requestHeader.get("content-type");
  return contentType !== null && BINARY_CONTENT_TYPE.test(contentType);
}

/** Field `no` of a message as an already encoded field; `payload` is the length prefix and the encoded message. */
export function preEncodedField(no: number, payload: Uint8Array): UnknownField {
  return { no, wireType: WireType.LengthDelimited, data: payload };
}
