/**
 * A fuzz case turned into the request to send: placeholders resolved to tokens the services handed
 * out, the message encoded and mutated, framed, compressed and labelled as the case says; and what
 * the judge needs to know about it (what the server parses, whether it is oversized, whether the
 * gRPC spec demands INTERNAL).
 */
import { gzipSync } from "node:zlib";
import { create, toBinary, toJsonString, type DescMethod } from "@bufbuild/protobuf";
import type { ByteMutation, Framing, FuzzCase, Transport } from "./fuzz-cases.js";
import { PLACEHOLDER } from "./fuzz-messages.js";
import { envelope, type WireRequest } from "./fuzz-framing.js";

/** Tokens the services handed out, by kind, for the placeholders. */
export interface TokenPools {
  readonly lease: string[];
  readonly reservation: string[];
  readonly running: string[];
}

function resolvePlaceholders(value: unknown, pools: TokenPools, pick: () => number): unknown {
  if (typeof value === "string") {
    const pool =
      value === PLACEHOLDER.lease
        ? pools.lease
        : value === PLACEHOLDER.reservation
          ? pools.reservation
          : value === PLACEHOLDER.running
            ? pools.running
            : undefined;
    if (pool === undefined) return value;
    return pool.length === 0 ? `never-issued-${pick()}` : pool[pick() % pool.length]!;
  }
  if (Array.isArray(value)) return value.map((v) => resolvePlaceholders(v, pools, pick));
  if (value instanceof Uint8Array || typeof value !== "object" || value === null) return value;
  const out: Record<string, unknown> = {};
  for (const [key, v] of Object.entries(value)) out[key] = resolvePlaceholders(v, pools, pick);
  return out;
}

function applyMutations(bytes: Uint8Array, mutations: readonly ByteMutation[]): Uint8Array {
  let out = Buffer.from(bytes);
  for (const m of mutations) {
    const at = (n: number) => (out.length === 0 ? 0 : n % (out.length + 1));
    switch (m.op) {
      case "flip":
        if (out.length > 0) out[m.at % out.length]! ^= 1 << m.bit;
        break;
      case "set":
        if (out.length > 0) out[m.at % out.length] = m.value;
        break;
      case "truncate":
        out = out.subarray(0, at(m.at));
        break;
      case "insert":
        out = Buffer.concat([out.subarray(0, at(m.at)), Buffer.from(m.bytes), out.subarray(at(m.at))]);
        break;
      case "append":
        out = Buffer.concat([out, Buffer.from(m.bytes)]);
        break;
      case "duplicate": {
        const a = at(m.from);
        const b = at(m.to);
        out = Buffer.concat([out, out.subarray(Math.min(a, b), Math.max(a, b))]);
        break;
      }
      case "pad":
        // Field 4095, wire type 2: unknown to every berth message, so the message stays valid.
        out = Buffer.concat([out, varint((4095 << 3) | 2), varint(m.bytes), Buffer.alloc(m.bytes, 0x61)]);
        break;
      case "nest":
        out = Buffer.concat([out, nestedValues(m.depth)]);
        break;
    }
  }
  return out;
}

function varint(value: number): Buffer {
  const bytes: number[] = [];
  let v = value;
  while (v > 0x7f) {
    bytes.push((v & 0x7f) | 0x80);
    v = Math.floor(v / 128);
  }
  bytes.push(v);
  return Buffer.from(bytes);
}

/**
 * Field 2, length-delimited, holding field 2 holding field 2… `depth` times: field 2 is a message
 * in many berth messages (an event, a need, a lease), so a parser follows the nesting down — past
 * protobuf's recursion limit (100) when `depth` is large.
 */
function nestedValues(depth: number): Buffer {
  let inner = Buffer.alloc(0);
  for (let i = 0; i < depth; i++) inner = Buffer.concat([varint((2 << 3) | 2), varint(inner.length), inner]);
  return Buffer.concat([varint((2 << 3) | 2), varint(inner.length), inner]);
}

/**
 * Whether the server, reading this body by its content type, meets an envelope flagged compressed
 * without the protocol's encoding header: the gRPC compression spec requires INTERNAL for exactly
 * that (connect-go answers the Connect streaming equivalent the same way).
 */
function compressedWithoutEncoding(contentType: string | null, headers: Readonly<Record<string, string>>, chunks: readonly Uint8Array[]): boolean {
  const first = chunks[0];
  if (contentType === null || first === undefined || first.byteLength === 0 || (first[0]! & 0x01) === 0) return false;
  const type = contentType.toLowerCase();
  const header = type.startsWith("application/grpc") ? "grpc-encoding" : type.startsWith("application/connect+") ? "connect-content-encoding" : undefined;
  if (header === undefined) return false;
  const encoding = headers[header];
  return encoding === undefined || encoding === "" || encoding === "identity";
}

