/**
 * What the fuzzer sends, as fast-check arbitraries built from the generated descriptors: for any
 * RPC, a message with random field values (protobuf, through `create`/`toBinary`) or random JSON
 * (right and wrong types by field), then mutated — bytes flipped, cut, appended; envelopes
 * truncated, mislabelled, compressed wrongly, oversized; headers and content types wrong. A case is
 * plain data (a recipe); {@link buildRequest} turns it into bytes when it is sent, so a batch of
 * cases costs little memory until then.
 */
import { gzipSync } from "node:zlib";
import {
  create,
  ScalarType,
  toBinary,
  toJsonString,
  type DescEnum,
  type DescField,
  type DescMessage,
  type DescMethod,
  type JsonValue,
} from "@bufbuild/protobuf";
import fc from "fast-check";
import { envelope, type WireRequest } from "./fuzz-wire.js";

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

/** Values that resolve, when a case is sent, to a token the service handed out earlier (or a bogus one). */
export const PLACEHOLDER = {
  lease: "\u0001lease-token\u0001",
  reservation: "\u0001reservation-id\u0001",
  running: "\u0001running-id\u0001",
} as const;

/** Settings of the generators for one target. */
export interface InputSettings {
  /** Session ids that pass validation: most appends go to these few, so some succeed. */
  readonly sessionIds: readonly string[];
  /** A unique name: traversal attempts aim at files named after it, so a hit is unmistakable. */
  readonly marker: string;
  /** The message limit of the service (bytes). */
  readonly maxMessageBytes: number;
}

const U32 = 2 ** 32 - 1;

/** Strings meant to break something: traversal, separators, NUL, odd unicode, edge lengths. */
function nastyStrings(settings: InputSettings): string[] {
  const m = settings.marker;
  return [
    "",
    " ",
    ".",
    "..",
    "../",
    "./x",
    "/",
    "//",
    "a/b",
    "a\\b",
    "\0",
    "a\0b",
    `${m}\0.jsonl`,
    "é",
    "e\u0301",
    "日本語",
    "🚀",
    "\u202eevil",
    "\ud800",
    "\udfff",
    "\uffff",
    "\ufeffbom",
    "CON",
    "nul",
    "-",
    "_",
    "--help",
    "a".repeat(128),
    "a".repeat(129),
    "a".repeat(4096),
    "a".repeat(4097),
    "%2e%2e",
    "%2f",
    "~",
    "~/x",
    "$HOME",
    "${HOME}",
    "*",
    "?",
    "\n",
    "\r\n",
    "\t",
    "null",
    "undefined",
    "NaN",
    "Infinity",
    "-1",
    "0",
    "1e400",
    "9".repeat(400),
    "__proto__",
    "constructor",
    "toString",
    `../${m}`,
    `../../${m}`,
    `../../../../../../../../tmp/${m}`,
    `/tmp/${m}`,
    `/tmp/${m}/x`,
    `..\\..\\${m}`,
    `${m}/../../../${m}`,
    `sessions/../../${m}`,
    `locks/../../${m}`,
    `./../${m}`,
    `/proc/self/cwd/${m}`,
  ];
}

/** Any string, with the nasty ones and a few huge ones well represented. */
function anyString(settings: InputSettings): fc.Arbitrary<string> {
  const huge = fc
    .constantFrom(65_536, 1 << 20, (1 << 20) + 1, settings.maxMessageBytes - 64, settings.maxMessageBytes + 1, settings.maxMessageBytes + 100_000)
    .chain((length) => fc.constantFrom("a", "/", "é", "\0").map((unit) => unit.repeat(Math.ceil(length / Buffer.byteLength(unit)))));
  return fc.oneof(
    { weight: 4, arbitrary: fc.string() },
    { weight: 2, arbitrary: fc.string({ unit: "binary", maxLength: 40 }) },
    { weight: 2, arbitrary: fc.string({ unit: fc.constantFrom("a", "/", ".", "\0", "é", "\ud800", "-", "\\", " "), maxLength: 30 }) },
    { weight: 6, arbitrary: fc.constantFrom(...nastyStrings(settings)) },
    { weight: 1, arbitrary: fc.oneof({ weight: 30, arbitrary: fc.constant("x") }, { weight: 1, arbitrary: huge }) },
  );
}

