import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { requestErrorOf } from "./request-errors.js";

/** What berth answers Connect's own error with: [code, reason, details], or undefined. */
const answer = (message: string, code: Code) => {
  const refusal = requestErrorOf(new ConnectError(message, code));
  return refusal === undefined ? undefined : [refusal.code, refusal.reason, refusal.details];
};

describe("requestErrorOf", () => {
  it("gives each condition of a request's bytes its own code and reason, whatever code Connect raised it with", () => {
    expect(answer("parse binary: premature EOF", Code.Internal)).toEqual(["invalid_argument", "MALFORMED_REQUEST", undefined]);
    expect(answer("decompression failed", Code.Internal)).toEqual(["invalid_argument", "MALFORMED_REQUEST", undefined]);
    expect(answer("decompression failed", Code.InvalidArgument)).toEqual(["invalid_argument", "MALFORMED_REQUEST", undefined]);
    expect(answer("protocol error: incomplete envelope", Code.InvalidArgument)).toEqual(["invalid_argument", "MALFORMED_REQUEST", undefined]);
    expect(answer("cannot decode message a.B from JSON: Unexpected end of JSON input", Code.InvalidArgument)?.[1]).toBe("MALFORMED_REQUEST");
    expect(answer("protocol error: missing input message for unary method", Code.Unimplemented)?.[1]).toBe("MALFORMED_REQUEST");
    expect(answer("protocol error: received extra input message for server-streaming method", Code.Unimplemented)?.[1]).toBe("MALFORMED_REQUEST");
    expect(answer('cannot decode message berth.x.v1.Req from JSON: key "fense" is unknown', Code.InvalidArgument)).toEqual([
      "invalid_argument",
      "UNKNOWN_FIELD",
      { field: "fense", message: "berth.x.v1.Req" },
    ]);
    expect(answer("message size 5242885 is larger than configured readMaxBytes 4194304", Code.ResourceExhausted)).toEqual([
      "resource_exhausted",
      "MESSAGE_TOO_LARGE",
      { limitBytes: 4194304, sizeBytes: 5242885 },
    ]);
    expect(answer("message size is larger than configured readMaxBytes 4194304", Code.ResourceExhausted)).toEqual([
      "resource_exhausted",
      "MESSAGE_TOO_LARGE",
      { limitBytes: 4194304 },
    ]);
    expect(answer("message is larger than configured readMaxBytes 4194304 after decompression", Code.ResourceExhausted)?.[1]).toBe("MESSAGE_TOO_LARGE");
    expect(answer("message size 5242885 is larger than configured writeMaxBytes 4194304", Code.ResourceExhausted)).toEqual([
      "resource_exhausted",
      "RESPONSE_TOO_LARGE",
      { limitBytes: 4194304 },
    ]);
    expect(answer('unknown compression "zstd": supported encodings are gzip,br', Code.Unimplemented)).toEqual([
      "unimplemented",
      "UNSUPPORTED_ENCODING",
      { encoding: "zstd", supported: "gzip,br" },
    ]);
    // The gRPC and Connect specs both demand INTERNAL for it; the reason says it is the client's framing.
    expect(answer("received compressed envelope, but do not know how to decompress", Code.Internal)).toEqual([
      "internal",
      "COMPRESSED_WITHOUT_ENCODING",
      undefined,
    ]);
  });

  it("says plainly that a string is not UTF-8, from either decoder", () => {
    const binary = requestErrorOf(new ConnectError("parse binary: The encoded data was not valid for encoding utf-8", Code.Internal));
    const json = requestErrorOf(new ConnectError("The encoded data was not valid for encoding utf-8", Code.InvalidArgument));
    expect(binary?.message).toBe("the request did not decode: a string in it is not valid UTF-8");
    expect(json?.message).toBe(binary?.message);
  });

  it("leaves alone what is not about the request's bytes", () => {
    expect(answer("internal error", Code.Internal)).toBeUndefined();
    expect(answer("serialize binary: x", Code.Internal)).toBeUndefined();
    expect(answer("the operation timed out", Code.DeadlineExceeded)).toBeUndefined();
    expect(answer("server shutting down", Code.Unavailable)).toBeUndefined();
    expect(answer("unknown service x", Code.NotFound)).toBeUndefined();
  });
});
