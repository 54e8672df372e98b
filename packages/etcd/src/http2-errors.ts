/**
 * Node's HTTP/2 and socket failures as ConnectErrors, read as connect-node reads them (its own
 * functions for this are not exported): the etcd client's unary path must fail with the errors its
 * streams and etcd-errors.ts know.
 */
import { constants } from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";

/** connect-node's `connectErrorFromNodeReason`: a Node error's code picks the ConnectError's. */
export function connectErrorFromNodeReason(reason: unknown): ConnectError {
  let code = Code.Internal;
  const codes = nodeErrorCodes(reason);
  if (codes.includes("ERR_STREAM_WRITE_AFTER_END")) {
    // The server answered and ended the stream while the request was still being written.
    code = Code.Aborted;
  } else if (codes.some((c) => c === "ERR_STREAM_DESTROYED" || c === "ERR_HTTP2_INVALID_STREAM" || c === "ECONNRESET")) {
    code = Code.Aborted;
  } else if (codes.some((c) => c === "ETIMEDOUT" || c === "ENOTFOUND" || c === "EAI_AGAIN" || c === "ECONNREFUSED")) {
    code = Code.Unavailable;
  }
  const error = ConnectError.from(reason, code);
  if (error !== reason) error.cause = reason;
  return error;
}

/** The `code` of each error along `reason`'s chain of causes. */
export function nodeErrorCodes(reason: unknown): string[] {
  const chain: Error[] = [];
  const codes: string[] = [];
  while (reason instanceof Error && !chain.includes(reason)) {
    chain.push(reason);
    const code = (reason as { code?: unknown }).code;
    if (typeof code === "string") codes.push(code);
    if (!("cause" in reason)) break;
    reason = reason.cause;
  }
  return codes;
}

const RESET_CODE_NAMES: Record<number, string> = {
  [constants.NGHTTP2_PROTOCOL_ERROR]: "PROTOCOL_ERROR",
  [constants.NGHTTP2_INTERNAL_ERROR]: "INTERNAL_ERROR",
  [constants.NGHTTP2_FLOW_CONTROL_ERROR]: "FLOW_CONTROL_ERROR",
  [constants.NGHTTP2_SETTINGS_TIMEOUT]: "SETTINGS_TIMEOUT",
  [constants.NGHTTP2_FRAME_SIZE_ERROR]: "FRAME_SIZE_ERROR",
  [constants.NGHTTP2_REFUSED_STREAM]: "REFUSED_STREAM",
  [constants.NGHTTP2_CANCEL]: "CANCEL",
  [constants.NGHTTP2_COMPRESSION_ERROR]: "COMPRESSION_ERROR",
  [constants.NGHTTP2_CONNECT_ERROR]: "CONNECT_ERROR",
  [constants.NGHTTP2_ENHANCE_YOUR_CALM]: "ENHANCE_YOUR_CALM",
  [constants.NGHTTP2_INADEQUATE_SECURITY]: "INADEQUATE_SECURITY",
  [constants.NGHTTP2_HTTP_1_1_REQUIRED]: "HTTP_1_1_REQUIRED",
};

/** The gRPC codes of HTTP/2 reset codes (STREAM_CLOSED and NO_ERROR are none: gRPC does not map them). */
const RESET_CODES: Record<number, Code> = {
  [constants.NGHTTP2_PROTOCOL_ERROR]: Code.Internal,
  [constants.NGHTTP2_INTERNAL_ERROR]: Code.Internal,
  [constants.NGHTTP2_FLOW_CONTROL_ERROR]: Code.Internal,
  [constants.NGHTTP2_SETTINGS_TIMEOUT]: Code.Internal,
  [constants.NGHTTP2_FRAME_SIZE_ERROR]: Code.Internal,
  [constants.NGHTTP2_COMPRESSION_ERROR]: Code.Internal,
  [constants.NGHTTP2_CONNECT_ERROR]: Code.Internal,
  [constants.NGHTTP2_REFUSED_STREAM]: Code.Unavailable,
  [constants.NGHTTP2_CANCEL]: Code.Canceled,
  [constants.NGHTTP2_ENHANCE_YOUR_CALM]: Code.ResourceExhausted,
  [constants.NGHTTP2_INADEQUATE_SECURITY]: Code.PermissionDenied,
  [constants.NGHTTP2_HTTP_1_1_REQUIRED]: Code.PermissionDenied,
};

/** connect-node's `connectErrorFromH2ResetCode`: the error of a stream reset with `rstCode`, if it is one. */
export function connectErrorFromH2ResetCode(rstCode: number | undefined): ConnectError | undefined {
  if (rstCode === undefined) return undefined;
  const code = RESET_CODES[rstCode];
  if (code === undefined) return undefined;
  return new ConnectError(`http/2 stream closed with error code ${RESET_CODE_NAMES[rstCode]} (0x${rstCode.toString(16)})`, code);
}
