/**
 * Test support: fast-check generators of journal events as a journal file gives them (parsed from
 * JSON text), of every type the seed knows and of others, each typed key holding either a value
 * its typed field can hold or junk a foreign journal can hold (numeric strings, nulls, negative or
 * fractional counts, unsafe integers, arrays where objects belong...), plus arbitrary other keys
 * (`id`, `extra`, `__proto__`, `constructor` among them).
 */
import { ScalarType } from "@bufbuild/protobuf";
import { EventSchema } from "@berth/api/berth/sessions/v1/events_pb";
import fc from "fast-check";

/** The seed's event types, each with a typed message in events.proto. */
export const SEED_TYPES: readonly string[] = [
  "generate",
  "variant_plan",
  "detector_waivers",
  "agent_phase",
  "variants_ready",
  "agent_done",
  "variant_mounted",
  "variant_mount_failed",
  "checkpoint",
  "accept",
  "accept_intent",
  "manual_edit_apply",
  "steer",
  "carbonize_cleanup",
  "steer_done",
  "discard",
  "discarded",
  "complete",
  "agent_error",
];

/** Per field kind, values that fit the typed field. */
const FITTING: Record<string, fc.Arbitrary<unknown>> = {
  string: fc.string({ maxLength: 6 }),
  bool: fc.boolean(),
  double: fc.double({ noNaN: true, noDefaultInfinity: true }),
  uint32: fc.oneof(fc.integer({ min: 0, max: 6 }), fc.integer({ min: 0, max: 2 ** 32 - 1 })),
  int64: fc.oneof(fc.integer({ min: -3, max: 12 }), fc.maxSafeInteger()),
  value: fc.jsonValue({ maxDepth: 2 }),
  list: fc.array(fc.jsonValue({ maxDepth: 2 }), { maxLength: 3 }),
  struct: fc.dictionary(fc.string({ maxLength: 4 }), fc.jsonValue({ maxDepth: 2 }), { maxKeys: 3 }),
};

/** Values that fit no typed field, or only some: the junk a foreign journal can hold. */
const JUNK = fc.oneof(
  fc.constantFrom<unknown>(null, "", "2", " 4 ", "0x3", -1, 1.5, 2 ** 32, 2 ** 53, -(2 ** 60), 1e300, 5e-324, true, false, [], {}, [null], { a: {} }),
  fc.jsonValue({ maxDepth: 2 }),
);

/** The codec's kind of a typed field, read from the descriptor. */
function kindOf(jsonKey: string, type: string): string | undefined {
  const member = EventSchema.oneofs[0]!.fields.find((f) => f.name === type);
  if (member?.fieldKind !== "message") return undefined;
  const field = member.message.fields.find((f) => f.jsonName === jsonKey && f.name !== "extra");
  if (!field) return undefined;
  if (field.fieldKind === "message")
    return { "google.protobuf.Value": "value", "google.protobuf.ListValue": "list", "google.protobuf.Struct": "struct" }[field.message.typeName];
  if (field.fieldKind === "scalar") {
    const kinds: Partial<Record<ScalarType, string>> = {
      [ScalarType.STRING]: "string",
      [ScalarType.BOOL]: "bool",
      [ScalarType.DOUBLE]: "double",
      [ScalarType.UINT32]: "uint32",
      [ScalarType.INT64]: "int64",
    };
    return kinds[field.scalar];
  }
  return undefined;
}

/** The journal keys of an event type's typed fields. */
export function typedKeys(type: string): string[] {
  const member = EventSchema.oneofs[0]!.fields.find((f) => f.name === type);
  if (member?.fieldKind !== "message") return [];
  return member.message.fields.filter((f) => f.name !== "extra").map((f) => f.jsonName);
}

const eventType = fc.oneof(
  { weight: 12, arbitrary: fc.constantFrom(...SEED_TYPES) },
  { weight: 2, arbitrary: fc.constantFrom("bogus", "resume", "toString", "__proto__", "constructor", "hasOwnProperty", "Generate", "generate ") },
  { weight: 1, arbitrary: fc.string({ maxLength: 8 }) },
  { weight: 1, arbitrary: fc.constantFrom("", "x".repeat(128), "x".repeat(129), "\u{1F600}".repeat(100), "\u{1F600}".repeat(129)) },
);

const otherKey = fc.oneof(
  { weight: 4, arbitrary: fc.string({ maxLength: 6 }) },
  { weight: 2, arbitrary: fc.constantFrom("id", "extra", "fields", "__proto__", "constructor", "toString", "prompt", "page_url", "value") },
);

/** A journal event as JSON text would give it: any type, its typed keys with fitting or junk values, other keys. */
export const journalEvent: fc.Arbitrary<Record<string, unknown>> = eventType.chain((type) => {
  const keys = typedKeys(type);
  const typedEntries = keys.map((key) =>
    fc.option(
      fc.oneof({ weight: 3, arbitrary: FITTING[kindOf(key, type)!]! }, { weight: 2, arbitrary: JUNK }).map((v) => [key, v] as [string, unknown]),
      { nil: undefined, freq: 2 },
    ),
  );
  const others = fc.array(fc.tuple(otherKey, JUNK), { maxLength: 3 });
  return fc.tuple(fc.tuple(...typedEntries), others).map(([entries, extra]) => {
    const all = [
      ["type", type] as [string, unknown],
      ...entries.filter((e): e is [string, unknown] => e !== undefined),
      ...extra.filter(([k]) => k !== "type"),
    ];
    // Through JSON text, as the journal reader sees it (Object.fromEntries keeps "__proto__" own).
    return JSON.parse(JSON.stringify(Object.fromEntries(all))) as Record<string, unknown>;
  });
});
