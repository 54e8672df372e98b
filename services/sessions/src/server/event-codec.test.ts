/**
 * The sessions service's side of the event codec: the client's codec (tested beside it, in
 * packages/client) with its refusals as INVALID_ARGUMENT, the seed's event types against the typed
 * ones, the round trip of journal events as a journal file gives them, and journal entries as
 * messages.
 */
import { create, equals, fromBinary, fromJsonString, toBinary, toJsonString, type MessageInitShape } from "@bufbuild/protobuf";
import { EventSchema, type Event } from "@berth/api/berth/sessions/v1/events_pb";
import { EntryIntegrity, JournalEntrySchema } from "@berth/api/berth/sessions/v1/session_service_pb";
import { eventToJournal as encodeEvent, isTypedEventType, journalToEvent, MAX_OTHER_TYPE_LENGTH, TYPED_EVENT_TYPES } from "@berth/wire/journal-events";
import { isBerthError } from "@berth/shared/errors";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { journalEvent, SEED_TYPES } from "./codec-fixtures/journal-events.js";
import { eventToJournal, journalEntryToProto } from "./event-codec.js";

type EventInit = MessageInitShape<typeof EventSchema>;

/** A typed event through protobuf-es's own `create`, independent of the codec's builders. */
function typed(kind: EventInit["kind"]): Event {
  return create(EventSchema, { kind } as EventInit);
}

/** Whatever the codec throws, as `{code, field}` (or the message when it is not a BerthError). */
function refusal(run: () => unknown): { code: string; field: unknown; message: string } | undefined {
  try {
    run();
  } catch (error) {
    if (isBerthError(error)) return { code: error.code, field: error.details?.field, message: error.message };
    return { code: "not a BerthError", field: undefined, message: String(error) };
  }
  return undefined;
}

describe("event types", () => {
  it("has a typed message for each of the seed's event types", () => {
    expect([...TYPED_EVENT_TYPES].sort()).toEqual([...SEED_TYPES].sort());
  });
});

describe("eventToJournal: the client's codec, its refusals as INVALID_ARGUMENT", () => {
  it("is the client's codec for a valid event", () => {
    const event = typed({ case: "generate", value: { pageUrl: "/p", count: 3, extra: { prompt: "bolder" } } });
    expect(eventToJournal(event)).toStrictEqual(encodeEvent(event));
  });

  const cases: [string, Event, string, RegExp?][] = [
    ["no event type set", create(EventSchema), "event", /must set one event type/],
    [
      "an extra key naming a typed field that is set",
      typed({ case: "generate", value: { count: 3, extra: { count: "3" } } }),
      "event.generate.extra.count",
      /collides with the typed field count/,
    ],
    ["a NaN double", typed({ case: "agentPhase", value: { at: Number.NaN } }), "event.agent_phase.at", /finite/],
    ["other naming a typed type", typed({ case: "other", value: { type: "variant_plan" } }), "event.other.type", /event\.variant_plan/],
  ];
  for (const [name, event, field, message] of cases) {
    it(`refuses ${name} as invalid_argument naming ${field}`, () => {
      const refused = refusal(() => eventToJournal(event));
      expect(refused).toMatchObject({ code: "invalid_argument", field });
      expect(refused!.message.startsWith(`${field}: `)).toBe(true);
      if (message) expect(refused!.message).toMatch(message);
    });
  }

  it("names the request path it is given (a batch's index)", () => {
    expect(refusal(() => eventToJournal(create(EventSchema), "events[2]"))).toMatchObject({ code: "invalid_argument", field: "events[2]" });
    const event = typed({ case: "generate", value: { count: 3, extra: { count: 4 } } });
    expect(refusal(() => eventToJournal(event, "events[0]"))).toMatchObject({ code: "invalid_argument", field: "events[0].generate.extra.count" });
  });
});

// --- the round-trip property -----------------------------------------------------------------

/**
 * Exact JSON equality as text: keys sorted, -0 told apart from 0, own keys only. (vitest's
 * toStrictEqual reads `.constructor` to compare types, so it reports two equal objects that have
 * an own `constructor` key as different.)
 */
function canonical(value: unknown): string {
  if (typeof value === "number") return Object.is(value, -0) ? "-0" : JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  if (value !== null && typeof value === "object") {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical((value as Record<string, unknown>)[k])}`).join(",")}}`;
  }
  return JSON.stringify(value);
}

function expectSameJson(actual: unknown, expected: unknown): void {
  expect(canonical(actual)).toBe(canonical(expected));
}

function withoutId(json: Record<string, unknown>): Record<string, unknown> {
  const copy = JSON.parse(JSON.stringify(json)) as Record<string, unknown>;
  delete copy.id;
  return copy;
}

