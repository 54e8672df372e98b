/**
 * The codec between berth's typed `Event` messages and the seed's journal events: what a client
 * appends as `{type, ...keys}` and what a journal line holds, both ways. The sessions service uses
 * the same codec for the journal it writes, so a client's journal events are the journal's.
 *
 * A journal event is a flat JSON object `{type, ...keys}` (the store adds `id`, the session id).
 * Each typed event message names the seed's keys exactly (a field's proto3 JSON name is its
 * journal key) and carries every other key in its `extra` Struct. The rules are those of
 * `events.proto`:
 *
 * - unset fields are absent keys; set ones are written as given (zero and "" included);
 * - `extra` may name a typed field only while that field is unset: that is how a value of another
 *   JSON type (`variant: "2"`, `count: null`) reaches the journal and comes back from it;
 * - `id` and `type` never appear in `extra` (the type is the set oneof case, the id the session's).
 *
 * So {@link journalToEvent} is lossless: every journal event with a string `type` comes back
 * from {@link eventToJournal} deep-equal (its `id` aside, which the journal entry carries).
 *
 * The field tables are read once from the generated descriptors at load, so a field added to
 * events.proto is picked up without touching this file (and a field of a kind the journal cannot
 * hold fails the first import, not a request). Per event the work is a loop over a few fields.
 */
import { ScalarType, type DescField, type DescMessage, type JsonObject, type JsonValue } from "@bufbuild/protobuf";
import { FeatureSet_FieldPresence, NullValue, type ListValue, type Value } from "@bufbuild/protobuf/wkt";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";

/**
 * An event that breaks a rule of events.proto: `field` is its path in the request (`event.generate.count`,
 * `events[2].other.type`), `rule` what it must be. The sessions service answers it as INVALID_ARGUMENT
 * naming the field.
 */
export class InvalidEventError extends Error {
  override name = "InvalidEventError";
  constructor(
    readonly field: string,
    readonly rule: string,
  ) {
    super(`${field}: ${rule}`);
  }
}

/** How a typed field's value maps to a journal value. */
export type FieldKind = "string" | "bool" | "double" | "uint32" | "int64" | "value" | "list" | "struct";

/** One typed field of an event message. */
interface TypedField {
  /** The property of the generated message (`pageUrl`). */
  readonly localName: string;
  /** The journal key: the field's proto3 JSON name (`pageUrl`). */
  readonly jsonKey: string;
  /** The proto field name, for error paths (`page_url`). */
  readonly protoName: string;
  readonly kind: FieldKind;
}

/** One event type: a case of `Event.kind` other than `other`. */
interface EventType {
  /** The seed's type string, which is the oneof field's proto name (`variant_plan`). */
  readonly type: string;
  /** The oneof case (`variantPlan`). */
  readonly oneofCase: string;
  /** The message's full name, for building messages (`berth.sessions.v1.VariantPlanEvent`). */
  readonly typeName: string;
  readonly fields: readonly TypedField[];
  readonly byJsonKey: ReadonlyMap<string, TypedField>;
}

/** The name of the Struct field holding an event's other keys, on every typed event message. */
const EXTRA_FIELD = "extra";
/** The oneof case of events of a type the seed does not know. */
const OTHER_CASE = "other";
/** The longest `OtherEvent.type` accepted, in characters (events.proto). */
export const MAX_OTHER_TYPE_LENGTH = 128;

const VALUE_TYPE = "google.protobuf.Value";
const LIST_VALUE_TYPE = "google.protobuf.ListValue";
const STRUCT_TYPE = "google.protobuf.Struct";
const EVENT_TYPE = "berth.sessions.v1.Event";
const OTHER_EVENT_TYPE = "berth.sessions.v1.OtherEvent";

