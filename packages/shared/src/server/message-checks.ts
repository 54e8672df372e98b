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

/**
 * What to look for. A binary request's strings were checked by the decoder, and only it keeps
 * unknown fields: look for those. A JSON request's unknown keys were refused by the decoder, which
 * lets lone surrogates through: look at its strings.
 */
export type RequestFormat = "binary" | "json";

/** The first break of the rules above in `message` (of schema `desc`, decoded from `format`), or undefined. */
export function checkRequestMessage(desc: DescMessage, message: unknown, format: RequestFormat): BerthError | undefined {
  // A first pass without paths (most requests pass); the second names where the break is.
  if (checkMessage(desc, message as Fields, undefined, format) === undefined) return undefined;
  return checkMessage(desc, message as Fields, "", format);
}

function join(path: string | undefined, name: string): string | undefined {
  return path === undefined ? undefined : path === "" ? name : `${path}.${name}`;
}

function at(path: string | undefined, key: string | number): string | undefined {
  return path === undefined ? undefined : `${path}[${typeof key === "number" ? key : JSON.stringify(key)}]`;
}

const FOUND: BerthError = unknownField("", "");

function checkMessage(desc: DescMessage, message: Fields, path: string | undefined, format: RequestFormat): BerthError | undefined {
  const unknown = message.$unknown?.[0];
  if (unknown !== undefined) return path === undefined ? FOUND : unknownField(join(path, `#${unknown.no}`)!, desc.typeName);
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
    const refusal = checkField(field, value, () => join(path, field.name), format);
    if (refusal !== undefined) return refusal;
  }
  return undefined;
}

function illFormed(path: string | undefined): BerthError {
  if (path === undefined) return FOUND;
  return malformedRequest(`${path} is not valid Unicode (a lone UTF-16 surrogate, such as the JSON escape \\ud800 alone)`, { field: path });
}

/** A JSON value (a `Struct` as protobuf-es holds it in a field): its strings and keys. */
function checkJson(value: unknown, path: string | undefined): BerthError | undefined {
  if (typeof value === "string") return wellFormed(value) ? undefined : illFormed(path);
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const refusal = checkJson(value[i], at(path, i));
      if (refusal !== undefined) return refusal;
    }
    return undefined;
  }
  if (value !== null && typeof value === "object") {
    for (const [key, item] of Object.entries(value)) {
      if (!wellFormed(key)) return illFormed(at(path, key));
      const refusal = checkJson(item, at(path, key));
      if (refusal !== undefined) return refusal;
    }
  }
  return undefined;
}

/**
 * A message value as protobuf-es holds it: a `Struct` in a field (outside a `Value`) as a JSON
 * object, a singular wrapper outside a oneof as its scalar, any other message as a message.
 */
function checkMessageValue(
  field: DescField & { message: DescMessage },
  value: unknown,
  path: string | undefined,
  singular: boolean,
  format: RequestFormat,
): BerthError | undefined {
  const desc = field.message;
  if (desc.typeName === "google.protobuf.Struct" && field.parent.typeName !== "google.protobuf.Value") {
    // Held as JSON: the unknown fields of its binary form are not kept.
    return format === "json" ? checkJson(value, path) : undefined;
  }
  if (singular && field.oneof === undefined && isWrapperDesc(desc)) {
    return format === "json" && typeof value === "string" && !wellFormed(value) ? illFormed(path) : undefined;
  }
  return checkMessage(desc, value as Fields, path, format);
}

const isString = (field: DescField) => "scalar" in field && field.scalar === ScalarType.STRING;

function checkField(field: DescField, value: unknown, pathOf: () => string | undefined, format: RequestFormat): BerthError | undefined {
  const json = format === "json";
  switch (field.fieldKind) {
    case "scalar":
      return json && isString(field) && !wellFormed(value as string) ? illFormed(pathOf()) : undefined;
    case "enum":
      return undefined;
    case "message":
      return checkMessageValue(field, value, pathOf(), true, format);
    case "list": {
      if (field.listKind === "enum" || (field.listKind === "scalar" && !(json && isString(field)))) return undefined;
      const items = value as unknown[];
      for (let i = 0; i < items.length; i++) {
        const refusal =
          field.listKind === "message"
            ? checkMessageValue(field, items[i], at(pathOf(), i), false, format)
            : wellFormed(items[i] as string)
              ? undefined
              : illFormed(at(pathOf(), i));
        if (refusal !== undefined) return refusal;
      }
      return undefined;
    }
    case "map":
      if (!json && field.mapKind !== "message") return undefined;
      for (const [key, item] of Object.entries(value as Record<string, unknown>)) {
        if (json && !wellFormed(key)) return illFormed(at(pathOf(), key));
        const refusal =
          field.mapKind === "message"
            ? checkMessageValue(field, item, at(pathOf(), key), false, format)
            : json && field.mapKind === "scalar" && isString(field) && !wellFormed(item as string)
              ? illFormed(at(pathOf(), key))
              : undefined;
        if (refusal !== undefined) return refusal;
      }
      return undefined;
  }
}

/** The format a request came in: JSON by its content type, or a Connect GET's `encoding=json`. */
function formatOf(req: { header: Headers; url: string }): RequestFormat {
  return /json/i.test(req.header.get("content-type") ?? "") || /[?&]encoding=json(&|$)/.test(req.url) ? "json" : "binary";
}

/** An interceptor applying {@link checkRequestMessage} to every request message, unary or streamed. */
export function createMessageCheckInterceptor(): Interceptor {
  return (next) => async (req) => {
    const desc = req.method.input;
    const format = formatOf(req);
    if (!req.stream) {
      const refusal = checkRequestMessage(desc, req.message, format);
      if (refusal !== undefined) throw refusal;
      return next(req);
    }
    const source = req.message;
    async function* checked() {
      for await (const message of source) {
        const refusal = checkRequestMessage(desc, message, format);
        if (refusal !== undefined) throw refusal;
        yield message;
      }
    }
    return next({ ...req, message: checked() });
  };
}