const int32 = fc.oneof(fc.integer(), fc.constantFrom(0, 1, -1, 2 ** 31 - 1, -(2 ** 31)));
const uint32 = fc.oneof(fc.integer({ min: 0, max: U32 }), fc.constantFrom(0, 1, U32), fc.integer({ min: 0, max: 20 }));
const int64 = fc.oneof(
  fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }),
  fc.constantFrom(0n, 1n, -1n, 2n ** 63n - 1n, -(2n ** 63n), 2n ** 53n + 1n, -(2n ** 53n) - 1n),
);
const uint64 = fc.oneof(
  fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }),
  fc.constantFrom(0n, 1n, 2n ** 64n - 1n, 2n ** 63n, 2n ** 53n, 2n ** 53n + 1n),
  fc.bigInt({ min: 0n, max: 20n }),
);
const double = fc.oneof(fc.double(), fc.constantFrom(NaN, Infinity, -Infinity, -0, Number.MAX_VALUE, Number.MIN_VALUE, -1, 1e300, 2 ** 64));

function scalar(type: ScalarType, settings: InputSettings): fc.Arbitrary<unknown> {
  switch (type) {
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return double;
    case ScalarType.INT32:
    case ScalarType.SINT32:
    case ScalarType.SFIXED32:
      return int32;
    case ScalarType.UINT32:
    case ScalarType.FIXED32:
      return uint32;
    case ScalarType.INT64:
    case ScalarType.SINT64:
    case ScalarType.SFIXED64:
      return int64;
    case ScalarType.UINT64:
    case ScalarType.FIXED64:
      return uint64;
    case ScalarType.BOOL:
      return fc.boolean();
    case ScalarType.STRING:
      return anyString(settings);
    case ScalarType.BYTES:
      return fc.uint8Array({ maxLength: 64 });
  }
}

function enumValue(desc: DescEnum): fc.Arbitrary<number> {
  return fc.oneof({ weight: 4, arbitrary: fc.constantFrom(...desc.values.map((v) => v.number)) }, { weight: 1, arbitrary: int32 });
}

const smallDuration = fc.record({ seconds: fc.bigInt({ min: 0n, max: 1n }), nanos: fc.integer({ min: 0, max: 999_999_999 }) });
const oddDuration = fc.oneof(
  fc.record({ seconds: fc.bigInt({ min: -5n, max: -1n }), nanos: fc.integer({ min: -999_999_999, max: 0 }) }),
  fc.record({ seconds: fc.constant(0n), nanos: fc.integer({ min: -999_999_999, max: -1 }) }),
  fc.record({ seconds: fc.constantFrom(315_576_000_000n, 315_576_000_001n, 2n ** 63n - 1n, -(2n ** 63n)), nanos: fc.constant(0) }),
  fc.record({ seconds: fc.bigInt({ min: 0n, max: 3n }), nanos: fc.constantFrom(1_000_000_000, 2 ** 31 - 1, -(2 ** 31)) }),
  fc.record({ seconds: fc.constant(1n), nanos: fc.integer({ min: -999_999_999, max: -1 }) }),
);

/** Scalars a validator accepts: short plain strings, small non-negative numbers. */
function saneScalar(type: ScalarType): fc.Arbitrary<unknown> {
  switch (type) {
    case ScalarType.STRING:
      return fc.constantFrom("a", "fuzz", "x-1", "hello world", "é", "http://localhost:3000/");
    case ScalarType.BOOL:
      return fc.boolean();
    case ScalarType.BYTES:
      return fc.uint8Array({ maxLength: 8 });
    case ScalarType.DOUBLE:
    case ScalarType.FLOAT:
      return fc.constantFrom(0, 0.5, 1, 2);
    case ScalarType.INT64:
    case ScalarType.UINT64:
    case ScalarType.SINT64:
    case ScalarType.FIXED64:
    case ScalarType.SFIXED64:
      return fc.bigInt({ min: 0n, max: 5n });
    default:
      return fc.integer({ min: 0, max: 5 });
  }
}

