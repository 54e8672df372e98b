/**
 * One rule for every protocol about what a decoded request may hold, where the decoders differ:
 *
 * - **Unknown fields are refused** (INVALID_ARGUMENT UNKNOWN_FIELD naming the field). The JSON
 *   decoder refuses an unknown key; the binary decoder keeps an unknown field number aside, which
 *   would silently turn off a check a newer client asked for (a fence, an expected seq, an
 *   idempotency key) on an older server. So binary requests are refused for it too.
 * - **Strings are valid Unicode** (INVALID_ARGUMENT MALFORMED_REQUEST naming the field). The binary
 *   decoder refuses a string that is not UTF-8, and the JSON decoder (with a strict text decoder)
 *   a body that is not; but a JSON escape of a lone surrogate (`"\ud800"`) in a `Struct` or a map
 *   key decodes into a string no UTF-8 can carry. Checked here on every request.
 */
import { ScalarType, type DescField, type DescMessage } from "@bufbuild/protobuf";
import { isWrapperDesc } from "@bufbuild/protobuf/wkt";
import type { Interceptor } from "@connectrpc/connect";
import type { BerthError } from "../errors.js";
import { LONE_SURROGATE } from "./connect-errors.js";
import { malformedRequest, unknownField } from "./request-errors.js";

type Fields = Record<string, unknown> & { $unknown?: ReadonlyArray<{ no: number }> };

const wellFormed = (text: string) => !LONE_SURROGATE.test(text);

/** The first break of the rules above in `message` (of schema `desc`), or undefined. */
export function checkRequestMessage(desc: DescMessage, message: unknown): BerthError | undefined {
  return checkMessage(desc, message as Fields, "");
}

function join(path: string, name: string): string {
  return path === "" ? name : `${path}.${name}`;
}

function checkMessage(desc: DescMessage, message: Fields, path: string): BerthError | undefined {
  const unknown = message.$unknown?.[0];
  if (unknown !== undefined) return unknownField(join(path, `#${unknown.no}`), desc.typeName);
  for (const member of desc.members) {
    let field: DescField | undefined;
    let value: unknown;
    if (member.kind === "oneof") {
      const chosen = message[member.localName] as { case?: string; value?: unknown } | undefined;
      if (chosen?.case === undefined) continue;
      field = member.fields.find((f) => f.localName === chosen.case);
      value = chosen.value;
    } else {
      field = member;
      value = message[member.localName];
    }
    if (field === undefined || value === undefined) continue;
    const refusal = checkField(field, value, join(path, field.name));
    if (refusal !== undefined) return refusal;
  }
  return undefined;
}

function illFormed(path: string): BerthError {
  return malformedRequest(`${path} is not valid Unicode (a lone UTF-16 surrogate, such as the JSON escape \\ud800 alone)`, { field: path });
}

/** A JSON value (a `Struct` as protobuf-es holds it in a field): its strings and keys. */
function checkJson(value: unknown, path: string): BerthError | undefined {
  if (typeof value === "string") return wellFormed(value) ? undefined : illFormed(path);
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const refusal = checkJson(value[i], `${path}[${i}]`);
      if (refusal !== undefined) return refusal;
    }
    return undefined;
  }
  if (value !== null && typeof value === "object") {
    for (const [key, item] of Object.entries(value)) {
      const at = `${path}[${JSON.stringify(key)}]`;
      if (!wellFormed(key)) return illFormed(at);
      const refusal = checkJson(item, at);
      if (refusal !== undefined) return refusal;
    }
  }
  return undefined;
}

/**
 * A message value as protobuf-es holds it: a `Struct` in a field (outside a `Value`) as a JSON
 * object, a singular wrapper outside a oneof as its scalar, any other message as a message.
 */
function checkMessageValue(field: DescField & { message: DescMessage }, value: unknown, path: string, singular: boolean): BerthError | undefined {
  const desc = field.message;
  if (desc.typeName === "google.protobuf.Struct" && field.parent.typeName !== "google.protobuf.Value") return checkJson(value, path);
  if (singular && field.oneof === undefined && isWrapperDesc(desc)) {
    return typeof value === "string" && !wellFormed(value) ? illFormed(path) : undefined;
  }
  return checkMessage(desc, value as Fields, path);
}

function checkField(field: DescField, value: unknown, path: string): BerthError | undefined {
  switch (field.fieldKind) {
    case "scalar":
      return field.scalar === ScalarType.STRING && !wellFormed(value as string) ? illFormed(path) : undefined;
    case "enum":
      return undefined;
    case "message":
      return checkMessageValue(field, value, path, true);
    case "list": {
      const items = value as unknown[];
      for (let i = 0; i < items.length; i++) {
        const at = `${path}[${i}]`;
        if (field.listKind === "message") {
          const refusal = checkMessageValue(field, items[i], at, false);
          if (refusal !== undefined) return refusal;
        } else if (field.listKind === "scalar" && field.scalar === ScalarType.STRING && !wellFormed(items[i] as string)) {
          return illFormed(at);
        }
      }
      return undefined;
    }
    case "map":
      for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
        const at = `${path}[${JSON.stringify(key)}]`;
        if (!wellFormed(key)) return illFormed(at);
        if (field.mapKind === "message") {
          const refusal = checkMessageValue(field, item, at, false);
          if (refusal !== undefined) return refusal;
        } else if (field.mapKind === "scalar" && field.scalar === ScalarType.STRING && !wellFormed(item as string)) {
          return illFormed(at);
        }
      }
      return undefined;
  }
}

/** An interceptor applying {@link checkRequestMessage} to every request message, unary or streamed. */
export function createMessageCheckInterceptor(): Interceptor {
  return (next) => async (req) => {
    const desc = req.method.input;
    if (!req.stream) {
      const refusal = checkRequestMessage(desc, req.message);
      if (refusal !== undefined) throw refusal;
      return next(req);
    }
    const source = req.message;
    async function* checked() {
      for await (const message of source) {
        const refusal = checkRequestMessage(desc, message);
        if (refusal !== undefined) throw refusal;
        yield message;
      }
    }
    return next({ ...req, message: checked() });
  };
}
