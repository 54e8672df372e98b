/**
 * What `--json` prints: every integer a JSON number. Proto3's JSON mapping writes 64-bit integers
 * as strings (`"seq":"5"`, `"memoryBytes":"2147483648"`) so that no JSON reader rounds them; a
 * script reading berth's output wants numbers, and berth's 64-bit values (seqs, fencing tokens,
 * byte counts) stay far below 2^53, where a JSON number is exact. One beyond it stays a string.
 */
import { ScalarType, toJson, type DescField, type DescMessage, type JsonObject, type JsonValue, type MessageShape } from "@bufbuild/protobuf";

/** A 64-bit integer as JSON: a number when exact (|n| ≤ 2^53 − 1), else its decimal string. */
export function jsonInteger(value: bigint): number | string {
  return value >= -BigInt(Number.MAX_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : String(value);
}

/** `message` as proto3 JSON (camelCase keys, enums by name, Timestamps and Durations as strings), its 64-bit integers as numbers. */
export function messageJson<Desc extends DescMessage>(schema: Desc, message: MessageShape<Desc>, options: { alwaysEmitImplicit?: boolean } = {}): JsonValue {
  return withNumbers(schema, toJson(schema, message, options));
}

const INT64 = new Set([ScalarType.INT64, ScalarType.UINT64, ScalarType.SINT64, ScalarType.FIXED64, ScalarType.SFIXED64]);

/** The proto JSON of a message of `schema` with its 64-bit integer fields as numbers, nested messages, lists and maps included. */
function withNumbers(schema: DescMessage, json: JsonValue): JsonValue {
  // The well-known types with a JSON form of their own (Timestamp, Duration, Struct, wrappers, …) keep it.
  if (json === null || typeof json !== "object" || Array.isArray(json) || schema.typeName.startsWith("google.protobuf.")) return json;
  const out: JsonObject = { ...json };
  for (const field of schema.fields) {
    const value = out[field.jsonName];
    if (value !== undefined) out[field.jsonName] = fieldWithNumbers(field, value);
  }
  return out;
}

function fieldWithNumbers(field: DescField, value: JsonValue): JsonValue {
  switch (field.fieldKind) {
    case "scalar":
      return INT64.has(field.scalar) ? integer(value) : value;
    case "message":
      return withNumbers(field.message, value);
    case "list":
      if (!Array.isArray(value)) return value;
      if (field.listKind === "message") return value.map((item) => withNumbers(field.message, item));
      return field.listKind === "scalar" && INT64.has(field.scalar) ? value.map(integer) : value;
    case "map": {
      if (value === null || typeof value !== "object" || Array.isArray(value)) return value;
      const entries = Object.entries(value);
      if (field.mapKind === "message") return Object.fromEntries(entries.map(([k, v]) => [k, withNumbers(field.message, v)]));
      return field.mapKind === "scalar" && INT64.has(field.scalar) ? Object.fromEntries(entries.map(([k, v]) => [k, integer(v)])) : value;
    }
    default:
      return value;
  }
}

function integer(value: JsonValue): JsonValue {
  return typeof value === "string" && /^-?\d+$/.test(value) ? jsonInteger(BigInt(value)) : value;
}