/**
 * Hints by field name: ids that pass validation (so some calls reach deep into the service), small
 * numbers where a small number means something, placeholders for tokens handed out earlier. `sane`
 * keeps only the valid side (a fence, which only a lock holder can give, is left out then).
 */
function hinted(field: DescField, settings: InputSettings, sane: boolean): fc.Arbitrary<unknown> | undefined {
  const nasty = anyString(settings);
  const mix = (valid: fc.Arbitrary<unknown>, validWeight: number, wild: fc.Arbitrary<unknown>, wildWeight: number) =>
    sane ? valid : fc.oneof({ weight: validWeight, arbitrary: valid }, { weight: wildWeight, arbitrary: wild });
  const name = field.name;
  if (field.fieldKind === "scalar" && field.scalar === ScalarType.STRING) {
    switch (name) {
      case "session_id":
        return mix(fc.constantFrom(...settings.sessionIds), 6, nasty, 4);
      case "file":
        // Absolute, as clients send them (a relative one is among the nasty strings), some spelled with '..'.
        return mix(fc.constantFrom("/berth-fuzz/src/a.ts", "/berth-fuzz/src/b.ts", "/berth-fuzz/src/x/../a.ts", `/tmp/${settings.marker}.ts`), 5, nasty, 5);
      case "owner":
      case "name":
        return mix(fc.constantFrom("fuzz", "fuzz-2", "web"), 5, nasty, 5);
      case "idempotency_key":
        return mix(
          fc.oneof(
            fc.constant(""),
            fc.integer({ min: 0, max: 30 }).map((n) => `k-${n}`),
          ),
          8,
          nasty,
          2,
        );
      case "lease_token":
        return mix(fc.constant(PLACEHOLDER.lease), 6, nasty, 4);
      case "request_id":
        // A few ids, so that repeats meet (a repeat answers the first call's lease, or waits with it).
        return mix(
          fc.oneof(
            fc.constant(""),
            fc.integer({ min: 0, max: 5 }).map((n) => `req-${n}`),
          ),
          8,
          nasty,
          2,
        );
      case "reservation_id":
        return mix(fc.constant(PLACEHOLDER.reservation), 6, nasty, 4);
      case "page_token":
        return mix(fc.constant(""), 3, nasty, 7);
      case "id":
        if (field.parent.typeName.startsWith("berth.budget")) return mix(fc.constantFrom(PLACEHOLDER.running, PLACEHOLDER.reservation), 6, nasty, 4);
        return undefined;
      case "memory":
        return mix(
          fc.constantFrom("512M", "2G", "1.5GiB", "1024", "0", "1K", "64M"),
          5,
          fc.oneof(fc.constantFrom("-1G", "1e400", "NaN", "Infinity", "99999999999999T", "1.5.5G", "G", " 2G", "2 G", "0x10", "1e3M"), nasty),
          7,
        );
      case "service":
        return mix(fc.constantFrom("", "berth.sessions.v1.SessionService", "berth.budget.v1.BudgetService", "berth.locks.v1.LockService"), 5, nasty, 5);
      default:
        return sane ? saneScalar(ScalarType.STRING) : undefined;
    }
  }
  if (field.fieldKind === "message" && field.message.typeName === "berth.sessions.v1.Fence" && sane) return fc.constant(undefined);
  if (field.fieldKind === "list" && field.listKind === "scalar" && field.scalar === ScalarType.STRING && name === "ids") {
    return fc.array(mix(fc.constantFrom(PLACEHOLDER.reservation, PLACEHOLDER.running), 1, nasty, 1), { maxLength: 5 });
  }
  if (field.fieldKind === "list" && field.listKind === "scalar" && field.scalar === ScalarType.STRING && name === "lease_tokens") {
    return fc.array(mix(fc.constant(PLACEHOLDER.lease), 1, nasty, 1), { minLength: sane ? 1 : 0, maxLength: 5 });
  }
  if (field.fieldKind === "scalar" && (field.scalar === ScalarType.UINT64 || field.scalar === ScalarType.INT64)) {
    if (name === "expected_seq" && sane) {
      // Mostly unset (the append goes through), sometimes a guess (a conflict that must change nothing).
      return fc.oneof({ weight: 3, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: fc.bigInt({ min: 0n, max: 12n }) });
    }
    if (["expected_seq", "from_seq", "fencing_token"].includes(name)) {
      return mix(fc.bigInt({ min: 0n, max: 12n }), 7, field.scalar === ScalarType.UINT64 ? uint64 : int64, 3);
    }
  }
  if (field.fieldKind === "scalar" && field.scalar === ScalarType.UINT32 && name === "limit") return mix(fc.integer({ min: 0, max: 50 }), 1, uint32, 1);
  if (field.fieldKind === "scalar" && field.scalar === ScalarType.INT32 && name === "page_size") return mix(fc.integer({ min: 0, max: 20 }), 1, int32, 1);
  if (field.fieldKind === "scalar" && field.scalar === ScalarType.INT32 && name === "pid") {
    return mix(fc.constantFrom(1, process.pid), 1, fc.oneof(fc.constantFrom(0, -1, 2 ** 31 - 1, 4_194_304), int32), 2);
  }
  if (field.fieldKind === "message" && field.message.typeName === "google.protobuf.Duration") return mix(smallDuration, 6, oddDuration, 4);
  if (sane && field.fieldKind === "scalar") return saneScalar(field.scalar);
  return undefined;
}