/** Whether berth's API accepts this type back (an `other` type must be non-empty, ≤128 chars, untyped). */
function acceptedType(type: unknown): boolean {
  return typeof type === "string" && type.length > 0 && [...type].length <= MAX_OTHER_TYPE_LENGTH;
}

describe("round trip: eventToJournal(journalToEvent(x)) deep-equals x", () => {
  it("for every JSON event with a string type (its id aside), every type, junk included", () => {
    fc.assert(
      fc.property(journalEvent, (x) => {
        const event = journalToEvent(x);
        if (!acceptedType(x.type)) {
          expect(refusal(() => eventToJournal(event))).toMatchObject({ code: "invalid_argument", field: "event.other.type" });
          return;
        }
        expectSameJson(eventToJournal(event), withoutId(x));
        expect(event.kind.case === "other").toBe(!isTypedEventType(x.type as string));
      }),
      { numRuns: 1500 },
    );
  });

  it("also across the wire, binary and JSON (what a ReadJournal client sends back)", () => {
    fc.assert(
      fc.property(journalEvent, (x) => {
        fc.pre(acceptedType(x.type));
        const event = journalToEvent(x);
        expectSameJson(eventToJournal(fromBinary(EventSchema, toBinary(EventSchema, event))), withoutId(x));
        expectSameJson(eventToJournal(fromJsonString(EventSchema, toJsonString(EventSchema, event))), withoutId(x));
      }),
      { numRuns: 700 },
    );
  });

  it("and typed → journal → typed is the identity for every valid typed event", () => {
    fc.assert(
      fc.property(journalEvent, (x) => {
        fc.pre(acceptedType(x.type));
        const event = journalToEvent(x);
        expect(equals(EventSchema, journalToEvent(eventToJournal(event)), event)).toBe(true);
      }),
      { numRuns: 500 },
    );
  });
});

describe("journalEntryToProto", () => {
  it("maps the seed's entry fields, the integrity and the idempotency key", () => {
    const entry = { seq: 4, id: "s-1", type: "generate", ts: "2026-01-02T03:04:05.678Z", event: { id: "s-1", type: "generate", count: 2 } };
    const message = journalEntryToProto(entry, { integrity: "verified", idempotencyKey: "k-1" });
    expect(message.seq).toBe(4n);
    expect(message.sessionId).toBe("s-1");
    expect(message.type).toBe("generate");
    expect(message.appendTime).toMatchObject({ seconds: BigInt((Date.parse(entry.ts) / 1000) | 0), nanos: 678_000_000 });
    expect(message.integrity).toBe(EntryIntegrity.VERIFIED);
    expect(message.idempotencyKey).toBe("k-1");
    expect(eventToJournal(message.event!)).toStrictEqual({ type: "generate", count: 2 });
    expect(toJsonString(JournalEntrySchema, message)).toContain('"appendTime":"2026-01-02T03:04:05.678Z"');
    expect(fromBinary(JournalEntrySchema, toBinary(JournalEntrySchema, message))).toEqual(message);
  });

  it("reads the line's own ikey, and maps each integrity name", () => {
    expect(journalEntryToProto({ seq: 1, id: "a", type: "x", ts: "", event: { type: "x" }, ikey: "k" }).idempotencyKey).toBe("k");
    expect(journalEntryToProto({ seq: 1, id: "a", type: "x", event: { type: "x" } }, { integrity: "unchecked" }).integrity).toBe(EntryIntegrity.UNCHECKED);
    expect(journalEntryToProto({ seq: 1, id: "a", type: "x", event: { type: "x" } }, { integrity: "mismatch" }).integrity).toBe(EntryIntegrity.MISMATCH);
    expect(journalEntryToProto({ seq: 1, id: "a", type: "x", event: { type: "x" } }).integrity).toBe(EntryIntegrity.UNSPECIFIED);
  });

  it("tolerates a foreign line: junk seq and ts, no event object (the seed then applies the entry itself)", () => {
    const message = journalEntryToProto({ seq: "7", id: "a", type: "steer", ts: "not a date", pageUrl: "/p" });
    expect(message.seq).toBe(0n);
    expect(message.appendTime).toBeUndefined();
    expect(message.type).toBe("steer");
    expect(eventToJournal(message.event!)).toStrictEqual({ type: "steer", seq: "7", ts: "not a date", pageUrl: "/p" });
    const untyped = journalEntryToProto({ seq: 2, event: { type: "resume" } });
    expect(untyped.type).toBe("resume");
    expect(untyped.sessionId).toBe("");
  });
});