/** The right content type of a transport and format. */
function defaultContentType(transport: Transport, format: "proto" | "json", streaming: boolean): string {
  if (transport === "grpc") return format === "json" ? "application/grpc+json" : "application/grpc";
  if (streaming) return format === "json" ? "application/connect+json" : "application/connect+proto";
  return format === "json" ? "application/json" : "application/proto";
}

/**
 * The message the server parses out of a request, so that what an acknowledged call did can be
 * attributed (empty when it parses none). The content type, not the transport, picks the protocol
 * the body is read in: a gRPC transport's body labelled `application/json` is a Connect unary call,
 * read whole, and an unframed one is then the message itself.
 */
function messageTheServerReads(
  contentType: string | null,
  enveloped: boolean,
  framing: Framing,
  chunks: readonly Uint8Array[],
  mutated: Uint8Array,
): Uint8Array {
  if (contentType === null) return new Uint8Array(0);
  if (/^application\/(grpc|connect\+)/i.test(contentType)) {
    // Enveloped protocols. Flag bits other than "compressed" mean nothing to the server, so an
    // odd-flags message is parsed as it stands.
    return enveloped && (framing === "normal" || framing === "gzip" || framing === "odd-flags") ? mutated : new Uint8Array(0);
  }
  // Connect unary: the body is the message (content-encoding is the only encoding header it reads,
  // and only a Connect unary transport sends it: its gzip framing is the message compressed).
  if (enveloped) return Buffer.concat(chunks);
  return framing === "normal" || framing === "gzip" ? mutated : new Uint8Array(0);
}

/** A built request plus what the judge needs to know about how it was built. */
export interface BuiltRequest {
  readonly wire: WireRequest;
  /** The message bytes before framing (what the server parses, when framing is intact). */
  readonly messageBytes: Uint8Array;
  /** The body carries a well-formed message larger than the limit (the answer must be RESOURCE_EXHAUSTED). */
  readonly oversized: boolean;
  /** The gRPC spec demands INTERNAL for this framing. */
  readonly internalBySpec: boolean;
  /** A one-line description of the case for reports. */
  readonly label: string;
}

/**
 * Turns a case into the request to send. Placeholders become tokens from `pools`; `serial` picks
 * among them deterministically.
 */
