/**
 * Random messages for any RPC, as fast-check arbitraries built from the generated descriptors: a
 * `create` init with random field values (right and wrong by field, strings meant to break
 * something, numbers at their edges), or with the values a validator accepts (`sane`), so that some
 * calls reach deep into the service.
 */
import { ScalarType, type DescEnum, type DescField, type DescMessage, type JsonValue } from "@bufbuild/protobuf";
import fc from "fast-check";

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
export function anyString(settings: InputSettings): fc.Arbitrary<string> {
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

export function scalar(type: ScalarType, settings: InputSettings): fc.Arbitrary<unknown> {
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
export function hinted(field: DescField, settings: InputSettings, sane: boolean): fc.Arbitrary<unknown> | undefined {
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
export function jsonValueArb(settings: InputSettings): fc.Arbitrary<JsonValue> {
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