function fieldKind(field: DescField, owner: DescMessage): FieldKind {
  if (field.fieldKind === "scalar") {
    switch (field.scalar) {
      case ScalarType.STRING:
        return "string";
      case ScalarType.BOOL:
        return "bool";
      case ScalarType.DOUBLE:
        return "double";
      case ScalarType.UINT32:
        return "uint32";
      case ScalarType.INT64:
        return "int64";
      default:
        break;
    }
  } else if (field.fieldKind === "message") {
    switch (field.message.typeName) {
      case VALUE_TYPE:
        return "value";
      case LIST_VALUE_TYPE:
        return "list";
      case STRUCT_TYPE:
        return "struct";
      default:
        break;
    }
  }
  throw new Error(`journal-events: ${owner.typeName}.${field.name} has a kind the journal codec does not map`);
}

function readEventTypes(): { byType: Map<string, EventType>; byCase: Map<string, EventType> } {
  const byType = new Map<string, EventType>();
  const byCase = new Map<string, EventType>();
  const oneof = EventSchema.oneofs[0];
  if (!oneof || EventSchema.oneofs.length !== 1) throw new Error("journal-events: Event must have exactly one oneof");
  for (const member of oneof.fields) {
    if (member.localName === OTHER_CASE) continue;
    if (member.fieldKind !== "message") throw new Error(`journal-events: Event.${member.name} is not a message`);
    const message = member.message;
    const fields: TypedField[] = [];
    for (const field of message.fields) {
      if (field.name === EXTRA_FIELD) {
        if (fieldKind(field, message) !== "struct") throw new Error(`journal-events: ${message.typeName}.extra must be a Struct`);
        continue;
      }
      // Explicit presence is what lets "unset" mean "absent from the journal".
      if (field.fieldKind === "scalar" && field.presence === FeatureSet_FieldPresence.IMPLICIT) {
        throw new Error(`journal-events: ${message.typeName}.${field.name} must be optional`);
      }
      fields.push({ localName: field.localName, jsonKey: field.jsonName, protoName: field.name, kind: fieldKind(field, message) });
    }
    if (!message.fields.some((f) => f.name === EXTRA_FIELD)) throw new Error(`journal-events: ${message.typeName} has no extra`);
    const type: EventType = {
      type: member.name,
      oneofCase: member.localName,
      typeName: message.typeName,
      fields,
      byJsonKey: new Map(fields.map((f) => [f.jsonKey, f])),
    };
    byType.set(type.type, type);
    byCase.set(type.oneofCase, type);
  }
  return { byType, byCase };
}

const { byType: EVENT_TYPES, byCase: EVENT_CASES } = readEventTypes();

/** The seed's event types that have a typed message (`generate`, `variant_plan`, …), in proto order. */
export const TYPED_EVENT_TYPES: readonly string[] = Object.freeze([...EVENT_TYPES.keys()]);

/** A typed event as a journal event writes it: its `type`, its message's full name, its keys and what each must hold. */
export interface TypedEventShape {
  /** The seed's type string (`variant_plan`): the name of `Event`'s oneof field. */
  readonly type: string;
  /** The message's full name (`berth.sessions.v1.VariantPlanEvent`). */
  readonly typeName: string;
  /** Its typed keys, in proto order: the journal key, the proto field name, and the kind of value it holds. */
  readonly fields: readonly { readonly jsonKey: string; readonly protoName: string; readonly kind: FieldKind }[];
}

/**
 * Every typed event type with its keys, read from the generated descriptors as this codec reads
 * them: what {@link appendableEvent} accepts, for a tool that describes it (a JSON Schema).
 */
export function typedEventShapes(): readonly TypedEventShape[] {
  return [...EVENT_TYPES.values()].map(({ type, typeName, fields }) => ({
    type,
    typeName,
    fields: fields.map(({ jsonKey, protoName, kind }) => ({ jsonKey, protoName, kind })),
  }));
}

/** True when `type` has a typed message (so an `OtherEvent` of that type is refused). */
export function isTypedEventType(type: string): boolean {
  return EVENT_TYPES.has(type);
}

// --- typed event → journal -------------------------------------------------------------------

