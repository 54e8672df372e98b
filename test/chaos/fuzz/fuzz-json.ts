/**
 * Random JSON for any RPC's input (the fuzzer's `format: "json"` cases): objects keyed by JSON or
 * proto names, each value of the right kind in canonical protobuf JSON or deliberately not, unknown
 * keys sometimes; then, as text, maybe broken.
 */
import { ScalarType, type DescEnum, type DescField, type DescMessage } from "@bufbuild/protobuf";
import fc from "fast-check";
import { anyString, hinted, jsonValueArb, scalar, type InputSettings } from "./fuzz-messages.js";

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
export function jsonText(desc: DescMessage, settings: InputSettings): fc.Arbitrary<string> {
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
