/**
 * The tools' input schemas, built from the generated descriptors and the protos' comments, so that
 * a field or an event type added, renamed or retyped in `proto/` changes the schemas an agent sees
 * (and a name a tool picks that is gone fails at load, not at a call).
 *
 * Zod schemas, as the MCP SDK takes them: it validates each call's arguments with them and lists
 * them as JSON Schema (draft 7). Objects are strict where the service would refuse an unknown field
 * and loose where it keeps one (an event's keys beyond its typed ones go to its `extra`).
 */
import { ScalarType, type DescEnum, type DescField, type DescMessage } from "@bufbuild/protobuf";
import * as z from "zod";
import { EventSchema } from "@berth/api/berth/sessions/v1/events_pb";
import { KIND_RULES, MAX_OTHER_TYPE_LENGTH, typedEventShapes, type FieldKind } from "@berth/client/journal-events";
import { protoComment } from "./proto-docs.js";

/** A session id, as every session RPC checks it (session_service.proto). */
export const SESSION_ID_PATTERN = /^[A-Za-z0-9_-]{1,128}$/;

/** The schema of a session id. */
export function sessionIdSchema(description: string): z.ZodString {
  return z.string().regex(SESSION_ID_PATTERN).describe(`${description} Letters, digits, '_' and '-', 1 to 128 of them.`);
}

/** The largest integer a JSON number carries exactly; the journal holds int64s as JSON numbers. */
const SAFE = Number.MAX_SAFE_INTEGER;

function kindSchema(kind: FieldKind): z.ZodType {
  switch (kind) {
    case "string":
      return z.string();
    case "bool":
      return z.boolean();
    case "double":
      return z.number();
    case "uint32":
      return z.number().int().min(0).max(0xffffffff);
    case "int64":
      return z.number().int().min(-SAFE).max(SAFE);
    case "value":
      return z.unknown();
    case "list":
      return z.array(z.unknown());
    case "struct":
      return z.record(z.string(), z.unknown());
  }
}

/**
 * An event as the journal holds it: `{type, ...keys}`. One object per typed event type (its typed
 * keys with the types events.proto gives them, and any other key, which the journal keeps in the
 * event's `extra`), or any other type with any keys (`other`: a type the reducer does not know).
 */
export function eventSchema(): z.ZodType {
  const typed = typedEventShapes().map((shape) => {
    const keys: Record<string, z.ZodType> = { type: z.literal(shape.type) };
    for (const field of shape.fields) {
      const comment = protoComment(`${shape.typeName}.${field.protoName}`);
      keys[field.jsonKey] = kindSchema(field.kind).optional().describe(`${comment} Must be ${KIND_RULES[field.kind]}.`);
    }
    // The message's comment says what the event does (the oneof field's only names it).
    return z.looseObject(keys).describe(protoComment(shape.typeName));
  });
  const names = typedEventShapes().map((shape) => shape.type);
  // Any type but the typed ones (whose keys must then hold their types), as the service refuses an
  // `other` naming a typed type. `u`: a character is a code point, as the service counts them.
  const otherType = new RegExp(`^(?!(?:${names.join("|")})$)[\\s\\S]{1,${MAX_OTHER_TYPE_LENGTH}}$`, "u");
  const other = z
    .looseObject({ type: z.string().regex(otherType).describe(`Any other event type, at most ${MAX_OTHER_TYPE_LENGTH} characters.`) })
    .describe(protoComment(`${EventSchema.typeName}.other`));
  return z.union([...typed, other]);
}

/** One or more events, appended atomically. */
export function eventsSchema(): z.ZodType {
  return z
    .array(eventSchema())
    .min(1)
    .describe(
      "The events to append, in order, atomically: they get consecutive seqs, all or none. Each is an event as the journal holds it: " +
        '{"type": "agent_phase", "phase": "writing"}. The typed keys of each type are listed below; any other key is kept as given.',
    );
}

