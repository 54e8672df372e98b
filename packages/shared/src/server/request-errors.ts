/**
 * Refusals of a request's bytes rather than its meaning, raised by Connect's protocol layer before
 * any handler runs (or while a handler reads a request stream): a body that is not the message, a
 * message over the size limit, an encoding the server does not speak. Connect raises them as bare
 * `ConnectError`s, some as INTERNAL ("parse binary: premature EOF"); berth answers each with its
 * own code and ErrorInfo reason, the same on every protocol, so that INTERNAL keeps meaning "a bug
 * in berth" and a client can branch on the case. The reasons are shared by every service's domain.
 */
import { Code, type ConnectError } from "@connectrpc/connect";
import { ANY_CALL_REASONS } from "@berth/wire/reasons";
import { BerthError } from "../errors.js";

/** The reasons of requests refused for their bytes, the same in every domain (the wire's table of any call's reasons). */
export const REQUEST_REASONS = {
  MALFORMED_REQUEST: ANY_CALL_REASONS.MALFORMED_REQUEST,
  UNKNOWN_FIELD: ANY_CALL_REASONS.UNKNOWN_FIELD,
  MESSAGE_TOO_LARGE: ANY_CALL_REASONS.MESSAGE_TOO_LARGE,
  RESPONSE_TOO_LARGE: ANY_CALL_REASONS.RESPONSE_TOO_LARGE,
  UNSUPPORTED_ENCODING: ANY_CALL_REASONS.UNSUPPORTED_ENCODING,
  COMPRESSED_WITHOUT_ENCODING: ANY_CALL_REASONS.COMPRESSED_WITHOUT_ENCODING,
} as const;

/** The prefix of every MALFORMED_REQUEST message. */
export const MALFORMED_PREFIX = "the request did not decode";

const UNKNOWN_JSON_KEY = /^cannot decode message (\S+) from JSON: key "(.*)" is unknown$/s;
const READ_LIMIT = /readMaxBytes (\d+)/;
const WRITE_LIMIT = /writeMaxBytes (\d+)/;
const MESSAGE_SIZE = /^message size (\d+) /;
const UNKNOWN_COMPRESSION = /^unknown compression "(.*)": supported encodings are (.*)$/s;
const NO_DECOMPRESSOR = "received compressed envelope, but do not know how to decompress";
const WRONG_MESSAGE_COUNT = /^protocol error: (missing input message|received extra input message) for ([\w-]+) method$/;
const INVALID_UTF8 = /not valid for encoding utf-8/i;

/** A MALFORMED_REQUEST refusal saying what did not decode. */
export function malformedRequest(what: string, details?: Record<string, unknown>): BerthError {
  return new BerthError("invalid_argument", `${MALFORMED_PREFIX}: ${what}`, details, { reason: REQUEST_REASONS.MALFORMED_REQUEST });
}

/** An UNKNOWN_FIELD refusal: `field` names the field (a JSON key, or `#<number>` in binary), `message` the message type holding it. */
export function unknownField(field: string, message: string): BerthError {
  return new BerthError(
    "invalid_argument",
    `${field}: no such field in ${message}: a misspelled field, or one of a newer berth than this server (which refuses what it does not know rather than ignore a check the caller asked for)`,
    { field, message },
    { reason: REQUEST_REASONS.UNKNOWN_FIELD },
  );
}

/**
 * The refusal berth answers an error of Connect's protocol layer with, or undefined for an error
 * that is not about the request's bytes (a cancel, a deadline, a handler's own error).
 */
export function requestErrorOf(error: ConnectError): BerthError | undefined {
  const message = error.rawMessage;
  switch (error.code) {
    // Connect's read and write limits, each naming the limit.
    case Code.ResourceExhausted: {
      const read = READ_LIMIT.exec(message);
      if (read !== null) {
        const size = MESSAGE_SIZE.exec(message);
        return new BerthError(
          "resource_exhausted",
          `a request message${size === null ? "" : ` of ${size[1]} bytes`} is over this server's limit of ${read[1]} bytes${/decompression/.test(message) ? " once decompressed" : ""} (its --max-message-bytes): send less in one message`,
          { limitBytes: Number(read[1]), ...(size === null ? {} : { sizeBytes: Number(size[1]) }) },
          { reason: REQUEST_REASONS.MESSAGE_TOO_LARGE },
        );
      }
      const write = WRITE_LIMIT.exec(message);
      if (write !== null) {
        return new BerthError(
          "resource_exhausted",
          `the answer would be over this server's message limit of ${write[1]} bytes (its --max-message-bytes): ask for less at once`,
          { limitBytes: Number(write[1]) },
          { reason: REQUEST_REASONS.RESPONSE_TOO_LARGE },
        );
      }
      return undefined;
    }
    // The gRPC compression spec and Connect's both answer an unknown encoding with UNIMPLEMENTED.
    case Code.Unimplemented: {
      const unknown = UNKNOWN_COMPRESSION.exec(message);
      if (unknown !== null) {
        return new BerthError(
          "unimplemented",
          `the request is compressed with ${JSON.stringify(unknown[1])}, which this server does not accept: use one of ${unknown[2]}, or none`,
          { encoding: unknown[1], supported: unknown[2] },
          { reason: REQUEST_REASONS.UNSUPPORTED_ENCODING },
        );
      }
      const count = WRONG_MESSAGE_COUNT.exec(message);
      if (count !== null)
        return malformedRequest(`a ${count[2]} call takes exactly one request message; ${count[1] === "missing input message" ? "none came" : "more came"}`);
      return undefined;
    }
    case Code.Internal:
      // Both specs demand INTERNAL here; the reason says it is the client's framing, not a bug of berth.
      if (message === NO_DECOMPRESSOR) {
        return new BerthError(
          "internal",
          "a message has the compressed flag set, but the request declares no encoding (grpc-encoding / connect-content-encoding): declare the encoding, or clear the flag",
          undefined,
          { reason: REQUEST_REASONS.COMPRESSED_WITHOUT_ENCODING },
        );
      }
      if (message.startsWith("parse binary: ")) return malformedRequest(describeDecodeFailure(message));
      if (message === "decompression failed") return malformedRequest("the body does not decompress with the encoding it declares");
      return undefined;
    // Connect raises INVALID_ARGUMENT only for requests it cannot read (berth's own refusals are BerthErrors).
    case Code.InvalidArgument: {
      const unknown = UNKNOWN_JSON_KEY.exec(message);
      if (unknown !== null) return unknownField(unknown[2]!, unknown[1]!);
      if (message === "decompression failed") return malformedRequest("the body does not decompress with the encoding it declares");
      return malformedRequest(describeDecodeFailure(message));
    }
    default:
      return undefined;
  }
}

/** Connect's and protobuf's words for a failed decode, with the invalid UTF-8 case said plainly. */
function describeDecodeFailure(message: string): string {
  if (INVALID_UTF8.test(message)) return "a string in it is not valid UTF-8";
  return message;
}
