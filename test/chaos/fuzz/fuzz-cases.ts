/**
 * What the fuzzer sends, as fast-check arbitraries: for any RPC, a clean case (a plausible call,
 * well framed) or a wild one (random message or JSON, then mutated — bytes flipped, cut, appended;
 * envelopes truncated, mislabelled, compressed wrongly, oversized; headers and content types
 * wrong), and now and then raw bytes on a socket. A case is plain data (a recipe); buildRequest
 * (fuzz-requests.ts) turns it into bytes when it is sent, so a batch of cases costs little memory
 * until then.
 */
import type { DescMethod } from "@bufbuild/protobuf";
import fc from "fast-check";
import { jsonText } from "./fuzz-json.js";
import { messageInit, type InputSettings } from "./fuzz-messages.js";

/** Where a case travels. */
export type Transport = "grpc" | "connect-h1" | "connect-h2" | "socket";

/** A change to the serialized message bytes. */
export type ByteMutation =
  | { readonly op: "flip"; readonly at: number; readonly bit: number }
  | { readonly op: "set"; readonly at: number; readonly value: number }
  | { readonly op: "truncate"; readonly at: number }
  | { readonly op: "insert"; readonly at: number; readonly bytes: readonly number[] }
  | { readonly op: "append"; readonly bytes: readonly number[] }
  | { readonly op: "duplicate"; readonly from: number; readonly to: number }
  /** A well-formed unknown field this long: an oversized message that is otherwise valid. */
  | { readonly op: "pad"; readonly bytes: number }
  /** Messages nested this deep (past protobuf's recursion limit when large). */
  | { readonly op: "nest"; readonly depth: number };

/** How the message travels inside its body. */
export type Framing =
  | "normal"
  /** Compressed flag set without an encoding (the gRPC compression spec requires INTERNAL for it). */
  | "compressed-flag"
  | "gzip"
  | "gzip-garbage"
  /** A few KB of gzip that inflates past the message limit. */
  | "gzip-bomb"
  | "unknown-encoding"
  /** The envelope announces more bytes than follow. */
  | "truncated"
  /** Only the first 1–4 bytes of the 5-byte prefix. */
  | "short-prefix"
  | "extra-garbage"
  | "two-messages"
  | "no-message"
  /** A prefix announcing ~4 GiB, then a few bytes. */
  | "huge-declared"
  /** Flag bits no protocol defines. */
  | "odd-flags"
  /** The bytes without any envelope. */
  | "unframed";

/** One fuzz case: everything needed to rebuild its request. */
export interface FuzzCase {
  readonly methodIndex: number;
  readonly transport: Transport;
  readonly format: "proto" | "json";
  /** A `create` init for the input message (placeholders resolved at send time). */
  readonly init: Record<string, unknown>;
  /** JSON text for `format: "json"` (already possibly broken). */
  readonly jsonText: string;
  /** A clean case: its JSON is `init` in canonical protobuf JSON, not `jsonText`. */
  readonly jsonFromInit: boolean;
  readonly mutations: readonly ByteMutation[];
  readonly framing: Framing;
  /** The content type to send, or `null` to leave it out; `undefined` means the right one. */
  readonly contentType: string | null | undefined;
  /** A timeout in ms sent the protocol's way, or a raw (probably broken) header value. */
  readonly deadline: number | { readonly raw: string };
  readonly extraHeaders: Readonly<Record<string, string>>;
  readonly dropTe: boolean;
  /** For transport "socket": the bytes to write. */
  readonly socketBytes: readonly number[];
  readonly settle: "status" | "first" | number;
  readonly requestEnd: "end" | "open";
}

const byteMutation: fc.Arbitrary<ByteMutation> = fc.oneof(
  fc.record({ op: fc.constant("flip" as const), at: fc.nat(), bit: fc.integer({ min: 0, max: 7 }) }),
  fc.record({ op: fc.constant("set" as const), at: fc.nat(), value: fc.integer({ min: 0, max: 255 }) }),
  fc.record({ op: fc.constant("truncate" as const), at: fc.nat() }),
  fc.record({ op: fc.constant("insert" as const), at: fc.nat(), bytes: fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 1, maxLength: 12 }) }),
  fc.record({ op: fc.constant("append" as const), bytes: fc.array(fc.integer({ min: 0, max: 255 }), { minLength: 1, maxLength: 12 }) }),
  fc.record({ op: fc.constant("duplicate" as const), from: fc.nat(), to: fc.nat() }),
);

/** Extra headers: wrong protocol versions, junk encodings, credentials nobody asked for, a big header. */
const headerNoise = fc.dictionary(
  fc.constantFrom(
    "connect-protocol-version",
    "grpc-accept-encoding",
    "accept-encoding",
    "authorization",
    "x-fuzz",
    "grpc-encoding",
    "content-encoding",
    "connect-content-encoding",
    "user-agent",
  ),
  fc.oneof(
    fc.constantFrom("1", "2", "", "gzip", "br", "identity", "zstd", "gzip, deflate", "Bearer x", "Bearer ", "\t"),
    fc.string({ unit: "grapheme-ascii", maxLength: 20 }),
    fc.constant("x".repeat(8000)),
  ),
  { maxKeys: 2 },
);

