import { create, fromBinary, fromJsonString, toBinary } from "@bufbuild/protobuf";
import { describe, expect, it } from "vitest";
import { AppendEventsRequestSchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { checkRequestMessage } from "./message-checks.js";

const request = (extra: Record<string, unknown>) =>
  create(AppendEventsRequestSchema, {
    sessionId: "s",
    events: [{ kind: { case: "generate", value: { pageUrl: "http://x/", extra: { fields: {} } } } }, { kind: { case: "generate", value: { count: 1 } } }],
    ...extra,
  });

/** [reason, field] of the check's refusal, or undefined. */
const refusalOf = (message: unknown, format: "binary" | "json" = "binary") => {
  const refusal = checkRequestMessage(AppendEventsRequestSchema, message, format);
  return refusal === undefined ? undefined : [refusal.reason, refusal.details?.field];
};

describe("checkRequestMessage", () => {
  it("passes a request of known fields and valid strings", () => {
    const bytes = toBinary(AppendEventsRequestSchema, request({}));
    expect(refusalOf(fromBinary(AppendEventsRequestSchema, bytes))).toBeUndefined();
    expect(refusalOf(fromJsonString(AppendEventsRequestSchema, '{"sessionId":"s","events":[{"generate":{"extra":{"a":["b"]}}}]}'), "json")).toBeUndefined();
  });

  it("refuses a field the schema does not know, naming its path and number (binary keeps it aside)", () => {
    const top = Buffer.concat([toBinary(AppendEventsRequestSchema, request({})), Buffer.from([0xb8, 0x3e, 0x01])]);
    expect(refusalOf(fromBinary(AppendEventsRequestSchema, top))).toEqual(["UNKNOWN_FIELD", "#999"]);
    const nested = request({});
    (nested.events[1]!.kind.value as { $unknown?: unknown }).$unknown = [{ no: 42, wireType: 0, data: new Uint8Array([8]) }];
    expect(refusalOf(nested)).toEqual(["UNKNOWN_FIELD", "events[1].generate.#42"]);
  });

  it("refuses a string that is not Unicode, where the JSON decoder lets it through (a Struct value, a map key)", () => {
    const json = (text: string) => fromJsonString(AppendEventsRequestSchema, text);
    const value = json('{"sessionId":"s","events":[{"generate":{"extra":{"note":"\\ud800"}}}]}');
    expect(refusalOf(value, "json")).toEqual(["MALFORMED_REQUEST", 'events[0].generate.extra["note"]']);
    const key = json('{"sessionId":"s","events":[{"generate":{"extra":{"\\udc00":1}}}]}');
    expect(refusalOf(key, "json")).toEqual(["MALFORMED_REQUEST", 'events[0].generate.extra["\\udc00"]']);
    const list = json('{"sessionId":"s","events":[{"generate":{"extra":{"l":[1,"\\ud83d"]}}}]}');
    expect(refusalOf(list, "json")).toEqual(["MALFORMED_REQUEST", 'events[0].generate.extra["l"][1]']);
    // A surrogate pair is one character, not a lone half.
    expect(refusalOf(json('{"sessionId":"s","events":[{"generate":{"extra":{"ok":"\\ud83d\\ude00"}}}]}'), "json")).toBeUndefined();
  });
});