/**
 * The journal event for a typed event: `{type, ...set typed fields, ...extra}` with the seed's
 * keys. `id` is not included: the store stamps the session id. `field` is the request path of
 * the event, used in error messages (`events[2]` for a batch).
 *
 * The result shares `extra`'s and Struct fields' JSON subtrees with the message; treat both as
 * immutable. Throws InvalidEventError naming the field for: no event type set; a non-finite
 * number anywhere; a Value without a kind; an int64 beyond ±2^53−1 (the journal holds JSON
 * numbers); an `extra` key that is `id`, `type` or a typed field that is set; an `OtherEvent`
 * whose type is empty, too long or one of the typed types, or whose fields hold `id` or `type`.
 */
export function eventToJournal(event: Event, field = "event"): Record<string, unknown> {
  const kind = event.kind;
  if (kind.case === undefined) throw new InvalidEventError(field, "must set one event type");
  if (kind.case === OTHER_CASE) return otherToJournal(kind.value, `${field}.other`);
  const type = EVENT_CASES.get(kind.case);
  if (!type) throw new InvalidEventError(field, `unknown event type ${JSON.stringify(kind.case)}`);
  const message = kind.value as unknown as Record<string, unknown>;
  const out: Record<string, unknown> = { type: type.type };
  for (const typed of type.fields) {
    const value = message[typed.localName];
    if (value !== undefined) out[typed.jsonKey] = encodeField(typed, value, field, type);
  }
  const extra = message[EXTRA_FIELD] as JsonObject | undefined;
  if (extra !== undefined) {
    for (const key of Object.keys(extra)) {
      if (key === "id" || key === "type") {
        throw new InvalidEventError(
          `${field}.${type.type}.extra.${key}`,
          `is not allowed in extra (the ${key === "id" ? "session id is the request's session_id" : "type is the set event field"})`,
        );
      }
      if (Object.hasOwn(out, key)) {
        const typed = type.byJsonKey.get(key);
        throw new InvalidEventError(
          `${field}.${type.type}.extra.${key}`,
          `collides with the typed field ${typed?.protoName ?? key}, which is set; set one of them`,
        );
      }
      const value = extra[key];
      checkJson(value, () => `${field}.${type.type}.extra.${key}`);
      setOwn(out, key, value);
    }
  }
  return out;
}

function encodeField(typed: TypedField, value: unknown, field: string, type: EventType): unknown {
  const path = (): string => `${field}.${type.type}.${typed.protoName}`;
  switch (typed.kind) {
    case "string":
      if (typeof value !== "string") throw new InvalidEventError(path(), "must be a string");
      return value;
    case "bool":
      if (typeof value !== "boolean") throw new InvalidEventError(path(), "must be a boolean");
      return value;
    case "double":
      if (typeof value !== "number" || !Number.isFinite(value)) {
        throw new InvalidEventError(path(), "must be a finite number (NaN and Infinity have no JSON form)");
      }
      return value;
    case "uint32":
      if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > 0xffffffff) {
        throw new InvalidEventError(path(), "must be an integer from 0 to 4294967295");
      }
      return value;
    case "int64": {
      const n = typeof value === "bigint" ? Number(value) : value;
      if (typeof n !== "number" || !Number.isSafeInteger(n) || (typeof value === "bigint" && BigInt(n) !== value)) {
        throw new InvalidEventError(path(), "must be an integer within ±9007199254740991 (the journal holds JSON numbers)");
      }
      return n;
    }
    case "value":
      return fromProtoValue(value as Value, path);
    case "list":
      return fromProtoListValue(value as ListValue, path);
    case "struct":
      checkJson(value, path);
      return value;
  }
}