/** A JSON value that protobuf-es can put in a Struct (any JSON; huge strings are rare). */
function jsonValueArb(settings: InputSettings): fc.Arbitrary<JsonValue> {
  const leaf = fc.oneof(
    fc.constant(null),
    fc.boolean(),
    fc.double({ noNaN: true, noDefaultInfinity: true }),
    fc.integer(),
    anyString(settings),
  ) as fc.Arbitrary<JsonValue>;
  return fc.letrec<{ value: JsonValue }>((tie) => ({
    value: fc.oneof(
      { depthSize: "small", withCrossShrink: true },
      leaf,
      fc.array(tie("value"), { maxLength: 4 }),
      fc.dictionary(fc.oneof(fc.string({ maxLength: 8 }), fc.constantFrom("__proto__", "constructor", "")), tie("value"), { maxKeys: 4 }),
    ) as fc.Arbitrary<JsonValue>,
  })).value;
}

/**
 * A `create` init for `desc` with random field values: each field present or not, one member of
 * each oneof or none, messages nested up to `depth`.
 */
export function messageInit(desc: DescMessage, settings: InputSettings, depth = 4, sane = false): fc.Arbitrary<Record<string, unknown>> {
  const memo = new Map<string, fc.Arbitrary<Record<string, unknown>>>();
  const build = (message: DescMessage, level: number): fc.Arbitrary<Record<string, unknown>> => {
    const key = `${message.typeName}@${level}`;
    const known = memo.get(key);
    if (known !== undefined) return known;
    if (level <= 0) return fc.constant({});
    const parts: Record<string, fc.Arbitrary<unknown>> = {};
    const valueFor = (field: DescField): fc.Arbitrary<unknown> | undefined => {
      const hint = hinted(field, settings, sane);
      if (hint !== undefined) return hint;
      switch (field.fieldKind) {
        case "scalar":
          return scalar(field.scalar, settings);
        case "enum":
          return sane ? fc.constantFrom(...field.enum.values.map((v) => v.number)) : enumValue(field.enum);
        case "message":
          if (field.message.typeName === "google.protobuf.Struct" && message.typeName !== "google.protobuf.Value") {
            if (sane)
              return fc.dictionary(fc.constantFrom("a", "b", "note"), fc.oneof(fc.integer({ min: 0, max: 9 }), fc.constantFrom("x", "y")), { maxKeys: 2 });
            return fc.dictionary(fc.string({ maxLength: 10 }), jsonValueArb(settings), { maxKeys: 5 });
          }
          return level > 1 ? build(field.message, level - 1) : undefined;
        case "list": {
          const scalarItem = (type: ScalarType) => (sane ? saneScalar(type) : scalar(type, settings));
          const item =
            field.listKind === "scalar"
              ? scalarItem(field.scalar)
              : field.listKind === "enum"
                ? enumValue(field.enum)
                : level > 1
                  ? build(field.message, level - 1)
                  : undefined;
          return item === undefined ? undefined : fc.array(item, { minLength: sane ? 1 : 0, maxLength: sane ? 3 : 4 });
        }
        case "map": {
          const keyArb = field.mapKey === ScalarType.STRING ? fc.string({ maxLength: 10 }) : scalar(field.mapKey, settings).map((k) => String(k));
          const value =
            field.mapKind === "scalar"
              ? sane
                ? saneScalar(field.scalar)
                : scalar(field.scalar, settings)
              : field.mapKind === "enum"
                ? enumValue(field.enum)
                : level > 1
                  ? build(field.message, level - 1)
                  : undefined;
          return value === undefined ? undefined : fc.dictionary(keyArb, value, { maxKeys: sane ? 2 : 4 });
        }
      }
    };
    for (const member of message.members) {
      if (member.kind === "field") {
        const arb = valueFor(member);
        if (arb !== undefined) parts[member.localName] = arb;
      } else {
        const cases = member.fields.flatMap((field) => {
          const arb = valueFor(field);
          return arb === undefined ? [] : [arb.map((value) => ({ case: field.localName, value }))];
        });
        if (cases.length > 0) parts[member.localName] = fc.oneof(...cases);
      }
    }
    // Wild: any field may be missing. Sane: every field and oneof is set, but for the optional
    // ones (proto3 `optional`), so that validators see complete requests.
    const optional = message.fields.filter((f) => f.proto.proto3Optional).map((f) => f.localName);
    const requiredKeys = sane ? Object.keys(parts).filter((key) => !optional.includes(key)) : [];
    const arb = fc.record(parts, { requiredKeys }) as fc.Arbitrary<Record<string, unknown>>;
    memo.set(key, arb);
    return arb;
  };
  return build(desc, depth);
}