/** The arbitrary of a case for one of `methods`. */
export function caseArbitrary(methods: readonly DescMethod[], settings: InputSettings): fc.Arbitrary<FuzzCase> {
  const perMethod = methods.map((method, methodIndex) => {
    const streamingIn = method.methodKind === "bidi_streaming" || method.methodKind === "client_streaming";
    const streamingOut = method.methodKind !== "unary";
    const settle: fc.Arbitrary<"status" | "first" | number> = streamingOut
      ? fc.oneof(
          { weight: 14, arbitrary: fc.constant("first" as const) },
          { weight: 4, arbitrary: fc.integer({ min: 0, max: 300 }) },
          { weight: 1, arbitrary: fc.constant("status" as const) },
        )
      : fc.oneof({ weight: 19, arbitrary: fc.constant("status" as const) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: 40 }) });
    const requestEnd: fc.Arbitrary<"end" | "open"> = streamingIn ? fc.constantFrom("open", "open", "end") : fc.constant("end");
    const transport = fc.constantFrom<Transport>("grpc", "grpc", "grpc", "grpc", "connect-h1", "connect-h1", "connect-h2", "connect-h2", "grpc", "connect-h1");
    const format = fc.constantFrom<"proto" | "json">("proto", "proto", "json");
    // A clean case is a plausible call, well framed: it gets past the protocol and the validators
    // often enough to append, lock and admit for real (so that refusals meet a service with state).
    const clean = fc.record({
      methodIndex: fc.constant(methodIndex),
      transport,
      format,
      init: messageInit(method.input, settings, 4, true),
      jsonText: fc.constant(""),
      jsonFromInit: fc.constant(true),
      mutations: fc.constant([]),
      framing: fc.constant<Framing>("normal"),
      contentType: fc.constant(undefined),
      deadline: fc.integer({ min: 150, max: 1000 }),
      extraHeaders: fc.constant({}),
      dropTe: fc.constant(false),
      socketBytes: fc.constant([]),
      settle,
      requestEnd,
    });
    const wild = fc.record({
      methodIndex: fc.constant(methodIndex),
      transport,
      format,
      init: messageInit(method.input, settings),
      jsonText: jsonText(method.input, settings),
      jsonFromInit: fc.constant(false),
      mutations: fc.oneof(
        { weight: 6, arbitrary: fc.constant([]) },
        { weight: 4, arbitrary: fc.array(byteMutation, { minLength: 1, maxLength: 3 }) },
        {
          weight: 1,
          arbitrary: fc.constantFrom<ByteMutation[]>(
            [{ op: "pad", bytes: settings.maxMessageBytes + 1 }],
            [{ op: "pad", bytes: settings.maxMessageBytes - 200 }],
            [{ op: "nest", depth: 150 }],
            [{ op: "nest", depth: 20 }],
          ),
        },
      ),
      framing: fc.oneof(
        { weight: 30, arbitrary: fc.constant<Framing>("normal") },
        {
          weight: 10,
          arbitrary: fc.constantFrom<Framing>(
            "compressed-flag",
            "gzip",
            "gzip-garbage",
            "gzip-bomb",
            "unknown-encoding",
            "truncated",
            "short-prefix",
            "extra-garbage",
            "two-messages",
            "no-message",
            "huge-declared",
            "odd-flags",
            "unframed",
          ),
        },
      ),
      contentType: fc.oneof(
        { weight: 20, arbitrary: fc.constant(undefined) },
        { weight: 1, arbitrary: fc.constant(null) },
        {
          weight: 3,
          arbitrary: fc.constantFrom(
            "text/plain",
            "application/xml",
            "application/x-www-form-urlencoded",
            "application/grpc+json",
            "application/grpc+xml",
            "application/json; charset=latin1",
            "application/json; charset=utf-8",
            "application/proto",
            "application/connect+json",
            "application/connect+proto",
            "application/grpc-web+proto",
            "application/grpc",
            "multipart/form-data; boundary=x",
            "",
            "application/jsonx",
          ),
        },
      ),
      deadline: fc.oneof(
        { weight: 12, arbitrary: fc.integer({ min: 150, max: 1000 }) },
        { weight: 1, arbitrary: fc.integer({ min: 1, max: 20 }) },
        { weight: 1, arbitrary: fc.constantFrom("abc", "", "-1S", "1", "99999999999S", "1.5S", "0m", "1x", "-5", "1e3", "NaN").map((raw) => ({ raw })) },
      ),
      extraHeaders: fc.oneof({ weight: 6, arbitrary: fc.constant({}) }, { weight: 1, arbitrary: headerNoise }),
      dropTe: fc.oneof({ weight: 9, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
      socketBytes: fc.constant([]),
      settle,
      requestEnd,
    });
    return fc.oneof({ weight: 1, arbitrary: clean }, { weight: 3, arbitrary: wild });
  });
  const socket = fc
    .oneof(
      fc.uint8Array({ minLength: 1, maxLength: 256 }).map((b) => [...b]),
      fc.uint8Array({ maxLength: 64 }).map((b) => [...Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1"), ...b]),
      fc
        .constantFrom(
          "GET / HTTP/1.1\r\n\r\n",
          "POST /berth.sessions.v1.SessionService/GetSnapshot HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\nContent-Type: application/json\r\n\r\n{",
          "POST /grpc.health.v1.Health/Check HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\nzz\r\n",
          "PRI * HTTP/2.0\r\n",
          "P",
          "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
          "GET /metrics HTTP/1.0\r\n\r\n",
          `GET /${"a".repeat(70_000)} HTTP/1.1\r\n\r\n`,
        )
        .map((s) => [...Buffer.from(s, "latin1")]),
    )
    .map(
      (socketBytes): FuzzCase => ({
        methodIndex: 0,
        transport: "socket",
        format: "proto",
        init: {},
        jsonText: "",
        jsonFromInit: false,
        mutations: [],
        framing: "normal",
        contentType: undefined,
        deadline: 1000,
        extraHeaders: {},
        dropTe: false,
        socketBytes,
        settle: "status",
        requestEnd: "end",
      }),
    );
  return fc.oneof({ weight: 49, arbitrary: fc.oneof(...perMethod) }, { weight: 1, arbitrary: socket });
}