function otherToJournal(other: { type: string; fields?: JsonObject | undefined }, path: string): Record<string, unknown> {
  const type = other.type;
  if (typeof type !== "string" || type.length === 0) throw new InvalidEventError(`${path}.type`, "must not be empty");
  if (type.length > MAX_OTHER_TYPE_LENGTH && [...type].length > MAX_OTHER_TYPE_LENGTH) {
    throw new InvalidEventError(`${path}.type`, `must be at most ${MAX_OTHER_TYPE_LENGTH} characters`);
  }
  const typed = EVENT_TYPES.get(type);
  if (typed) throw new InvalidEventError(`${path}.type`, `names the typed event ${JSON.stringify(type)}: send event.${typed.type} instead`);
  const out: Record<string, unknown> = { type };
  const fields = other.fields;
  if (fields !== undefined) {
    for (const key of Object.keys(fields)) {
      if (key === "id" || key === "type") {
        throw new InvalidEventError(
          `${path}.fields.${key}`,
          `is not allowed (the ${key === "id" ? "session id is the request's session_id" : "type is other.type"})`,
        );
      }
      const value = fields[key];
      checkJson(value, () => `${path}.fields.${key}`);
      setOwn(out, key, value);
    }
  }
  return out;
}

/**
 * Checks that `value` is JSON that survives `JSON.stringify` unchanged: finite numbers, strings,
 * booleans, null, arrays and plain objects of those. A Struct decoded from the wire can hold a
 * NaN or an Infinity (a double's bits), which JSON.stringify would silently write as null.
 */
function checkJson(value: unknown, path: () => string): void {
  switch (typeof value) {
    case "string":
    case "boolean":
      return;
    case "number":
      if (!Number.isFinite(value)) throw new InvalidEventError(path(), "numbers must be finite (NaN and Infinity have no JSON form)");
      return;
    case "object":
      if (value === null) return;
      if (Array.isArray(value)) {
        for (let i = 0; i < value.length; i++) checkJson(value[i], () => `${path()}[${i}]`);
        return;
      }
      for (const key of Object.keys(value)) checkJson((value as Record<string, unknown>)[key], () => `${path()}.${key}`);
      return;
    default:
      throw new InvalidEventError(path(), `must be a JSON value, not ${typeof value}`);
  }
}

/**
 * The JSON value a `google.protobuf.Value` holds. Throws InvalidEventError at `path` for a Value
 * without a kind (JSON null is `null_value`) or with a non-finite number, anywhere inside it.
 */
export function fromProtoValue(value: Value, path: () => string): JsonValue {
  const kind = value.kind;
  switch (kind.case) {
    case "nullValue":
      return null;
    case "numberValue":
      if (!Number.isFinite(kind.value)) throw new InvalidEventError(path(), "numbers must be finite (NaN and Infinity have no JSON form)");
      return kind.value;
    case "stringValue":
    case "boolValue":
      return kind.value;
    case "listValue":
      return fromProtoListValue(kind.value, path);
    case "structValue": {
      const out: JsonObject = {};
      const fields = kind.value.fields;
      for (const key of Object.keys(fields)) {
        setOwn(
          out,
          key,
          fromProtoValue(fields[key] as Value, () => `${path()}.${key}`),
        );
      }
      return out;
    }
    default:
      throw new InvalidEventError(path(), "must hold a value (JSON null is null_value)");
  }
}

/** The JSON array a `google.protobuf.ListValue` holds; see {@link fromProtoValue}. */
export function fromProtoListValue(list: ListValue, path: () => string): JsonValue[] {
  const values = list.values;
  const out = new Array<JsonValue>(values.length);
  for (let i = 0; i < values.length; i++) out[i] = fromProtoValue(values[i] as Value, () => `${path()}[${i}]`);
  return out;
}

// --- journal → typed event -------------------------------------------------------------------

/** Marks a journal value that the typed field cannot hold (it goes to `extra`). */
const DOES_NOT_FIT: unique symbol = Symbol("does not fit");

