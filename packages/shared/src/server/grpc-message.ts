/**
 * gRPC's own percent-encoding of the `grpc-message` status text.
 *
 * connect-node writes `grpc-message` with `encodeURIComponent`, which also escapes printable ASCII
 * such as `:`, `/`, `,` and `;`. The gRPC spec leaves printable ASCII (except `%`) as is, and
 * @grpc/grpc-js decodes the header with `decodeURI`, which does not undo `%3A`, `%2F`, `%2C`,
 * `%3B`...: a grpc-js caller read "session_id%3A must match [A-Za-z0-9_-]{1%2C128}". Re-encoding
 * the header the spec's way gives every decoder (grpc-js, grpcio, connect, grpc-go) the same text.
 */

/** Printable ASCII but `%`: the bytes gRPC leaves unencoded in `grpc-message`. */
const UNENCODED = /^[\x20-\x24\x26-\x7e]*$/;

/** `text` percent-encoded as gRPC specifies: UTF-8, every byte outside 0x20–0x7E and `%` as `%XX`. */
export function encodeGrpcMessage(text: string): string {
  if (UNENCODED.test(text)) return text;
  let encoded = "";
  for (const byte of Buffer.from(text, "utf8")) {
    encoded += byte >= 0x20 && byte <= 0x7e && byte !== 0x25 ? String.fromCharCode(byte) : `%${byte.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return encoded;
}

/** A `grpc-message` value as connect-node wrote it, re-encoded with {@link encodeGrpcMessage} (unchanged if it does not decode). */
export function reencodeGrpcMessage(value: string): string {
  if (!value.includes("%")) return value;
  try {
    return encodeGrpcMessage(decodeURIComponent(value));
  } catch {
    return value;
  }
}

/** True for gRPC's content types (`application/grpc`, `application/grpc+proto`...), not gRPC-Web's. */
export function isGrpcContentType(contentType: string | undefined): boolean {
  return contentType !== undefined && /^application\/grpc(?:[+;]|$)/i.test(contentType);
}

type HeaderObject = Record<string, unknown>;

function reencodeIn(headers: unknown): void {
  if (headers === null || typeof headers !== "object" || Array.isArray(headers)) return;
  const value = (headers as HeaderObject)["grpc-message"];
  if (typeof value === "string") (headers as HeaderObject)["grpc-message"] = reencodeGrpcMessage(value);
}

/**
 * Makes `res` (a gRPC call's response) send `grpc-message` in gRPC's encoding, both in the headers
 * of a trailers-only response and in the trailers: the two places connect-node writes it (as an
 * object of headers, through `writeHead` and `addTrailers`).
 */
export function useGrpcMessageEncoding(res: object): void {
  const response = res as unknown as { writeHead: (...args: unknown[]) => unknown; addTrailers: (trailers: unknown) => void };
  const writeHead = response.writeHead;
  const addTrailers = response.addTrailers;
  response.writeHead = function (this: unknown, ...args: unknown[]) {
    reencodeIn(args[args.length - 1]);
    return writeHead.apply(this, args);
  };
  response.addTrailers = function (this: unknown, trailers: unknown) {
    reencodeIn(trailers);
    addTrailers.call(this, trailers);
  };
}