/** A JSON value of the right kind for `field` in canonical protobuf JSON, or deliberately not. */
function jsonForField(field: DescField, settings: InputSettings, depth: number): fc.Arbitrary<unknown> {
  const wrong = fc.oneof(
    fc.constant(null),
    fc.boolean(),
    fc.double(),
    fc.constantFrom("NaN", "Infinity", "-Infinity", "1e400", "-1", "0x10", "", "1.5", "18446744073709551616", "-9223372036854775809"),
    fc.constant([]),
    fc.constant({}),
    anyString(settings),
  );
  const scalarJson = (type: ScalarType, hint: fc.Arbitrary<unknown> | undefined): fc.Arbitrary<unknown> => {
    if (type === ScalarType.STRING) return hint ?? anyString(settings);
    if (type === ScalarType.BOOL) return fc.boolean();
    if (type === ScalarType.BYTES) return fc.base64String({ maxLength: 40 });
    if (type === ScalarType.DOUBLE || type === ScalarType.FLOAT)
      return fc.oneof(fc.double({ noNaN: true, noDefaultInfinity: true }), fc.constantFrom("NaN", "Infinity", "-Infinity"));
    return fc.oneof(
      (hint ?? scalar(type, settings)).map((v) => (typeof v === "bigint" ? v.toString() : v)),
      fc.integer({ min: 0, max: 20 }),
    );
  };
  const enumJson = (desc: DescEnum): fc.Arbitrary<unknown> =>
    fc.oneof(fc.constantFrom(...desc.values.map((v) => v.name)), fc.constantFrom(...desc.values.map((v) => v.number)), fc.constant("NOT_A_VALUE"));
  const messageJson = (desc: DescMessage): fc.Arbitrary<unknown> => {
    switch (desc.typeName) {
      case "google.protobuf.Duration":
        return fc.constantFrom(
          "0s",
          "0.5s",
          "1s",
          "1.000000001s",
          "-1s",
          "-0.5s",
          "315576000001s",
          "1e9s",
          "abc",
          "1m",
          "s",
          "",
          "NaNs",
          "Infinitys",
          "0.0000000001s",
        );
      case "google.protobuf.Timestamp":
        return fc.constantFrom(
          "1970-01-01T00:00:00Z",
          "2030-01-01T00:00:00.123Z",
          "0000-01-01T00:00:00Z",
          "10000-01-01T00:00:00Z",
          "yesterday",
          "",
          "2024-02-30T25:61:61Z",
        );
      case "google.protobuf.Struct":
        return fc.dictionary(fc.string({ maxLength: 8 }), jsonValueArb(settings), { maxKeys: 4 });
      case "google.protobuf.Value":
        return jsonValueArb(settings);
      case "google.protobuf.ListValue":
        return fc.array(jsonValueArb(settings), { maxLength: 4 });
      default:
        return depth > 0 ? jsonForMessage(desc, settings, depth - 1) : fc.constant({});
    }
  };
  const hint = hinted(field, settings, false);
  let right: fc.Arbitrary<unknown>;
  switch (field.fieldKind) {
    case "scalar":
      right = scalarJson(field.scalar, hint);
      break;
    case "enum":
      right = enumJson(field.enum);
      break;
    case "message":
      right = messageJson(field.message);
      break;
    case "list": {
      const item =
        field.listKind === "scalar" ? scalarJson(field.scalar, undefined) : field.listKind === "enum" ? enumJson(field.enum) : messageJson(field.message);
      right = hint ?? fc.array(item, { maxLength: 4 });
      break;
    }
    case "map": {
      const item =
        field.mapKind === "scalar" ? scalarJson(field.scalar, undefined) : field.mapKind === "enum" ? enumJson(field.enum) : messageJson(field.message);
      right = fc.dictionary(fc.string({ maxLength: 8 }), item, { maxKeys: 4 });
      break;
    }
  }
  return fc.oneof({ weight: 4, arbitrary: right }, { weight: 1, arbitrary: wrong });
}