/**
 * The typed event for a journal event (`ReadJournal`, `WatchSession`). Each key goes to its typed
 * field when the value fits the field's type exactly (a uint32 field takes only integers from 0
 * to 2^32−1, an int64 field only safe integers, a Struct field only objects, …), and to `extra`
 * as is otherwise, so that `eventToJournal(journalToEvent(x))` deep-equals `x` without its `id`.
 * `id` is dropped: it is the session id, which the journal entry carries. Keys whose value is
 * `undefined` (never in parsed JSON) are dropped as JSON.stringify would.
 *
 * A type the seed does not know becomes `other` with the event's keys in `fields`. An event whose
 * `type` is not a string becomes `other` with an empty type and the raw `type` kept in `fields`,
 * so nothing is lost; such an event (like an `other` with an empty or over-long type) is refused
 * if sent back. The result shares JSON subtrees with `json`; treat both as immutable.
 */
export function journalToEvent(json: Record<string, unknown>): Event {
  const rawType = json.type;
  const type = typeof rawType === "string" ? EVENT_TYPES.get(rawType) : undefined;
  if (!type) return otherFromJournal(json, typeof rawType === "string");
  const message: Record<string, unknown> = { $typeName: type.typeName };
  let extra: JsonObject | undefined;
  for (const key of Object.keys(json)) {
    if (key === "type" || key === "id") continue;
    const value = json[key];
    if (value === undefined) continue;
    const typed = type.byJsonKey.get(key);
    const decoded = typed ? decodeField(typed.kind, value) : DOES_NOT_FIT;
    if (decoded !== DOES_NOT_FIT) {
      message[typed!.localName] = decoded;
    } else {
      extra ??= {};
      setOwn(extra, key, value as JsonValue);
    }
  }
  if (extra !== undefined) message[EXTRA_FIELD] = extra;
  return { $typeName: EVENT_TYPE, kind: { case: type.oneofCase, value: message } } as unknown as Event;
}

/**
 * The typed event for a journal event a client appends: as {@link journalToEvent}, but a key of a
 * typed field must hold a value of the field's type, as the API's own JSON decoding requires
 * (`{"generate": {"count": "abc"}}` is refused); only keys without a typed field go to `extra`.
 * So `berth sessions append s1 generate --field count=abc` is refused like its curl, while
 * journalToEvent keeps reading back whatever the seed's processes wrote. Throws InvalidEventError
 * naming the field (`event.generate.count`; `field` is the event's path in the request).
 */
export function appendableEvent(json: Record<string, unknown>, field = "event"): Event {
  const type = typeof json.type === "string" ? EVENT_TYPES.get(json.type) : undefined;
  if (type !== undefined) {
    for (const key of Object.keys(json)) {
      const typed = type.byJsonKey.get(key);
      const value = json[key];
      if (typed === undefined || value === undefined || decodeField(typed.kind, value) !== DOES_NOT_FIT) continue;
      throw new InvalidEventError(
        `${field}.${type.type}.${typed.protoName}`,
        `the event's "${key}" must be ${KIND_RULES[typed.kind]}, got ${describeJson(value)}`,
      );
    }
  }
  return journalToEvent(json);
}

/** What a value of each kind of typed field must be, for messages. */
export const KIND_RULES: Readonly<Record<FieldKind, string>> = {
  string: "a string",
  bool: "true or false",
  double: "a number",
  uint32: "a whole number from 0 to 4294967295",
  int64: `a whole number from -${Number.MAX_SAFE_INTEGER} to ${Number.MAX_SAFE_INTEGER}`,
  value: "a JSON value (finite numbers)",
  list: "a JSON array",
  struct: "a JSON object",
};

function describeJson(value: unknown): string {
  if (typeof value === "number" && !Number.isFinite(value)) return String(value);
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 60 ? `${text.slice(0, 59)}…` : text;
}