/** How an input property reads a proto field: under which name, described how. */
export interface FieldPick {
  /** The input's name for it, when not the field's JSON name. */
  readonly as?: string;
  /** Replaces the proto's comment (a tool that resolves a relative path, a default of its own). */
  readonly description?: string;
  /** Added after the proto's comment. */
  readonly note?: string;
  /** Required in the input (default: optional). */
  readonly required?: boolean;
  /** Bounds the proto's comment states (a string's length, a number's value), for the schema to refuse what the service refuses. */
  readonly min?: number;
  readonly max?: number;
  /** A string's form, as the service parses it. */
  readonly pattern?: RegExp;
}

/**
 * Input properties read from the fields of a request message, each named by its JSON name (a
 * Duration as `<name>Ms`, in milliseconds), typed as the field is, described by its comment.
 * Throws for a field the message does not have.
 */
export function fieldsOf(message: DescMessage, picks: Readonly<Record<string, FieldPick>>): Record<string, z.ZodType> {
  const shape: Record<string, z.ZodType> = {};
  for (const [name, pick] of Object.entries(picks)) {
    const field = message.fields.find((f) => f.name === name);
    if (field === undefined) throw new Error(`schemas: ${message.typeName} has no field ${name}`);
    const [key, unbounded, unit] = fieldSchema(field);
    const schema = bounded(unbounded, pick);
    const description = pick.description ?? `${protoComment(`${message.typeName}.${field.name}`)}${unit}${pick.note === undefined ? "" : ` ${pick.note}`}`;
    shape[pick.as ?? key] = (pick.required ? schema : schema.optional()).describe(description);
  }
  return shape;
}

function bounded(schema: z.ZodType, { min, max, pattern }: FieldPick): z.ZodType {
  if (pattern !== undefined) {
    if (!(schema instanceof z.ZodString)) throw new Error("schemas: a pattern applies to strings only");
    schema = schema.regex(pattern);
  }
  if (schema instanceof z.ZodString || schema instanceof z.ZodNumber) {
    let out: z.ZodString | z.ZodNumber = schema;
    if (min !== undefined) out = out.min(min);
    if (max !== undefined) out = out.max(max);
    return out;
  }
  if (min !== undefined || max !== undefined) throw new Error("schemas: bounds apply to strings and numbers only");
  return schema;
}

/** A field's input name, its schema, and a note on its unit. */
function fieldSchema(field: DescField): [string, z.ZodType, string] {
  if (field.fieldKind === "scalar") {
    switch (field.scalar) {
      case ScalarType.STRING:
        return [field.jsonName, z.string(), ""];
      case ScalarType.BOOL:
        return [field.jsonName, z.boolean(), ""];
      case ScalarType.DOUBLE:
      case ScalarType.FLOAT:
        return [field.jsonName, z.number(), ""];
      case ScalarType.INT32:
        return [
          field.jsonName,
          z
            .number()
            .int()
            .min(-(2 ** 31))
            .max(2 ** 31 - 1),
          "",
        ];
      case ScalarType.UINT32:
        return [field.jsonName, z.number().int().min(0).max(0xffffffff), ""];
      case ScalarType.INT64:
      case ScalarType.UINT64:
        return [field.jsonName, z.number().int().min(0).max(SAFE), ""];
      default:
        break;
    }
  } else if (field.fieldKind === "message" && field.message.typeName === "google.protobuf.Duration") {
    return [`${field.jsonName}Ms`, z.number().min(0), " In milliseconds."];
  } else if (field.fieldKind === "enum") {
    return [field.jsonName, enumSchema(field.enum), ""];
  }
  throw new Error(`schemas: ${field.parent.typeName}.${field.name} has a kind no tool input takes`);
}

/** An enum's values by their short names (`NEED_ITEM_KIND_START` → `start`), the unspecified one left out. */
export function enumSchema(desc: DescEnum): z.ZodType {
  const values = enumNames(desc);
  return z.enum(values as [string, ...string[]]).describe(
    desc.values
      .filter((v) => v.number !== 0)
      .map((v) => `${v.localName.toLowerCase()}: ${protoComment(`${desc.typeName}.${v.name}`)}`)
      .join(" "),
  );
}

/** The short names of an enum's values (`NEED_ITEM_KIND_START` is `start`), the unspecified one left out. */
export function enumNames(desc: DescEnum): string[] {
  return desc.values.filter((v) => v.number !== 0).map((v) => v.localName.toLowerCase());
}