/** A JSON object for `desc`: fields by JSON or proto name, right or wrong values, unknown keys sometimes. */
export function jsonForMessage(desc: DescMessage, settings: InputSettings, depth = 3): fc.Arbitrary<Record<string, unknown>> {
  const parts: Record<string, fc.Arbitrary<unknown>> = {};
  for (const field of desc.fields) {
    parts[field.jsonName] = jsonForField(field, settings, depth);
  }
  const keyed = fc.record(parts, { requiredKeys: [] });
  const renamed = fc
    .tuple(keyed, fc.boolean(), fc.dictionary(fc.constantFrom("unknownField", "__proto__", "x", "@type"), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 2 }))
    .map(([object, protoNames, extra]) => {
      const out: Record<string, unknown> = {};
      for (const [key, value] of Object.entries(object)) {
        const field = desc.fields.find((f) => f.jsonName === key);
        out[protoNames && field !== undefined ? field.name : key] = value;
      }
      return { ...out, ...extra };
    });
  return renamed;
}

/** JSON text for a case: usually an object for the input type, sometimes anything at all, then maybe broken. */
function jsonText(desc: DescMessage, settings: InputSettings): fc.Arbitrary<string> {
  const body = fc.oneof(
    { weight: 8, arbitrary: jsonForMessage(desc, settings).map((v) => JSON.stringify(v)) },
    { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 3 }).map((v) => JSON.stringify(v)) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        "",
        "{",
        "}",
        "[",
        '{"a":',
        "null",
        "nul",
        "{}{}",
        '{"sessionId":"a","sessionId":5}',
        "\ufeff{}",
        "{} // x",
        "{'a':1}",
        "[".repeat(100_000) + "]".repeat(100_000),
        `${'{"a":'.repeat(20_000)}1${"}".repeat(20_000)}`,
      ),
    },
  );
  return fc.tuple(body, fc.constantFrom("none", "none", "none", "none", "truncate", "garbage", "whitespace")).map(([text, damage]) => {
    switch (damage) {
      case "truncate":
        return text.slice(0, Math.floor(text.length / 2));
      case "garbage":
        return `${text.slice(0, Math.floor(text.length / 3))}\u0000\ud800"${text.slice(Math.floor(text.length / 3))}`;
      case "whitespace":
        return ` \n\t${text}\r\n `;
      default:
        return text;
    }
  });
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