function otherFromJournal(json: Record<string, unknown>, hasStringType: boolean): Event {
  let fields: JsonObject | undefined;
  for (const key of Object.keys(json)) {
    if (key === "id" || (key === "type" && hasStringType)) continue;
    const value = json[key];
    if (value === undefined) continue;
    fields ??= {};
    setOwn(fields, key, value as JsonValue);
  }
  const other: Record<string, unknown> = { $typeName: OTHER_EVENT_TYPE, type: hasStringType ? json.type : "" };
  if (fields !== undefined) other.fields = fields;
  return { $typeName: EVENT_TYPE, kind: { case: OTHER_CASE, value: other } } as unknown as Event;
}

function decodeField(kind: FieldKind, value: unknown): unknown {
  switch (kind) {
    case "string":
      return typeof value === "string" ? value : DOES_NOT_FIT;
    case "bool":
      return typeof value === "boolean" ? value : DOES_NOT_FIT;
    case "double":
      return typeof value === "number" && Number.isFinite(value) ? value : DOES_NOT_FIT;
    case "uint32":
      // -0 is an integer to JavaScript but would come back from the wire as 0.
      return typeof value === "number" && Number.isInteger(value) && value >= 0 && value <= 0xffffffff && !Object.is(value, -0) ? value : DOES_NOT_FIT;
    case "int64":
      return typeof value === "number" && Number.isSafeInteger(value) && !Object.is(value, -0) ? BigInt(value) : DOES_NOT_FIT;
    case "value":
      return isJsonValue(value) ? toProtoValue(value) : DOES_NOT_FIT;
    case "list":
      return Array.isArray(value) && isJsonValue(value) ? toProtoListValue(value) : DOES_NOT_FIT;
    case "struct":
      return value !== null && typeof value === "object" && !Array.isArray(value) ? value : DOES_NOT_FIT;
  }
}

/** True for values a Value can hold without loss: JSON, finite numbers only. */
function isJsonValue(value: unknown): value is JsonValue {
  switch (typeof value) {
    case "string":
    case "boolean":
      return true;
    case "number":
      return Number.isFinite(value);
    case "object":
      if (value === null) return true;
      if (Array.isArray(value)) return value.every(isJsonValue);
      return Object.values(value).every((v) => v === undefined || isJsonValue(v));
    default:
      return false;
  }
}

/**
 * A `google.protobuf.Value` holding `json`. Built as plain message objects (what `create` would
 * return) without a per-field descriptor walk. Object keys whose value is `undefined` are skipped
 * and array holes become null, as JSON.stringify does.
 */
export function toProtoValue(json: JsonValue): Value {
  switch (typeof json) {
    case "number":
      return { $typeName: VALUE_TYPE, kind: { case: "numberValue", value: json } };
    case "string":
      return { $typeName: VALUE_TYPE, kind: { case: "stringValue", value: json } };
    case "boolean":
      return { $typeName: VALUE_TYPE, kind: { case: "boolValue", value: json } };
    default:
      break;
  }
  if (json === null || json === undefined) return { $typeName: VALUE_TYPE, kind: { case: "nullValue", value: NullValue.NULL_VALUE } };
  if (Array.isArray(json)) return { $typeName: VALUE_TYPE, kind: { case: "listValue", value: toProtoListValue(json) } };
  const fields: Record<string, Value> = {};
  for (const key of Object.keys(json)) {
    const item = json[key];
    if (item !== undefined) setOwn(fields, key, toProtoValue(item));
  }
  return { $typeName: VALUE_TYPE, kind: { case: "structValue", value: { $typeName: STRUCT_TYPE, fields } } };
}

/** A `google.protobuf.ListValue` holding `array`; see {@link toProtoValue}. */
export function toProtoListValue(array: readonly JsonValue[]): ListValue {
  const values = new Array<Value>(array.length);
  for (let i = 0; i < array.length; i++) values[i] = toProtoValue(array[i] as JsonValue);
  return { $typeName: LIST_VALUE_TYPE, values };
}

/**
 * Sets an own property, including one named `__proto__` (which plain assignment would take as
 * the object's prototype, silently dropping the key).
 */
export function setOwn(target: Record<string, unknown>, key: string, value: unknown): void {
  if (key === "__proto__") Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
  else target[key] = value;
}