export function buildRequest(fuzzCase: FuzzCase, method: DescMethod, pools: TokenPools, serial: number, maxMessageBytes: number): BuiltRequest {
  let counter = serial;
  const pick = () => (counter = (counter * 1103515245 + 12345) >>> 0);
  const streamingOut = method.methodKind !== "unary";
  const streamingIn = method.methodKind === "bidi_streaming" || method.methodKind === "client_streaming";
  const connectStreaming = fuzzCase.transport !== "grpc" && streamingOut;
  const enveloped = fuzzCase.transport === "grpc" || connectStreaming;

  let messageBytes: Uint8Array;
  let labelBody: string;
  if (fuzzCase.format === "json" && fuzzCase.jsonFromInit) {
    const init = resolvePlaceholders(fuzzCase.init, pools, pick) as Record<string, unknown>;
    try {
      messageBytes = Buffer.from(toJsonString(method.input, create(method.input, init as never)), "utf8");
      labelBody = "clean json";
    } catch (error) {
      messageBytes = Buffer.from("{}");
      labelBody = `clean json(unencodable: ${(error as Error).message.slice(0, 60)})`;
    }
  } else if (fuzzCase.format === "json") {
    messageBytes = Buffer.from(String(resolvePlaceholders(fuzzCase.jsonText, pools, pick)), "utf8");
    labelBody = "json";
  } else {
    const init = resolvePlaceholders(fuzzCase.init, pools, pick) as Record<string, unknown>;
    try {
      messageBytes = toBinary(method.input, create(method.input, init as never));
      labelBody = fuzzCase.jsonFromInit ? "clean proto" : "proto";
    } catch (error) {
      // A generator value protobuf-es will not encode: send what it would have been without it.
      messageBytes = new Uint8Array(0);
      labelBody = `proto(unencodable: ${(error as Error).message.slice(0, 60)})`;
    }
  }
  const mutated = applyMutations(messageBytes, fuzzCase.mutations);
  const padded = fuzzCase.mutations.some((m) => m.op === "pad" && m.bytes > maxMessageBytes);
  const onlyPadding = fuzzCase.mutations.every((m) => m.op === "pad");

  const headers: Record<string, string> = {};
  const contentType = fuzzCase.contentType === undefined ? defaultContentType(fuzzCase.transport, fuzzCase.format, streamingOut) : fuzzCase.contentType;
  if (contentType !== null) headers["content-type"] = contentType;
  if (fuzzCase.transport === "grpc" && !fuzzCase.dropTe) headers.te = "trailers";
  // Both protocols' deadline headers: a mislabelled content type makes the server read the request
  // in another protocol than the transport's, and a server without a deadline may rightly wait for
  // ever for a stream message that never comes.
  let deadlineMs: number | undefined;
  if (typeof fuzzCase.deadline === "number") {
    deadlineMs = fuzzCase.deadline;
    headers["grpc-timeout"] = `${fuzzCase.deadline}m`;
    headers["connect-timeout-ms"] = String(fuzzCase.deadline);
  } else {
    // The broken value in the transport's header; the other protocol still gets a real deadline.
    headers["grpc-timeout"] = fuzzCase.transport === "grpc" ? fuzzCase.deadline.raw : "1500m";
    headers["connect-timeout-ms"] = fuzzCase.transport === "grpc" ? "1500" : fuzzCase.deadline.raw;
  }
  for (const [name, value] of Object.entries(fuzzCase.extraHeaders)) {
    if (name === "grpc-encoding" || name === "content-encoding" || name === "connect-content-encoding") continue; // framing decides these
    headers[name] = value;
  }

  let chunks: Uint8Array[];
  const framing = enveloped
    ? fuzzCase.framing
    : (["normal", "gzip", "gzip-garbage", "gzip-bomb", "unknown-encoding"] as const).includes(fuzzCase.framing as never)
      ? fuzzCase.framing
      : "normal";
  const encodingHeader = fuzzCase.transport === "grpc" ? "grpc-encoding" : connectStreaming ? "connect-content-encoding" : "content-encoding";
  const bomb = () => gzipSync(Buffer.alloc(maxMessageBytes + 1024 * 1024, 0));
  const frame = (flags: number, payload: Uint8Array) => (enveloped ? envelope(flags, payload) : payload);
  switch (framing) {
    case "normal":
      chunks = [frame(0, mutated)];
      break;
    case "compressed-flag":
      chunks = [frame(1, mutated)];
      break;
    case "gzip":
      headers[encodingHeader] = "gzip";
      chunks = [frame(1, gzipSync(mutated))];
      break;
    case "gzip-garbage":
      headers[encodingHeader] = "gzip";
      chunks = [frame(1, Buffer.concat([Buffer.from([0x1f, 0x8b]), mutated]))];
      break;
    case "gzip-bomb":
      headers[encodingHeader] = "gzip";
      chunks = [frame(1, bomb())];
      break;
    case "unknown-encoding":
      headers[encodingHeader] = "zstd-fuzz";
      chunks = [frame(1, mutated)];
      break;
    case "truncated":
      chunks = [envelope(0, mutated.subarray(0, Math.floor(mutated.byteLength / 2)), mutated.byteLength + 1)];
      break;
    case "short-prefix":
      chunks = [envelope(0, mutated).subarray(0, 1 + (serial % 4))];
      break;
    case "extra-garbage":
      chunks = [envelope(0, mutated), Buffer.from([0xde, 0xad, 0xbe])];
      break;
    case "two-messages":
      chunks = [envelope(0, mutated), envelope(0, mutated)];
      break;
    case "no-message":
      chunks = [];
      break;
    case "huge-declared":
      chunks = [envelope(0, mutated.subarray(0, 8), 0xfffffff0)];
      break;
    case "odd-flags":
      chunks = [envelope(0x80 | 0x40 | 0x04, mutated)];
      break;
    case "unframed":
      chunks = [mutated];
      break;
  }
  // HTTP/1.1 cannot carry a bidi stream; Connect streams over it are still sent (to get the 505).
  // Only a request whose every other part is right must be refused for its size (a broken timeout
  // header or a bidi call over HTTP/1.1 is refused first, rightly).
  const plainOtherwise =
    fuzzCase.contentType === undefined &&
    typeof fuzzCase.deadline === "number" &&
    Object.keys(fuzzCase.extraHeaders).length === 0 &&
    typeof fuzzCase.settle !== "number" &&
    !(fuzzCase.transport === "connect-h1" && streamingIn);
  const oversized = plainOtherwise && ((padded && onlyPadding && (framing === "normal" || framing === "gzip")) || framing === "gzip-bomb");
  const wire: WireRequest = {
    protocol: fuzzCase.transport === "grpc" ? "grpc" : "connect",
    httpVersion: fuzzCase.transport === "connect-h1" ? 1 : 2,
    path: `/${method.parent.typeName}/${method.name}`,
    headers,
    chunks,
    requestEnd: fuzzCase.requestEnd,
    settle: fuzzCase.settle,
    timeoutMs: Math.max(5_000, (deadlineMs ?? 0) + 4_000),
    streamingResponse: connectStreaming,
    bidi: method.methodKind === "bidi_streaming",
  };
  const mutationLabel = fuzzCase.mutations.map((m) => m.op).join("+") || "intact";
  return {
    wire,
    messageBytes: messageTheServerReads(contentType, enveloped, framing, chunks, mutated),
    oversized,
    internalBySpec: compressedWithoutEncoding(contentType, headers, chunks),
    label: `${fuzzCase.transport} ${method.parent.name}.${method.name} ${labelBody} ${mutationLabel} ${framing} ct=${contentType ?? "(none)"} settle=${fuzzCase.settle}`,
  };
}
